// SIGTERM as a flag (term_signal.hpp).
#include "term_signal.hpp"

#include <csignal>

namespace tally::engine {

namespace {
volatile std::sig_atomic_t g_term_requested = 0;
extern "C" void on_sigterm(int) { g_term_requested = 1; }
}  // namespace

TermSignalFlag::TermSignalFlag() {
  g_term_requested = 0;
  struct sigaction sa{};
  sa.sa_handler = on_sigterm;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, &previous_);
}

TermSignalFlag::~TermSignalFlag() { sigaction(SIGTERM, &previous_, nullptr); }

bool TermSignalFlag::requested() const { return g_term_requested != 0; }

}  // namespace tally::engine
