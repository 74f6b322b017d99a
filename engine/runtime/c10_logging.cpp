// Note [c10's log lines]. c10d writes its own lines to stderr through glog when a store cannot
// bind or connect ("WARNING: Logging before InitGoogleLogging() is written to STDERR", then
// "W… socket.cpp:426] [c10d] The server socket has failed to bind to [::]:40599 (errno: 98 -
// Address already in use)." and two more), before the one line tally writes for the same failure,
// which carries c10d's words (`--master-port` on a taken port printed four such lines above tally's
// error). Every failure tally reports is one line of its own, so the engine's processes keep glog
// to FATAL — c10d's fatal errors still abort with theirs — unless the user set GLOG_minloglevel,
// which glog reads when it loads.
#include "c10_logging.hpp"

#include <c10/util/Logging.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

namespace tally::engine {

void quiet_c10_logging() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("GLOG_minloglevel") == nullptr)
      FLAGS_minloglevel = std::max(FLAGS_minloglevel, int(google::GLOG_FATAL));
  });
}

}  // namespace tally::engine
