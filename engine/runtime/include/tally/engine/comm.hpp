// tally::engine::Comm — one rank's end of a process group: c10d TCPStore rendezvous (rank 0 serves)
// and Gloo collectives, with a timeout on every call and per-rank byte counters.
//
// Contract (as c10d's ProcessGroup): every rank calls the same operations in the same order with
// the same element counts and dtype. Every call blocks until it completes on this rank or the
// timeout passes (all_reduce_async returns at once; its PendingCollective::wait() blocks
// instead); a timeout, a dead peer or a broken connection throws CommError naming the operation
// and, where known, the peer rank. After a CommError the Comm is unusable (every later
// call throws CommError at once): which messages a half-finished collective left in flight is
// unknown, so carrying on could match the wrong data.
//
// Counters (DESIGN.md §4, the communication ledger measured): per collective kind, the number of
// calls, the seconds spent in them, and the bytes this rank sent, from the core's formula
// collective_bytes_per_rank() with S = the full tensor's bytes — the same function the planner
// uses, so prediction and measurement share one definition. tally's own ring all-reduce is counted
// apart, from the bytes its send calls actually moved. At k = 1 every collective is the identity
// and nothing runs (no Gloo call, no staging, no pass over the data; an out-of-place form only
// copies its input to its output): it is counted as a call of 0 bytes, which is the formula's
// (k − 1)/k at k = 1.
//
// No torch in this header: buffers are plain spans. Engine code holding at::Tensor uses the
// overloads in engine/runtime/comm_torch.hpp.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <ranges>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "tally/core/comm.hpp"
#include "tally/core/sharding.hpp"
#include "tally/engine/dist_env.hpp"

namespace tally::engine {

enum class DType { f32, f64 };
std::string_view to_string(DType d);
inline constexpr std::size_t dtype_size_bytes(DType d) { return d == DType::f32 ? 4 : 8; }

// sum: element-wise sum over ranks. average: that sum divided by the world size, on every rank.
enum class ReduceOp { sum, average };

template <class R>
concept FloatRange = std::ranges::contiguous_range<R> && std::ranges::sized_range<R> &&
                     (std::is_same_v<std::remove_cv_t<std::ranges::range_value_t<R>>, float> ||
                      std::is_same_v<std::remove_cv_t<std::ranges::range_value_t<R>>, double>);

template <class T>
inline constexpr DType dtype_of = std::is_same_v<std::remove_cv_t<T>, float> ? DType::f32 : DType::f64;

// A non-owning, typed view of `count` contiguous elements: what every Comm operation takes.
// Built implicitly from std::vector<float|double>, std::span, std::array, ...
struct Buffer {
  void* data = nullptr;
  std::int64_t count = 0;
  DType dtype = DType::f32;

  Buffer() = default;
  Buffer(void* data_, std::int64_t count_, DType dtype_) : data(data_), count(count_), dtype(dtype_) {}
  template <FloatRange R>
    requires(!std::is_const_v<std::remove_reference_t<std::ranges::range_reference_t<R>>>)
  Buffer(R&& r)  // NOLINT(google-explicit-constructor): spans and vectors convert implicitly
      : data(std::ranges::data(r)),
        count(std::int64_t(std::ranges::size(r))),
        dtype(dtype_of<std::ranges::range_value_t<R>>) {}
  double size_bytes() const { return double(count) * double(dtype_size_bytes(dtype)); }
};

struct ConstBuffer {
  const void* data = nullptr;
  std::int64_t count = 0;
  DType dtype = DType::f32;

