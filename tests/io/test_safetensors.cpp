// safetensors: CRC-32C against published vectors, bit-exact round trips, the reference byte layout,
// an independent Python reader, atomic replacement, and one test per class of hostile file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <system_error>

#include "../support/subprocess.hpp"
#include "../support/temp_dir.hpp"
#include "io_test_util.hpp"
#include "tally/io/safetensors.hpp"

namespace tally::io::test_safetensors {
namespace {

namespace fs = std::filesystem;
using test::expect_invalid;

std::span<const std::byte> as_span(std::string_view s) { return std::as_bytes(std::span(s)); }

template <class T>
TensorView view(std::string name, TensorDType dtype, std::vector<std::int64_t> shape,
                const std::vector<T>& v) {
  return {.name = std::move(name),
          .dtype = dtype,
          .shape = std::move(shape),
          .data = reinterpret_cast<const std::byte*>(v.data()),
          .size_bytes = v.size() * sizeof(T)};
}

using TempDir = ::tally::test::TempDir;  // tests/support/temp_dir.hpp

std::string le64(std::uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = char((n >> (8 * i)) & 0xff);
  return s;
}

// A raw file: length field, header text as given, data bytes.
std::string raw_file(std::string_view header, std::string_view data) {
  return le64(header.size()) + std::string(header) + std::string(data);
}

// ---- CRC-32C ------------------------------------------------------------------------------------

// Bit-at-a-time CRC-32C, the definition itself, to check the table-driven version.
std::uint32_t crc32c_bitwise(std::span<const std::byte> bytes) {
  std::uint32_t c = 0xFFFFFFFFu;
  for (const std::byte b : bytes) {
    c ^= std::to_integer<std::uint32_t>(b);
    for (int i = 0; i < 8; ++i) c = (c >> 1) ^ ((c & 1u) ? 0x82F63B78u : 0u);
  }
  return ~c;
}

TEST(Crc32c, KnownVectors) {
  // The check value of the CRC catalogue (CRC-32/ISCSI) and RFC 3720 §B.4's 32-byte vectors.
  EXPECT_EQ(crc32c(as_span("123456789")), 0xE3069283u);
  EXPECT_EQ(crc32c({}), 0u);
  std::vector<std::byte> v(32, std::byte{0});
  EXPECT_EQ(crc32c(v), 0x8A9136AAu);
  std::fill(v.begin(), v.end(), std::byte{0xFF});
  EXPECT_EQ(crc32c(v), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) v[i] = std::byte(i);
  EXPECT_EQ(crc32c(v), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) v[i] = std::byte(31 - i);
  EXPECT_EQ(crc32c(v), 0x113FDB5Cu);
  EXPECT_EQ(crc32c_hex(0xE3069283u), "e3069283");
  EXPECT_EQ(crc32c_hex(0x0000ABCDu), "0000abcd");
}

TEST(Crc32c, MatchesBitwiseDefinitionAndStreams) {
  std::mt19937 rng(7);
  std::vector<std::byte> buf(1031);
  for (auto& b : buf) b = std::byte(rng() & 0xff);
  const std::span<const std::byte> all(buf);
  for (std::size_t n : {0u, 1u, 7u, 8u, 9u, 63u, 64u, 1031u})
    EXPECT_EQ(crc32c(all.first(n)), crc32c_bitwise(all.first(n))) << n << " bytes";
  const std::uint32_t whole = crc32c(all);
  for (std::size_t cut = 0; cut <= buf.size(); cut += 13)
    EXPECT_EQ(crc32c_update(crc32c(all.first(cut)), all.subspan(cut)), whole) << "cut " << cut;
}

// ---- dtypes and round trips ---------------------------------------------------------------------

TEST(Safetensors, DTypeNamesAndSizes) {
  for (const TensorDType d :
       {TensorDType::boolean, TensorDType::u8, TensorDType::i8, TensorDType::f8_e5m2,
        TensorDType::f8_e4m3, TensorDType::i16, TensorDType::u16, TensorDType::f16,
        TensorDType::bf16, TensorDType::i32, TensorDType::u32, TensorDType::f32, TensorDType::f64,
        TensorDType::i64, TensorDType::u64})
    EXPECT_EQ(parse_tensor_dtype(to_string(d)), d) << to_string(d);
  EXPECT_EQ(element_size_bytes(TensorDType::bf16), 2u);
  EXPECT_EQ(element_size_bytes(TensorDType::f64), 8u);
  EXPECT_EQ(element_size_bytes(TensorDType::boolean), 1u);
  EXPECT_FALSE(parse_tensor_dtype("f32"));  // names are exact, upper case
  EXPECT_FALSE(parse_tensor_dtype("F4"));   // sub-byte types are not supported
  const std::int64_t k2e62 = std::int64_t{1} << 62;
  const std::vector<std::int64_t> scalar{}, empty{3, 0, 2}, big{std::int64_t{1} << 40, 1 << 23},
      at_limit{std::int64_t{1} << 40, 1 << 22}, empty_big{k2e62, k2e62, 0};
  EXPECT_EQ(shape_elements(scalar), 1);
  EXPECT_EQ(shape_elements(empty), 0);
  EXPECT_FALSE(shape_elements(big));  // 2^63 elements
  EXPECT_EQ(shape_elements(at_limit), k2e62);
  EXPECT_EQ(shape_elements(empty_big), 0);  // a 0 anywhere: empty, whatever the order
  const std::vector<std::int64_t> negative{2, -1};
  EXPECT_FALSE(shape_elements(negative));
}

// Tensors of every kind the engine saves, plus edge shapes.
struct Sample {
  std::vector<float> f32{1.5f,
                         -0.0f,
                         std::numeric_limits<float>::infinity(),
                         std::numeric_limits<float>::quiet_NaN(),
                         1e-45f,
                         3.0f};
  std::vector<double> f64{0.1, -2.5e300, 4.9e-324, 7.0, 1.0 / 3.0};
  std::vector<std::uint16_t> bf16{0x3F80, 0xC000, 0x7F80, 0x0001};  // 1, -2, inf, denormal
  std::vector<std::uint16_t> f16{0x3C00, 0xBC00, 0x7BFF};           // 1, -1, 65504
  std::vector<std::int64_t> i64{-(std::int64_t{1} << 62)};          // a scalar
  std::vector<std::int32_t> i32{};                                  // shape [0]
  std::vector<std::uint8_t> u8{};                                   // shape [3, 0, 2]
  std::vector<std::uint8_t> flags{1, 0, 1, 1, 0, 0, 1};
  std::vector<std::uint64_t> u64{~std::uint64_t{0}};

