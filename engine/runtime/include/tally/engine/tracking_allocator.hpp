// A tracking, caching CPU allocator: the engine's memory probe, the CPU counterpart of
// torch.cuda.memory_allocated / max_memory_allocated / memory_reserved (seed §report(tag)).
//
// While a TrackingAllocatorScope lives, it is c10's CPU allocator (c10::SetCPUAllocator), so every
// CPU tensor storage the process creates — parameters, optimizer state, activations saved for
// backward, temporaries of every op, in every intra-op thread — goes through it.
//
// Note [allocated vs reserved]
//   allocated  the bytes of live storages, as requested (Σ nbytes = numel × element size of every
//              live storage; the same figure the ledgers predict). PyTorch's CUDA counter rounds each
//              block up to 512 B first; tally keeps the requested figure so a test can check it exactly.
//   reserved   the bytes this allocator holds from the system (posix_memalign): every live block plus
//              every freed block kept in its cache for reuse, each rounded up to a multiple of 512 B.
//   reserved − allocated = cached free blocks + rounding (+ the spare of a reused larger block):
//              memory the process holds but no tensor uses ("fragmentation and cache", seed ⑥).
// The cache works like PyTorch's CUDA caching allocator without block splitting: a freed block goes
// to a free list by size and is handed to the next request whose rounded size it covers with at most
// 1/8 to spare (best fit); a request the cache cannot serve goes to the system. So, as on a GPU, a
// training loop's second step is served from the cache and reserved stays at the first step's peak.
// With `cache = false` freed blocks go straight back and reserved − allocated is only overhead.
//
// Thread safety: allocation and free may happen from any thread (one mutex). Creating and destroying
// a scope must not race with other threads allocating (c10::SetCPUAllocator is a plain store), and
// only one scope may be active at a time (a second throws std::logic_error).
//
// Lifetime: the destructor restores the allocator that was installed before and returns every cached
// block to the system. Tensors still alive then keep their blocks; each returns to the system when
// the tensor dies (a side table knows each block's owner), so nothing leaks and nothing is freed twice.
#pragma once

#include <cstdint>

namespace tally::engine {

struct MemoryCounters {
  std::int64_t allocated_bytes = 0;       // live storages, requested bytes
  std::int64_t peak_allocated_bytes = 0;  // max of allocated_bytes since the last reset_peak()
  std::int64_t reserved_bytes = 0;        // held from the system: live + cached blocks (+ overhead)
  std::int64_t peak_reserved_bytes = 0;   // max of reserved_bytes since the last reset_peak()
  std::int64_t cached_bytes = 0;          // freed blocks kept for reuse (part of reserved_bytes)
  std::int64_t live_blocks = 0;           // storages alive now (zero-size ones have no block)
  std::int64_t allocations = 0;           // allocate() calls of > 0 bytes since the scope began
  std::int64_t zero_size_allocations = 0; // allocate(0) calls (no block, no bytes)
  std::int64_t cache_hits = 0;            // allocations served from the cache
  std::int64_t system_allocations = 0;    // blocks obtained from the system
  std::int64_t system_frees = 0;          // blocks returned to the system
  // Bytes held from the system that no tensor uses (Note [allocated vs reserved]).
  std::int64_t unused_reserved_bytes() const { return reserved_bytes - allocated_bytes; }
};

struct TrackingAllocatorOptions {
  bool cache = true;  // keep freed blocks for reuse (PyTorch CUDA style); false = free at once
};

class TrackingAllocatorScope {
 public:
  // Installs the tracking allocator as c10's CPU allocator; counters start at zero. Throws
  // std::logic_error when another scope is active or c10 refuses the allocator.
  explicit TrackingAllocatorScope(const TrackingAllocatorOptions& options = {});
  // Restores the previous CPU allocator and returns the cached blocks to the system.
  ~TrackingAllocatorScope();
  TrackingAllocatorScope(const TrackingAllocatorScope&) = delete;
  TrackingAllocatorScope& operator=(const TrackingAllocatorScope&) = delete;

  MemoryCounters counters() const;
  // Phase marker: peak_allocated_bytes and peak_reserved_bytes restart from the current values.
  void reset_peak();
  // Returns every cached block to the system (torch.cuda.empty_cache); reserved drops to the live
  // blocks.
  void empty_cache();

  // The block a request of `nbytes` occupies when it comes from the system (512-byte rounding).
  static std::int64_t block_bytes(std::int64_t nbytes);

  struct State;  // internal (tracking_allocator.cpp)

 private:
  State* state_;  // owned jointly with the live blocks (freed by whichever ends last)
};

}  // namespace tally::engine
