// The launchers' store (launcher_group.hpp, Note [launchers' store]): c10d's TCPStore, driven by
// one background thread per launcher.
#include "launcher_group.hpp"

#include <unistd.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "c10_logging.hpp"
#include "tally/engine/dist_env.hpp"
#include "tally/engine/local_route.hpp"

namespace tally::engine {

namespace {

constexpr double kPoll_s = 0.1;  // how often a launcher reads the others' keys: bounds how late it
                                 // hears of a failure elsewhere (plus the kill grace)
constexpr double kStoreCall_s = 10;  // each store call once connected (a silent network)

std::vector<std::uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<std::uint8_t>& b) { return {b.begin(), b.end()}; }

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

// "node 1 (host h, 10.77.0.2)": the address is this host's route towards node 0.
std::string describe_self(const LauncherGroupOptions& o) {
  std::string where = "host " + host_name();
  try {
    where += ", " + local_route_to(o.master_addr).address;
  } catch (const std::exception&) {
    // no route: the host name alone
  }
  return "node " + std::to_string(o.node_rank) + " (" + where + ")";
}

std::string current_store_error() {
  try {
    throw;
  } catch (const std::exception& e) {
    const std::string what = e.what();
    return what.substr(0, what.find('\n'));  // c10d appends a C++ stack trace
  } catch (...) {
    return "unknown error";
  }
}

}  // namespace

std::string node_list(const std::vector<int>& nodes) {
  std::string s;
  for (int n : nodes) s += (s.empty() ? "" : ", ") + std::to_string(n);
  return s;
}

struct LauncherGroup::Impl {
  LauncherGroupOptions o;
  std::string self;
  mutable std::mutex mu;
  std::condition_variable wake;
  LauncherGroupState st;
  // Requests from the launcher loop, carried out by the thread.
  std::optional<std::string> post_failure;
  std::optional<bool> post_done;
  bool post_leave = false, stop = false;
  std::vector<bool> arrived, finished, left;
  bool all_left = false;

  std::string where() const { return "launchers' store at " + o.master_addr + ":" + std::to_string(o.port); }

  void run();
  void poll(c10d::TCPStore& store);
};

void LauncherGroup::Impl::run() {
  c10::intrusive_ptr<c10d::TCPStore> store;
  try {
    c10d::TCPStoreOptions so;
    so.port = std::uint16_t(o.port);
    so.isServer = o.node_rank == 0;
    so.waitWorkers = false;
    so.timeout = std::chrono::milliseconds(std::int64_t(o.join_timeout_s * 1000));
    if (!so.isServer) await_listener(o.master_addr, o.port, o.join_timeout_s);
    store = c10::make_intrusive<c10d::TCPStore>(o.master_addr, so);
    store->set("node/" + std::to_string(o.node_rank), bytes(self));
  } catch (...) {
    std::lock_guard lock(mu);
    st.store_lost = true;
    st.store_error = (o.node_rank == 0 ? "serving the " : "reaching node 0's ") + where() +
                     " failed: " + current_store_error();
    return;
  }
  try {
    store->setTimeout(std::chrono::milliseconds(std::int64_t(kStoreCall_s * 1000)));
    {
      std::lock_guard lock(mu);
      st.connected = true;
    }
    for (;;) {
      poll(*store);
      std::unique_lock lock(mu);
      const bool posted = post_failure || post_done || post_leave;
      if (stop && !posted) return;  // what was posted before stop is written first
      if (!posted) wake.wait_for(lock, std::chrono::duration<double>(kPoll_s));
    }
  } catch (...) {
    std::lock_guard lock(mu);
    st.store_lost = true;
    st.store_error = "the " + where() + " failed: " + current_store_error();
  }
}

// One round: write what the launcher posted, then read the others' keys.
void LauncherGroup::Impl::poll(c10d::TCPStore& store) {
  std::optional<std::string> failure;
  std::optional<bool> done;
  bool leave = false;
  {
    std::lock_guard lock(mu);
    std::swap(failure, post_failure);
    std::swap(done, post_done);
    std::swap(leave, post_leave);
  }
  if (failure && store.add("failures", 1) == 1) store.set("failed", bytes(*failure));
  if (done) store.set("done/" + std::to_string(o.node_rank), bytes(*done ? "ok" : "failed"));
  if (leave) store.set("left/" + std::to_string(o.node_rank), bytes("left"));

  std::optional<std::string> failed;
  if (store.check({"failed"})) failed = text(store.get("failed"));
  const auto seen = [&](const std::string& stem, std::vector<bool>& flags) {
    std::vector<int> missing;
    for (int n = 0; n < o.nnodes; ++n) {
      if (!flags[std::size_t(n)]) flags[std::size_t(n)] = store.check({stem + std::to_string(n)});
      if (!flags[std::size_t(n)]) missing.push_back(n);
    }
    return missing;
  };
  const std::vector<int> missing = seen("node/", arrived);
  const std::vector<int> unfinished = seen("done/", finished);
  bool everyone_left = true;  // of those who arrived: a node never seen will not leave either
  for (int n : seen("left/", left)) everyone_left = everyone_left && !arrived[std::size_t(n)];
  std::lock_guard lock(mu);
  if (failed) st.failure = failed;
  st.missing_nodes = missing;
  st.unfinished_nodes = unfinished;
  all_left = everyone_left;
}

LauncherGroup::LauncherGroup(const LauncherGroupOptions& options)
    : impl_(std::make_shared<Impl>()) {
  Impl& m = *impl_;
  m.o = options;
  m.self = describe_self(options);
  quiet_c10_logging();  // Note [c10's log lines]
  for (auto* v : {&m.arrived, &m.finished, &m.left}) v->assign(std::size_t(options.nnodes), false);
  for (int n = 0; n < options.nnodes; ++n) {
    if (n != options.node_rank) m.st.missing_nodes.push_back(n);
    m.st.unfinished_nodes.push_back(n);
  }
  thread_ = std::thread([impl = impl_] { impl->run(); });
}

LauncherGroup::~LauncherGroup() {
  bool connected = false;
  {
    std::lock_guard lock(impl_->mu);
    impl_->stop = true;
    connected = impl_->st.connected && !impl_->st.store_lost;
  }
  impl_->wake.notify_all();
  // Once connected the thread ends within one store call (kStoreCall_s at most). Still connecting,
  // it may sit in c10d's connect retries for up to join_timeout_s: it is left to finish on its
  // own (it holds its own reference to Impl).
  if (connected)
    thread_.join();
  else
    thread_.detach();
}

const std::string& LauncherGroup::self() const { return impl_->self; }

LauncherGroupState LauncherGroup::state() const {
  std::lock_guard lock(impl_->mu);
  return impl_->st;
}

void LauncherGroup::report_failure(const std::string& description) {
  {
    std::lock_guard lock(impl_->mu);
    impl_->post_failure = description;
  }
  impl_->wake.notify_all();
}

void LauncherGroup::report_done(bool ok) {
  {
    std::lock_guard lock(impl_->mu);
    impl_->post_done = ok;
  }
  impl_->wake.notify_all();
}

void LauncherGroup::leave(double linger_s) {
  {
    std::lock_guard lock(impl_->mu);
    impl_->post_leave = true;
  }
  impl_->wake.notify_all();
  if (impl_->o.node_rank != 0) return;
  // Node 0 serves the store: the others may still be reading `failed` or done/<i>.
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(linger_s);
  while (std::chrono::steady_clock::now() < until) {
    {
      std::lock_guard lock(impl_->mu);
      if (impl_->all_left || impl_->st.store_lost) return;
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(kPoll_s / 2));
  }
}

}  // namespace tally::engine
