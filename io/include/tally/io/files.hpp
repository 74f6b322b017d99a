// Reading files from outside (DESIGN.md §5): every reader in io/ goes through read_text_file, which
// refuses anything that is not a regular file or is larger than the limit, before reading a byte.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>

namespace tally::io {

// Size limit for the JSON inputs io/ reads (config.json, cluster and calibration files). The largest
// real Hugging Face config.json files are a few tens of KiB; 4 MiB leaves room and bounds memory.
inline constexpr std::size_t kMaxJsonFileBytes = std::size_t{4} << 20;  // 4 MiB

// Nesting depth limit for the same files (real ones nest 3–4 levels).
inline constexpr int kMaxJsonDepth = 64;

// The whole file as bytes. Throws tally::InvalidInput naming the path when it does not exist, is not
// a regular file, cannot be read, or is larger than limit_bytes.
std::string read_text_file(const std::filesystem::path& path,
                           std::size_t limit_bytes = kMaxJsonFileBytes);

}  // namespace tally::io
