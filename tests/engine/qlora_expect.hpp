// Shared by the QLoRA run's tests (exp_qlora.cpp, exp_qlora_llama.cpp): every check of a run holds,
// each failure naming the check, its measured value, relation and limit.
#pragma once

#include <gtest/gtest.h>

#include "tally/engine/experiments/qlora.hpp"

namespace tally::test {

inline void expect_every_check_ok(const engine::QloraResult& r) {
  for (const auto& c : engine::qlora_checks(r))
    EXPECT_TRUE(c.ok) << c.id << " " << c.what << ": " << c.measured << " " << c.relation << " "
                      << c.limit;
}

}  // namespace tally::test
