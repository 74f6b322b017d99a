// Comm::Impl: the process group of a Comm and its operations on owned, contiguous CPU tensors
// (Note [owned tensors] in comm.cpp), shared by comm.cpp (the Buffer API, rendezvous, async
// collectives, the ring) and comm_torch.cpp (the at::Tensor overloads). Internal to the runtime.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <algorithm>
#include <chrono>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tally/core/comm.hpp"
#include "tally/core/types.hpp"
#include "tally/engine/comm.hpp"

namespace tally::engine {

namespace detail {

std::string seconds_str(double s);
// The message of the exception being handled, without c10's backtrace (call inside a catch).
std::string current_error();
bool mentions_timeout(const std::string& s);
void require_same_dtype(DType a, DType b, const char* op);
// The tensor's DType; throws InvalidInput unless it is a defined float32/float64 CPU tensor.
DType dtype_of_tensor(const at::Tensor& t, const char* op);

// Adds the wall time of its scope to a counter (CollectiveCounter::seconds).
class TimedInto {
 public:
  explicit TimedInto(CollectiveCounter& c) : counter_(c) {}
  ~TimedInto() {
    counter_.seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  TimedInto(const TimedInto&) = delete;
  TimedInto& operator=(const TimedInto&) = delete;

 private:
  CollectiveCounter& counter_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// Note [arrival wait]: while the Comm records spans (Comm::record_spans), the outermost scope of
// each blocking collective appends its (enter, exit) to Impl::spans; an inner scope (the blocking
// all-reduce's start and finish, say) adds nothing. Defined after Impl.
class SpanScope {
 public:
  explicit SpanScope(Comm::Impl& m);
  ~SpanScope();
  SpanScope(const SpanScope&) = delete;
  SpanScope& operator=(const SpanScope&) = delete;

 private:
  Comm::Impl& m_;
  bool counted_ = false;  // opened while recording: counted in m_.span_depth
  bool outer_ = false;   // records the span
  double enter_s_ = 0;
  std::optional<double> queued_s_;  // the thread's run-queue wait at entry (Note [run-queue wait])
};

}  // namespace detail

struct Comm::Impl {
  DistEnv env;
  CommOptions options;
  std::chrono::milliseconds timeout{0};
  c10::intrusive_ptr<c10d::Store> store;  // the TCPStore, or a sub-group's PrefixStore over it
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;  // declared after store: destroyed first
  CommCounters counters;
  bool recording_spans = false;   // Comm::record_spans
  int span_depth = 0;             // open SpanScopes
  std::vector<CallSpan> spans;    // recorded since the last take_spans
  std::string failure;  // the first CommError's message; non-empty = unusable

  int k() const { return env.world_size; }

  // `hint`, when given, ends the message: "…; this rank uses local address …".
  [[noreturn]] void fail(const std::string& op, int peer, const std::string& what_failed,
                         const std::string& detail, const std::string& hint = "") {
    // (`detail::` below names the namespace: a nested-name-specifier ignores the parameter.)
    std::string reason = detail::mentions_timeout(detail)
                             ? "timed out after " + detail::seconds_str(options.timeout_s)
                         : detail.find("Address already in use") != std::string::npos
                             ? "the port is already in use"
                             : "peer failure or broken connection";
    std::string message = "rank " + std::to_string(env.rank) + ": " + what_failed + " failed: " +
                          reason + " (" + detail + ")" + (hint.empty() ? "" : "; " + hint);
    failure = message;
    throw CommError(op, peer, message);
  }

  void check_usable(const std::string& op, int peer) const {
    if (!failure.empty())
      throw CommError(op, peer, "rank " + std::to_string(env.rank) + ": " + op +
                                    " on a Comm that already failed: " + failure);
  }

  void check_peer(int peer, const char* role, const char* op) const {
    if (peer < 0 || peer >= k())
      throw InvalidInput(std::string(op) + ": " + role + " = " + std::to_string(peer) +
                         " vs world_size = " + std::to_string(k()) + ": must be in [0, " +
                         std::to_string(k()) + ")");
  }

  void check_tag(int tag, const char* op) const {
    if (tag < 0 || tag >= kMaxUserTag)
      throw InvalidInput(std::string(op) + ": tag = " + std::to_string(tag) + ": must be in [0, " +
                         std::to_string(kMaxUserTag) + ")");
  }