  std::vector<TensorView> views() const {
    return {view("layers.0.w", TensorDType::f32, {2, 3}, f32),
            view("f64", TensorDType::f64, {5}, f64),
            view("bf16", TensorDType::bf16, {2, 2}, bf16),
            view("f16", TensorDType::f16, {3}, f16),
            view("scalar", TensorDType::i64, {}, i64),
            view("empty_i32", TensorDType::i32, {0}, i32),
            view("empty_u8", TensorDType::u8, {3, 0, 2}, u8),
            view("flags", TensorDType::boolean, {7}, flags),
            view("u64", TensorDType::u64, {1}, u64)};
  }
};

const std::map<std::string, std::string> kMetadata{{"format", "pt"}, {"note", "ünïcode ✓"}};

TEST(Safetensors, RoundTripIsBitExact) {
  const Sample s;
  const TempDir tmp("roundtrip");
  const fs::path path = tmp / "model.safetensors";
  const WrittenFile w = write_safetensors(path, s.views(), kMetadata);
  EXPECT_EQ(w.size_bytes, fs::file_size(path));
  EXPECT_EQ(w.crc32c, crc32c(as_span(read_text_file(path))));

  const SafetensorsFile f = read_safetensors(path);
  EXPECT_EQ(f.header.metadata, kMetadata);
  EXPECT_EQ(f.header.source, path.string());
  ASSERT_EQ(f.header.tensors.size(), s.views().size());
  for (const TensorView& v : s.views()) {
    const TensorInfo* t = f.header.find(v.name);
    ASSERT_NE(t, nullptr) << v.name;
    EXPECT_EQ(t->dtype, v.dtype) << v.name;
    EXPECT_EQ(t->shape, v.shape) << v.name;
    const auto bytes = f.bytes(*t);
    ASSERT_EQ(bytes.size(), v.size_bytes) << v.name;
    EXPECT_TRUE(v.size_bytes == 0 || std::memcmp(bytes.data(), v.data, v.size_bytes) == 0)
        << v.name;
  }
  // The header alone describes the same file.
  const SafetensorsHeader h = read_safetensors_header(path);
  EXPECT_EQ(h.file_bytes, w.size_bytes);
  EXPECT_EQ(h.tensors.size(), f.header.tensors.size());
  expect_invalid([&] { (void)f.bytes("absent"); },
                 {path.string(), "\"absent\"", "not in the file"});
}

TEST(Safetensors, LayoutMatchesTheReferenceWriter) {
  const Sample s;
  const TempDir tmp("layout");
  const fs::path path = tmp / "model.safetensors";
  write_safetensors(path, s.views(), kMetadata);
  const std::string raw = read_text_file(path);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | std::uint8_t(raw[std::size_t(i)]);
  EXPECT_EQ(n % 8, 0u) << "header padded to a multiple of 8";
  const std::string header = raw.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}')) << "padding is spaces";
  EXPECT_EQ(header.find("\"__metadata__\""), 1u) << "metadata first";

