// Tests of lesson 03: what .to() copies, seeds across devices, pinned copies.
#include <gtest/gtest.h>

// The lesson is one file with its own main(); the tests include it for its functions.
#define GPU_LESSONS_NO_MAIN
#include "cuda_test.h"
#include "moving_tensors.cpp"

// Tests the tutorial's lines: a [2, 3] CPU tensor, and .to(cpu) handing back that very tensor,
// as the tutorial's note says.
TEST(Tutorial, ToCpuReturnsTheOriginal) {
  const auto t = lesson03::tutorial_move(torch::kCPU);
  EXPECT_TRUE(t.cpu_tensor.is_cpu());
  EXPECT_EQ(t.cpu_tensor.sizes(), torch::IntArrayRef({2, 3}));
  EXPECT_TRUE(t.gpu_tensor.is_same(t.cpu_tensor));
}

// Tests that the tutorial's tensor moves to another device as a new tensor (the meta device
// stands in for a GPU).
TEST(Tutorial, ToAnotherDeviceIsANewTensor) {
  const auto t = lesson03::tutorial_move(torch::Device(torch::kMeta));
  EXPECT_TRUE(t.cpu_tensor.is_cpu());
  EXPECT_TRUE(t.gpu_tensor.is_meta());
  EXPECT_FALSE(t.gpu_tensor.is_same(t.cpu_tensor));
}

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

// Tests what the page says of the three ways to a sum of squares: the same result. The input's
// sum is known: 1² + 2² + ... + n² = n(n+1)(2n+1)/6.
TEST(ThreeWays, SameSumOnCpu) {
  const torch::Tensor x = torch::arange(1, 1001, torch::kFloat);
  const double expected = 1000.0 * 1001.0 * 2001.0 / 6.0;
  EXPECT_EQ(lesson03::sum_of_squares_item_loop(x), expected);
  EXPECT_EQ(lesson03::sum_of_squares_accessor_loop(x), expected);
  EXPECT_EQ(lesson03::sum_of_squares_vectorized(x), expected);
  const torch::Tensor r = torch::rand({5000});
  EXPECT_NEAR(lesson03::sum_of_squares_item_loop(r), lesson03::sum_of_squares_vectorized(r),
              1e-9 * lesson03::sum_of_squares_vectorized(r));
  EXPECT_EQ(lesson03::sum_of_squares_item_loop(r), lesson03::sum_of_squares_accessor_loop(r));
}

// Tests that the accessor loop takes a non-contiguous tensor (it copies to contiguous first).
TEST(ThreeWays, AccessorLoopOnAStridedView) {
  const torch::Tensor x = torch::arange(1, 21, torch::kFloat).reshape({10, 2}).select(1, 0);
  ASSERT_FALSE(x.is_contiguous());
  EXPECT_EQ(lesson03::sum_of_squares_accessor_loop(x), lesson03::sum_of_squares_vectorized(x));
}

// Tests the GPU facts: a copy to new memory, different generators, pinned non_blocking copies.
TEST_F(CudaTest, GpuFacts) {
  const auto t = lesson03::tutorial_move(device);
  EXPECT_TRUE(t.gpu_tensor.is_cuda());
  EXPECT_TRUE(torch::equal(t.gpu_tensor.cpu(), t.cpu_tensor));
  EXPECT_TRUE(lesson03::to_same_device(device).same_tensor);
  const auto moved = lesson03::cpu_to(device);
  EXPECT_FALSE(moved.same_tensor);
  EXPECT_TRUE(moved.new_storage);
  EXPECT_TRUE(moved.equal_values);
  EXPECT_FALSE(lesson03::same_seed_same_numbers(device, lesson03::kSeed));
  EXPECT_TRUE(lesson03::create_on_cpu_then_move_matches(device, lesson03::kSeed));
  EXPECT_TRUE(lesson03::pinned_non_blocking_copy_matches(device));
  EXPECT_GT(lesson03::copy_bandwidth(device, lesson03::kCopyBytesQuick, /*pinned=*/true), 0.0);
  const torch::Tensor x = torch::rand({1000}).to(device);
  const double vectorized = lesson03::sum_of_squares_vectorized(x);
  EXPECT_NEAR(lesson03::sum_of_squares_item_loop(x), vectorized, 1e-9 * vectorized);
  EXPECT_NEAR(lesson03::sum_of_squares_accessor_loop(x), vectorized, 1e-9 * vectorized);
}
