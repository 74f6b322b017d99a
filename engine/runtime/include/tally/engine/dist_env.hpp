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
#include <utility>

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

// The first of `count` consecutive TCP ports of this host that were free a moment ago, drawn at
// random outside the kernel's ephemeral range, so that no outgoing connection's local port and no
// other bind(0) can take them before their servers bind (Note [free ports] in dist_env.cpp).
// Still racy against a process that binds fixed ports, as torchrun's own choice of a free port;
// callers that can should let the server bind port 0 itself. `count` in [1, kMaxFreePorts].
inline constexpr int kMaxFreePorts = 16;
int find_free_port(int count = 1);

// The kernel's ephemeral port range [lo, hi] (/proc/sys/net/ipv4/ip_local_port_range), the one
// find_free_port avoids.
std::pair<int, int> ephemeral_port_range();

// Returns once something accepts a TCP connection at host:port (any of its addresses), dialling
// every 10 ms; throws std::runtime_error ("nothing accepted a connection at host:port within the
// timeout of … s") after timeout_s. Call it before a c10d TCPStore client, whose own retries wait a
// second each (Note [prompt connect] in dist_env.cpp). An unresolvable host returns at once: the
// store's connect then says why.
void await_listener(const std::string& host, int port, double timeout_s);

}  // namespace tally::engine
