// Tests of lesson 23's kernel (epoch_kernel.cuh) on the CPU: the kernel's own code, each CUDA
// thread a host thread (cuda_emulation.h), against the operator's CPU implementation, from the
// same start on the same batches: its losses, parameters, gradients and Adam's state, its step
// count, its grid barriers (kGridSyncsPerStep a step) and its clock. Every barrier wakes host
// threads, so the emulation is slow: a test runs two or three steps.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>

#include "common/compare.h"
#include "cuda_emulation.h"  // defines: launch_cooperative, and the CUDA names the kernel uses
#include "epoch_kernel.cuh"  // defines: train_epoch_kernel, EpochArgs
#include "epoch_op.h"        // defines: kName, TrainEpoch

namespace {

constexpr double kLearningRate = 1e-3;  // the tutorial's

// What one run trains: the flat tensors, as lesson 23's OpTrainer holds them, from `seed`.
struct State {
  torch::Tensor parameters, gradients, exp_avg, exp_avg_sq, step;
};
State start(std::uint64_t seed) {
  torch::manual_seed(seed);
  const torch::Tensor parameters = torch::randn({epoch_kernel::kParameters}) * 0.05;
  return {parameters, torch::zeros_like(parameters), torch::zeros_like(parameters),
          torch::zeros_like(parameters), torch::zeros({})};
}

// The kernel on the CPU with `blocks` blocks: every step over `order` in batches of `batch`.
// Returns the losses; `*syncs`, the grid barriers it passed; `clock`, the phases' times.
torch::Tensor emulated_epoch(State& s, const torch::Tensor& images, const torch::Tensor& labels,
                             const torch::Tensor& order, std::int64_t batch, unsigned blocks,
                             std::int64_t* syncs, torch::Tensor& clock) {
  const std::int64_t steps = (order.size(0) + batch - 1) / batch;
  clock = torch::full({epoch_kernel::kGridSyncsPerStep * steps + 1}, -1, torch::kLong);
  torch::Tensor losses = torch::full({steps}, -1.0f);
  torch::Tensor scratch = torch::full({epoch_kernel::kScratchFloats}, std::nanf(""));
  const epoch_kernel::EpochArgs args{s.parameters.data_ptr<float>(),
                                     s.gradients.data_ptr<float>(),
                                     s.exp_avg.data_ptr<float>(),
                                     s.exp_avg_sq.data_ptr<float>(),
                                     s.step.data_ptr<float>(),
                                     images.data_ptr<float>(),
                                     labels.data_ptr<std::int64_t>(),
                                     order.data_ptr<std::int64_t>(),
                                     images.size(0),
                                     order.size(0),
                                     batch,
                                     static_cast<float>(kLearningRate),
                                     losses.data_ptr<float>(),
                                     scratch.data_ptr<float>(),
                                     clock.data_ptr<std::int64_t>()};
  *syncs =
      cuda_emulation::launch_cooperative(blocks, epoch_kernel::kThreads, epoch_kernel::kSharedBytes,
                                         [&] { epoch_kernel::train_epoch_kernel(args); });
  return losses;
}

// The operator's CPU implementation on the same start and batches.
torch::Tensor reference_epoch(State& s, const torch::Tensor& images, const torch::Tensor& labels,
                              const torch::Tensor& order, std::int64_t batch) {
  const auto op = c10::Dispatcher::singleton()
                      .findSchemaOrThrow(epoch_op::kName, "")
                      .typed<epoch_op::TrainEpoch>();
  return op.call(s.parameters, s.gradients, s.exp_avg, s.exp_avg_sq, s.step, images, labels, order,
                 batch, kLearningRate, /*clock=*/{});
}

// The kernel against the reference for one grid of `blocks`, `steps` batches of `batch` rows
// (the last `last` rows).
void expect_kernel_matches(unsigned blocks, std::int64_t batch, std::int64_t steps,
                           std::int64_t last) {
  torch::manual_seed(21);
  const torch::Tensor images = torch::rand({300, epoch_kernel::kIn});
  const torch::Tensor labels = torch::randint(epoch_kernel::kClasses, {300}, torch::kLong);
  const torch::Tensor order =
      torch::randperm(300, torch::kLong).narrow(0, 0, (steps - 1) * batch + last);
  State kernel = start(4), reference = start(4);
  std::int64_t syncs = 0;
  torch::Tensor clock;
  const torch::Tensor got =
      emulated_epoch(kernel, images, labels, order, batch, blocks, &syncs, clock);
  const torch::Tensor expected = reference_epoch(reference, images, labels, order, batch);
  ASSERT_EQ(got.size(0), steps);
  EXPECT_LE(course::max_rel_diff(got, expected), course::kFloatTolerance) << got << expected;
  // The gradients are the last step's; the rest is after Adam. Adam moves a parameter by about
  // lr whatever its gradient's size, so a gradient near zero (a sum that cancels), rounded
  // otherwise, moves its parameter otherwise: by a small part of lr, where a wrong step moves it
  // by lr or more.
  EXPECT_LE(course::max_rel_diff(kernel.gradients, reference.gradients), course::kFloatTolerance);
  EXPECT_LE(course::max_abs_diff(kernel.parameters, reference.parameters), kLearningRate / 100);
  EXPECT_LE(course::max_rel_diff(kernel.exp_avg, reference.exp_avg), course::kFloatTolerance);
  EXPECT_LE(course::max_rel_diff(kernel.exp_avg_sq, reference.exp_avg_sq), course::kFloatTolerance);
  EXPECT_EQ(kernel.step.item<double>(), static_cast<double>(steps));
  EXPECT_EQ(syncs, epoch_kernel::kGridSyncsPerStep * steps);
  // The clock: the start, then a time after each barrier, each no earlier than the one before.
  EXPECT_GT(clock[0].item<std::int64_t>(), 0);
  EXPECT_TRUE((clock.narrow(0, 1, clock.size(0) - 1) >= clock.narrow(0, 0, clock.size(0) - 1))
                  .all()
                  .item<bool>())
      << clock;
}

}  // namespace

// Tests the kernel on the tutorial's batch of 64 (every row tile of phase 1, every row of the
// scratch), then a last batch of 5 (its one row tile cut short), with fewer blocks than phase 1
// has tiles and phase 2 rows: each block takes several in turn (on a GPU, with a block per SM,
// one or none).
TEST(EpochKernel, ThreeBlocksTrainAsTheCpuImplementation) { expect_kernel_matches(3, 64, 2, 5); }

// Tests the kernel with more blocks than a step has rows and tiles (idle blocks still meet at
// every barrier), batches of 7, the last of one row.
TEST(EpochKernel, BlocksWithNothingToDoStillMeetAtTheBarriers) {
  expect_kernel_matches(17, 7, 2, 1);
}
