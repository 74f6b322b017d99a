// Files (DESIGN.md §5): io/ owns every byte tally reads from or writes to disk. Readers go through
// ReadOnlyFile or read_text_file, which refuse anything that is not a regular file (and, where
// asked, any symbolic link) before reading a byte; writers go through write_file_atomically.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

namespace tally::io {

// Size limit for the JSON inputs io/ reads (config.json, cluster and calibration files). The largest
// real Hugging Face config.json files are a few tens of KiB; 4 MiB leaves room and bounds memory.
inline constexpr std::size_t kMaxJsonFileBytes = std::size_t{4} << 20;  // 4 MiB

// Nesting depth limit for the same files (real ones nest 3–4 levels).
inline constexpr int kMaxJsonDepth = 64;

// Whether a reader follows a symbolic link. User-named inputs follow (a Hugging Face cache's
// snapshots/<rev>/config.json is a link into blobs/); the files inside a checkpoint directory refuse,
// so a checkpoint can never make tally read outside its directory (Note [no links in checkpoints]
// in checkpoint.cpp). A refused link is named, and nothing about its target is revealed.
enum class Symlinks { follow, refuse };

// A regular file open for reading (RAII). Opened with O_NONBLOCK (a path swapped for a FIFO must not
// hang the open) and, for Symlinks::refuse, O_NOFOLLOW (a path swapped for a link after the check
// fails to open instead of being followed).
class ReadOnlyFile {
 public:
  // Throws tally::InvalidInput "<source>: ..." when the path is missing, not a regular file, a
  // refused link, or cannot be opened.
  ReadOnlyFile(const std::filesystem::path& path, std::string source,
               Symlinks links = Symlinks::follow);
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;
  ~ReadOnlyFile();

  std::uint64_t size_bytes() const { return size_bytes_; }  // at open time (fstat)
  const std::string& source() const { return source_; }
  // Reads exactly out.size() bytes at offset_bytes; false when the file ends first. Throws
  // InvalidInput on a read error.
  bool read_at(std::span<std::byte> out, std::uint64_t offset_bytes) const;

 private:
  int fd_ = -1;
  std::uint64_t size_bytes_ = 0;
  std::string source_;
};

// The whole file as bytes. Throws tally::InvalidInput naming the path when it does not exist, is not
// a regular file (or is a link and links are refused), cannot be read, or is larger than
// limit_bytes.
std::string read_text_file(const std::filesystem::path& path,
                           std::size_t limit_bytes = kMaxJsonFileBytes,
                           Symlinks links = Symlinks::follow);

// ---- checksums ----------------------------------------------------------------------------------

// CRC-32C (Castagnoli; polynomial 0x1EDC6F41, reflected 0x82F63B78; initial value and final XOR
// 0xFFFFFFFF; RFC 3720 §B.4), the checksum of iSCSI, ext4 metadata and Google's storage APIs.
// crc32c("123456789") == 0xE3069283. crc32c_update continues a running checksum: starting from 0,
// crc32c_update(crc32c_update(0, a), b) == crc32c(a ++ b).
std::uint32_t crc32c_update(std::uint32_t crc, std::span<const std::byte> bytes);
inline std::uint32_t crc32c(std::span<const std::byte> bytes) { return crc32c_update(0, bytes); }
std::string crc32c_hex(std::uint32_t crc);  // 8 lower-case hex digits, "e3069283"

// ---- durable, atomic file writes ----------------------------------------------------------------

// What was written (or read): the file's size and the CRC-32C of all its bytes.
struct WrittenFile {
  std::uint64_t size_bytes = 0;
  std::uint32_t crc32c = 0;
};

// Size and CRC-32C of a whole file, read in 1 MiB blocks.
WrittenFile checksum_file(const std::filesystem::path& path, Symlinks links = Symlinks::follow);

// Writes the concatenation of `pieces` to `<path>.tmp.<pid>`, fsyncs it, renames it over `path` and
// fsyncs the directory, so `path` holds either its previous content or all the new bytes, even
// after a crash or power loss. Throws std::system_error naming the path on an I/O failure (the
// temporary file is removed; `path` is untouched).
WrittenFile write_file_atomically(const std::filesystem::path& path,
                                  std::span<const std::span<const std::byte>> pieces);
// The same for one piece of text.
WrittenFile write_text_atomically(const std::filesystem::path& path, std::string_view text);
// fsync of a directory, making the renames and creations inside it durable. Throws
// std::system_error.
void sync_directory(const std::filesystem::path& dir);

}  // namespace tally::io
