// Comm over c10d: TCPStore rendezvous + ProcessGroupGloo (PyTorch 1.13). The one torch TU of the
// communication layer; comm_torch.hpp's overloads are defined here too.
//
// Note [owned tensors]
// Gloo runs collectives on its own worker threads. When a wait times out, that thread may still
// be inside the collective, and would write into the caller's memory after the caller has moved
// on (or freed it). So Gloo only ever sees tensors that own their storage: the Buffer API copies
// into a fresh tensor and back; the at::Tensor API passes the caller's tensor (or views of it),
// whose storage the Gloo work item keeps alive by reference. A timed-out operation can then only
// touch memory nobody else uses. tally's ring (ring_all_reduce, reduce_scatter_in_place) works on
// the caller's memory itself: each of its transfers sends an owned copy of a chunk and receives
// into an owned tensor the ring reads from once the transfer has completed.
//
// Note [timeouts]
// Every wait is bounded twice: Work::wait(timeout) here, and Gloo's own context timeout (the
// same value, set through ProcessGroupGloo::Options) inside each transfer, which is what finally
// frees a Gloo worker thread stuck on a silent peer. A peer that exits closes its sockets, and
// Gloo reports "Connection closed by peer" on every pair to it at once, well before the timeout.
#include <signal.h>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>

#include "comm_p2p.hpp"
#include "comm_torch.hpp"
#include "ring.hpp"
#include "tally/core/sharding.hpp"
#include "tally/core/types.hpp"
#include "tally/engine/local_route.hpp"

