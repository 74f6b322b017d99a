// Where a rank is in the job: torchrun's environment contract (DESIGN.md §3), so `tally launch`,
// `torchrun`, `srun` wrappers or a shell loop can all start tally ranks.
//
//   RANK         global rank r, 0 <= r < WORLD_SIZE
//   WORLD_SIZE   k, ranks in the job
//   LOCAL_RANK   rank within this host, 0 <= LOCAL_RANK < WORLD_SIZE
//   MASTER_ADDR  host of rank 0, which serves the c10d TCPStore rendezvous
//   MASTER_PORT  TCP port of that store, 1..65535
#pragma once

#include <string>

namespace tally::engine {

inline constexpr int kMaxWorldSize = 4096;

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;

  // Throws tally::InvalidInput naming the field and both values, e.g.
  // "RANK = 3 vs WORLD_SIZE = 2: RANK must be in [0, WORLD_SIZE)".
  void validate() const;

  // Reads the five variables above from the process environment and validates them. Throws
  // tally::InvalidInput when one is missing ("RANK is not set: start ranks with `tally launch`
  // or torchrun") or is not an integer in range.
  static DistEnv from_environment();
};

// True for 127.0.0.0/8, "localhost" and "::1": the whole job then runs on this host's loopback.
bool is_loopback_address(const std::string& host);

// A TCP port on 127.0.0.1 that was free a moment ago: bind port 0, read the kernel's choice, close.
// Racy by nature (as torchrun's own choice of a free port); callers that can should let the
// server bind port 0 itself.
int find_free_port();

}  // namespace tally::engine