  // Data order: element size descending, then name; every tensor aligned to its element size.
  const SafetensorsHeader h = read_safetensors_header(path);
  std::vector<std::string> order;
  for (const TensorInfo& t : h.tensors) {
    if (t.size_bytes() > 0) order.push_back(t.name);
    EXPECT_EQ((h.data_begin_bytes + t.begin_bytes) % element_size_bytes(t.dtype), 0u) << t.name;
  }
  EXPECT_EQ(order, (std::vector<std::string>{"f64", "scalar", "u64", "layers.0.w", "bf16", "f16",
                                             "flags"}));
}

TEST(Safetensors, NoTensorsIsAValidFile) {
  const TempDir tmp("empty");
  const fs::path path = tmp / "empty.safetensors";
  write_safetensors(path, {});
  EXPECT_EQ(read_text_file(path), le64(8) + "{}      ");
  const SafetensorsFile f = read_safetensors(path);
  EXPECT_TRUE(f.header.tensors.empty());
  EXPECT_TRUE(f.header.metadata.empty());
  EXPECT_TRUE(f.data.empty());
}

// ---- an independent reader ----------------------------------------------------------------------

// Runs tests/io/read_safetensors.py with /usr/bin/python3; nullopt when python3 or numpy is
// missing.
std::optional<std::string> run_python_reader(const fs::path& file) {
  if (!fs::exists("/usr/bin/python3") ||
      std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0)
    return std::nullopt;
  const fs::path script = fs::path(TALLY_IO_TEST_DATA).parent_path() / "read_safetensors.py";
  const tally::subprocess::Ran r =
      tally::subprocess::run_command({"/usr/bin/python3", script.string(), file.string()}, 120);
  EXPECT_EQ(r.exit_code, 0) << "read_safetensors.py failed; output:\n" << r.out << r.err;
  return r.out;
}

// The values of a tensor as doubles (BF16: the upper half of a float32; F16: IEEE half).
std::vector<double> as_doubles(TensorDType d, std::span<const std::byte> b) {
  std::vector<double> out;
  const std::size_t es = element_size_bytes(d);
  for (std::size_t i = 0; i + es <= b.size(); i += es) {
    const std::byte* p = b.data() + i;
    auto load = [&](auto x) {
      std::memcpy(&x, p, sizeof x);
      return x;
    };
    switch (d) {
      case TensorDType::f32:
        out.push_back(load(float{}));
        break;
      case TensorDType::f64:
        out.push_back(load(double{}));
        break;
      case TensorDType::bf16: {
        const std::uint32_t bits = std::uint32_t(load(std::uint16_t{})) << 16;
        float f;
        std::memcpy(&f, &bits, 4);
        out.push_back(f);
        break;
      }
      case TensorDType::f16: {
        const std::uint16_t h = load(std::uint16_t{});
        const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
        const double mag = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
        out.push_back((h & 0x8000) ? -mag : mag);
        break;
      }
      case TensorDType::i64:
        out.push_back(double(load(std::int64_t{})));
        break;
      case TensorDType::u64:
        out.push_back(double(load(std::uint64_t{})));
        break;
      case TensorDType::i32:
        out.push_back(load(std::int32_t{}));
        break;
      default:
        out.push_back(std::to_integer<int>(*p));
        break;
    }
  }
  return out;
}

TEST(Safetensors, IndependentPythonReaderAgrees) {
  const TempDir tmp("python");
  const fs::path path = tmp / "model.safetensors";
  const Sample s;
  // Finite values only: the Python side sums them.
  std::vector<float> big(1000);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = float(i) * 0.25f - 7.0f;
  std::vector<TensorView> views = s.views();
  views.erase(views.begin());  // layers.0.w holds inf and NaN
  views.push_back(view("big", TensorDType::f32, {10, 100}, big));
  write_safetensors(path, views, kMetadata);
  const auto out = run_python_reader(path);
  // The independent reader is part of the test: a missing one fails it (scripts/install-deps.sh
  // installs python3-numpy), it is never skipped.
  ASSERT_TRUE(out.has_value()) << "/usr/bin/python3 with numpy is not available";

  const SafetensorsFile f = read_safetensors(path);
  std::istringstream lines(*out);
  std::string line;
  std::size_t tensors = 0, metas = 0;
  while (std::getline(lines, line)) {
    std::vector<std::string> col;
    std::istringstream fields(line);
    for (std::string c; std::getline(fields, c, '\t');) col.push_back(c);
    if (col.at(0) == "meta") {
      EXPECT_EQ(kMetadata.at(col.at(1)), col.at(2));
      ++metas;
      continue;
    }
    ASSERT_EQ(col.size(), 7u) << line;
    const TensorInfo* t = f.header.find(col[1]);
    ASSERT_NE(t, nullptr) << col[1];
    ++tensors;
    EXPECT_EQ(col[2], to_string(t->dtype));
    EXPECT_EQ(nlohmann::json::parse(col[3]).get<std::vector<std::int64_t>>(), t->shape);
    const auto bytes = f.bytes(*t);
    const std::vector<double> v = as_doubles(t->dtype, bytes);
    double sum = 0;
    std::uint64_t byte_sum = 0;
    for (const double x : v) sum += x;
    for (const std::byte b : bytes) byte_sum += std::to_integer<std::uint64_t>(b);
    if (std::isfinite(sum))  // numpy sums pairwise: order may change the last bits
      EXPECT_NEAR(std::stod(col[4]), sum, 1e-12 * std::max(1.0, std::fabs(sum))) << t->name;
    else
      EXPECT_EQ(std::stod(col[4]), sum) << t->name;  // the bf16 sample holds +inf
    EXPECT_EQ(std::stoull(col[5]), byte_sum) << t->name;
    const auto first = nlohmann::json::parse(col[6]);
    ASSERT_EQ(first.size(), std::min<std::size_t>(4, v.size())) << t->name;
    for (std::size_t i = 0; i < first.size(); ++i)  // repr round-trips: compare exactly
      EXPECT_EQ(std::strtod(first[i].get<std::string>().c_str(), nullptr), v[i])
          << t->name << "[" << i << "]";
  }
  EXPECT_EQ(tensors, views.size());
  EXPECT_EQ(metas, kMetadata.size());
}

// ---- writing: validation and atomic replacement -------------------------------------------------

TEST(Safetensors, RewriteReplacesAtomicallyAndLeavesNoTemporaryFile) {
  const TempDir tmp("rewrite");
  const fs::path dir = tmp.path;
  const fs::path path = dir / "a.safetensors";
  const std::vector<float> one{1, 2}, two{3, 4, 5};
  write_safetensors(path, {view("x", TensorDType::f32, {2}, one)});
  write_safetensors(path, {view("x", TensorDType::f32, {3}, two)});
  EXPECT_EQ(read_safetensors(path).header.tensors.at(0).shape, std::vector<std::int64_t>{3});
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);

