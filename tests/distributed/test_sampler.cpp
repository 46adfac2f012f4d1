// Tests of distributed/sampler.h: a data-parallel job's sampler: every sample once an epoch, the
// same order on every rank.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "distributed/sampler.h"
// Tests that across ranks and steps every sample of an epoch is taken exactly once, and that a
// global step's shards, in rank order, are one process's batch of world x batch.
TEST(Sampler, EverySampleExactlyOncePerEpoch) {
  using course::shard_indices;
  for (std::int64_t samples : {1000, 1003, 60000}) {
    for (int world : {1, 2, 3, 4}) {
      for (std::int64_t batch : {7, 64}) {
        const torch::Tensor order = course::epoch_order(samples, 9, 0);
        const std::int64_t steps = (samples + world * batch - 1) / (world * batch);
        std::vector<torch::Tensor> all;
        for (std::int64_t s = 0; s < steps; ++s) {
          std::vector<torch::Tensor> step;
          for (int r = 0; r < world; ++r) step.push_back(shard_indices(order, s, r, world, batch));
          const torch::Tensor together = torch::cat(step);
          const torch::Tensor one_process = shard_indices(order, s, 0, 1, world * batch);
          ASSERT_TRUE(torch::equal(together, one_process)) << samples << " " << world << " " << s;
          all.push_back(together);
        }
        EXPECT_TRUE(torch::equal(std::get<0>(torch::cat(all).sort()), torch::arange(samples)))
            << samples << " samples, world " << world << ", batch " << batch;
        // No step beyond the last one, and the last one is not empty.
        EXPECT_EQ(shard_indices(order, steps, 0, world, batch).numel(), 0);
        EXPECT_GT(shard_indices(order, steps - 1, 0, world, batch).numel(), 0);
      }
    }
  }
}

// Tests that the order depends on the seed and the epoch only: every rank draws the same one.
TEST(Sampler, SameOrderOnEveryRankNewEachEpoch) {
  const torch::Tensor a = course::epoch_order(500, 9, 3);
  torch::manual_seed(123);  // the global generator plays no part
  EXPECT_TRUE(torch::equal(a, course::epoch_order(500, 9, 3)));
  EXPECT_FALSE(torch::equal(a, course::epoch_order(500, 9, 4)));
  EXPECT_FALSE(torch::equal(a, course::epoch_order(500, 10, 3)));
}
