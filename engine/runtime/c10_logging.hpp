// c10's own log lines (glog), quieted once per process: Note [c10's log lines] in c10_logging.cpp.
#pragma once

namespace tally::engine {

// Raises glog's minimum level to FATAL unless GLOG_minloglevel is set in the environment (which
// then decides, for whoever wants c10d's lines back). Idempotent.
void quiet_c10_logging();

}  // namespace tally::engine
