// The tracking, caching CPU allocator (tracking_allocator.hpp, Note [allocated vs reserved]).
//
// Note [block layout]
// A block is a plain posix_memalign(64, rounded size) allocation whose base is the tensor's data
// pointer, exactly like c10's default CPU allocator; the block's size and owner live in a side table
// (block base → BlockInfo), not in a header. Two reasons:
//   * c10's raw interface needs data == context: oneDNN (ideep) allocates its scratch memory through
//     GetAllocator(kCPU)->raw_allocate and frees it through whatever allocator is installed *at free
//     time* (raw_deallocate). A block of ours freed by the default allocator is then still a valid
//     free(); a default block freed by ours is not in the table and goes to free() too.
//   * the block outlives its scope safely: a tensor alive at scope end returns its block to the
//     system when it dies, and the scope's State is deleted by whichever ends last.
// The table, the active State and every State's counters are guarded by one mutex: allocation is a
// map insert and a few additions, negligible next to the tensor work behind it.
#include "tally/engine/tracking_allocator.hpp"

#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <stdexcept>
#include <unordered_map>
#include <vector>

namespace tally::engine {

namespace {

constexpr std::size_t kAlignmentBytes = 64;   // c10::gAlignment (AVX-512 loads)
constexpr std::size_t kRoundBytes = 512;      // PyTorch CUDA's kMinBlockSize
constexpr std::size_t kMaxSpareFraction = 8;  // a cached block serves requests ≥ 7/8 of its size

std::size_t round_up(std::size_t n) { return (n + kRoundBytes - 1) / kRoundBytes * kRoundBytes; }

}  // namespace

struct TrackingAllocatorScope::State {
  TrackingAllocatorOptions options;
  c10::Allocator* previous = nullptr;      // restored by the scope's destructor
  bool detached = false;                   // the scope ended: frees go straight to the system
  int pending = 0;                         // allocations between cache miss and table insert
  MemoryCounters c;
  std::multimap<std::size_t, void*> cache; // block bytes → cached block base
};

namespace {

using State = TrackingAllocatorScope::State;

struct BlockInfo {
  State* owner;
  std::size_t block_bytes;      // rounded size held from the system
  std::size_t requested_bytes;  // what the storage asked for
};

// Immortal: frees may arrive during static destruction (tensors in static storage).
struct Registry {
  std::mutex mu;
  State* active = nullptr;
  std::unordered_map<void*, BlockInfo> live;  // every live block of every state
};
Registry& registry() {
  static auto* r = new Registry;
  return *r;
}

void note_peaks(MemoryCounters& c) {
  c.peak_allocated_bytes = std::max(c.peak_allocated_bytes, c.allocated_bytes);
  c.peak_reserved_bytes = std::max(c.peak_reserved_bytes, c.reserved_bytes);
}

// Removes every cached block from `s` (caller holds the lock) and returns them for free().
std::vector<void*> take_cache(State& s) {
  std::vector<void*> blocks;
  blocks.reserve(s.cache.size());
  for (const auto& [bytes, ptr] : s.cache) {
    blocks.push_back(ptr);
    s.c.reserved_bytes -= std::int64_t(bytes);
    ++s.c.system_frees;
  }
  s.cache.clear();
  s.c.cached_bytes = 0;
  return blocks;
}

void free_all(const std::vector<void*>& blocks) {
  for (void* p : blocks) std::free(p);
}

bool state_done(const State& s) { return s.detached && s.c.live_blocks == 0 && s.pending == 0; }

// The deleter of every block (and c10's raw deleter): back to the cache, or to the system.
void free_block(void* ptr) {
  if (ptr == nullptr) return;
  Registry& r = registry();
  std::unique_lock lock(r.mu);
  const auto it = r.live.find(ptr);
  if (it == r.live.end()) {  // not ours: a default-allocator block freed through us (Note [block layout])
    lock.unlock();
    std::free(ptr);
    return;
  }
  const BlockInfo b = it->second;
  r.live.erase(it);
  State& s = *b.owner;
  s.c.allocated_bytes -= std::int64_t(b.requested_bytes);
  --s.c.live_blocks;
  if (!s.detached && s.options.cache) {
    s.cache.emplace(b.block_bytes, ptr);
    s.c.cached_bytes += std::int64_t(b.block_bytes);
    return;
  }
  s.c.reserved_bytes -= std::int64_t(b.block_bytes);
  ++s.c.system_frees;
  const bool done = state_done(s);
  lock.unlock();
  std::free(ptr);
  if (done) delete &s;
}

void* system_alloc(std::size_t bytes) {
  void* p = nullptr;
  return posix_memalign(&p, kAlignmentBytes, bytes) == 0 ? p : nullptr;
}

class TrackingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t nbytes) const override {
    const c10::Device cpu(c10::DeviceType::CPU);
    Registry& r = registry();
    std::unique_lock lock(r.mu);
    State* s = r.active;
    if (s == nullptr) {  // only through a stale pointer to this allocator after its scope ended
      lock.unlock();
      return c10::GetDefaultCPUAllocator()->allocate(nbytes);
    }
    if (nbytes == 0) {  // like c10's default: no block, a null pointer that is never freed
      ++s->c.zero_size_allocations;
      return {nullptr, nullptr, &free_block, cpu};
    }
    ++s->c.allocations;
    const std::size_t want = round_up(nbytes);
    if (s->options.cache) {  // best fit, at most 1/8 to spare
      const auto it = s->cache.lower_bound(want);
      if (it != s->cache.end() && it->first - want <= it->first / kMaxSpareFraction) {
        void* p = it->second;
        const std::size_t bytes = it->first;
        s->cache.erase(it);
        s->c.cached_bytes -= std::int64_t(bytes);
        ++s->c.cache_hits;
        insert(r, *s, p, bytes, nbytes);
        return {p, p, &free_block, cpu};
      }
    }
    ++s->pending;  // keeps *s alive while the lock is released
    lock.unlock();
    void* p = system_alloc(want);
    if (p == nullptr) {  // out of memory: return the cache to the system and try once more
      lock.lock();
      const auto blocks = take_cache(*s);
      lock.unlock();
      free_all(blocks);
      p = system_alloc(want);
    }
    lock.lock();
    --s->pending;
    if (p == nullptr) {
      const bool done = state_done(*s);
      lock.unlock();
      if (done) delete s;
      TORCH_CHECK(false, "tally tracking allocator: out of memory allocating ", nbytes, " bytes");
    }
    s->c.reserved_bytes += std::int64_t(want);
    ++s->c.system_allocations;
    insert(r, *s, p, want, nbytes);
    return {p, p, &free_block, cpu};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_block; }

