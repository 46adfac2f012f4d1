// Tests of lesson 03: what .to() copies, seeds across devices, pinned copies.
#include <gtest/gtest.h>

#include "cuda_test.h"
#include "moving_tensors.h"

// Tests that .to() on a tensor already on the device returns that very tensor.
TEST(MoveTensors, SameDeviceIsNoCopy) {
  const auto facts = lesson03::to_same_device(torch::kCPU);
  EXPECT_TRUE(facts.same_tensor);
  EXPECT_FALSE(facts.new_storage);
}

// Tests that copy=true forces a real copy with equal values.
TEST(MoveTensors, ForcedCopyIsNewStorage) {
  const auto facts = lesson03::forced_copy(torch::kCPU);
  EXPECT_FALSE(facts.same_tensor);
  EXPECT_TRUE(facts.new_storage);
  EXPECT_TRUE(facts.equal_values);
}

// Tests that numbers made on the CPU and moved stay identical.
TEST(Seeds, CreateOnCpuThenMoveMatches) {
  EXPECT_TRUE(lesson03::create_on_cpu_then_move_matches(torch::kCPU, lesson03::kSeed));
  EXPECT_TRUE(lesson03::same_seed_same_numbers(torch::kCPU, lesson03::kSeed));
}

// Tests the GPU facts: a copy to new memory, different generators, pinned non_blocking copies.
TEST_F(CudaTest, GpuFacts) {
  EXPECT_TRUE(lesson03::to_same_device(device).same_tensor);
  const auto moved = lesson03::cpu_to(device);
  EXPECT_FALSE(moved.same_tensor);
  EXPECT_TRUE(moved.new_storage);
  EXPECT_TRUE(moved.equal_values);
  EXPECT_FALSE(lesson03::same_seed_same_numbers(device, lesson03::kSeed));
  EXPECT_TRUE(lesson03::create_on_cpu_then_move_matches(device, lesson03::kSeed));
  EXPECT_TRUE(lesson03::pinned_non_blocking_copy_matches(device));
  EXPECT_GT(lesson03::copy_bandwidth(device, lesson03::kCopyBytesQuick, /*pinned=*/true), 0.0);
}
