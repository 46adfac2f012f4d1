// Tests of lessons/08_mixed_precision/autocast.h: the guard switches autocast on and off as
// Python's torch.autocast does, nests, puts back what it found, and refuses what LibTorch's
// autocast cannot do.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>

#include "autocast.h"
#include "common/version.h"
#include "cuda_test.h"

namespace {

torch::ScalarType mm_dtype(const torch::Device& device) {
  const torch::Tensor a = torch::ones({2, 2}, torch::TensorOptions().device(device));
  return torch::mm(a, a).scalar_type();
}

}  // namespace

// Tests that a guard switches CPU autocast on for its scope only, in the dtype it names.
TEST(Autocast, OnForItsScopeOnly) {
  EXPECT_FALSE(lesson08::autocast_enabled(torch::kCPU));
  EXPECT_EQ(mm_dtype(torch::kCPU), torch::kFloat);
  {
    lesson08::Autocast autocast(torch::kCPU, torch::kBFloat16);
    EXPECT_TRUE(lesson08::autocast_enabled(torch::kCPU));
    EXPECT_FALSE(lesson08::autocast_enabled(torch::kCUDA));  // one switch per device type
    EXPECT_EQ(mm_dtype(torch::kCPU), torch::kBFloat16);
  }
  EXPECT_FALSE(lesson08::autocast_enabled(torch::kCPU));
  EXPECT_EQ(mm_dtype(torch::kCPU), torch::kFloat);
}

// Tests that guards nest and each puts back the state it found.
TEST(Autocast, GuardsNestAndRestore) {
  {
    lesson08::Autocast outer(torch::kCPU, torch::kBFloat16);
    {
      lesson08::Autocast inner(torch::kCPU, torch::kBFloat16);
      EXPECT_TRUE(lesson08::autocast_enabled(torch::kCPU));
    }
    EXPECT_TRUE(lesson08::autocast_enabled(torch::kCPU));
    EXPECT_EQ(mm_dtype(torch::kCPU), torch::kBFloat16);
  }
  EXPECT_FALSE(lesson08::autocast_enabled(torch::kCPU));
}

// Tests `enabled=false`: inside an autocast block it switches autocast off for its own scope,
// so one loop serves fp32 and mixed precision.
TEST(Autocast, DisabledSwitchesOffForItsScope) {
  lesson08::Autocast outer(torch::kCPU, torch::kBFloat16);
  {
    lesson08::Autocast off(torch::kCPU, torch::kBFloat16, /*enabled=*/false);
    EXPECT_FALSE(lesson08::autocast_enabled(torch::kCPU));
    EXPECT_EQ(mm_dtype(torch::kCPU), torch::kFloat);
  }
  EXPECT_TRUE(lesson08::autocast_enabled(torch::kCPU));
  EXPECT_EQ(mm_dtype(torch::kCPU), torch::kBFloat16);
}

// Tests that the guard refuses a type that is not 16 bits and a device autocast does not know,
// and leaves autocast as it was.
TEST(Autocast, RefusesWhatAutocastCannotDo) {
  EXPECT_THROW({ lesson08::Autocast guard(torch::kCPU, torch::kFloat); }, std::invalid_argument);
  EXPECT_THROW({ lesson08::Autocast guard(torch::kMeta, torch::kBFloat16); },
               std::invalid_argument);
  EXPECT_FALSE(lesson08::autocast_enabled(torch::kCPU));
}

// Tests fp16 on the CPU: refused before LibTorch 2.4 (whose CPU autocast takes bf16 only), honoured
// from 2.4 on.
TEST(Autocast, CpuHalfByVersion) {
#if GPU_LESSONS_TORCH_AT_LEAST(2, 4)
  lesson08::Autocast autocast(torch::kCPU, torch::kHalf);
  EXPECT_EQ(mm_dtype(torch::kCPU), torch::kHalf);
#else
  EXPECT_THROW({ lesson08::Autocast guard(torch::kCPU, torch::kHalf); }, std::invalid_argument);
#endif
}

// Tests the guard on CUDA, in both 16-bit types, and that the CPU's switch stays off meanwhile.
TEST_F(CudaTest, AutocastOnCuda) {
  for (const torch::ScalarType dtype : {torch::kHalf, torch::kBFloat16}) {
    {
      lesson08::Autocast autocast(torch::kCUDA, dtype);
      EXPECT_TRUE(lesson08::autocast_enabled(torch::kCUDA));
      EXPECT_FALSE(lesson08::autocast_enabled(torch::kCPU));
      EXPECT_EQ(mm_dtype(device), dtype);
      EXPECT_EQ(mm_dtype(torch::kCPU), torch::kFloat);
    }
    EXPECT_FALSE(lesson08::autocast_enabled(torch::kCUDA));
    EXPECT_EQ(mm_dtype(device), torch::kFloat);
  }
}
