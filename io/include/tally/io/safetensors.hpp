// safetensors, the Hugging Face tensor file format (https://github.com/huggingface/safetensors),
// written and read exactly as the reference implementation does. Byte layout:
//
//   [0, 8)        N, the header length in bytes: unsigned 64-bit little-endian
//   [8, 8+N)      the header: UTF-8 JSON object, starting with '{', padded with spaces (0x20, and
//                 nothing else: no NUL, no newline) so that N % 8 == 0
//   [8+N, end)    the data section: every tensor's bytes, row-major, little-endian, no gaps
//
//   header = {"__metadata__": {"key": "value", ...},                       optional, strings only
//             "<tensor name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]},
//             ...}
//
// data_offsets are byte offsets relative to the start of the data section; end − begin must equal
// product(shape) × element size (a scalar has shape [] and one element; a 0 in the shape means no
// bytes). The tensors must cover the data section exactly — no overlap, no hole, nothing after the
// last tensor — as the reference reader demands.
//
// Reading treats the file as hostile (DESIGN.md §5): every failure is one tally::InvalidInput line
// "<file>: <what was checked> = <value>: <what is allowed>"; nothing is allocated before the size
// it needs has been checked against the file size and the limits. Writing is durable and atomic: a
// crash mid-write leaves the previous file (if any) untouched.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tally/io/files.hpp"

namespace tally::io {

// Element types of the safetensors format (the byte-aligned ones; the reference's sub-byte F4/F6
// types are rejected as unknown). The names on disk are the reference's: "F32", "BF16", "BOOL", ...
enum class TensorDType {
  boolean,
  u8,
  i8,
  f8_e5m2,
  f8_e4m3,
  i16,
  u16,
  f16,
  bf16,
  i32,
  u32,
  f32,
  f64,
  i64,
  u64
};

std::string_view to_string(TensorDType d);                          // "F32", "BF16", ...
std::optional<TensorDType> parse_tensor_dtype(std::string_view s);  // exact, upper case
std::size_t element_size_bytes(TensorDType d);                      // BOOL 1, BF16 2, F64 8, ...
std::string allowed_tensor_dtypes();  // "BOOL, U8, I8, ..." for messages

// Elements of a tensor of this shape (1 for the scalar shape []), or nullopt when a dimension is
// negative or the product exceeds kMaxTensorElements.
inline constexpr std::int64_t kMaxTensorElements = std::int64_t{1} << 62;
std::optional<std::int64_t> shape_elements(std::span<const std::int64_t> shape);

// ---- writing ------------------------------------------------------------------------------------

// One tensor to write: `size_bytes` bytes at `data` (may be null when size_bytes == 0), row-major,
// little-endian. The caller keeps the bytes alive during the call.
struct TensorView {
  std::string name;  // unique in the file, not "__metadata__", valid UTF-8
  TensorDType dtype = TensorDType::f32;
  std::vector<std::int64_t> shape;  // elements per dimension; [] is a scalar
  const std::byte* data = nullptr;
  std::size_t size_bytes = 0;  // must equal shape_elements(shape) × element_size_bytes(dtype)
};

// Writes a safetensors file through write_file_atomically. As the reference writer does, the data
// section holds the tensors sorted by element size (largest first), then by name, so every tensor
// starts at a multiple of its element size (the data section starts at a multiple of 8). Throws
// InvalidInput when a tensor is inconsistent (size vs shape, duplicate or reserved name, invalid
// UTF-8) — what is written can always be read back — and std::system_error on an I/O failure.
WrittenFile write_safetensors(const std::filesystem::path& path,
                              const std::vector<TensorView>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// ---- reading ------------------------------------------------------------------------------------

struct SafetensorsLimits {
  std::uint64_t max_header_bytes = std::uint64_t{100} << 20;  // 100 MiB, the reference's limit
  std::uint64_t max_file_bytes = std::uint64_t{64} << 30;     // 64 GiB: whole-file reads only
  std::size_t max_dims = 64;                                  // rank of one tensor
  Symlinks links = Symlinks::follow;  // checkpoint shards: Symlinks::refuse
};

// One tensor's entry in the header.
struct TensorInfo {
  std::string name;
  TensorDType dtype = TensorDType::f32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin_bytes = 0;  // data_offsets[0], relative to the data section
  std::uint64_t end_bytes = 0;    // data_offsets[1]
  std::uint64_t size_bytes() const { return end_bytes - begin_bytes; }
};

// The validated header of a file.
struct SafetensorsHeader {
  std::filesystem::path path;                   // where it was read from (empty when parsed)
  std::string source;                           // the path, for messages
  std::map<std::string, std::string> metadata;  // "__metadata__"
  std::vector<TensorInfo> tensors;              // in data order (sorted by begin_bytes)
  std::uint64_t header_bytes = 0;               // N
  std::uint64_t data_begin_bytes = 0;           // 8 + N: file offset of the data section
  std::uint64_t file_bytes = 0;                 // 8 + N + data section
  Symlinks links = Symlinks::follow;            // how it was opened; later reads do the same
  const TensorInfo* find(std::string_view name) const;  // nullptr when absent
};

// A whole file in memory.
struct SafetensorsFile {
  SafetensorsHeader header;
  std::vector<std::byte> data;  // the data section
  // The tensor's bytes inside `data`.
  std::span<const std::byte> bytes(const TensorInfo& t) const;
  // The bytes of the tensor called `name`; throws InvalidInput naming the file when absent.
  std::span<const std::byte> bytes(std::string_view name) const;
};

// Reads and validates only the header (8 + N bytes), checking it against the file's size.
SafetensorsHeader read_safetensors_header(const std::filesystem::path& path,
                                          const SafetensorsLimits& limits = {});
// Reads and validates the whole file.
SafetensorsFile read_safetensors(const std::filesystem::path& path,
                                 const SafetensorsLimits& limits = {});
// Validates an in-memory file (the same checks as read_safetensors); `source` names it in messages.
SafetensorsFile parse_safetensors(std::span<const std::byte> file, std::string_view source,
                                  const SafetensorsLimits& limits = {});
// Reads out.size() bytes starting `offset_bytes` into tensor `t` of a file whose header was read
// with read_safetensors_header. Throws InvalidInput when the range lies outside the tensor or the
// file has changed size (e.g. been truncated) since the header was read.
void read_tensor_bytes(const SafetensorsHeader& header, const TensorInfo& t,
                       std::uint64_t offset_bytes, std::span<std::byte> out);

}  // namespace tally::io
