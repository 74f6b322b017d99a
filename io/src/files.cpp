#include "tally/io/files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <system_error>
#include <utility>
#include <vector>

#include "tally/core/types.hpp"

namespace tally::io {

namespace {

[[noreturn]] void throw_errno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

// A descriptor closed on scope exit (files this module writes).
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // close(2) can report a delayed write error: check it for files we wrote.
  void close_checked(const std::string& what) {
    const int fd = std::exchange(fd_, -1);
    if (fd >= 0 && ::close(fd) != 0) throw_errno(what + ": close");
  }

 private:
  int fd_;
};

void write_all(int fd, std::span<const std::byte> bytes, const std::string& what) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), std::min<std::size_t>(bytes.size(), 1u << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw_errno(what + ": write");
    bytes = bytes.subspan(static_cast<std::size_t>(n));
  }
}

constexpr const char* kLinkRefused =
    "is a symbolic link: must be a regular file (links are refused here)";

std::string limit_text(std::size_t limit_bytes) {
  return limit_bytes % (std::size_t{1} << 20) == 0
             ? std::to_string(limit_bytes >> 20) + " MiB (" + std::to_string(limit_bytes) +
                   " bytes)"
             : std::to_string(limit_bytes) + " bytes";
}

}  // namespace

// ---- reading ------------------------------------------------------------------------------------

ReadOnlyFile::ReadOnlyFile(const std::filesystem::path& path, std::string source, Symlinks links)
    : source_(std::move(source)) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // lstat first: a link is refused by what it is, before anything about its target is looked at.
  const fs::file_status lst = fs::symlink_status(path, ec);
  if (fs::is_symlink(lst)) {
    if (links == Symlinks::refuse) throw InvalidInput(source_ + ": " + kLinkRefused);
  } else if (ec || !fs::exists(lst)) {
    throw InvalidInput(source_ + ": cannot read: " + (ec ? ec.message() : "no such file"));
  }
  int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK;
  if (links == Symlinks::refuse) flags |= O_NOFOLLOW;
  fd_ = ::open(path.c_str(), flags);
  if (fd_ < 0) {
    const int err = errno;
    if (err == ELOOP && links == Symlinks::refuse)
      throw InvalidInput(source_ + ": " + kLinkRefused);
    if (err == ENOENT) throw InvalidInput(source_ + ": cannot read: no such file");
    throw InvalidInput(source_ + ": cannot open for reading: " + std::strerror(err));
  }
  struct stat sb {};
  if (::fstat(fd_, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    throw InvalidInput(source_ + ": cannot read: not a regular file");
  }
  size_bytes_ = static_cast<std::uint64_t>(sb.st_size);
}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) ::close(fd_);
}

bool ReadOnlyFile::read_at(std::span<std::byte> out, std::uint64_t offset_bytes) const {
  while (!out.empty()) {
    const ssize_t n = ::pread(fd_, out.data(), std::min<std::size_t>(out.size(), 1u << 30),
                              static_cast<off_t>(offset_bytes));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw InvalidInput(source_ + ": read error: " + std::strerror(errno));
    if (n == 0) return false;
    out = out.subspan(static_cast<std::size_t>(n));
    offset_bytes += static_cast<std::uint64_t>(n);
  }
  return true;
}

std::string read_text_file(const std::filesystem::path& path, std::size_t limit_bytes,
                           Symlinks links) {
  const ReadOnlyFile file(path, path.string(), links);
  const std::string& name = file.source();
  if (file.size_bytes() > limit_bytes)
    throw InvalidInput(name + ": size = " + std::to_string(file.size_bytes()) +
                       " bytes: must be at most " + limit_text(limit_bytes));
  std::string data(static_cast<std::size_t>(file.size_bytes()), '\0');
  if (!file.read_at(std::as_writable_bytes(std::span(data)), 0))
    throw InvalidInput(name + ": file shrank while reading");
  // One byte more than its size must not be there: the file may have grown since fstat.
  std::byte extra{};
  if (file.read_at(std::span(&extra, 1), file.size_bytes()))
    throw InvalidInput(name + ": file grew while reading: must not change while tally reads it");
  return data;
}

