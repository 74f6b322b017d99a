// local_route_to: Note [the address peers dial] (local_route.hpp).
#include "tally/engine/local_route.hpp"

#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <stdexcept>

namespace tally::engine {

namespace {

// The numeric form of a socket address, without its port: "10.77.0.2", "fd00::2".
std::string numeric_host(const sockaddr* addr, socklen_t len) {
  char host[NI_MAXHOST];
  if (getnameinfo(addr, len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0) return "";
  return host;
}

socklen_t length_of(const sockaddr* addr) {
  return addr->sa_family == AF_INET6 ? socklen_t(sizeof(sockaddr_in6))
                                     : socklen_t(sizeof(sockaddr_in));
}

struct AddrInfoDeleter {
  void operator()(addrinfo* a) const { freeaddrinfo(a); }
};

// The source address of a UDP socket connected to `to`, or "" with `error` set.
std::string source_address_towards(const addrinfo& to, std::string& error) {
  const int fd = socket(to.ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    error = std::string("socket: ") + std::strerror(errno);
    return "";
  }
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  std::string address;
  if (connect(fd, to.ai_addr, to.ai_addrlen) != 0)
    error = std::string("connect: ") + std::strerror(errno);
  else if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0)
    error = std::string("getsockname: ") + std::strerror(errno);
  else
    address = numeric_host(reinterpret_cast<const sockaddr*>(&local), len);
  close(fd);
  return address;
}

}  // namespace

std::string LocalRoute::describe() const {
  return address + (interface.empty() ? " (no interface holds it)" : " (interface " + interface + ")");
}

std::string interface_holding(const std::string& address) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string name;
  for (const ifaddrs* a = list; a != nullptr && name.empty(); a = a->ifa_next)
    if (a->ifa_addr != nullptr &&
        (a->ifa_addr->sa_family == AF_INET || a->ifa_addr->sa_family == AF_INET6) &&
        numeric_host(a->ifa_addr, length_of(a->ifa_addr)) == address)
      name = a->ifa_name;
  freeifaddrs(list);
  return name;
}

LocalRoute local_route_to(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  // The port only makes the address complete: connecting a datagram socket sends nothing.
  if (const int rc = getaddrinfo(host.c_str(), "9", &hints, &found); rc != 0)
    throw std::runtime_error("cannot resolve '" + host + "' (" + gai_strerror(rc) + ")");
  const std::unique_ptr<addrinfo, AddrInfoDeleter> owned(found);
  std::string error = "no address";
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const std::string address = source_address_towards(*a, error);
    if (!address.empty()) return {.address = address, .interface = interface_holding(address)};
  }
  throw std::runtime_error("no route from this host to " + host + " (" + error + ")");
}

}  // namespace tally::engine
