// local_route_to (Note [the address peers dial], local_route.hpp): on this host's loopback, and
// inside two network namespaces joined by a veth pair (netns_fixture.hpp), where the expected
// addresses are the ones the fixture gave each side and `ip route get` would print.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "netns_fixture.hpp"
#include "tally/engine/dist_env.hpp"
#include "tally/engine/local_route.hpp"

namespace tally::engine {
namespace {

std::string error_of(const std::string& host) {
  try {
    local_route_to(host);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(LocalRoute, LoopbackMasterGivesLoopback) {
  const LocalRoute r = local_route_to("127.0.0.1");
  EXPECT_EQ(r.address, "127.0.0.1");
  EXPECT_EQ(r.interface, "lo");
  EXPECT_EQ(r.describe(), "127.0.0.1 (interface lo)");
  EXPECT_TRUE(is_loopback_address(local_route_to("localhost").address));
}

TEST(LocalRoute, InterfaceHoldingAnAddress) {
  EXPECT_EQ(interface_holding("127.0.0.1"), "lo");
  EXPECT_EQ(interface_holding("203.0.113.9"), "");  // TEST-NET-3: held by nobody
  EXPECT_EQ((LocalRoute{.address = "203.0.113.9"}).describe(), "203.0.113.9 (no interface holds it)");
}

using TwoHosts = netns::TwoHosts;

TEST_F(TwoHosts, EachHostUsesItsVethAddressNeverLoopback) {
  LocalRoute from_b, from_a;
  netns::inside(b.ns, [&] { from_b = local_route_to(a.address); });
  netns::inside(a.ns, [&] { from_a = local_route_to(a.address); });
  EXPECT_EQ(from_b.address, b.address);
  EXPECT_EQ(from_b.interface, b.veth);
  // On rank 0's own host the route to MASTER_ADDR is local; its source is MASTER_ADDR itself.
  EXPECT_EQ(from_a.address, a.address);
  EXPECT_EQ(from_a.interface, a.veth);
}

TEST_F(TwoHosts, NoRouteAndNoNameAreErrorsNamingTheHost) {
  std::string unreachable, unresolvable;
  netns::inside(b.ns, [&] {
    unreachable = error_of("192.0.2.1");  // TEST-NET-1: B routes only 10.77.0.0/24
    unresolvable = error_of("no-such-host.invalid");
  });
  EXPECT_EQ(unreachable, "no route from this host to 192.0.2.1 (connect: Network is unreachable)");
  EXPECT_EQ(unresolvable.rfind("cannot resolve 'no-such-host.invalid' (", 0), 0u) << unresolvable;
}

}  // namespace
}  // namespace tally::engine