namespace tally::engine {

namespace {

constexpr int kRingTag = Comm::kMaxUserTag;  // tally's own ring exchanges

std::string seconds_str(double s) {
  std::ostringstream os;
  os << s << " s";
  return os.str();
}

std::string first_line(std::string s) {
  if (auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
  return s;
}

// The message of the exception being handled, without c10's backtrace.
std::string current_error() {
  try {
    throw;
  } catch (const c10::Error& e) {
    return first_line(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return first_line(e.what());
  } catch (...) {
    return "unknown error";
  }
}

bool mentions_timeout(const std::string& s) {
  std::string lower = s;
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  return lower.find("timed out") != std::string::npos ||
         lower.find("timeout") != std::string::npos;
}

// The Gloo device a rank binds, and the words naming it in a failed rendezvous
// (Note [the address peers dial], local_route.hpp).
struct GlooDeviceChoice {
  std::string hostname;   // an IP literal to bind; empty: the interface below
  std::string interface;  // GLOO_SOCKET_IFNAME, when set
  std::string described;  // "local address 10.77.0.2 (interface eth0), its route to MASTER_ADDR"

  std::shared_ptr<::gloo::transport::Device> make() const {
    return hostname.empty() ? c10d::ProcessGroupGloo::createDeviceForInterface(interface)
                            : c10d::ProcessGroupGloo::createDeviceForHostname(hostname);
  }
};

constexpr const char* kSetIfname =
    "; if another interface reaches the other hosts, set GLOO_SOCKET_IFNAME to it";

// Loopback MASTER_ADDR: the whole job is on this host. Otherwise GLOO_SOCKET_IFNAME when set, else
// the source address of this host's route to MASTER_ADDR (never the hostname's address, often a
// loopback one).
GlooDeviceChoice choose_gloo_device(const std::string& master_addr) {
  if (is_loopback_address(master_addr)) {
    const LocalRoute lo{.address = "127.0.0.1", .interface = interface_holding("127.0.0.1")};
    return {.hostname = lo.address,
            .described = "local address " + lo.describe() + ", as MASTER_ADDR is loopback"};
  }
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifname != nullptr && *ifname != '\0')
    return {.interface = ifname,
            .described = std::string("interface ") + ifname + " (GLOO_SOCKET_IFNAME)"};
  const LocalRoute route = local_route_to(master_addr);
  return {.hostname = route.address,
          .described = "local address " + route.describe() + ", its route to MASTER_ADDR"};
}

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

at::ScalarType scalar_type(DType d) { return d == DType::f32 ? at::kFloat : at::kDouble; }

// A fresh tensor owning a copy of the buffer (Note [owned tensors]).
at::Tensor owned_copy(ConstBuffer b) {
  at::Tensor t = at::empty({b.count}, at::TensorOptions().dtype(scalar_type(b.dtype)));
  if (b.count > 0) std::memcpy(t.data_ptr(), b.data, std::size_t(b.size_bytes()));
  return t;
}

at::Tensor owned_empty(std::int64_t count, DType d) {
  return at::empty({count}, at::TensorOptions().dtype(scalar_type(d)));
}

void copy_out(const at::Tensor& t, Buffer b) {
  if (b.count > 0) std::memcpy(b.data, t.data_ptr(), std::size_t(b.size_bytes()));
}

void require_same_dtype(DType a, DType b, const char* op) {
  if (a != b)
    throw InvalidInput(std::string(op) + ": input dtype " + std::string(to_string(a)) +
                       " vs output dtype " + std::string(to_string(b)) + ": must match");
}

DType dtype_of_tensor(const at::Tensor& t, const char* op) {
  if (!t.defined()) throw InvalidInput(std::string(op) + ": undefined tensor");
  if (!t.device().is_cpu())
    throw InvalidInput(std::string(op) + ": tensor on " + t.device().str() +
                       ": the Gloo engine needs CPU tensors");
  if (t.scalar_type() == at::kFloat) return DType::f32;
  if (t.scalar_type() == at::kDouble) return DType::f64;
  throw InvalidInput(std::string(op) + ": tensor dtype " + std::string(c10::toString(t.scalar_type())) +
                     ": must be float32 or float64");
}

}  // namespace

std::string_view to_string(DType d) { return d == DType::f32 ? "float32" : "float64"; }

ShardSpan chunk_range(std::int64_t count, int ranks, int index) {
  TALLY_INVARIANT(count >= 0 && ranks >= 1 && index >= 0 && index < ranks);
  return shard_span(count, ranks, index);  // core's one sharding rule
}

bool CommError::timed_out() const { return mentions_timeout(what()); }

void CommOptions::validate() const {
  if (!(timeout_s > 0 && timeout_s <= 86400))
    throw InvalidInput("timeout_s = " + std::to_string(timeout_s) + ": must be in (0, 86400] s");
}

struct Comm::Impl {
  DistEnv env;
  CommOptions options;
  std::chrono::milliseconds timeout{0};
  c10::intrusive_ptr<c10d::Store> store;  // the TCPStore, or a sub-group's PrefixStore over it
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;  // declared after store: destroyed first
  CommCounters counters;
  std::string failure;  // the first CommError's message; non-empty = unusable

  int k() const { return env.world_size; }

