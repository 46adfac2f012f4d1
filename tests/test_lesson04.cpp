// Tests of lesson 04: the device-mismatch error, its HINT and its fix.
#include <gtest/gtest.h>

// The lesson is one file with its own main(); the tests include it for its functions.
#define GPU_LESSONS_NO_MAIN
#include "cuda_test.h"
#include "mismatch_error.cpp"

namespace {
void expect_error_then_fix(const torch::Device& model_device) {
  torch::manual_seed(lesson04::kSeed);
  lesson04::Classifier model = lesson04::make_model(model_device);
  ASSERT_EQ(lesson04::device_of(model), model_device);
  const auto mistake = lesson04::feed_cpu_batch(model);
  EXPECT_TRUE(mistake.threw);
  EXPECT_NE(mistake.message.find(lesson04::kMismatchText), std::string::npos) << mistake.message;
  EXPECT_EQ(mistake.message.find('\n'), std::string::npos);  // no backtrace
  EXPECT_FALSE(lesson04::hint_for(mistake.message).empty());
  const auto fixed = lesson04::feed_moved_batch(model);
  ASSERT_FALSE(fixed.threw) << fixed.message;
  EXPECT_EQ(fixed.output.sizes(), torch::IntArrayRef({lesson04::kBatch, lesson04::kClasses}));
  EXPECT_EQ(fixed.output.device(), model_device);
}
}  // namespace

// Tests the tutorial's golden rule on the CPU: as in the tutorial, nothing to demonstrate.
TEST(GoldenRule, SkippedOnTheCpu) {
  const auto rule = lesson04::golden_rule(torch::kCPU);
  EXPECT_FALSE(rule.demonstrated);
  EXPECT_TRUE(rule.error.empty());
}

// Tests the tutorial's golden rule with the meta device in the GPU's place: LibTorch's own
// mismatch message, without a backtrace, then the sum on the device after the fix.
TEST(GoldenRule, MismatchThenFixOnMeta) {
  const auto rule = lesson04::golden_rule(torch::Device(torch::kMeta));
  EXPECT_TRUE(rule.demonstrated);
  EXPECT_NE(rule.error.find(lesson04::kMismatchText), std::string::npos) << rule.error;
  EXPECT_EQ(rule.error.find("Exception raised from"), std::string::npos);  // no backtrace
  ASSERT_TRUE(rule.result.defined());
  EXPECT_TRUE(rule.result.is_meta());
  EXPECT_EQ(rule.result.sizes(), torch::IntArrayRef({3, 4}));
}

// Tests that without a GPU the lesson demonstrates on the meta device.
TEST(ModelDevice, MetaWithoutGpu) {
  EXPECT_TRUE(lesson04::model_device_for(torch::kCPU).is_meta());
}

// Tests the real error and the fix with a model on the meta device (any machine).
TEST(Mismatch, MetaModelCpuBatch) { expect_error_then_fix(torch::Device(torch::kMeta)); }

// Tests that the HINT is only given for the mismatch error.
TEST(Hint, OnlyForMismatch) {
  EXPECT_TRUE(lesson04::hint_for("shape '[2]' is invalid").empty());
  EXPECT_NE(lesson04::hint_for(lesson04::kMismatchText).find(".to("), std::string::npos);
}

// Tests the classic case on a GPU: a model on CUDA fed a CPU batch.
TEST_F(CudaTest, CudaModelCpuBatch) {
  const auto rule = lesson04::golden_rule(device);
  EXPECT_NE(rule.error.find(lesson04::kMismatchText), std::string::npos) << rule.error;
  EXPECT_TRUE(rule.result.is_cuda());
  EXPECT_EQ(lesson04::model_device_for(device), device);
  expect_error_then_fix(device);
}
