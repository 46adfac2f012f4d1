// Tests of lesson 18, silent failures: on real ranks (threads of this process, Gloo), the checks
// of the failures that raise no error (the summed gradient against one process's, the ranks'
// parameters against rank 0's), which leave lesson 09's loop as it is, and the gradient check
// telling a wrong sum from a right one. The ranks of a real job check what they learn against one
// process (tests/test_programs.cpp).
#include <gtest/gtest.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

// The lesson is one file with its own main(); the tests include it for its functions.
#define GPU_LESSONS_NO_MAIN
#include "common/device.h"  // defines: cuda_device_count
#include "fashion_mnist_test.h"
#include "ranks_test.h"
#include "silent_failures.cpp"

namespace {

// Tests the check of silent failure 2 on a real Gloo group of three ranks: each rank is told
// whether it holds rank 0's value, bit for bit (rank 2's differs in its last bit).
TEST_F(GlooTest, EachRankToldWhetherItHoldsRank0sValue) {
  constexpr int kWorld = 3;
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::chrono::milliseconds timeout(30000);
  std::vector<int> same(kWorld);
  on_ranks(kWorld, [&](int rank) {
    auto group = lesson17::make_group(store, rank, kWorld, torch::kCPU, timeout);
    torch::Tensor values = torch::full({5}, rank == 2 ? 1.0f + 1e-7f : 1.0f);
    same[rank] = lesson18::equals_rank0(*group, values.view(torch::kInt), timeout);
    course::shutdown_group(*group);
  });
  EXPECT_EQ(same, (std::vector<int>{1, 1, 0}));
}

// Tests the same check on NCCL, a job of one on the GPU (any one-GPU server): rank 0 holds its
// own value.
TEST(Lesson18Nccl, Rank0HoldsItsOwnValueOnTheGpu) {
  if (course::cuda_device_count() == 0) GTEST_SKIP() << "needs CUDA";
#ifndef GPU_LESSONS_WITH_NCCL
  GTEST_SKIP() << "this build has no NCCL";
#endif
  const torch::Device gpu(torch::kCUDA, 0);
  const std::chrono::seconds timeout(60);
  auto group = lesson17::make_group(c10::make_intrusive<c10d::HashStore>(), 0, 1, gpu, timeout);
  const torch::Tensor values = torch::full({10}, 3.0f, torch::TensorOptions().device(gpu));
  EXPECT_TRUE(lesson18::equals_rank0(*group, values.view(torch::kInt), timeout));
  course::shutdown_group(*group);
}

// ---- the silent failures ------------------------------------------------------------------------
class Lesson18Training : public FashionMnistGlooTest {};

// Tests what data parallelism promises, on real ranks (threads, Gloo over a HashStore): every
// rank holds identical parameters after every step, and the summed gradient of the first steps is
// one process's gradient over the global batch from the same parameters. (What the ranks learn
// against one process is checked by the ranks of a real job: Jobs.TwoRanksPassWithTheSameParameters
// in tests/test_programs.cpp.)
TEST_F(Lesson18Training, SummedGradientIsTheGlobalBatchsGradient) {
  constexpr int kWorld = 2;
  constexpr std::int64_t kBatch = 32;
  const course::ImageSet data{train().images.slice(0, 0, 3000), train().labels.slice(0, 0, 3000)};
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::chrono::milliseconds timeout(60000);
  std::vector<lesson18::RankRun> runs(kWorld);
  on_ranks(kWorld, [&](int rank) {
    auto group = lesson17::make_group(store, rank, kWorld, torch::kCPU, timeout);
    runs[rank] = lesson18::train_checked(*group, rank, kWorld, data, 1, kBatch, torch::kCPU,
                                         lesson18::kSeed, timeout);
  });
  EXPECT_TRUE(
      torch::equal(lesson18::parameters(runs[0].model), lesson18::parameters(runs[1].model)));
  EXPECT_EQ(runs[0].trail.item<std::int64_t>(), runs[1].trail.item<std::int64_t>());
  for (int rank = 0; rank < kWorld; ++rank) {
    ASSERT_EQ(runs[rank].gradient_diffs.size(), static_cast<size_t>(lesson18::kCheckedSteps));
    for (const double d : runs[rank].gradient_diffs) {
      EXPECT_LE(d, course::tolerance_for(torch::kFloat)) << "rank " << rank;
    }
  }
}

// Tests that the checks leave lesson 09's loop as it is: a rank that trains with them
// (train_checked) and without them (lesson 09's train_data_parallel) ends with the same parameters,
// bit for bit, and the same loss. One rank, a group of one: ranks that are threads of one process
// draw their first weights from one generator, in an order that differs from run to run.
TEST_F(Lesson18Training, ChecksLeaveLesson09sLoopAsItIs) {
  const course::ImageSet data{train().images.slice(0, 0, 2000), train().labels.slice(0, 0, 2000)};
  const std::chrono::milliseconds timeout(60000);
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto group = lesson17::make_group(store, 0, 1, torch::kCPU, timeout);
  lesson18::RankRun checked =
      lesson18::train_checked(*group, 0, 1, data, 2, 64, torch::kCPU, lesson18::kSeed, timeout);
  std::vector<double> losses;
  course::ANN plain = lesson17::train_data_parallel(*group, 0, 1, data, 2, 64, torch::kCPU,
                                                    lesson18::kSeed, timeout, &losses);
  EXPECT_TRUE(torch::equal(lesson18::parameters(checked.model), lesson18::parameters(plain)));
  EXPECT_EQ(checked.losses, losses);
  EXPECT_EQ(checked.gradient_diffs.size(), static_cast<size_t>(lesson18::kCheckedSteps));
  course::shutdown_group(*group);
}

// Tests that the gradient check tells a wrong sum from a right one: the gradient of half of a
// global batch (a rank whose gradients were never summed) is far from the whole batch's, while
// the two halves' gradients added up are within the tolerance, from the same parameters.
TEST_F(Lesson18Training, GradientCheckCatchesAMissingRank) {
  torch::manual_seed(lesson18::kSeed);
  course::ANN model;
  const torch::Tensor all = torch::arange(128, torch::kLong);
  const torch::Tensor whole = lesson18::gradient_of_global_batch(model, train(), all, torch::kCPU);
  // Each half's gradient, scaled as a rank scales its share: (half's sum of losses) / 128.
  const torch::Tensor first =
      lesson18::gradient_of_global_batch(model, train(), all.slice(0, 0, 64), torch::kCPU) / 2;
  const torch::Tensor second =
      lesson18::gradient_of_global_batch(model, train(), all.slice(0, 64, 128), torch::kCPU) / 2;
  EXPECT_LE(course::relative_diff(first + second, whole), course::tolerance_for(torch::kFloat));
  EXPECT_GT(course::relative_diff(first, whole), 100 * course::tolerance_for(torch::kFloat));
  EXPECT_GT(course::relative_diff(2 * (first + second), whole), 0.5);  // averaged twice
}

}  // namespace
