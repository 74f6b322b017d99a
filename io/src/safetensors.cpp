#include "tally/io/safetensors.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>
#include <tuple>
#include <utility>

#include "json_reader.hpp"
#include "tally/core/types.hpp"

namespace tally::io {

namespace {

using detail::json;
using detail::show;

struct DTypeEntry {
  TensorDType dtype;
  std::string_view name;
  std::size_t size_bytes;
};

// The reference's names and element sizes.
constexpr std::array<DTypeEntry, 15> kDTypes{{{TensorDType::boolean, "BOOL", 1},
                                              {TensorDType::u8, "U8", 1},
                                              {TensorDType::i8, "I8", 1},
                                              {TensorDType::f8_e5m2, "F8_E5M2", 1},
                                              {TensorDType::f8_e4m3, "F8_E4M3", 1},
                                              {TensorDType::i16, "I16", 2},
                                              {TensorDType::u16, "U16", 2},
                                              {TensorDType::f16, "F16", 2},
                                              {TensorDType::bf16, "BF16", 2},
                                              {TensorDType::i32, "I32", 4},
                                              {TensorDType::u32, "U32", 4},
                                              {TensorDType::f32, "F32", 4},
                                              {TensorDType::f64, "F64", 8},
                                              {TensorDType::i64, "I64", 8},
                                              {TensorDType::u64, "U64", 8}}};

const DTypeEntry& entry(TensorDType d) {
  for (const auto& e : kDTypes)
    if (e.dtype == d) return e;
  TALLY_INVARIANT(false && "TensorDType missing from kDTypes");
}

std::string shape_text(std::span<const std::int64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string range_text(std::uint64_t begin, std::uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
}

std::string tensor_label(std::string_view name) {
  return "tensor " + show(json(std::string(name)));
}

std::uint64_t load_le64(const std::byte* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | std::to_integer<std::uint64_t>(p[i]);
  return v;
}

std::array<std::byte, 8> store_le64(std::uint64_t v) {
  std::array<std::byte, 8> out{};
  for (auto& b : out) {
    b = static_cast<std::byte>(v & 0xff);
    v >>= 8;
  }
  return out;
}

// ---- header parsing -----------------------------------------------------------------------------

// The header length N from the first 8 bytes, checked against the file size and the limit.
// first9: the file's first 9 bytes (zero where the file is shorter).
std::uint64_t checked_header_length(const std::byte* first9, std::uint64_t file_bytes,
                                    const std::string& source, const SafetensorsLimits& limits) {
  const std::uint64_t n = load_le64(first9);
  if (n > limits.max_header_bytes)
    throw InvalidInput(source + ": header length = " + std::to_string(n) +
                       " bytes: must be at most the limit of " +
                       std::to_string(limits.max_header_bytes) + " bytes");
  if (n > file_bytes - 8)
    throw InvalidInput(source + ": header length = " + std::to_string(n) + " bytes: exceeds the " +
                       std::to_string(file_bytes - 8) + " bytes after the length field");
  if (n < 2 || std::to_integer<char>(first9[8]) != '{')
    throw InvalidInput(source + ": header does not start with '{': must be a JSON object");
  return n;
}

void check_file_size(std::uint64_t file_bytes, const std::string& source) {
  if (file_bytes < 8)
    throw InvalidInput(source + ": file size = " + std::to_string(file_bytes) +
                       " bytes: must be at least 8 (the header length field)");
}

// Only for reads of the whole file into memory: reading a header needs no bound on the data.
void check_file_limit(std::uint64_t file_bytes, const std::string& source,
                      const SafetensorsLimits& limits) {
  if (file_bytes > limits.max_file_bytes)
    throw InvalidInput(source + ": file size = " + std::to_string(file_bytes) +
                       " bytes: must be at most the limit of " +
                       std::to_string(limits.max_file_bytes) + " bytes");
}

// Parses the header text. The format pads the header with spaces (0x20) only: any other byte after
// the object (a newline, a NUL, "{...}") is an error. Depth: root object → tensor object → shape
// array; anything deeper is an error raised as soon as it opens. A key repeated within one object
// is an error (a duplicated tensor name would otherwise silently keep the last entry).
json parse_header_json(std::string_view text, const std::string& source) {
  const std::size_t end = text.find_last_not_of(' ');
  if (end != std::string_view::npos && text[end] != '}' && text.find('\0') == std::string_view::npos)
    throw InvalidInput(source + ": header is not valid JSON: it ends with byte " +
                       std::to_string(end) + " = " + detail::printable(std::string(1, text[end])) +
                       ": must be one JSON object {...} padded with spaces (0x20) only");
  const std::string_view object = end == std::string_view::npos ? text : text.substr(0, end + 1);
  return detail::parse_object(object, source,
                              {.max_bytes = object.size(),
                               .max_depth = 3,
                               .what = "header",
                               .top_key_is = "a tensor name"});
}

std::uint64_t offset_value(const json& v, const std::string& where) {
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<std::int64_t>() >= 0))
    throw InvalidInput(where + ": data_offsets entries must be integers in [0, 2^64), not " +
                       show(v));
  return v.get<std::uint64_t>();
}

TensorInfo parse_tensor(const std::string& name, const json& v, const std::string& source,
                        const SafetensorsLimits& limits) {
  const std::string where = source + ": " + tensor_label(name);
  if (!v.is_object())
    throw InvalidInput(where + " = " + show(v) +
                       ": must be an object {\"dtype\", \"shape\", "
                       "\"data_offsets\"}");
  for (const auto& item : v.items())
    if (item.key() != "dtype" && item.key() != "shape" && item.key() != "data_offsets")
      throw InvalidInput(where + ": unknown key " + show(json(item.key())) +
                         ": allowed keys are dtype, shape, data_offsets");
  TensorInfo t{.name = name};

  const auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string())
    throw InvalidInput(where + ": dtype = " + (dt == v.end() ? "missing" : show(*dt)) +
                       ": must be one of " + allowed_tensor_dtypes());
  const auto parsed = parse_tensor_dtype(dt->get_ref<const std::string&>());
  if (!parsed)
    throw InvalidInput(where + ": dtype = " + show(*dt) + ": must be one of " +
                       allowed_tensor_dtypes());
  t.dtype = *parsed;

