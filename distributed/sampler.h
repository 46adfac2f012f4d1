// sampler.h defines: epoch_order() and shard_indices(), what PyTorch's DistributedSampler (with
// set_epoch) does for a data-parallel job: every rank draws the same shuffled order of an epoch and
// takes its own disjoint part of each global step. Lessons 09 and 17 call them; LibTorch's own
// DistributedRandomSampler pads and splits the epoch otherwise (see lesson 09's page).
#pragma once

#include <ATen/CPUGeneratorImpl.h>  // defines: at::detail::createCPUGenerator
#include <ATen/core/Tensor.h>       // defines: at::Tensor
#include <ATen/ops/randperm.h>      // defines: at::randperm

#include <algorithm>
#include <cstdint>

namespace course {

//! [sampler]
/// The epoch's shuffled order of `samples` indices (int64), from a generator seeded with the seed
/// and the epoch only: every rank draws the same order without a word to the others
/// (DistributedSampler's set_epoch).
inline at::Tensor epoch_order(std::int64_t samples, std::uint64_t seed, int epoch) {
  auto generator =
      at::detail::createCPUGenerator(seed * 1000003ULL + static_cast<std::uint64_t>(epoch));
  return at::randperm(samples, generator, at::kLong);
}

/// Rank `rank`'s indices of global step `step`: the step takes order[s*W*B, (s+1)*W*B) (W ranks,
/// B = `batch_per_rank`), rank r the r-th B of those, so one process with batch W*B takes the very
/// same samples in step s. The last step may leave a rank none (an empty tensor).
inline at::Tensor shard_indices(const at::Tensor& order, std::int64_t step, int rank,
                                int world_size, std::int64_t batch_per_rank) {
  const std::int64_t start = (step * world_size + rank) * batch_per_rank, n = order.size(0);
  return order.slice(0, std::min(start, n), std::min(start + batch_per_rank, n));
}
//! [sampler]

}  // namespace course