  ConstBuffer() = default;
  ConstBuffer(const void* data_, std::int64_t count_, DType dtype_)
      : data(data_), count(count_), dtype(dtype_) {}
  ConstBuffer(Buffer b) : data(b.data), count(b.count), dtype(b.dtype) {}  // NOLINT
  template <FloatRange R>
  ConstBuffer(R&& r)  // NOLINT(google-explicit-constructor)
      : data(std::ranges::data(r)),
        count(std::int64_t(std::ranges::size(r))),
        dtype(dtype_of<std::ranges::range_value_t<R>>) {}
  double size_bytes() const { return double(count) * double(dtype_size_bytes(dtype)); }
};

// Chunk `index` of a `count`-element buffer split over `ranks`: the first count % ranks chunks
// hold one element more than the rest (llm.c's ZeRO shard, gloo's ring chunks). Used for the ring
// chunks, the reduce-scatter output and the all-gather input of rank `index`.
// It is core's shard_span (tally/core/sharding.hpp), checked: one sharding rule, one type.
ShardSpan chunk_range(std::int64_t count, int ranks, int index);

// A communication failure: timeout, dead peer, broken connection, or a call after one of those.
class CommError : public std::runtime_error {
 public:
  CommError(std::string op, int peer_rank, const std::string& message)
      : std::runtime_error(message), op_(std::move(op)), peer_rank_(peer_rank) {}
  const std::string& op() const { return op_; }  // "all-reduce", "recv", "rendezvous", ...
  int peer_rank() const { return peer_rank_; }    // -1 when unknown
  bool timed_out() const;                         // the message says the wait timed out

 private:
  std::string op_;
  int peer_rank_ = -1;
};

struct CommOptions {
  double timeout_s = 60;  // every wait: rendezvous, each collective, each send / recv
  void validate() const;  // throws InvalidInput unless 0 < timeout_s <= 86400
};

struct CollectiveCounter {
  std::int64_t calls = 0;
  double bytes_sent = 0;  // by this rank
  // Wall time this rank spent inside the calls, from the check of the arguments to the result in
  // place (for all_reduce_async: starting it, and wait()); the Buffer API's copies to and from
  // its owned tensors are outside. What a step's phase timing charges to communication.
  double seconds = 0;
};

struct CommCounters {
  // Indexed by tally::Collective; bytes from the core formula (see the header comment).
  std::array<CollectiveCounter, kCollectiveKinds> by_collective{};
  // tally's ring all-reduce: bytes this rank's send calls moved (not a formula).
  CollectiveCounter ring_all_reduce;

  CollectiveCounter& operator[](Collective c) { return by_collective[std::size_t(c)]; }
  const CollectiveCounter& operator[](Collective c) const { return by_collective[std::size_t(c)]; }
};

// A collective started by Comm::all_reduce_async (or the at::Tensor overload): it runs on Gloo's
// worker threads while the caller goes on (computing more gradients, say). wait() blocks until it
// completes on this rank or the Comm's timeout passes, counted from the wait() call, and then
// writes the result (see Note [async collectives] in comm.cpp). Failures are those of the blocking
// call: CommError, and the Comm is unusable afterwards. Counters are updated when the collective is
// started, so they count collectives issued. A handle must not outlive its Comm; destroying one
// without wait() abandons the result (Gloo still finishes or fails the transfer on its own
// memory, so the group stays consistent). Default-constructed or moved-from: wait() does nothing.
class PendingCollective {
 public:
  PendingCollective();
  PendingCollective(PendingCollective&&) noexcept;
  PendingCollective& operator=(PendingCollective&&) noexcept;
  ~PendingCollective();

  void wait();                 // idempotent; throws CommError on failure or timeout
  bool waited() const;         // true after a successful wait() (or when there was nothing to do)
  bool done() const;           // without blocking: Gloo has finished it (or failed it)

  struct State;  // torch-side, defined in comm.cpp
  explicit PendingCollective(std::unique_ptr<State> state);