  const auto sh = v.find("shape");
  if (sh == v.end() || !sh->is_array() || sh->size() > limits.max_dims)
    throw InvalidInput(where + ": shape = " + (sh == v.end() ? "missing" : show(*sh)) +
                       ": must be an array of at most " + std::to_string(limits.max_dims) +
                       " integers");
  for (const auto& d : *sh) {
    const bool ok = d.is_number_unsigned() || (d.is_number_integer() && d.get<std::int64_t>() >= 0);
    if (!ok || d.get<std::uint64_t>() > std::uint64_t(kMaxTensorElements))
      throw InvalidInput(where + ": shape = " + show(*sh) +
                         ": dimensions must be integers in [0, 2^62]");
    t.shape.push_back(d.get<std::int64_t>());
  }
  const auto elements = shape_elements(t.shape);
  if (!elements)
    throw InvalidInput(where + ": shape = " + shape_text(t.shape) +
                       ": the product of the dimensions exceeds 2^62 elements");
  const std::size_t esize = element_size_bytes(t.dtype);
  if (std::uint64_t(*elements) > std::numeric_limits<std::uint64_t>::max() / esize)
    throw InvalidInput(where + ": shape = " + shape_text(t.shape) + ": size in bytes overflows");
  const std::uint64_t need_bytes = std::uint64_t(*elements) * esize;

  const auto off = v.find("data_offsets");
  if (off == v.end() || !off->is_array() || off->size() != 2)
    throw InvalidInput(where + ": data_offsets = " + (off == v.end() ? "missing" : show(*off)) +
                       ": must be [begin, end]");
  t.begin_bytes = offset_value((*off)[0], where);
  t.end_bytes = offset_value((*off)[1], where);
  if (t.begin_bytes > t.end_bytes)
    throw InvalidInput(where + ": data_offsets = " + range_text(t.begin_bytes, t.end_bytes) +
                       ": begin must not exceed end");
  if (t.size_bytes() != need_bytes)
    throw InvalidInput(where + ": data_offsets = " + range_text(t.begin_bytes, t.end_bytes) +
                       " hold " + std::to_string(t.size_bytes()) + " bytes but shape " +
                       shape_text(t.shape) + " of " + std::string(to_string(t.dtype)) + " needs " +
                       std::to_string(need_bytes));
  return t;
}