  void wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& op, int peer,
            const std::string& what_failed) {
    try {
      work->wait(timeout);
    } catch (...) {
      fail(op, peer, what_failed, detail::current_error());
    }
    released(work);
  }

  // Note [released tensors]: Work::wait returns when the worker thread marks the work done; the
  // thread drops its own reference (ProcessGroupGloo::runLoop's workInProgress_) a moment later.
  // Until then the work keeps the caller's tensors alive, so a tensor the caller drops right after
  // a collective could outlive it by a race — and the tracking allocator (the engine's memory
  // probe) would count it or not by chance. Waiting for that reference to go (microseconds; never
  // longer than the timeout) makes a returned collective hold nothing of the caller's.
  void released(const c10::intrusive_ptr<c10d::Work>& work) const {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (work.use_count() > 1 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
  }

  std::string describe(const std::string& op, double size_bytes) const {
    std::ostringstream os;
    os << op << " of " << size_bytes << " bytes over " << k() << " ranks";
    return os.str();
  }

  void count(Collective c, double size_bytes) {
    CollectiveCounter& counter = counters[c];
    counter.calls += 1;
    counter.bytes_sent += collective_bytes_per_rank(c, size_bytes, k());  // the core's formula
  }

  // k = 1: the collective is the identity (every rank's data is the result; the average over one
  // rank is the value), so nothing runs. Still checked and counted: a call of 0 bytes, the
  // formula's (k − 1)/k at k = 1 (comm.hpp). Returns whether the caller is done.
  bool identity_at_one_rank(Collective c, const char* op, double size_bytes) {
    if (k() > 1) return false;
    check_usable(op, -1);
    count(c, size_bytes);
    return true;
  }

  // ---- operations on owned, contiguous CPU tensors (Note [owned tensors]) ----

  void all_reduce(at::Tensor& t, ReduceOp op);  // start_all_reduce + finish
  // Enqueues the all-reduce on Gloo's workers and counts it (Note [async collectives]).
  PendingCollective::State start_all_reduce(const at::Tensor& t, ReduceOp op);
  // Posts a send of t (contiguous, kept alive by the state) and counts it as checked_send does.
  PendingCollective::State start_send(const at::Tensor& t, int dst, int tag);
  void finish(PendingCollective::State& pending);

  void broadcast(at::Tensor& t, int root) {
    const detail::SpanScope span(*this);
    const detail::TimedInto timed(counters[Collective::broadcast]);
    check_peer(root, "root_rank", "broadcast");
    check_usable("broadcast", root);
    const double size_bytes = double(t.nbytes());
    if (t.numel() > 0 && k() > 1) {  // k = 1: the identity (comm.hpp)
      std::vector<at::Tensor> tensors{t};
      c10d::BroadcastOptions opts;
      opts.rootRank = root;
      opts.timeout = timeout;
      wait(group->broadcast(tensors, opts), "broadcast", root,
           describe("broadcast from rank " + std::to_string(root), size_bytes));
    }
    count(Collective::broadcast, size_bytes);
  }

  // Note [all-gather layout]
  // Gloo's all-gather takes equal chunks, so every chunk travels padded to the largest, |C_0|
  // (chunk_range: the first n mod k chunks are that long, the rest one element shorter). Gloo
  // gathers into a flat buffer of its own and then copies chunk j into outputs[j]; so each chunk
  // of full length is handed to Gloo as a view of `out` and lands in place, and only the short
  // ones go through a padded temporary and one more copy. When k divides n there are none.
  // Likewise the input goes to Gloo as it is unless it is short: then a padded copy, whose one
  // pad element is zeroed (never read back, but the bytes on the wire stay deterministic).
  // The input may be out's own chunk (an in-place all-gather): Gloo reads its input into its own
  // buffer before it writes any output, and writes that chunk back with the same values.
  void all_gather(const at::Tensor& in, at::Tensor& out) {
    const detail::SpanScope span(*this);
    const detail::TimedInto timed(counters[Collective::all_gather]);
    check_usable("all-gather", -1);
    const std::int64_t n = out.numel();
    const ShardSpan mine = chunk_range(n, k(), env.rank);
    if (in.numel() != mine.count)
      throw InvalidInput("all-gather: input count " + std::to_string(in.numel()) + " vs " +
                         std::to_string(mine.count) + " expected (chunk " +
                         std::to_string(env.rank) + " of " + std::to_string(n) +
                         " elements over " + std::to_string(k()) + " ranks)");
    const double size_bytes = double(out.nbytes());
    if (identity_at_one_rank(Collective::all_gather, "all-gather", size_bytes)) {
      if (n > 0 && in.data_ptr() != out.data_ptr()) out.copy_(in);
      return;
    }
    if (n > 0) {
      const std::int64_t padded = chunk_range(n, k(), 0).count;
      std::vector<at::Tensor> inputs{in};
      if (mine.count < padded) {
        inputs[0] = at::empty({padded}, out.options());
        inputs[0].narrow(0, 0, mine.count).copy_(in);
        inputs[0].narrow(0, mine.count, padded - mine.count).zero_();
      }
      std::vector<std::vector<at::Tensor>> outputs(1);
      for (int r = 0; r < k(); ++r) {
        const ShardSpan c = chunk_range(n, k(), r);
        outputs[0].push_back(c.count == padded ? out.narrow(0, c.offset, c.count)
                                               : at::empty({padded}, out.options()));
      }
      c10d::AllgatherOptions opts;
      opts.timeout = timeout;
      wait(group->allgather(outputs, inputs, opts), "all-gather", -1,
           describe("all-gather", size_bytes));
      for (int r = 0; r < k(); ++r) {
        const ShardSpan c = chunk_range(n, k(), r);
        if (c.count < padded)
          out.narrow(0, c.offset, c.count).copy_(outputs[0][r].narrow(0, 0, c.count));
      }
    }
    count(Collective::all_gather, size_bytes);
  }

  // in, out: owned, contiguous, 1-D, distinct storage (Gloo reads the input while it writes the
  // output). counts empty: equal splits; else the per-rank element counts (comm.hpp).
  void all_to_all(const at::Tensor& in, at::Tensor& out, std::vector<std::int64_t> send_counts,
                  std::vector<std::int64_t> recv_counts) {
    const detail::SpanScope span(*this);
    const detail::TimedInto timed(counters[Collective::all_to_all]);
    check_usable("all-to-all", -1);
    const bool even = send_counts.empty() && recv_counts.empty();
    const double elem = double(in.element_size());
    double sent_bytes = 0;  // uneven splits: what leaves this rank
    if (even) {
      if (in.numel() != out.numel() || in.numel() % k() != 0)
        throw InvalidInput("all-to-all: input count " + std::to_string(in.numel()) +
                           " vs output count " + std::to_string(out.numel()) +
                           ": must be equal and a multiple of the " + std::to_string(k()) +
                           " ranks");
    } else {
      auto check = [&](const std::vector<std::int64_t>& c, std::int64_t total, const char* what) {
        std::int64_t sum = 0;
        for (const std::int64_t n : c) sum += n < 0 ? total + 1 : n;
        if (std::int64_t(c.size()) != k() || sum != total)
          throw InvalidInput(std::string("all-to-all: ") + what + " counts: " +
                             std::to_string(c.size()) + " of them summing to " +
                             std::to_string(sum) + " vs " + std::to_string(k()) +
                             " ranks and " + std::to_string(total) +
                             " elements: must be one per rank, each >= 0, summing to the count");
      };
      check(send_counts, in.numel(), "send");
      check(recv_counts, out.numel(), "recv");
      for (int j = 0; j < k(); ++j)
        if (j != env.rank) sent_bytes += double(send_counts[std::size_t(j)]) * elem;
    }
    const double size_bytes = double(in.nbytes());
    auto count_it = [&] {
      if (even) return count(Collective::all_to_all, size_bytes);
      counters[Collective::all_to_all].calls += 1;
      counters[Collective::all_to_all].bytes_sent += sent_bytes;
    };
    if (k() == 1) {  // the identity (comm.hpp): nothing runs
      if (in.numel() > 0) out.copy_(in);
      return count_it();
    }
    if (in.numel() > 0 || out.numel() > 0) {
      c10d::AllToAllOptions opts;
      opts.timeout = timeout;
      at::Tensor input = in;
      wait(group->alltoall_base(out, input, recv_counts, send_counts, opts), "all-to-all", -1,
           describe("all-to-all", size_bytes));
    }
    count_it();
  }

  void send(const at::Tensor& t, int dst, int tag) {
    std::vector<at::Tensor> tensors{t};
    const std::string what = "send of " + std::to_string(t.nbytes()) + " bytes to rank " +
                             std::to_string(dst) + " (tag " + std::to_string(tag) + ")";
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = group->send(tensors, dst, tag);
    } catch (...) {
      fail("send", dst, what, detail::current_error());
    }
    wait(work, "send", dst, what);
  }