 private:
  std::unique_ptr<State> state_;
};

// One blocking collective on one rank (Note [arrival wait] in comm.cpp): when this rank entered
// it and when it returned, steady_seconds() (CLOCK_MONOTONIC: one clock for every process of a
// host, so the spans of ranks on one host compare; across hosts they do not).
// The calling thread's time on a run queue during the span (Note [run-queue wait] below): in a
// blocking collective, how long the thread, once woken, waited for a core; 0 where unreadable.
struct CallSpan {
  double enter_s = 0;
  double exit_s = 0;
  double runqueue_wait_s = 0;
};
double steady_seconds();  // std::chrono::steady_clock, seconds since its epoch
// Note [run-queue wait]: the seconds the calling thread has spent runnable but not running — on a
// run queue, waiting for a CPU the scheduler gave to another thread — since it started: the second
// field of Linux's /proc/thread-self/schedstat (ns; the kernel's sched_info, always kept where
// that file exists). Differences only have a meaning. Empty where the file cannot be read (another
// OS, a kernel without CONFIG_SCHED_INFO). A compute thread that waited here was delayed by the
// host's scheduler, not by its kernels: `run zero` records it per step (Note [every rank's
// phases] in engine/experiments/zero.cpp) and so does `run 3d` (Note [3-D step times] in
// engine/experiments/three_d.cpp), each collective's span records its share (CallSpan),
// and `bench allreduce` its timed calls' (TimedLoopResult, engine/bench/harness.hpp). A reading
// opens, reads and closes the file: about 10 µs on this VM (2026-12-07, under load), read outside
// every timed call but inside the steps of `run zero` and `run 3d` — two a step and two a
// collective: 20 (0.2 ms of 28) for ZeRO-3 at k = 2, 6 (0.06 of 16) for ZeRO-1, 66 (0.7 ms of
// about 250) for `run 3d`'s TP 2 on the report's GPT.
std::optional<double> thread_runqueue_wait_s();
// The run-queue wait inside `spans` (each CallSpan's share, Note [run-queue wait]): the part of a
// step's wait that fell in its collectives.
double runqueue_wait_in(std::span<const CallSpan> spans);

// A collective's span split on rank r, given every rank's span of the same call: wait_s =
// max_q enter_q − enter_r, how long r waited for the last rank to arrive (0 for that rank);
// rest_s = exit_r − max_q enter_q, the collective itself once all had arrived. Both clamped at 0.
struct ArrivalSplit {
  double wait_s = 0;
  double rest_s = 0;
};
// same_call[q] = rank q's span of one call. Throws InvalidInput when empty or rank is outside it.
ArrivalSplit arrival_split(std::span<const CallSpan> same_call, int rank);
class Comm;
// A collective over `comm`: every rank passes its spans of the same calls of `comm` (take_spans,
// so the same count on every rank), they are all-gathered, and this rank's split of each call is
// returned, in order. Meaningful when comm.on_one_host(); recording must be off (the gather is
// itself a collective).
std::vector<ArrivalSplit> arrival_splits(Comm& comm, std::span<const CallSpan> mine);
// The same per step: spans[i] = this rank's spans of step i (the same calls, in the same order,
// on every rank); returns this rank's arrival wait summed over each step's calls, in step order.
std::vector<double> arrival_waits(Comm& comm, const std::vector<std::vector<CallSpan>>& spans);

class Comm {
 public:
  // Rendezvous: rank 0 serves a c10d TCPStore on env.master_addr:env.master_port, every rank
  // joins a Gloo process group over it (the loopback device when master_addr is loopback, else
  // GLOO_SOCKET_IFNAME's interface when set, else the local address of this host's route to
  // master_addr: Note [the address peers dial], local_route.hpp). Throws InvalidInput for bad env
  // or options, CommError("rendezvous") when the group does not form within the timeout; its
  // message names the local address and interface this rank used and suggests GLOO_SOCKET_IFNAME.
  explicit Comm(const DistEnv& env, const CommOptions& options = {});
  // A sub-group (engine/runtime/include/tally/engine/process_groups.hpp builds the TP, CP, DP and
  // PP ones): the parent's ranks `ranks` (parent ranks, in group order, this rank among them) form
  // their own Gloo process group over the parent's TCPStore, its keys prefixed by `name` (c10d's
  // PrefixStore, as torch.distributed.new_group does). Ranks are group-local: rank() is this
  // rank's index in `ranks`, world_size() is ranks.size(); peers in messages are group-local too.
  // Its own counters and the parent's timeout. Every rank in `ranks` constructs it, each rank its
  // groups in one agreed order; `name` must be unique per group. The parent must outlive it.
  // Throws InvalidInput for bad ranks, CommError("rendezvous") when the group does not form.
  Comm(Comm& parent, std::span<const int> ranks, const std::string& name);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const;
  int world_size() const;
  double timeout_s() const;