std::map<std::string, std::string> parse_metadata(const json& v, const std::string& source) {
  if (!v.is_object())
    throw InvalidInput(source + ": __metadata__ = " + show(v) +
                       ": must be an object of strings {\"key\": \"value\"}");
  std::map<std::string, std::string> out;
  for (const auto& item : v.items()) {
    if (!item.value().is_string())
      throw InvalidInput(source + ": __metadata__." + detail::printable(item.key()) + " = " +
                         show(item.value()) + ": must be a string");
    out.emplace(item.key(), item.value().get<std::string>());
  }
  return out;
}

// The reference rejects any data section not covered exactly by the tensors (sorted by offset).
void check_coverage(const std::vector<TensorInfo>& tensors, std::uint64_t data_bytes,
                    const std::string& source) {
  std::uint64_t covered = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& t : tensors) {
    const std::string where = source + ": " + tensor_label(t.name) + ": data_offsets " +
                              range_text(t.begin_bytes, t.end_bytes);
    if (t.end_bytes > data_bytes)
      throw InvalidInput(where + " exceed the data section of " + std::to_string(data_bytes) +
                         " bytes");
    const std::string after = previous ? tensor_label(previous->name) + " " +
                                             range_text(previous->begin_bytes, previous->end_bytes)
                                       : std::string("the start of the data section");
    if (t.begin_bytes < covered)
      throw InvalidInput(where + " overlap " + after + ": tensors must not overlap");
    if (t.begin_bytes > covered)
      throw InvalidInput(where + " leave a hole of " + std::to_string(t.begin_bytes - covered) +
                         " bytes after " + after + ": tensors must cover the data section exactly");
    covered = t.end_bytes;
    previous = &t;
  }
  if (covered != data_bytes)
    throw InvalidInput(source + ": data section = " + std::to_string(data_bytes) +
                       " bytes but the tensors cover " + std::to_string(covered) + ": " +
                       std::to_string(data_bytes - covered) + " trailing bytes");
}

// Parses and validates the header text of a file of `file_bytes` bytes.
SafetensorsHeader parse_header(std::string_view text, std::uint64_t file_bytes,
                               const std::string& source, const SafetensorsLimits& limits) {
  SafetensorsHeader h;
  h.source = source;
  h.header_bytes = text.size();
  h.data_begin_bytes = 8 + text.size();
  h.file_bytes = file_bytes;
  const json root = parse_header_json(text, source);
  for (const auto& item : root.items()) {
    if (item.key() == "__metadata__")
      h.metadata = parse_metadata(item.value(), source);
    else
      h.tensors.push_back(parse_tensor(item.key(), item.value(), source, limits));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::tie(a.begin_bytes, a.end_bytes, a.name) <
           std::tie(b.begin_bytes, b.end_bytes, b.name);
  });
  check_coverage(h.tensors, file_bytes - h.data_begin_bytes, source);
  return h;
}

// Reads and validates the header of an open file.
SafetensorsHeader read_header(const ReadOnlyFile& file, const SafetensorsLimits& limits) {
  const std::string& source = file.source();
  const std::uint64_t file_bytes = file.size_bytes();
  check_file_size(file_bytes, source);
  std::array<std::byte, 9> first{};
  const std::size_t first_bytes = std::min<std::uint64_t>(9, file_bytes);
  if (!file.read_at(std::span(first.data(), first_bytes), 0))
    throw InvalidInput(source + ": file shrank while reading");
  const std::uint64_t n = checked_header_length(first.data(), file_bytes, source, limits);
  std::string text(static_cast<std::size_t>(n), '\0');
  if (!file.read_at(std::as_writable_bytes(std::span(text)), 8))
    throw InvalidInput(source + ": file shrank while reading");
  SafetensorsHeader h = parse_header(text, file_bytes, source, limits);
  h.links = limits.links;
  return h;
}

void check_writable_string(const std::string& s, const std::string& what) {
  try {
    (void)json(s).dump();
  } catch (const json::exception&) {
    throw InvalidInput(what + " = " + show(json(s)) + ": must be valid UTF-8");
  }
}

}  // namespace