  // A refused write (bad tensor, or an unwritable place) leaves the previous file as it was.
  const std::string before = read_text_file(path);
  EXPECT_THROW(write_safetensors(path, {view("x", TensorDType::f64, {3}, two)}), InvalidInput);
  EXPECT_THROW(write_safetensors(dir / "no/such/dir/a.safetensors", {}), std::system_error);
  EXPECT_EQ(read_text_file(path), before);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
}

TEST(Safetensors, WriterRefusesWhatTheReaderWouldReject) {
  const TempDir tmp("refuse");
  const fs::path path = tmp / "x.safetensors";
  const std::vector<float> v{1, 2, 3, 4}, two{1, 2};
  const std::string p = path.string();
  expect_invalid(
      [&] {
        write_safetensors(path, {view("w", TensorDType::f32, {2, 3}, v)});
      },
      {p, "tensor \"w\"", "size = 16 bytes", "shape [2, 3] of F32 needs 24 bytes"});
  expect_invalid(
      [&] {
        write_safetensors(
            path, {view("w", TensorDType::f32, {2}, two), view("w", TensorDType::f32, {2}, two)});
      },
      {p, "\"w\" appears twice"});
  expect_invalid([&] { write_safetensors(path, {view("__metadata__", TensorDType::u8, {16}, v)}); },
                 {p, "reserved"});
  expect_invalid([&] { write_safetensors(path, {view("w", TensorDType::f32, {-4}, v)}); },
                 {p, "shape = [-4]"});
  expect_invalid([&] { write_safetensors(path, {view("bad\xff", TensorDType::f32, {4}, v)}); },
                 {p, "UTF-8"});
  TensorView null_data = view("w", TensorDType::f32, {4}, v);
  null_data.data = nullptr;
  expect_invalid([&] { write_safetensors(path, {null_data}); }, {p, "data is null"});
  expect_invalid([&] { write_safetensors(path, {}, {{"k", "\xc3"}}); }, {p, "metadata", "UTF-8"});
  EXPECT_FALSE(fs::exists(path));
}

