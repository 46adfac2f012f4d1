// Tests of common/generator.h: a generator's state put back.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/generator.h"

// Tests that a CPU generator state read and put back makes the next draws repeat.
TEST(Generator, StatePutBackRepeatsTheDraws) {
  torch::manual_seed(3);
  const torch::Tensor state = course::rng_state(c10::kCPU);
  const torch::Tensor first = torch::rand({8});
  EXPECT_FALSE(torch::equal(torch::rand({8}), first));
  course::set_rng_state(c10::kCPU, state);
  EXPECT_TRUE(torch::equal(torch::rand({8}), first));
}
