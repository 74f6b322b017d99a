// SIGTERM as a flag (internal, torch-free): finish reporting, then stop.
//
// `tally launch` SIGTERMs the surviving ranks as soon as one dies. A survivor is then usually
// blocked in a collective whose CommError arrives within milliseconds (the dead peer's sockets
// closed); dying on SIGTERM would lose the report naming the lost rank. So SIGTERM only sets a
// flag, checked between steps; the launcher's SIGKILL after its grace period still bounds it.
#pragma once

#include <signal.h>

namespace tally::engine {

// While it lives, SIGTERM sets a flag instead of ending the process; the previous handler is
// restored when it dies. One at a time.
class TermSignalFlag {
 public:
  TermSignalFlag();
  ~TermSignalFlag();
  TermSignalFlag(const TermSignalFlag&) = delete;
  TermSignalFlag& operator=(const TermSignalFlag&) = delete;
  bool requested() const;

 private:
  struct sigaction previous_{};
};

}  // namespace tally::engine