// ---- hostile files: one test per check ----------------------------------------------------------

// A valid two-tensor header: a = F32 [2] at [0, 8), b = I32 [3] at [8, 20).
const std::string kData(20, '\x01');
std::string header_with(std::string_view a, std::string_view b) {
  return "{\"a\":" + std::string(a) + ",\"b\":" + std::string(b) + "}";
}
const std::string kA = R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
const std::string kB = R"({"dtype":"I32","shape":[3],"data_offsets":[8,20]})";

// Writes `content` and expects read_safetensors to fail with the file's name and every piece.
void expect_bad_file(std::string_view name, const std::string& content,
                     std::initializer_list<std::string_view> pieces,
                     const SafetensorsLimits& limits = {}) {
  const fs::path path =
      test::temp_file(std::string("st_") + std::string(name) + ".safetensors", content);
  expect_invalid([&] { read_safetensors(path, limits); }, pieces);
  expect_invalid([&] { read_safetensors_header(path, limits); }, pieces);
  expect_invalid([&] { parse_safetensors(as_span(content), path.string(), limits); }, pieces);
  expect_invalid([&] { read_safetensors(path, limits); }, {path.string() + ": "});
}

TEST(SafetensorsHostile, ValidBaselineReads) {
  const auto path =
      test::temp_file("st_baseline.safetensors", raw_file(header_with(kA, kB), kData));
  EXPECT_EQ(read_safetensors(path).header.tensors.size(), 2u);
}