  void recv(at::Tensor& t, int src, int tag) {
    std::vector<at::Tensor> tensors{t};
    const std::string what = "recv of " + std::to_string(t.nbytes()) + " bytes from rank " +
                             std::to_string(src) + " (tag " + std::to_string(tag) + ")";
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = group->recv(tensors, src, tag);
    } catch (...) {
      fail("recv", src, what, detail::current_error());
    }
    wait(work, "recv", src, what);
  }

  void checked_send(const at::Tensor& t, int dst, int tag) {
    check_peer(dst, "dst_rank", "send");
    check_tag(tag, "send");
    if (dst == env.rank) throw InvalidInput("send: dst_rank = " + std::to_string(dst) + ": is this rank");
    check_usable("send", dst);
    if (t.numel() > 0) send(t, dst, tag);
    count(Collective::send_recv, double(t.nbytes()));
  }

  void checked_recv(at::Tensor& t, int src, int tag) {
    check_peer(src, "src_rank", "recv");
    check_tag(tag, "recv");
    if (src == env.rank) throw InvalidInput("recv: src_rank = " + std::to_string(src) + ": is this rank");
    check_usable("recv", src);
    if (t.numel() > 0) recv(t, src, tag);  // not counted: counters hold bytes this rank sent
  }

  void barrier() {
    check_usable("barrier", -1);
    c10d::BarrierOptions opts;
    opts.timeout = timeout;
    wait(group->barrier(opts), "barrier", -1, "barrier of " + std::to_string(k()) + " ranks");
  }
};

namespace detail {

inline SpanScope::SpanScope(Comm::Impl& m) : m_(m) {
  if (!m_.recording_spans) return;
  counted_ = true;
  outer_ = m_.span_depth++ == 0;
  if (!outer_) return;
  queued_s_ = thread_runqueue_wait_s();
  enter_s_ = steady_seconds();
}

inline SpanScope::~SpanScope() {
  if (!counted_) return;
  --m_.span_depth;
  if (!outer_) return;
  const double exit_s = steady_seconds();
  const std::optional<double> queued = thread_runqueue_wait_s();
  m_.spans.push_back({.enter_s = enter_s_,
                      .exit_s = exit_s,
                      .runqueue_wait_s = queued_s_ && queued
                                             ? std::max(0.0, *queued - *queued_s_)
                                             : 0.0});
}

}  // namespace detail

// Note [async collectives]
// all_reduce_async enqueues the collective on ProcessGroupGloo's worker threads and returns; Gloo
// numbers collectives in issue order, so ranks that issue the same sequence match up however the
// calls interleave with computation (DDP issues one per gradient bucket from autograd hooks while
// the backward pass goes on). The tensor Gloo works on is owned by the handle (Note [owned
// tensors]); the average's division and any copy back to the caller happen in wait(). The timeout
// counts from wait(): a collective that has been running while the caller computed is not charged
// for that time, and Gloo's own context timeout still bounds every transfer.
struct PendingCollective::State {
  Comm::Impl* impl = nullptr;
  c10::intrusive_ptr<c10d::Work> work;  // null when there was nothing to reduce
  at::Tensor reduced;                   // contiguous, what Gloo reduces in place
  at::Tensor target;                    // defined: copy `reduced` back into it (non-contiguous)
  Buffer out;                           // data set: copy `reduced` back into it (Buffer API)
  ReduceOp op = ReduceOp::sum;
  std::string what;                     // "all-reduce of 40 bytes over 2 ranks"
  bool waited = false;
  Collective kind = Collective::all_reduce;  // or send_recv (start_send)
  std::string op_name = "all-reduce";        // for CommError
  int peer = -1;                             // the send's destination
};

}  // namespace tally::engine