// ---- dtypes and shapes --------------------------------------------------------------------------

std::string_view to_string(TensorDType d) { return entry(d).name; }
std::size_t element_size_bytes(TensorDType d) { return entry(d).size_bytes; }

std::optional<TensorDType> parse_tensor_dtype(std::string_view s) {
  for (const auto& e : kDTypes)
    if (e.name == s) return e.dtype;
  return std::nullopt;
}

std::string allowed_tensor_dtypes() {
  std::string s;
  for (const auto& e : kDTypes) s += (s.empty() ? "" : ", ") + std::string(e.name);
  return s;
}

std::optional<std::int64_t> shape_elements(std::span<const std::int64_t> shape) {
  // A 0 anywhere makes the product 0 whatever the other dimensions (which must still be in range).
  bool empty = false;
  for (const std::int64_t d : shape) {
    if (d < 0 || d > kMaxTensorElements) return std::nullopt;
    empty = empty || d == 0;
  }
  if (empty) return 0;
  std::int64_t n = 1;
  for (const std::int64_t d : shape) {
    if (n > kMaxTensorElements / d) return std::nullopt;
    n *= d;
  }
  return n;
}

// ---- writing ------------------------------------------------------------------------------------

WrittenFile write_safetensors(const std::filesystem::path& path,
                              const std::vector<TensorView>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  const std::string source = path.string();
  // Validate everything before touching the disk.
  std::set<std::string_view> names;
  for (const TensorView& t : tensors) {
    const std::string where = source + ": " + tensor_label(t.name);
    check_writable_string(t.name, source + ": tensor name");
    if (t.name == "__metadata__")
      throw InvalidInput(where + ": the name __metadata__ is reserved for the metadata");
    if (!names.insert(t.name).second)
      throw InvalidInput(where + " appears twice: each tensor name may appear once");
    if (t.shape.size() > SafetensorsLimits{}.max_dims)
      throw InvalidInput(where + ": " + std::to_string(t.shape.size()) +
                         " dimensions: must be at most " +
                         std::to_string(SafetensorsLimits{}.max_dims));
    const auto elements = shape_elements(t.shape);
    if (!elements)
      throw InvalidInput(where + ": shape = " + shape_text(t.shape) +
                         ": dimensions must be >= 0 with a product of at most 2^62");
    const std::size_t esize = element_size_bytes(t.dtype);
    if (std::uint64_t(*elements) > std::numeric_limits<std::size_t>::max() / esize ||
        std::uint64_t(*elements) * esize != t.size_bytes)
      throw InvalidInput(where + ": size = " + std::to_string(t.size_bytes) + " bytes: shape " +
                         shape_text(t.shape) + " of " + std::string(to_string(t.dtype)) +
                         " needs " + std::to_string(std::uint64_t(*elements) * esize) + " bytes");
    if (t.size_bytes > 0 && t.data == nullptr)
      throw InvalidInput(where + ": data is null but size = " + std::to_string(t.size_bytes) +
                         " bytes");
  }
  for (const auto& [k, v] : metadata) {
    check_writable_string(k, source + ": metadata key");
    check_writable_string(v, source + ": metadata value of " + show(json(k)));
  }

  // Data order: element size descending, then name (the reference writer's order).
  std::vector<const TensorView*> order;
  for (const TensorView& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const TensorView* a, const TensorView* b) {
    const std::size_t sa = element_size_bytes(a->dtype), sb = element_size_bytes(b->dtype);
    return sa != sb ? sa > sb : a->name < b->name;
  });

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const TensorView* t : order) {
    header[t->name] = {{"dtype", to_string(t->dtype)},
                       {"shape", t->shape},
                       {"data_offsets", {offset, offset + t->size_bytes}}};
    offset += t->size_bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  if (text.size() > SafetensorsLimits{}.max_header_bytes)
    throw InvalidInput(source + ": header length = " + std::to_string(text.size()) +
                       " bytes: must be at most " +
                       std::to_string(SafetensorsLimits{}.max_header_bytes) +
                       " to be readable with the default limits");

  const auto length = store_le64(text.size());
  std::vector<std::span<const std::byte>> pieces{std::span<const std::byte>(length),
                                                 std::as_bytes(std::span(text))};
  for (const TensorView* t : order) pieces.emplace_back(t->data, t->size_bytes);
  return write_file_atomically(path, pieces);
}

