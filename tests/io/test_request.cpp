// `tally serve`'s request bodies (io/request.hpp): values become the words the command line would
// type (worked by hand below), and hostile bodies are refused with one line.
#include "tally/io/request.hpp"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "io_test_util.hpp"

namespace tally::io::test_request {
namespace {

using test::expect_invalid;

std::vector<RequestFlag> parse(const std::string& text) { return parse_request(text); }

TEST(Request, ValuesAsTheCommandLineTypesThem) {
  const auto flags = parse(R"({"seq": "4096", "gpus": 64, "sp": true, "dropout": false,
      "max-tp": null, "alternative": ["double-gpus", "double-micro-batch"], "none": [],
      "headroom": 0.2, "model": {"hidden_size": 4096, "a": [1, 2.5]}})");
  // nlohmann's objects keep their keys sorted, so the words come in key order.
  struct Want {
    std::string name;
    std::vector<std::string> values;
  };
  const std::vector<Want> want = {
      {"alternative", {"double-gpus", "double-micro-batch"}},
      {"gpus", {"64"}},
      {"headroom", {"0.2"}},
      {"model", {R"({"a":[1,2.5],"hidden_size":4096})"}},  // compact JSON text
      {"seq", {"4096"}},
      {"sp", {}},  // true: the bare flag
  };  // false, null and [] leave their flag out
  ASSERT_EQ(flags.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(flags[i].name, want[i].name);
    EXPECT_EQ(flags[i].values, want[i].values) << want[i].name;
  }
}

// Numbers: integers exactly, whole doubles below 2^53 as integers (an integer flag reads them),
// others in the shortest form that reads back to the same double (%.17g would print 0.1 as
// 0.10000000000000001).
TEST(Request, NumbersReadBackExactly) {
  auto word = [](const std::string& number) {
    const auto f = parse_request("{\"x\": " + number + "}");
    return f.size() == 1 && f[0].values.size() == 1 ? f[0].values[0] : std::string("(none)");
  };
  EXPECT_EQ(word("18446744073709551615"), "18446744073709551615");  // 2^64 − 1
  EXPECT_EQ(word("-3"), "-3");
  EXPECT_EQ(word("64.0"), "64");
  EXPECT_EQ(word("0.1"), "0.1");
  EXPECT_EQ(word("1e-5"), "1e-05");
  EXPECT_EQ(word("7e9"), "7000000000");
  EXPECT_EQ(word("1e21"), "1e+21");
  EXPECT_EQ(word("-0.0"), "0");
  EXPECT_EQ(word("9007199254740993.0"), "9007199254740992");  // 2^53 + 1 reads as 2^53
  EXPECT_EQ(word("1e16"), "1e+16");
}

TEST(Request, HostileBodiesAreOneLine) {
  expect_invalid([] { parse("{"); }, {"request body: not valid JSON"});
  expect_invalid([] { parse(""); }, {"request body: not valid JSON"});
  expect_invalid([] { parse("[1]"); }, {"request body: top level is an array"});
  expect_invalid([] { parse(R"({"gpus": 1, "gpus": 2})"); }, {"\"gpus\" (a flag name) appears twice"});
  expect_invalid([] { parse(std::string("{\"a\": 1}\0", 9)); }, {"NUL"});
  expect_invalid([] { parse(R"({"a": "x\u0000"})"); }, {"request body: a = ", "NUL"});
  expect_invalid([] { parse(R"({"a": [[1]]})"); }, {"request body: a[0] = [1]: must be a string or a number"});
  expect_invalid([] { parse(R"({"a": [true]})"); }, {"a[0] = true"});
  expect_invalid([] { parse(std::string(kMaxRequestBytes + 1, ' ')); },
                 {"request body: size = 1048577 bytes: must be at most 1 MiB"});
  expect_invalid([] { parse("{\"a\": " + std::string(64, '[') + std::string(64, ']') + "}"); },
                 {"request body: nesting depth = 65: must be at most 64"});
  for (const char* key : {"GPUs", "", "-gpus", "--gpus", "a b", "1gpus", "gpus_count", "é"})
    expect_invalid([&] { parse(std::string("{\"") + key + "\": 1}"); },
                   {"request body: key ", "must be a flag name"});
  expect_invalid([] { parse("{\"" + std::string(65, 'a') + "\": 1}"); }, {"at most 64 characters"});
  EXPECT_EQ(parse("{\"" + std::string(64, 'a') + "\": 1}").size(), 1u);
}

// Random damage to a valid body: a value or one line, never another exception.
TEST(Request, DamagedBodiesGiveAValueOrOneLine) {
  const std::string valid =
      R"({"gpus": 64, "sp": true, "alternative": ["a", "b"], "model": {"x": [1, {"y": null}]}})";
  std::mt19937 rng(7);
  for (int iter = 0; iter < 2000; ++iter) {
    std::string m = valid;
    if (iter % 2 == 0)
      for (int k = 0; k < 1 + int(rng() % 3); ++k) m[rng() % m.size()] ^= char(1 << (rng() % 8));
    else
      m.resize(rng() % m.size());
    if (test::reads_or_fails_in_one_line(iter, [&] {
          for (const RequestFlag& f : parse(m))
            for (const std::string& v : f.values)
              EXPECT_EQ(v.find('\0'), std::string::npos) << "mutation " << iter;
        }))
      continue;
  }
}

}  // namespace
}  // namespace tally::io::test_request