 private:
  // Caller holds the lock.
  static void insert(Registry& r, State& s, void* p, std::size_t block, std::size_t requested) {
    r.live[p] = BlockInfo{&s, block, requested};
    s.c.allocated_bytes += std::int64_t(requested);
    ++s.c.live_blocks;
    note_peaks(s.c);
  }
};

TrackingCpuAllocator& tracking_allocator() {
  static auto* a = new TrackingCpuAllocator;  // immortal: storages keep a pointer to their allocator
  return *a;
}

}  // namespace

TrackingAllocatorScope::TrackingAllocatorScope(const TrackingAllocatorOptions& options)
    : state_(new State) {
  state_->options = options;
  Registry& r = registry();
  {
    std::lock_guard lock(r.mu);
    if (r.active != nullptr) {
      delete state_;
      throw std::logic_error("TrackingAllocatorScope: another scope is already active (one at a "
                             "time: its counters would miss the inner scope's allocations)");
    }
    state_->previous = c10::GetCPUAllocator();
    r.active = state_;
  }
  // Priority 0 is c10's default allocator's; a higher registered priority would refuse us.
  c10::SetCPUAllocator(&tracking_allocator(), 0);
  if (c10::GetCPUAllocator() != &tracking_allocator()) {
    std::lock_guard lock(r.mu);
    r.active = nullptr;
    delete state_;
    throw std::logic_error("TrackingAllocatorScope: c10 refused the allocator (a CPU allocator "
                           "with priority > 0 is registered)");
  }
}

TrackingAllocatorScope::~TrackingAllocatorScope() {
  c10::SetCPUAllocator(state_->previous, 0);
  Registry& r = registry();
  std::unique_lock lock(r.mu);
  r.active = nullptr;
  state_->detached = true;
  const auto blocks = take_cache(*state_);
  const bool done = state_done(*state_);
  lock.unlock();
  free_all(blocks);
  if (done) delete state_;
}

MemoryCounters TrackingAllocatorScope::counters() const {
  std::lock_guard lock(registry().mu);
  return state_->c;
}

void TrackingAllocatorScope::reset_peak() {
  std::lock_guard lock(registry().mu);
  state_->c.peak_allocated_bytes = state_->c.allocated_bytes;
  state_->c.peak_reserved_bytes = state_->c.reserved_bytes;
}

void TrackingAllocatorScope::empty_cache() {
  std::unique_lock lock(registry().mu);
  const auto blocks = take_cache(*state_);
  lock.unlock();
  free_all(blocks);
}

std::int64_t TrackingAllocatorScope::block_bytes(std::int64_t nbytes) {
  return nbytes <= 0 ? 0 : std::int64_t(round_up(std::size_t(nbytes)));
}

}  // namespace tally::engine
