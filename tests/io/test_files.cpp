// read_text_file: the one door through which io/ reads files from outside.
#include "tally/io/files.hpp"

#include <gtest/gtest.h>

#include "io_test_util.hpp"

namespace tally::io::test_files {
namespace {

using test::expect_invalid;

TEST(Files, ReadsWholeFile) {
  const std::string content = std::string("{\"a\": 1}\n") + '\0' + "tail";
  EXPECT_EQ(read_text_file(test::temp_file("files_whole.json", content)), content);
}

TEST(Files, ExactlyAtLimitIsAllowed) {
  const auto path = test::temp_file("files_limit.json", std::string(100, 'x'));
  EXPECT_EQ(read_text_file(path, 100).size(), 100u);
  expect_invalid([&] { read_text_file(path, 99); }, {path.string(), "size = 100 bytes", "99 bytes"});
}

TEST(Files, MissingDirectoryAndDevice) {
  expect_invalid([] { read_text_file("/nonexistent/tally/config.json"); },
                 {"/nonexistent/tally/config.json", "cannot read"});
  expect_invalid([] { read_text_file(std::filesystem::temp_directory_path()); },
                 {"not a regular file"});
  expect_invalid([] { read_text_file("/dev/zero"); }, {"/dev/zero", "not a regular file"});
}

}  // namespace
}  // namespace tally::io::test_files
