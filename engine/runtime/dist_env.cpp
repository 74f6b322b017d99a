#include "tally/engine/dist_env.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "tally/core/types.hpp"

namespace tally::engine {

namespace {

std::string required_variable(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr)
    throw InvalidInput(std::string(name) +
                       " is not set: start ranks with `tally launch` or torchrun (they set RANK, "
                       "WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)");
  return value;
}

int integer_variable(const char* name, int lo, int hi) {
  const std::string text = required_variable(name);
  int value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end)
    throw InvalidInput(std::string(name) + " = '" + text + "': not an integer");
  if (value < lo || value > hi)
    throw InvalidInput(std::string(name) + " = " + text + ": must be in [" + std::to_string(lo) +
                       ", " + std::to_string(hi) + "]");
  return value;
}

}  // namespace

void DistEnv::validate() const {
  if (world_size < 1 || world_size > kMaxWorldSize)
    throw InvalidInput("WORLD_SIZE = " + std::to_string(world_size) + ": must be in [1, " +
                       std::to_string(kMaxWorldSize) + "]");
  if (rank < 0 || rank >= world_size)
    throw InvalidInput("RANK = " + std::to_string(rank) + " vs WORLD_SIZE = " +
                       std::to_string(world_size) + ": RANK must be in [0, WORLD_SIZE)");
  if (local_rank < 0 || local_rank >= world_size)
    throw InvalidInput("LOCAL_RANK = " + std::to_string(local_rank) + " vs WORLD_SIZE = " +
                       std::to_string(world_size) + ": LOCAL_RANK must be in [0, WORLD_SIZE)");
  if (master_addr.empty()) throw InvalidInput("MASTER_ADDR is empty: give rank 0's host");
  if (master_port < 1 || master_port > 65535)
    throw InvalidInput("MASTER_PORT = " + std::to_string(master_port) + ": must be in [1, 65535]");
}

DistEnv DistEnv::from_environment() {
  DistEnv env;
  env.world_size = integer_variable("WORLD_SIZE", 1, kMaxWorldSize);
  env.rank = integer_variable("RANK", 0, kMaxWorldSize - 1);
  env.local_rank = integer_variable("LOCAL_RANK", 0, kMaxWorldSize - 1);
  env.master_addr = required_variable("MASTER_ADDR");
  env.master_port = integer_variable("MASTER_PORT", 1, 65535);
  env.validate();
  return env;
}

bool is_loopback_address(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

int find_free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(std::string("find_free_port: socket: ") + strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    close(fd);
    throw std::runtime_error(std::string("find_free_port: bind 127.0.0.1:0: ") + strerror(err));
  }
  close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace tally::engine