TEST(SafetensorsHostile, FileShorterThanTheLengthField) {
  expect_bad_file("short0", "", {"file size = 0 bytes", "at least 8"});
  expect_bad_file("short7", "1234567", {"file size = 7 bytes", "at least 8"});
  expect_bad_file("only8", le64(0), {"does not start with '{'"});
}

TEST(SafetensorsHostile, HeaderLengthBeyondTheFile) {
  expect_bad_file("beyond", le64(1000) + "{}",
                  {"header length = 1000 bytes", "exceeds the 2 bytes"});
  expect_bad_file("huge", le64(~std::uint64_t{0}) + "{}", {"header length = 18446744073709551615"});
}

TEST(SafetensorsHostile, HeaderLengthOverTheLimit) {
  expect_bad_file("limit", raw_file(header_with(kA, kB), kData),
                  {"header length = ", "must be at most the limit of 16 bytes"},
                  SafetensorsLimits{.max_header_bytes = 16});
  // The file-size limit bounds whole-file reads; reading the header alone needs no such bound.
  const std::string file = raw_file(header_with(kA, kB), kData);
  const auto path = test::temp_file("st_filelimit.safetensors", file);
  const SafetensorsLimits small{.max_file_bytes = 32};
  expect_invalid([&] { read_safetensors(path, small); },
                 {path.string(), "file size = ", "must be at most the limit of 32 bytes"});
  expect_invalid([&] { parse_safetensors(as_span(file), "mem", small); }, {"mem: file size = "});
  EXPECT_EQ(read_safetensors_header(path, small).tensors.size(), 2u);
}

TEST(SafetensorsHostile, HeaderNotJsonOrNotAnObject) {
  expect_bad_file("notjson", raw_file("{\"a\": nope}", ""), {"header is not valid JSON"});
  expect_bad_file("array", raw_file("[1, 2]", ""), {"does not start with '{'"});
  expect_bad_file("leadingspace", raw_file(" {}", ""), {"does not start with '{'"});
  expect_bad_file("badutf8", raw_file("{\"\xff\":1}", ""), {"not valid JSON"});
  expect_bad_file("garbage_in_header", raw_file("{}x      ", ""), {"not valid JSON"});
  expect_bad_file("deep", raw_file(R"({"a":{"shape":[[1]]}})", ""), {"nesting depth = 4"});
  expect_bad_file("entry", raw_file(R"({"a":[1]})", ""),
                  {"tensor \"a\" = [1]", "must be an object"});
}

TEST(SafetensorsHostile, UnknownDtype) {
  expect_bad_file(
      "dtype",
      raw_file(header_with(R"({"dtype":"F33","shape":[2],"data_offsets":[0,8]})", kB), kData),
      {"tensor \"a\"", "dtype = \"F33\"", "must be one of BOOL"});
  expect_bad_file("nodtype",
                  raw_file(header_with(R"({"shape":[2],"data_offsets":[0,8]})", kB), kData),
                  {"tensor \"a\"", "dtype = missing"});
}

TEST(SafetensorsHostile, NegativeOrOverflowingShape) {
  expect_bad_file(
      "negative",
      raw_file(header_with(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})", kB), kData),
      {"tensor \"a\"", "shape = [-2]", "integers in [0, 2^62]"});
  expect_bad_file(
      "overflow",
      raw_file(header_with(
                   R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]})", kB),
               kData),
      {"tensor \"a\"", "exceeds 2^62 elements"});
  expect_bad_file(
      "float_dim",
      raw_file(header_with(R"({"dtype":"F32","shape":[2.0],"data_offsets":[0,8]})", kB), kData),
      {"tensor \"a\"", "shape = [2.0]"});
}

TEST(SafetensorsHostile, SizeDoesNotMatchShape) {
  expect_bad_file(
      "size",
      raw_file(header_with(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})", kB), kData),
      {"tensor \"a\"", "hold 8 bytes but shape [3] of F32 needs 12"});
}

