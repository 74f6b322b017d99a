#include "tally/io/files.hpp"

#include <fstream>
#include <system_error>

#include "tally/core/types.hpp"

namespace tally::io {

std::string read_text_file(const std::filesystem::path& path, std::size_t limit_bytes) {
  namespace fs = std::filesystem;
  const std::string name = path.string();
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st))
    throw InvalidInput(name + ": cannot read: " + (ec ? ec.message() : "no such file"));
  if (!fs::is_regular_file(st)) throw InvalidInput(name + ": cannot read: not a regular file");
  const std::uintmax_t size = fs::file_size(path, ec);
  if (ec) throw InvalidInput(name + ": cannot read: " + ec.message());
  const std::string limit_text =
      limit_bytes % (std::size_t{1} << 20) == 0
          ? std::to_string(limit_bytes >> 20) + " MiB (" + std::to_string(limit_bytes) + " bytes)"
          : std::to_string(limit_bytes) + " bytes";
  if (size > limit_bytes)
    throw InvalidInput(name + ": size = " + std::to_string(size) + " bytes: must be at most " +
                       limit_text);

  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidInput(name + ": cannot open for reading");
  // Read at most limit + 1 bytes: the file may have grown since file_size.
  std::string data(static_cast<std::size_t>(size), '\0');
  in.read(data.data(), static_cast<std::streamsize>(data.size()));
  data.resize(static_cast<std::size_t>(in.gcount()));
  char extra[4096];
  while (in.read(extra, sizeof extra) || in.gcount() > 0) {
    data.append(extra, static_cast<std::size_t>(in.gcount()));
    if (data.size() > limit_bytes)
      throw InvalidInput(name + ": size > " + limit_text + " (file grew while reading): must be "
                         "at most " + limit_text);
  }
  if (in.bad()) throw InvalidInput(name + ": read error");
  return data;
}

}  // namespace tally::io
