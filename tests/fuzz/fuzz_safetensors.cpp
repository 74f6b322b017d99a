// Fuzz harness: the safetensors reader (io/include/tally/io/safetensors.hpp).
//
// The input is a whole .safetensors file. Checked (Note [fuzz contract] in fuzz_check.hpp):
//  - the header of an accepted file is JSON (and space padding);
//  - parse_safetensors (in memory), read_safetensors (the file) and read_safetensors_header (header
//    only) accept and refuse the same bytes with the same message, and read the same header and
//    data;
//  - read_tensor_bytes gives every tensor's bytes as the whole-file read does;
//  - an accepted file written again with write_safetensors reads back to the same tensors (name,
//    dtype, shape, bytes) and metadata, and writing that again gives the same bytes.
#include <cstring>
#include <map>

#include "fuzz_check.hpp"
#include "tally/io/safetensors.hpp"

namespace tally::fuzz {
namespace {

using namespace tally::io;

bool same_info(const TensorInfo& a, const TensorInfo& b) {
  return a.name == b.name && a.dtype == b.dtype && a.shape == b.shape &&
         a.begin_bytes == b.begin_bytes && a.end_bytes == b.end_bytes;
}

bool same_header(const SafetensorsHeader& a, const SafetensorsHeader& b) {
  if (a.source != b.source || a.metadata != b.metadata || a.header_bytes != b.header_bytes ||
      a.data_begin_bytes != b.data_begin_bytes || a.file_bytes != b.file_bytes ||
      a.tensors.size() != b.tensors.size())
    return false;
  for (std::size_t i = 0; i < a.tensors.size(); ++i)
    if (!same_info(a.tensors[i], b.tensors[i])) return false;
  return true;
}

bool same_file(const SafetensorsFile& a, const SafetensorsFile& b) {
  return same_header(a.header, b.header) && a.data == b.data;
}

// What a file means, independent of where its tensors sit in the data section.
struct Content {
  std::map<std::string, std::string> metadata;
  // name → (dtype, shape, bytes)
  std::map<std::string, std::tuple<TensorDType, std::vector<std::int64_t>, std::vector<std::byte>>>
      tensors;
  bool operator==(const Content&) const = default;
};

Content content_of(const SafetensorsFile& f) {
  Content c{.metadata = f.header.metadata};
  for (const TensorInfo& t : f.header.tensors) {
    const auto bytes = f.bytes(t);
    c.tensors[t.name] = {t.dtype, t.shape, {bytes.begin(), bytes.end()}};
  }
  return c;
}

std::vector<TensorView> views_of(const SafetensorsFile& f) {
  std::vector<TensorView> out;
  for (const TensorInfo& t : f.header.tensors) {
    const auto bytes = f.bytes(t);
    out.push_back({.name = t.name,
                   .dtype = t.dtype,
                   .shape = t.shape,
                   .data = bytes.data(),
                   .size_bytes = bytes.size()});
  }
  return out;
}

// Every tensor read alone (read_tensor_bytes: whole, and its second half) equals the whole-file
// read.
void check_tensor_reads(const SafetensorsHeader& h, const SafetensorsFile& whole) {
  for (const TensorInfo& t : h.tensors) {
    const auto want = whole.bytes(t.name);
    std::vector<std::byte> got(t.size_bytes());
    const auto read = attempt("read_tensor_bytes", [&] { read_tensor_bytes(h, t, 0, got); });
    FUZZ_CHECK(read.ok(), "tensor \"" + t.name + "\" of an accepted file: " + read.error);
    FUZZ_CHECK(std::equal(got.begin(), got.end(), want.begin(), want.end()), t.name);
    const std::uint64_t half = t.size_bytes() / 2;
    std::vector<std::byte> tail(t.size_bytes() - half);
    const auto read_tail =
        attempt("read_tensor_bytes", [&] { read_tensor_bytes(h, t, half, tail); });
    FUZZ_CHECK(read_tail.ok(), read_tail.error);
    FUZZ_CHECK(
        std::equal(tail.begin(), tail.end(), want.begin() + std::ptrdiff_t(half), want.end()),
        t.name);
  }
}

// write → read is exact, and write(read(write(x))) == write(x) byte for byte.
void check_round_trip(const SafetensorsFile& f) {
  const fs::path once = scratch_dir() / "once.safetensors";
  const fs::path twice = scratch_dir() / "twice.safetensors";
  must_succeed("write_safetensors",
               [&] { return write_safetensors(once, views_of(f), f.header.metadata); });
  const SafetensorsFile back =
      must_succeed("read_safetensors(written)", [&] { return read_safetensors(once); });
  FUZZ_CHECK(content_of(back) == content_of(f), "write → read changed the tensors or metadata");
  must_succeed("write_safetensors",
               [&] { return write_safetensors(twice, views_of(back), back.header.metadata); });
  FUZZ_CHECK(read_bytes(once) == read_bytes(twice), "writing the same content twice differs");
}

}  // namespace
}  // namespace tally::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tally::fuzz;
  using namespace tally::io;
  const auto bytes = as_bytes(data, size);
  const fs::path path = scratch_dir() / "input.safetensors";
  write_bytes(path, bytes);

  const auto mem =
      attempt("parse_safetensors", [&] { return parse_safetensors(bytes, path.string()); });
  const auto file = attempt("read_safetensors", [&] { return read_safetensors(path); });
  const auto header =
      attempt("read_safetensors_header", [&] { return read_safetensors_header(path); });
  expect_agree("parse_safetensors", mem, "read_safetensors", file, same_file);
  // Every check is on the header and the file's size, so reading the header alone accepts and
  // refuses exactly what reading the whole file does.
  const Outcome<SafetensorsHeader> file_header =
      file.ok() ? Outcome<SafetensorsHeader>{file.value->header, ""}
                : Outcome<SafetensorsHeader>{std::nullopt, file.error};
  expect_agree("read_safetensors_header", header, "read_safetensors", file_header, same_header);
  if (!file.ok()) return 0;

  const SafetensorsHeader& h = file.value->header;
  expect_json_text("read_safetensors (header)",
                   std::string_view(reinterpret_cast<const char*>(data) + 8, h.header_bytes));
  check_tensor_reads(*header.value, *file.value);
  check_round_trip(*file.value);
  return 0;
}