TEST(SafetensorsHostile, OffsetsOutOfBounds) {
  expect_bad_file(
      "oob",
      raw_file(header_with(kA, R"({"dtype":"I32","shape":[8],"data_offsets":[8,40]})"), kData),
      {"tensor \"b\"", "data_offsets [8, 40] exceed the data section of 20 bytes"});
  expect_bad_file(
      "negoffset",
      raw_file(header_with(R"({"dtype":"F32","shape":[2],"data_offsets":[-8,0]})", kB), kData),
      {"tensor \"a\"", "data_offsets entries must be integers"});
  expect_bad_file(
      "hugeoffset",
      raw_file(header_with(
                   R"({"dtype":"F32","shape":[2],"data_offsets":[0,99999999999999999999999]})", kB),
               kData),
      {"tensor \"a\"", "data_offsets entries must be integers"});
  expect_bad_file(
      "threeoffsets",
      raw_file(header_with(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8,9]})", kB), kData),
      {"tensor \"a\"", "must be [begin, end]"});
}

TEST(SafetensorsHostile, BeginAfterEnd) {
  expect_bad_file(
      "reversed",
      raw_file(header_with(R"({"dtype":"F32","shape":[0],"data_offsets":[8,0]})", kB), kData),
      {"tensor \"a\"", "data_offsets = [8, 0]", "begin must not exceed end"});
}

TEST(SafetensorsHostile, OverlappingTensors) {
  expect_bad_file(
      "overlap",
      raw_file(header_with(kA, R"({"dtype":"I32","shape":[4],"data_offsets":[4,20]})"), kData),
      {"tensor \"b\"", "data_offsets [4, 20] overlap tensor \"a\" [0, 8]"});
}

TEST(SafetensorsHostile, HoleBetweenTensors) {
  expect_bad_file(
      "hole",
      raw_file(header_with(kA, R"({"dtype":"I32","shape":[2],"data_offsets":[12,20]})"), kData),
      {"tensor \"b\"", "leave a hole of 4 bytes after tensor \"a\" [0, 8]"});
  expect_bad_file("hole_at_start",
                  raw_file(R"({"b":{"dtype":"I32","shape":[3],"data_offsets":[8,20]}})", kData),
                  {"tensor \"b\"", "hole of 8 bytes after the start of the data section"});
}

TEST(SafetensorsHostile, DuplicateNames) {
  expect_bad_file("dup", raw_file("{\"a\":" + kA + ",\"a\":" + kB + "}", kData),
                  {"header key \"a\" (a tensor name) appears twice"});
}

TEST(SafetensorsHostile, TrailingGarbage) {
  expect_bad_file("trailing", raw_file(header_with(kA, kB), kData + "junk"),
                  {"data section = 24 bytes but the tensors cover 20: 4 trailing bytes"});
}

TEST(SafetensorsHostile, MetadataAndUnknownKeys) {
  expect_bad_file("meta_num", raw_file(R"({"__metadata__":{"k":3}})", ""),
                  {"__metadata__.k = 3: must be a string"});
  expect_bad_file("meta_arr", raw_file(R"({"__metadata__":[]})", ""),
                  {"__metadata__ = []", "object of strings"});
  expect_bad_file(
      "unknown_key",
      raw_file(header_with(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1})", kB),
               kData),
      {"tensor \"a\"", "unknown key \"extra\""});
}

TEST(SafetensorsHostile, NotARegularFile) {
  expect_invalid([] { read_safetensors("/nonexistent/x.safetensors"); },
                 {"/nonexistent/x.safetensors", "cannot read"});
  expect_invalid([] { read_safetensors(fs::temp_directory_path()); }, {"not a regular file"});
  expect_invalid([] { read_safetensors("/dev/zero"); }, {"/dev/zero", "not a regular file"});
}

