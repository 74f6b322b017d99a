// fuzz_make_seeds OUT: the starting corpus of every harness, in OUT/<reader>/.
//  - safetensors, checkpoint: small valid files written with tally's own writers (every dtype, a
//    scalar, an empty tensor, metadata; checkpoints of 1, 2 and 3 ranks with an empty shard), so
//    the seeds follow the format wherever it goes;
//  - hf_config, cluster, calibration: the fixtures of tests/io/data (cluster-*.json → cluster,
//    calibration*.json → calibration, every other file → hf_config), plus a calibration written by
//    calibration_to_json.
// Each generated seed is read back with its reader first: a seed that does not load is a bug here.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "checkpoint_input.hpp"
#include "tally/io/calibration.hpp"
#include "tally/io/checkpoint.hpp"
#include "tally/io/files.hpp"
#include "tally/io/safetensors.hpp"

namespace {

namespace fs = std::filesystem;
using namespace tally::io;
using tally::ShardSpan;

template <class T>
TensorView view(std::string name, TensorDType dtype, std::vector<std::int64_t> shape,
                const std::vector<T>& v) {
  return {.name = std::move(name),
          .dtype = dtype,
          .shape = std::move(shape),
          .data = reinterpret_cast<const std::byte*>(v.data()),
          .size_bytes = v.size() * sizeof(T)};
}

void write_text(const fs::path& path, std::string_view text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

void safetensors_seeds(const fs::path& out) {
  const std::vector<float> f32 = {1.5f, -2.0f, 0.0f, 3.25f, 1e-7f, -0.0f};
  const std::vector<std::int64_t> i64 = {42};
  const std::vector<std::uint16_t> bf16 = {0x3f80, 0xc000, 0x7f80};
  const std::vector<std::uint8_t> u8 = {0, 1, 255, 7, 9};
  const std::vector<double> f64 = {1.0 / 3.0, -1e300};
  const std::vector<std::int8_t> i8 = {-128, 0, 127};
  const std::vector<std::uint8_t> none;
  write_safetensors(
      out / "mixed.safetensors",
      {view("w", TensorDType::f32, {2, 3}, f32), view("step", TensorDType::i64, {}, i64),
       view("h", TensorDType::bf16, {3}, bf16), view("empty", TensorDType::u8, {0, 4}, none),
       view("flags", TensorDType::boolean, {5}, std::vector<std::uint8_t>{0, 1, 1, 0, 1})},
      {{"format", "pt"}, {"note", "fuzz seed"}});
  write_safetensors(out / "no_tensors.safetensors", {}, {{"format", "pt"}});
  write_safetensors(out / "one_u8.safetensors", {view("bytes", TensorDType::u8, {5}, u8)});
  write_safetensors(out / "f64_i8.safetensors", {view("d", TensorDType::f64, {2}, f64),
                                                 view("c", TensorDType::i8, {3, 1}, i8)});
  for (const auto& e : fs::directory_iterator(out)) (void)read_safetensors(e.path());
}

// A checkpoint of `world_size` ranks as one fuzz input (checkpoint_input.hpp).
void checkpoint_seed(const fs::path& out, const fs::path& scratch, int world_size) {
  CheckpointIndex x{.step = 5,
                    .consumed_samples = 2560,
                    .seed = 1234,
                    .rng_state = "00ff13a7",
                    .lr_schedule = {.name = "cosine",
                                    .step = 5,
                                    .base_lr = 3e-4,
                                    .lr = 1e-4,
                                    .warmup_steps = 2,
                                    .total_steps = 100,
                                    .min_lr = 3e-5},
                    .world_size = world_size};
  x.groups.push_back(
      make_flat_group("params", TensorDType::f32, {{"w", {2, 3}}, {"b", {3}}}, world_size));
  x.groups.push_back(make_flat_group("step_count", TensorDType::i64, {{"count", {}}}, world_size));
  std::vector<float> params(9);
  std::iota(params.begin(), params.end(), -4.0f);
  const std::vector<std::int64_t> step_count = {5};
  std::vector<std::vector<TensorView>> shards;
  for (int r = 0; r < world_size; ++r) {
    const ShardSpan p = x.groups[0].shards[std::size_t(r)], s = x.groups[1].shards[std::size_t(r)];
    shards.push_back({{.name = "params",
                       .dtype = TensorDType::f32,
                       .shape = {p.count},
                       .data = reinterpret_cast<const std::byte*>(params.data() + p.offset),
                       .size_bytes = std::size_t(p.count) * 4},
                      {.name = "step_count",
                       .dtype = TensorDType::i64,
                       .shape = {s.count},
                       .data = reinterpret_cast<const std::byte*>(step_count.data() + s.offset),
                       .size_bytes = std::size_t(s.count) * 8}});
  }
  const fs::path dir = scratch / ("ckpt" + std::to_string(world_size));
  write_checkpoint(dir, x, shards);
  (void)verify_checkpoint(dir);
  std::string input = read_text_file(dir / "index.json");
  for (int r = 0; r < world_size; ++r)
    input += std::string(tally::fuzz::kFileSeparator) +
             read_text_file(dir / shard_file_name(r, world_size), std::size_t{1} << 20);
  write_text(out / ("world" + std::to_string(world_size) + ".ckpt"), input);
}

void copy_fixtures(const fs::path& out) {
  for (const auto& e : fs::directory_iterator(TALLY_IO_TEST_DATA)) {
    const std::string name = e.path().filename().string();
    const char* reader = name.starts_with("cluster")       ? "cluster"
                         : name.starts_with("calibration") ? "calibration"
                                                           : "hf_config";
    fs::copy_file(e.path(), out / reader / name, fs::copy_options::overwrite_existing);
  }
}

void calibration_seed(const fs::path& out) {
  const Calibration c{.source = "fuzz seed, 2 nodes x 8",
                      .intra_node = tally::LinkSpec{.bandwidth_bps = 2.5e11, .latency_s = 3e-6},
                      .inter_node = tally::LinkSpec{.bandwidth_bps = 4.8e10, .latency_s = 1e-5},
                      .mfu = 0.45,
                      .points = {{.collective = "allreduce",
                                  .ranks = 16,
                                  .size_bytes = 1048576,
                                  .seconds_median = 1.2e-4,
                                  .busbw_bps = 7.6e9}}};
  write_text(out / "calibration" / "written.json", calibration_to_json(c));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  try {
    const fs::path out = argv[1];
    fs::remove_all(out);
    for (const char* reader : {"safetensors", "checkpoint", "hf_config", "cluster", "calibration"})
      fs::create_directories(out / reader);
    safetensors_seeds(out / "safetensors");
    const fs::path scratch =
        fs::temp_directory_path() / ("tally_fuzz_seeds_" + std::to_string(::getpid()));
    fs::create_directories(scratch);
    for (const int k : {1, 2, 3}) checkpoint_seed(out / "checkpoint", scratch, k);
    fs::remove_all(scratch);
    copy_fixtures(out);
    calibration_seed(out);
    std::printf("fuzz seeds written to %s\n", out.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_make_seeds: %s\n", e.what());
    return 1;
  }
}