// ---- reading ------------------------------------------------------------------------------------

const TensorInfo* SafetensorsHeader::find(std::string_view name) const {
  for (const TensorInfo& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

std::span<const std::byte> SafetensorsFile::bytes(const TensorInfo& t) const {
  TALLY_INVARIANT(t.end_bytes <= data.size() && t.begin_bytes <= t.end_bytes);
  return std::span(data).subspan(t.begin_bytes, t.size_bytes());
}

std::span<const std::byte> SafetensorsFile::bytes(std::string_view name) const {
  const TensorInfo* t = header.find(name);
  if (!t) throw InvalidInput(header.source + ": " + tensor_label(name) + " is not in the file");
  return bytes(*t);
}

SafetensorsHeader read_safetensors_header(const std::filesystem::path& path,
                                          const SafetensorsLimits& limits) {
  const ReadOnlyFile file(path, path.string(), limits.links);
  SafetensorsHeader h = read_header(file, limits);
  h.path = path;
  return h;
}

SafetensorsFile read_safetensors(const std::filesystem::path& path,
                                 const SafetensorsLimits& limits) {
  const ReadOnlyFile file(path, path.string(), limits.links);
  const std::string& source = file.source();
  check_file_size(file.size_bytes(), source);
  check_file_limit(file.size_bytes(), source, limits);
  SafetensorsFile f;
  f.header = read_header(file, limits);
  f.header.path = path;
  f.data.resize(static_cast<std::size_t>(file.size_bytes() - f.header.data_begin_bytes));
  if (!file.read_at(f.data, f.header.data_begin_bytes))
    throw InvalidInput(source + ": file shrank while reading");
  std::byte extra{};
  if (file.read_at(std::span(&extra, 1), file.size_bytes()))
    throw InvalidInput(source + ": file grew while reading");
  return f;
}

SafetensorsFile parse_safetensors(std::span<const std::byte> file, std::string_view source_name,
                                  const SafetensorsLimits& limits) {
  const std::string source(source_name);
  check_file_size(file.size(), source);
  check_file_limit(file.size(), source, limits);
  std::array<std::byte, 9> first{};
  std::copy_n(file.begin(), std::min<std::size_t>(9, file.size()), first.begin());
  const std::uint64_t n = checked_header_length(first.data(), file.size(), source, limits);
  const auto text = file.subspan(8, static_cast<std::size_t>(n));
  SafetensorsFile f;
  f.header = parse_header(std::string_view(reinterpret_cast<const char*>(text.data()), text.size()),
                          file.size(), source, limits);
  const auto data = file.subspan(static_cast<std::size_t>(f.header.data_begin_bytes));
  f.data.assign(data.begin(), data.end());
  return f;
}

void read_tensor_bytes(const SafetensorsHeader& header, const TensorInfo& t,
                       std::uint64_t offset_bytes, std::span<std::byte> out) {
  const std::string where = header.source + ": " + tensor_label(t.name);
  if (offset_bytes > t.size_bytes() || out.size() > t.size_bytes() - offset_bytes)
  {
    // The end is printed exactly: offset + size may not fit in 64 bits.
    const std::uint64_t size = out.size();
    const std::string end = offset_bytes <= std::numeric_limits<std::uint64_t>::max() - size
                                ? std::to_string(offset_bytes + size)
                                : std::to_string(offset_bytes) + " + " + std::to_string(size);
    throw InvalidInput(where + ": bytes [" + std::to_string(offset_bytes) + ", " + end +
                       ") lie outside its " + std::to_string(t.size_bytes()) + " bytes");
  }
  const ReadOnlyFile file(header.path, header.source, header.links);
  if (file.size_bytes() != header.file_bytes)
    throw InvalidInput(header.source + ": file size = " + std::to_string(file.size_bytes()) +
                       " bytes: changed since its header was read (" +
                       std::to_string(header.file_bytes) + " bytes)");
  if (!file.read_at(out, header.data_begin_bytes + t.begin_bytes + offset_bytes))
    throw InvalidInput(header.source + ": file shrank while reading");
}

}  // namespace tally::io
