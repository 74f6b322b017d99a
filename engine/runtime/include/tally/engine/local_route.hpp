// Which local address this host uses to reach rank 0's host: the address the Gloo device is made
// for (comm.cpp). No torch here, so it is tested on its own (tests/engine/test_local_route.cpp).
//
// Note [the address peers dial]
// Gloo's TCP transport binds one local address, publishes it in the TCPStore, and every peer dials
// what was published. Made from the hostname (Gloo's createDefaultDevice), that address is whatever
// the hostname resolves to: 127.0.x.1 in most containers, so a peer on another host dials its own
// loopback and is refused (the classic PyTorch Gloo failure). The kernel knows better: connect() a
// UDP socket to MASTER_ADDR (a datagram socket's connect sends nothing; it only picks the route)
// and getsockname() is the source address of the route to rank 0's host. On rank 0's own host that
// is MASTER_ADDR itself. Where the other hosts reach this one by another address (NAT, several
// networks with rank 0 on only one of them), GLOO_SOCKET_IFNAME names the interface instead.
#pragma once

#include <string>

namespace tally::engine {

struct LocalRoute {
  std::string address;    // numeric: "10.77.0.2", "fd00::2"
  std::string interface;  // the interface holding it, "eth0"; empty when getifaddrs finds none
  // "10.77.0.2 (interface eth0)", or "10.77.0.2 (no interface holds it)"
  std::string describe() const;
};

// The local address the kernel would send from to reach `host` (a name or an IP literal), and its
// interface. Never a loopback address unless `host` is one of this host's loopback addresses.
// Throws std::runtime_error naming the host when it does not resolve or no route reaches it,
// e.g. "no route from this host to 192.0.2.1 (connect: Network is unreachable)".
LocalRoute local_route_to(const std::string& host);

// The name of the interface holding the numeric `address` (getifaddrs), or "" when none does.
std::string interface_holding(const std::string& address);

}  // namespace tally::engine