  // In place: data becomes the element-wise sum (or average) over ranks. Gloo's algorithm.
  void all_reduce(Buffer data, ReduceOp op = ReduceOp::sum);
  // all_reduce started without waiting: data is read now and written by the handle's wait(), so
  // it must stay alive until then. Every rank must start its collectives in the same order (Gloo
  // matches them by issue order), whether blocking or not.
  [[nodiscard]] PendingCollective all_reduce_async(Buffer data, ReduceOp op = ReduceOp::sum);
  // input: the full count-element buffer on every rank; output: chunk_range(count, k, rank) of the
  // reduced result (output.count must equal that chunk's count). Gloo 1.13 has no reduce-scatter,
  // so this runs the reduce-scatter half of tally's ring over send / recv, on a scratch copy of
  // the input (which stays as it was).
  void reduce_scatter(ConstBuffer input, Buffer output, ReduceOp op = ReduceOp::sum);
  // The same for a caller whose full buffer is dead after the reduction (ZeRO's gradients): the
  // ring runs in `data` itself, no scratch copy and no copy out. Returns the view of `data` that
  // holds this rank's reduced chunk, chunk_range(data.count, k, rank); every other element of
  // `data` is left unspecified (partial sums). At k = 1 it is the identity: nothing is read or
  // written, and the chunk is all of `data`. Counted as reduce_scatter, like the copying form.
  [[nodiscard]] Buffer reduce_scatter_in_place(Buffer data, ReduceOp op = ReduceOp::sum);
  // input: this rank's chunk_range(output.count, k, rank); output: the concatenation of all
  // ranks' chunks. Gloo's all-gather (chunks padded to the largest one).
  void all_gather(ConstBuffer input, Buffer output);
  void broadcast(Buffer data, int root_rank);
  // Pairwise exchange (MPI_Alltoall; c10d's alltoall_base on Gloo): input holds k chunks, chunk j
  // for rank j; output receives chunk i from rank i. Equal splits (send_counts empty): input.count
  // == output.count, a multiple of k, every chunk count/k elements. Uneven splits (MPI_Alltoallv):
  // send_counts[j] elements go to rank j and recv_counts[i] come from rank i, in rank order,
  // summing to input.count and output.count; every rank's send_counts[j] must equal rank j's
  // recv_counts[this rank]. Counted as all_to_all: equal splits by core's formula on S = input's
  // bytes, S(k−1)/k — exactly the k−1 chunks that leave this rank; uneven splits by the bytes that
  // leave it, Σ_{j≠rank} send_counts[j] (the same figure when the splits are equal).
  void all_to_all(ConstBuffer input, Buffer output, std::span<const std::int64_t> send_counts = {},
                  std::span<const std::int64_t> recv_counts = {});
  // Point to point; tag (0 <= tag < kMaxUserTag) matches a send with its recv. Gloo's TCP
  // transport is rendezvous-based: a send completes only once the peer has posted the matching
  // recv, so two ranks that both send first wait until the timeout. Pair them up (e.g. even ranks
  // send first, odd ranks receive first). send_recv counters count sends only.
  void send(ConstBuffer data, int dst_rank, int tag = 0);
  void recv(Buffer data, int src_rank, int tag = 0);
  void barrier();

  // tally's own ring all-reduce (see the note in ring.cpp): reduce-scatter then all-gather over
  // send / recv, 2(k−1) steps. Counted in counters().ring_all_reduce from its actual sends.
  void ring_all_reduce(Buffer data, ReduceOp op = ReduceOp::sum);

  const CommCounters& counters() const;
  void reset_counters();
  // While on, each blocking collective (all_reduce, reduce_scatter, reduce_scatter_in_place,
  // all_gather, broadcast, all_to_all, ring_all_reduce and their at::Tensor forms; not the async
  // all-reduce, send, recv or barrier) appends its CallSpan; take_spans() returns them in call
  // order and clears. Off by default. Every rank calls the same collectives in the same order, so
  // the i-th spans of all ranks are one call (arrival_split).
  void record_spans(bool on);
  std::vector<CallSpan> take_spans();
  // Every rank of this group runs on this host (the rendezvous address is loopback), so their
  // spans share one clock.
  bool on_one_host() const;

  static constexpr int kMaxUserTag = 1 << 30;  // tags at and above are tally's own (the ring)

  struct Impl;  // torch-side state, defined in comm.cpp
  // For engine internals (engine/runtime/comm_torch.hpp); Impl is opaque outside comm.cpp.
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tally::engine