// Random mutations of a valid file: each must either read as a file whose tensors lie inside its
// data section, or throw InvalidInput with a one-line message — nothing else escapes (and nothing
// crashes: this runs under ASan/UBSan in the sanitizer build). The unmutated file still reads as
// the tensors and metadata that were written. tests/fuzz/fuzz_safetensors.cpp explores further.
TEST(SafetensorsHostile, RandomMutationsReadOrFailInOneLine) {
  const Sample s;
  const TempDir tmp("fuzz");
  const fs::path path = tmp / "valid.safetensors";
  write_safetensors(path, s.views(), kMetadata);
  const std::string valid = read_text_file(path);
  std::mt19937 rng(12345);
  int accepted = 0, rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string m = valid;
    switch (iter % 4) {
      case 0:  // flip a few bytes anywhere
        for (int k = 0; k < 1 + int(rng() % 3); ++k) m[rng() % m.size()] ^= char(1 << (rng() % 8));
        break;
      case 1:  // truncate
        m.resize(rng() % m.size());
        break;
      case 2:  // change a digit in the header
        for (std::size_t at = 8 + rng() % (m.size() - 8); at < m.size(); ++at)
          if (m[at] >= '0' && m[at] <= '9') {
            m[at] = char('0' + rng() % 10);
            break;
          }
        break;
      default:  // a wrong header length
        m.replace(0, 8, le64(rng() % (m.size() + 16)));
    }
    const bool ok = test::reads_or_fails_in_one_line(iter, [&] {
      const SafetensorsFile f = parse_safetensors(as_span(m), "fuzz");
      EXPECT_EQ(f.header.file_bytes, m.size()) << "mutation " << iter;
      for (const TensorInfo& t : f.header.tensors)
        EXPECT_TRUE(t.begin_bytes <= t.end_bytes && t.end_bytes <= f.data.size())
            << "mutation " << iter << ": tensor " << t.name;
    });
    ++(ok ? accepted : rejected);
  }
  EXPECT_EQ(accepted + rejected, 3000);
  EXPECT_GT(rejected, 0);
  EXPECT_GT(accepted, 0);  // flips inside the data section are not the reader's business

  const SafetensorsFile f = parse_safetensors(as_span(valid), "fuzz");
  EXPECT_EQ(f.header.metadata, kMetadata);
  ASSERT_EQ(f.header.tensors.size(), s.views().size());
  for (const TensorView& v : s.views()) {
    const TensorInfo* t = f.header.find(v.name);
    ASSERT_NE(t, nullptr) << v.name;
    EXPECT_EQ(t->dtype, v.dtype) << v.name;
    EXPECT_EQ(t->shape, v.shape) << v.name;
    const auto bytes = f.bytes(*t);
    EXPECT_TRUE(bytes.size() == v.size_bytes &&
                (v.size_bytes == 0 || std::memcmp(bytes.data(), v.data, v.size_bytes) == 0))
        << v.name;
  }
}

TEST(Safetensors, ReadTensorBytesReadsSubrangesAndNoticesChanges) {
  const TempDir tmp("subrange");
  const fs::path path = tmp / "x.safetensors";
  std::vector<float> v(100);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(i);
  write_safetensors(path, {view("v", TensorDType::f32, {100}, v)});
  const SafetensorsHeader h = read_safetensors_header(path);
  std::vector<float> out(10);
  read_tensor_bytes(h, h.tensors[0], 40 * 4, std::as_writable_bytes(std::span(out)));
  EXPECT_EQ(out, std::vector<float>(v.begin() + 40, v.begin() + 50));
  expect_invalid(
      [&] { read_tensor_bytes(h, h.tensors[0], 95 * 4, std::as_writable_bytes(std::span(out))); },
      {"tensor \"v\"", "bytes [380, 420) lie outside its 400 bytes"});
  fs::resize_file(path, h.file_bytes - 4);
  expect_invalid(
      [&] { read_tensor_bytes(h, h.tensors[0], 0, std::as_writable_bytes(std::span(out))); },
      {path.string(), "changed since its header was read"});
}

}  // namespace
}  // namespace tally::io::test_safetensors