  // `hint`, when given, ends the message: "…; this rank uses local address …".
  [[noreturn]] void fail(const std::string& op, int peer, const std::string& what_failed,
                         const std::string& detail, const std::string& hint = "") {
    std::string reason = mentions_timeout(detail) ? "timed out after " + seconds_str(options.timeout_s)
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
      fail(op, peer, what_failed, current_error());
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
    const TimedInto timed(counters[Collective::broadcast]);
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
    const TimedInto timed(counters[Collective::all_gather]);
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
    const TimedInto timed(counters[Collective::all_to_all]);
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
      fail("send", dst, what, current_error());
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
      fail("recv", src, what, current_error());
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

PendingCollective::State Comm::Impl::start_all_reduce(const at::Tensor& t, ReduceOp op) {
  const TimedInto timed(counters[Collective::all_reduce]);
  check_usable("all-reduce", -1);
  const double size_bytes = double(t.nbytes());
  PendingCollective::State s;
  s.impl = this;
  s.reduced = t;
  s.op = op;
  s.what = describe("all-reduce", size_bytes);
  if (t.numel() > 0 && k() > 1) {  // k = 1: the identity (comm.hpp)
    std::vector<at::Tensor> tensors{t};
    c10d::AllreduceOptions opts;
    opts.timeout = timeout;
    try {
      s.work = group->allreduce(tensors, opts);
    } catch (...) {
      fail("all-reduce", -1, s.what, current_error());
    }
  }
  count(Collective::all_reduce, size_bytes);
  return s;
}

void Comm::Impl::all_reduce(at::Tensor& t, ReduceOp op) {
  PendingCollective::State pending = start_all_reduce(t, op);
  finish(pending);
}

// Note [non-blocking send]: Gloo's TCP transport ships a message only once the receiver has
// posted its buffer, so a blocking send waits for the peer's recv. A pipeline stage in 1F1B's
// steady state both sends (its output onward) and receives (a gradient back); if two neighbours
// each block in a send to the other, neither reaches its recv. Posting the send and waiting for
// it later (PendingCollective::wait) leaves the rank free to run its recv meanwhile, as Megatron's
// batched isend / irecv does.
PendingCollective::State Comm::Impl::start_send(const at::Tensor& t, int dst, int tag) {
  const TimedInto timed(counters[Collective::send_recv]);
  check_peer(dst, "dst_rank", "send");
  check_tag(tag, "send");
  if (dst == env.rank) throw InvalidInput("send: dst_rank = " + std::to_string(dst) + ": is this rank");
  check_usable("send", dst);
  PendingCollective::State s;
  s.impl = this;
  s.reduced = t;
  s.kind = Collective::send_recv;
  s.op_name = "send";
  s.peer = dst;
  s.what = "send of " + std::to_string(t.nbytes()) + " bytes to rank " + std::to_string(dst) +
           " (tag " + std::to_string(tag) + ")";
  if (t.numel() > 0) {
    std::vector<at::Tensor> tensors{t};
    try {
      s.work = group->send(tensors, dst, tag);
    } catch (...) {
      fail("send", dst, s.what, current_error());
    }
  }
  count(Collective::send_recv, double(t.nbytes()));
  return s;
}

void Comm::Impl::finish(PendingCollective::State& s) {
  if (s.waited) return;
  const TimedInto timed(counters[s.kind]);
  if (s.work) {
    check_usable(s.op_name, s.peer);
    wait(s.work, s.op_name, s.peer, s.what);
    s.work.reset();
  }
  if (s.kind != Collective::all_reduce) {
    s.waited = true;
    return;
  }
  if (s.op == ReduceOp::average && s.reduced.numel() > 0 && k() > 1) s.reduced.div_(k());
  if (s.target.defined()) s.target.copy_(s.reduced);
  if (s.out.data != nullptr) copy_out(s.reduced, s.out);
  s.waited = true;
}

PendingCollective::PendingCollective() = default;
PendingCollective::PendingCollective(std::unique_ptr<State> state) : state_(std::move(state)) {}
PendingCollective::PendingCollective(PendingCollective&&) noexcept = default;
PendingCollective& PendingCollective::operator=(PendingCollective&&) noexcept = default;
PendingCollective::~PendingCollective() = default;

void PendingCollective::wait() {
  if (state_) state_->impl->finish(*state_);
}

bool PendingCollective::waited() const { return !state_ || state_->waited; }

bool PendingCollective::done() const {
  return !state_ || state_->waited || !state_->work || state_->work->isCompleted();
}

namespace {

// The ring's link: receive posted before the send (Gloo's TCP transport only ships a message once
// the receiver has posted a buffer, so send-then-receive around a ring would deadlock), both on
// owned tensors, both waited with the timeout.
class GlooRingTransport final : public detail::RingTransport {
 public:
  GlooRingTransport(Comm::Impl& impl, std::string op, CollectiveCounter* measured)
      : impl_(impl), op_(std::move(op)), measured_(measured) {}

  ConstBuffer exchange(ConstBuffer send, int dst_rank, std::int64_t recv_count,
                       int src_rank) override {
    auto& group = *impl_.group;
    std::vector<at::Tensor> in{owned_empty(recv_count, send.dtype)};
    std::vector<at::Tensor> out{owned_copy(send)};
    c10::intrusive_ptr<c10d::Work> recv_work, send_work;
    const std::string recv_what = op_ + ": ring recv of " +
                                  std::to_string(double(in[0].nbytes())) + " bytes from rank " +
                                  std::to_string(src_rank);
    const std::string send_what = op_ + ": ring send of " + std::to_string(send.size_bytes()) +
                                  " bytes to rank " + std::to_string(dst_rank);
    try {
      if (recv_count > 0) recv_work = group.recv(in, src_rank, kRingTag);
    } catch (...) {
      impl_.fail(op_, src_rank, recv_what, current_error());
    }
    try {
      if (send.count > 0) send_work = group.send(out, dst_rank, kRingTag);
    } catch (...) {
      impl_.fail(op_, dst_rank, send_what, current_error());
    }
    if (send_work) impl_.wait(send_work, op_, dst_rank, send_what);
    if (recv_work) impl_.wait(recv_work, op_, src_rank, recv_what);
    if (measured_ != nullptr) measured_->bytes_sent += send.size_bytes();
    received_ = in[0];  // owned (Note [owned tensors]); the ring reads it before the next exchange
    return ConstBuffer(received_.data_ptr(), recv_count, send.dtype);
  }

 private:
  Comm::Impl& impl_;
  std::string op_;
  CollectiveCounter* measured_;
  at::Tensor received_;
};

}  // namespace

// ---- Comm ----

Comm::Comm(const DistEnv& env, const CommOptions& options) : impl_(std::make_unique<Impl>()) {
  env.validate();
  options.validate();
  Impl& m = *impl_;
  m.env = env;
  m.options = options;
  m.timeout = std::chrono::milliseconds(std::int64_t(options.timeout_s * 1000.0 + 0.5));
  // A peer that dies leaves sockets whose writes raise SIGPIPE, which would kill this rank
  // instead of reporting a CommError. Python ignores SIGPIPE at startup; so do we, once.
  struct sigaction current{};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL)
    signal(SIGPIPE, SIG_IGN);

  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  GlooDeviceChoice device;
  try {
    device = choose_gloo_device(env.master_addr);
  } catch (...) {
    m.failure = "rank " + std::to_string(env.rank) + ": rendezvous via " + where +
                " failed: " + current_error() + kSetIfname;
    throw CommError("rendezvous", -1, m.failure);
  }
  try {
    c10d::TCPStoreOptions store_opts;
    store_opts.port = std::uint16_t(env.master_port);
    store_opts.isServer = env.rank == 0;
    store_opts.numWorkers = std::size_t(env.world_size);
    store_opts.waitWorkers = false;  // the process group's rendezvous below waits for everyone
    store_opts.timeout = m.timeout;
    m.store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_opts);
  } catch (...) {
    const std::string what = env.rank == 0 ? "serving the TCPStore on " + where
                                           : "reaching rank 0's TCPStore at " + where;
    m.fail("rendezvous", env.rank == 0 ? -1 : 0, what, current_error(),
           "this rank uses " + device.described);
  }
  try {
    auto pg_opts = c10d::ProcessGroupGloo::Options::create(m.timeout);
    pg_opts->devices.push_back(device.make());
    m.group = c10::make_intrusive<c10d::ProcessGroupGloo>(m.store, env.rank, env.world_size,
                                                         pg_opts);
  } catch (...) {
    m.fail("rendezvous", -1,
           "Gloo rendezvous of " + std::to_string(env.world_size) + " ranks via " + where,
           current_error(), "this rank uses " + device.described + kSetIfname);
  }
}

Comm::Comm(Comm& parent, std::span<const int> ranks, const std::string& name)
    : impl_(std::make_unique<Impl>()) {
  const Impl& p = *parent.impl_;
  const auto me = std::find(ranks.begin(), ranks.end(), p.env.rank);
  if (ranks.empty() || me == ranks.end())
    throw InvalidInput("process group " + name + ": rank " + std::to_string(p.env.rank) +
                       " is not among its ranks");
  for (const int r : ranks) p.check_peer(r, "group rank", "process group");
  p.check_usable("rendezvous", -1);
  Impl& m = *impl_;
  m.env = p.env;
  m.env.rank = int(me - ranks.begin());
  m.env.world_size = int(ranks.size());
  m.options = p.options;
  m.timeout = p.timeout;
  m.store = c10::make_intrusive<c10d::PrefixStore>(name + "/", p.store);
  const GlooDeviceChoice device = choose_gloo_device(p.env.master_addr);
  try {
    auto pg_opts = c10d::ProcessGroupGloo::Options::create(m.timeout);
    pg_opts->devices.push_back(device.make());
    m.group = c10::make_intrusive<c10d::ProcessGroupGloo>(m.store, m.env.rank, m.env.world_size,
                                                         pg_opts);
  } catch (...) {
    m.fail("rendezvous", -1,
           "Gloo rendezvous of process group " + name + " (" + std::to_string(ranks.size()) +
               " ranks)",
           current_error(), "this rank uses " + device.described);
  }
}

Comm::~Comm() = default;

int Comm::rank() const { return impl_->env.rank; }
int Comm::world_size() const { return impl_->env.world_size; }
double Comm::timeout_s() const { return impl_->options.timeout_s; }
const CommCounters& Comm::counters() const { return impl_->counters; }
void Comm::reset_counters() { impl_->counters = CommCounters{}; }

void Comm::all_reduce(Buffer data, ReduceOp op) {
  if (impl_->identity_at_one_rank(Collective::all_reduce, "all-reduce", data.size_bytes())) return;
  at::Tensor t = owned_copy(data);
  impl_->all_reduce(t, op);
  copy_out(t, data);
}

PendingCollective Comm::all_reduce_async(Buffer data, ReduceOp op) {
  if (impl_->identity_at_one_rank(Collective::all_reduce, "all-reduce", data.size_bytes()))
    return PendingCollective();  // nothing in flight: wait() returns at once
  auto state =
      std::make_unique<PendingCollective::State>(impl_->start_all_reduce(owned_copy(data), op));
  state->out = data;
  return PendingCollective(std::move(state));
}

void Comm::reduce_scatter(ConstBuffer input, Buffer output, ReduceOp op) {
  require_same_dtype(input.dtype, output.dtype, "reduce-scatter");
  Impl& m = *impl_;
  const ShardSpan mine = chunk_range(input.count, m.k(), m.env.rank);
  if (output.count != mine.count)
    throw InvalidInput("reduce-scatter: output count " + std::to_string(output.count) + " vs " +
                       std::to_string(mine.count) + " expected (chunk " +
                       std::to_string(m.env.rank) + " of " + std::to_string(input.count) +
                       " elements over " + std::to_string(m.k()) + " ranks)");
  if (m.identity_at_one_rank(Collective::reduce_scatter, "reduce-scatter", input.size_bytes())) {
    if (output.count > 0 && output.data != input.data)  // the chunk is the whole input
      std::memcpy(output.data, input.data, std::size_t(output.size_bytes()));
    return;
  }
  at::Tensor scratch = owned_copy(input);  // the input stays as it was
  const Buffer own =
      reduce_scatter_in_place(Buffer(scratch.data_ptr(), input.count, input.dtype), op);
  if (output.count > 0) std::memcpy(output.data, own.data, std::size_t(output.size_bytes()));
}

Buffer Comm::reduce_scatter_in_place(Buffer data, ReduceOp op) {
  Impl& m = *impl_;
  const TimedInto timed(m.counters[Collective::reduce_scatter]);
  const ShardSpan mine = chunk_range(data.count, m.k(), m.env.rank);
  const Buffer own(static_cast<char*>(data.data) +
                       mine.offset * std::int64_t(dtype_size_bytes(data.dtype)),
                   mine.count, data.dtype);
  if (m.identity_at_one_rank(Collective::reduce_scatter, "reduce-scatter", data.size_bytes()))
    return own;
  m.check_usable("reduce-scatter", -1);
  // The ring works on the caller's memory directly, as ring_all_reduce does: every Gloo transfer
  // inside it uses owned tensors and completes (or fails) before exchange() returns.
  GlooRingTransport transport(m, "reduce-scatter", nullptr);
  detail::ring_reduce_scatter(data, op, m.env.rank, m.k(), transport);
  m.count(Collective::reduce_scatter, data.size_bytes());
  return own;
}

void Comm::all_gather(ConstBuffer input, Buffer output) {
  require_same_dtype(input.dtype, output.dtype, "all-gather");
  if (impl_->k() == 1) {  // the identity: no owned staging (Impl::all_gather checks and counts)
    at::Tensor in = at::from_blob(const_cast<void*>(input.data), {input.count},
                                  at::TensorOptions().dtype(scalar_type(input.dtype)));
    at::Tensor out = at::from_blob(output.data, {output.count},
                                   at::TensorOptions().dtype(scalar_type(output.dtype)));
    impl_->all_gather(in, out);
    return;
  }
  at::Tensor in = owned_copy(input);
  at::Tensor out = owned_empty(output.count, output.dtype);
  impl_->all_gather(in, out);
  copy_out(out, output);
}

void Comm::broadcast(Buffer data, int root_rank) {
  impl_->check_peer(root_rank, "root_rank", "broadcast");
  if (impl_->identity_at_one_rank(Collective::broadcast, "broadcast", data.size_bytes())) return;
  at::Tensor t = owned_copy(data);
  impl_->broadcast(t, root_rank);
  copy_out(t, data);
}

void Comm::all_to_all(ConstBuffer input, Buffer output, std::span<const std::int64_t> send_counts,
                      std::span<const std::int64_t> recv_counts) {
  require_same_dtype(input.dtype, output.dtype, "all-to-all");
  at::Tensor out = owned_empty(output.count, output.dtype);
  impl_->all_to_all(owned_copy(input), out, {send_counts.begin(), send_counts.end()},
                    {recv_counts.begin(), recv_counts.end()});
  copy_out(out, output);
}

void Comm::send(ConstBuffer data, int dst_rank, int tag) {
  impl_->checked_send(owned_copy(data), dst_rank, tag);
}

void Comm::recv(Buffer data, int src_rank, int tag) {
  at::Tensor t = owned_empty(data.count, data.dtype);
  impl_->checked_recv(t, src_rank, tag);
  copy_out(t, data);
}

void Comm::barrier() { impl_->barrier(); }

void Comm::ring_all_reduce(Buffer data, ReduceOp op) {
  Impl& m = *impl_;
  const TimedInto timed(m.counters.ring_all_reduce);
  m.check_usable("ring all-reduce", -1);
  // The ring works on the caller's memory directly: every Gloo transfer inside it uses owned
  // tensors and completes (or fails) before exchange() returns.
  GlooRingTransport transport(m, "ring all-reduce", &m.counters.ring_all_reduce);
  detail::ring_reduce_scatter(data, op, m.env.rank, m.k(), transport);
  detail::ring_all_gather(data, m.env.rank, m.k(), transport);
  m.counters.ring_all_reduce.calls += 1;
}

// ---- at::Tensor overloads (comm_torch.hpp) ----

namespace {

Buffer buffer_of(at::Tensor& t, DType d) { return Buffer(t.data_ptr(), t.numel(), d); }

// Runs fn on a contiguous version of t and copies the result back when that was a copy.
template <class Fn>
void in_place(at::Tensor& t, Fn&& fn) {
  at::Tensor c = t.contiguous();
  fn(c);
  if (!c.is_same(t)) t.copy_(c);
}

}  // namespace

void all_reduce(Comm& comm, at::Tensor& tensor, ReduceOp op) {
  dtype_of_tensor(tensor, "all-reduce");
  in_place(tensor, [&](at::Tensor& c) { comm.impl().all_reduce(c, op); });
}

PendingCollective all_reduce_async(Comm& comm, at::Tensor& tensor, ReduceOp op) {
  dtype_of_tensor(tensor, "all-reduce");
  const at::Tensor c = tensor.contiguous();
  auto state = std::make_unique<PendingCollective::State>(comm.impl().start_all_reduce(c, op));
  if (!c.is_same(tensor)) state->target = tensor;
  return PendingCollective(std::move(state));
}

void reduce_scatter(Comm& comm, const at::Tensor& input, at::Tensor& output, ReduceOp op) {
  const DType d = dtype_of_tensor(input, "reduce-scatter");
  require_same_dtype(d, dtype_of_tensor(output, "reduce-scatter"), "reduce-scatter");
  const at::Tensor in = input.contiguous();
  in_place(output, [&](at::Tensor& c) {
    comm.reduce_scatter(ConstBuffer(in.data_ptr(), in.numel(), d), buffer_of(c, d), op);
  });
}

at::Tensor reduce_scatter_in_place(Comm& comm, at::Tensor& data, ReduceOp op) {
  const DType d = dtype_of_tensor(data, "reduce-scatter");
  const at::Tensor c = data.contiguous().view({-1});  // data's memory when contiguous
  const Buffer own = comm.reduce_scatter_in_place(Buffer(c.data_ptr(), c.numel(), d), op);
  const std::int64_t offset =
      (static_cast<const char*>(own.data) - static_cast<const char*>(c.data_ptr())) /
      std::int64_t(dtype_size_bytes(d));
  return c.narrow(0, offset, own.count);
}

void all_gather(Comm& comm, const at::Tensor& input, at::Tensor& output) {
  const DType d = dtype_of_tensor(input, "all-gather");
  require_same_dtype(d, dtype_of_tensor(output, "all-gather"), "all-gather");
  const at::Tensor in = input.contiguous();
  in_place(output, [&](at::Tensor& c) { comm.impl().all_gather(in, c); });
}

void all_gather_in_place(Comm& comm, at::Tensor& data) {
  dtype_of_tensor(data, "all-gather");
  in_place(data, [&](at::Tensor& c) {
    at::Tensor flat = c.view({-1});
    const ShardSpan mine = chunk_range(flat.numel(), comm.world_size(), comm.rank());
    comm.impl().all_gather(flat.narrow(0, mine.offset, mine.count), flat);
  });
}

void broadcast(Comm& comm, at::Tensor& tensor, int root_rank) {
  dtype_of_tensor(tensor, "broadcast");
  in_place(tensor, [&](at::Tensor& c) { comm.impl().broadcast(c, root_rank); });
}

void all_to_all(Comm& comm, const at::Tensor& input, at::Tensor& output) {
  const DType d = dtype_of_tensor(input, "all-to-all");
  require_same_dtype(d, dtype_of_tensor(output, "all-to-all"), "all-to-all");
  const at::Tensor in = input.contiguous().view({-1});
  if (output.is_contiguous() && !output.storage().is_alias_of(in.storage())) {
    at::Tensor flat = output.view({-1});
    comm.impl().all_to_all(in, flat, {}, {});
    return;
  }
  at::Tensor flat = at::empty({output.numel()}, output.options());
  comm.impl().all_to_all(in, flat, {}, {});
  output.copy_(flat.view(output.sizes()));
}

void send(Comm& comm, const at::Tensor& tensor, int dst_rank, int tag) {
  dtype_of_tensor(tensor, "send");
  comm.impl().checked_send(tensor.contiguous(), dst_rank, tag);
}

PendingCollective send_async(Comm& comm, const at::Tensor& tensor, int dst_rank, int tag) {
  dtype_of_tensor(tensor, "send");
  return PendingCollective(std::make_unique<PendingCollective::State>(
      comm.impl().start_send(tensor.contiguous(), dst_rank, tag)));
}

void recv(Comm& comm, at::Tensor& tensor, int src_rank, int tag) {
  dtype_of_tensor(tensor, "recv");
  in_place(tensor, [&](at::Tensor& c) { comm.impl().checked_recv(c, src_rank, tag); });
}

void ring_all_reduce(Comm& comm, at::Tensor& tensor, ReduceOp op) {
  const DType d = dtype_of_tensor(tensor, "ring all-reduce");
  in_place(tensor, [&](at::Tensor& c) { comm.ring_all_reduce(buffer_of(c, d), op); });
}

}  // namespace tally::engine