// ---- CRC-32C ------------------------------------------------------------------------------------

// Slicing-by-8 (Intel, Kounavis & Berry 2005): table[k][b] is the CRC of byte b followed by k zero
// bytes, so eight input bytes are folded per step with eight table look-ups.
namespace {
struct Crc32cTables {
  std::uint32_t t[8][256];
  Crc32cTables() {
    constexpr std::uint32_t kPolyReflected = 0x82F63B78u;
    for (std::uint32_t b = 0; b < 256; ++b) {
      std::uint32_t c = b;
      for (int i = 0; i < 8; ++i) c = (c >> 1) ^ ((c & 1u) ? kPolyReflected : 0u);
      t[0][b] = c;
    }
    for (int k = 1; k < 8; ++k)
      for (std::uint32_t b = 0; b < 256; ++b)
        t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
  }
};
const Crc32cTables& crc_tables() {
  static const Crc32cTables tables;
  return tables;
}
}  // namespace

std::uint32_t crc32c_update(std::uint32_t crc, std::span<const std::byte> bytes) {
  const auto& t = crc_tables().t;
  std::uint32_t c = ~crc;
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  std::size_t n = bytes.size();
  while (n >= 8) {
    const std::uint32_t lo = c ^ (std::uint32_t(p[0]) | std::uint32_t(p[1]) << 8 |
                                  std::uint32_t(p[2]) << 16 | std::uint32_t(p[3]) << 24);
    const std::uint32_t hi = std::uint32_t(p[4]) | std::uint32_t(p[5]) << 8 |
                             std::uint32_t(p[6]) << 16 | std::uint32_t(p[7]) << 24;
    c = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^
        t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xff];
  return ~c;
}

std::string crc32c_hex(std::uint32_t crc) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", crc);
  return buf;
}

WrittenFile checksum_file(const std::filesystem::path& path, Symlinks links) {
  const ReadOnlyFile file(path, path.string(), links);
  WrittenFile out;
  std::vector<std::byte> buf(std::size_t{1} << 20);
  for (;;) {
    const std::uint64_t left = file.size_bytes() - out.size_bytes;
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), left));
    if (n == 0) break;
    const std::span<std::byte> block(buf.data(), n);
    if (!file.read_at(block, out.size_bytes))
      throw InvalidInput(file.source() + ": file shrank while reading");
    out.crc32c = crc32c_update(out.crc32c, block);
    out.size_bytes += n;
  }
  std::byte extra{};
  if (file.read_at(std::span(&extra, 1), out.size_bytes))
    throw InvalidInput(file.source() + ": file grew while reading");
  return out;
}

// ---- durable writes -----------------------------------------------------------------------------

void sync_directory(const std::filesystem::path& dir) {
  const std::filesystem::path d = dir.empty() ? std::filesystem::path(".") : dir;
  Fd fd(::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) throw_errno(d.string() + ": open directory");
  if (::fsync(fd.get()) != 0) throw_errno(d.string() + ": fsync directory");
}

WrittenFile write_file_atomically(const std::filesystem::path& path,
                                  std::span<const std::span<const std::byte>> pieces) {
  std::filesystem::path tmp = path;
  tmp += ".tmp." + std::to_string(::getpid());
  const std::string what = tmp.string();
  WrittenFile written;
  try {
    Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644));
    if (fd.get() < 0) throw_errno(what + ": create");
    for (const auto piece : pieces) {
      write_all(fd.get(), piece, what);
      written.crc32c = crc32c_update(written.crc32c, piece);
      written.size_bytes += piece.size();
    }
    if (::fsync(fd.get()) != 0) throw_errno(what + ": fsync");
    fd.close_checked(what);
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      throw_errno(what + ": rename to " + path.string());
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  sync_directory(path.parent_path());
  return written;
}

WrittenFile write_text_atomically(const std::filesystem::path& path, std::string_view text) {
  const std::span<const std::byte> piece = std::as_bytes(std::span(text.data(), text.size()));
  return write_file_atomically(path, std::span(&piece, 1));
}

}  // namespace tally::io
