// Comm over c10d: TCPStore rendezvous + ProcessGroupGloo (PyTorch 1.13): the helpers, the
// rendezvous, the Buffer API, asynchronous collectives and the ring's transport. Comm::Impl (the
// operations on owned tensors) is in comm_impl.hpp; comm_torch.hpp's at::Tensor overloads are in
// comm_torch.cpp.
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
#include <cstdio>
#include <cstring>
#include <sstream>
#include <thread>
#include <utility>

#include "c10_logging.hpp"
#include "comm_impl.hpp"
#include "comm_p2p.hpp"
#include "ring.hpp"
#include "tally/core/sharding.hpp"
#include "tally/core/types.hpp"
#include "tally/engine/local_route.hpp"

namespace tally::engine {

namespace {

std::string first_line(std::string s) {
  if (auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
  return s;
}

}  // namespace

namespace detail {

std::string seconds_str(double s) {
  std::ostringstream os;
  os << s << " s";
  return os.str();
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

}  // namespace detail

using detail::current_error;
using detail::mentions_timeout;
using detail::require_same_dtype;
using detail::TimedInto;

namespace {

constexpr int kRingTag = Comm::kMaxUserTag;  // tally's own ring exchanges


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
  const detail::SpanScope span(*this);
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
  quiet_c10_logging();  // Note [c10's log lines]

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
    if (env.rank != 0) await_listener(env.master_addr, env.master_port, options.timeout_s);
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

// Note [arrival wait]
// A collective cannot finish on any rank before the last rank has entered it, so the time a rank
// spends inside one is two things: waiting for the slowest rank to arrive (the ranks' compute
// before the call differs: jitter, uneven work, a slower core) and the collective itself. The
// α–β model prices only the second; a step pays both. With spans recorded on every rank, the
// split is exact on one host: entry times on one monotonic clock, no barrier added to the step.
void Comm::record_spans(bool on) { impl_->recording_spans = on; }

std::vector<CallSpan> Comm::take_spans() { return std::exchange(impl_->spans, {}); }

bool Comm::on_one_host() const { return is_loopback_address(impl_->env.master_addr); }

std::vector<ArrivalSplit> arrival_splits(Comm& comm, std::span<const CallSpan> mine) {
  const std::size_t n = mine.size(), k = std::size_t(comm.world_size());
  std::vector<double> flat;
  flat.reserve(2 * n);
  for (const CallSpan& c : mine) flat.insert(flat.end(), {c.enter_s, c.exit_s});
  std::vector<double> all(2 * n * k);
  comm.all_gather(ConstBuffer(flat), Buffer(all));
  std::vector<ArrivalSplit> out;
  out.reserve(n);
  std::vector<CallSpan> same(k);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t q = 0; q < k; ++q)
      same[q] = {.enter_s = all[q * 2 * n + 2 * i], .exit_s = all[q * 2 * n + 2 * i + 1]};
    out.push_back(arrival_split(same, comm.rank()));
  }
  return out;
}

std::vector<double> arrival_waits(Comm& comm, const std::vector<std::vector<CallSpan>>& spans) {
  std::vector<CallSpan> mine;
  for (const auto& step : spans) mine.insert(mine.end(), step.begin(), step.end());
  const std::vector<ArrivalSplit> split = arrival_splits(comm, mine);
  std::vector<double> waits;
  std::size_t call = 0;
  for (const auto& step : spans) {
    double wait = 0;
    for (std::size_t j = 0; j < step.size(); ++j) wait += split[call++].wait_s;
    waits.push_back(wait);
  }
  return waits;
}

std::optional<double> thread_runqueue_wait_s() {
  std::FILE* f = std::fopen("/proc/thread-self/schedstat", "r");
  if (f == nullptr) return std::nullopt;
  unsigned long long on_cpu_ns = 0, waiting_ns = 0;
  const int read = std::fscanf(f, "%llu %llu", &on_cpu_ns, &waiting_ns);
  std::fclose(f);
  if (read != 2) return std::nullopt;
  return double(waiting_ns) * 1e-9;
}

double runqueue_wait_in(std::span<const CallSpan> spans) {
  double s = 0;
  for (const CallSpan& c : spans) s += c.runqueue_wait_s;
  return s;
}

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

ArrivalSplit arrival_split(std::span<const CallSpan> same_call, int rank) {
  if (same_call.empty() || rank < 0 || rank >= int(same_call.size()))
    throw InvalidInput("arrival_split: rank = " + std::to_string(rank) + " vs " +
                       std::to_string(same_call.size()) + " spans: must be in [0, " +
                       std::to_string(same_call.size()) + ")");
  double last = same_call[0].enter_s;
  for (const CallSpan& c : same_call) last = std::max(last, c.enter_s);
  const CallSpan& mine = same_call[std::size_t(rank)];
  return {.wait_s = std::max(0.0, last - mine.enter_s),
          .rest_s = std::max(0.0, mine.exit_s - last)};
}

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
  const detail::SpanScope span(m);
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
  const detail::SpanScope span(m);
  const TimedInto timed(m.counters.ring_all_reduce);
  m.check_usable("ring all-reduce", -1);
  // The ring works on the caller's memory directly: every Gloo transfer inside it uses owned
  // tensors and completes (or fails) before exchange() returns.
  GlooRingTransport transport(m, "ring all-reduce", &m.counters.ring_all_reduce);
  detail::ring_reduce_scatter(data, op, m.env.rank, m.k(), transport);
  detail::ring_all_gather(data, m.env.rank, m.k(), transport);
  m.counters.ring_all_reduce.calls += 1;
}

}  // namespace tally::engine
