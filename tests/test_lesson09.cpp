// Tests of lesson 09: DataParallel's forward and its steps against one model, the rendezvous and
// the collectives on real c10d groups (Gloo ranks as threads of this process, meeting in a
// TCPStore or a HashStore), training ranks that end equal, and NCCL on a GPU. The sharding of an
// epoch across ranks (distributed/sampler.h) is tested in tests/distributed/test_sampler.cpp. The
// two-process jobs (a rank killed, a rank missing) run the program itself (tests/test_programs.cpp,
// Jobs); lesson 17 tests what happens when ranks fail.
#include <gtest/gtest.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

// The lesson is one file with its own main(); the tests include it for its functions.
#define GPU_LESSONS_NO_MAIN
#include "data_parallel.cpp"
#include "fashion_mnist_test.h"
#include "ranks_test.h"

namespace {

// ---- part 1 -------------------------------------------------------------------------------------
// Tests that a DataParallel step (replicas on CPU threads) gives one model's loss and gradients on
// the whole batch, leaves them on the model's parameters, and does not touch its values.
TEST(Lesson09DataParallel, MatchesOneModelOnTheWholeBatch) {
  for (const auto dtype : {torch::kFloat, torch::kDouble}) {
    for (int replicas : {2, 3}) {  // 3 does not divide the batch: chunks of 34, 34, 32
      torch::manual_seed(1);
      lesson09::ANN model;
      model->to(dtype);
      lesson09::ANN one = std::dynamic_pointer_cast<lesson09::ANNImpl>(model->clone());
      const torch::Tensor before =
          torch::nn::utils::parameters_to_vector(model->parameters()).clone();
      torch::manual_seed(2);
      const torch::Tensor x = torch::randn({100, 28, 28}, dtype);
      const torch::Tensor y = torch::randint(10, {100}, torch::kLong);
      const torch::Tensor loss = lesson09::data_parallel_step(
          model, x, y, std::vector<torch::Device>(replicas, torch::kCPU));
      const torch::Tensor one_loss = torch::nn::functional::cross_entropy(one->forward(x), y);
      one_loss.backward();
      const double tol = course::tolerance_for(dtype);
      EXPECT_LE(course::max_rel_diff(loss, one_loss), tol) << dtype << " " << replicas;
      EXPECT_LE(course::max_rel_diff(course::gradients(model->parameters()),
                                     course::gradients(one->parameters())),
                tol)
          << dtype << " " << replicas;
      EXPECT_TRUE(
          torch::equal(torch::nn::utils::parameters_to_vector(model->parameters()), before));
    }
  }
}

// Tests the tutorial's forward through DataParallel without a GPU: the model's own forward, as
// Python's DataParallel runs the module as it is when it has no GPUs.
TEST(Lesson09DataParallel, WithoutAGpuTheModelRunsAsItIs) {
  torch::manual_seed(1);
  lesson09::ANN model;
  const torch::Tensor x = torch::randn({10, 28, 28});
  EXPECT_TRUE(torch::equal(lesson09::data_parallel_forward(model, x), model->forward(x)));
}

// Tests that a replica is a deep copy on its device, with the model's layers (the relu module
// too): changing it leaves the model alone.
TEST(Lesson09DataParallel, ReplicasAreCopies) {
  lesson09::ANN model;
  auto replica = std::dynamic_pointer_cast<lesson09::ANNImpl>(model->clone(torch::kCPU));
  {
    torch::NoGradGuard no_grad;
    replica->fc1->weight.add_(1);
  }
  EXPECT_FALSE(torch::equal(replica->fc1->weight, model->fc1->weight));
  EXPECT_EQ(replica->named_parameters().keys(), model->named_parameters().keys());
  EXPECT_EQ(replica->named_children().keys(), model->named_children().keys());
}

// Tests part 1's program, the tutorial's (lesson 05's loop, its forward pass through
// data_parallel_forward), on the CPU: one epoch on 3,000 images beats chance well.
class Lesson09Part1 : public FashionMnistTest {};
TEST_F(Lesson09Part1, TheTutorialsLoopLearns) {
  const course::ImageSet data{train().images.slice(0, 0, 3000), train().labels.slice(0, 0, 3000)};
  lesson09::ANN model =
      lesson09::train_one_epoch(course::FashionMNIST(data), torch::kCPU, lesson09::kSeed);
  EXPECT_GT(course::test_accuracy(model, test(), torch::kCPU), 0.5);
}

// ---- the rendezvous and the collectives -------------------------------------------------------
// Tests init_process_group's two steps as the lesson's ranks take them: three ranks meet at a
// TCPStore that rank 0 hosts and form a Gloo group; rank 0's parameters reach every rank; the
// gradients' bucket is summed and copied back into every gradient, a rank with none adding zeros.
TEST_F(GlooTest, RanksMeetAndSumTheirGradients) {
  constexpr int kWorld = 3;
  const int port = course::free_tcp_port();
  const std::chrono::milliseconds timeout(30000);
  std::vector<torch::Tensor> params(kWorld), grads(kWorld);
  on_ranks(kWorld, [&](int rank) {
    course::RankInfo info;
    info.rank = rank;
    info.world_size = kWorld;
    info.master_port = port;
    auto group = lesson09::make_group(lesson09::connect_store(info, timeout), rank, kWorld,
                                      torch::kCPU, timeout);
    lesson09::ANN model;
    for (auto& p : model->parameters()) p.detach().fill_(rank);  // rank r's weights all r
    lesson09::broadcast_parameters(*group, model->parameters(), timeout);
    for (auto& p : model->parameters()) {
      if (rank != 2) p.mutable_grad() = torch::full_like(p, rank + 1.0);  // rank 2: no samples
    }
    lesson09::allreduce_gradients(*group, model->parameters(), timeout);
    params[rank] = torch::nn::utils::parameters_to_vector(model->parameters()).detach();
    grads[rank] = torch::cat({model->fc1->weight.grad().flatten(), model->out->bias.grad()});
    torch::Tensor sum = torch::arange(1000, torch::kFloat) * static_cast<float>(rank + 1);
    lesson09::allreduce_sum(*group, sum, timeout);
    EXPECT_TRUE(torch::equal(sum, torch::arange(1000, torch::kFloat) * 6.0f)) << rank;
    course::shutdown_group(*group);
  });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(torch::equal(params[r], torch::zeros_like(params[r]))) << "rank " << r;
    EXPECT_TRUE(torch::equal(grads[r], torch::full_like(grads[r], 3.0f))) << "rank " << r;
  }
}

// Tests that a rank whose rendezvous does not exist (no rank 0) gives up after the timeout.
TEST(Lesson09Rendezvous, NoStoreIsAnErrorWithinTheTimeout) {
  course::RankInfo info;
  info.rank = 1;
  info.world_size = 2;
  info.master_port = course::free_tcp_port();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_ANY_THROW(lesson09::connect_store(info, std::chrono::milliseconds(1500)));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

// ---- training -----------------------------------------------------------------------------------
class Lesson09Training : public FashionMnistGlooTest {};

// Tests that ranks (threads, Gloo over a HashStore) end with the same parameters, bit for bit,
// also when a rank has no samples in the last step (more ranks than samples left): it still takes
// part in every all-reduce, so nobody waits for it.
TEST_F(Lesson09Training, RanksEndEqualAlsoWithAnEmptyLastShard) {
  constexpr int kWorld = 3;
  // Batches of 8 per rank: the last global step has 2 samples, all on rank 0.
  const course::ImageSet data{train().images.slice(0, 0, 50), train().labels.slice(0, 0, 50)};
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::uint64_t> sums(kWorld);
  on_ranks(kWorld, [&](int rank) {
    auto group = lesson09::make_group(store, rank, kWorld, torch::kCPU, std::chrono::seconds(60));
    lesson09::ANN model = lesson09::train_data_parallel(
        *group, rank, kWorld, data, 2, 8, torch::kCPU, lesson09::kSeed, std::chrono::seconds(60));
    sums[rank] = course::checksum(torch::nn::utils::parameters_to_vector(model->parameters()));
  });
  EXPECT_EQ(sums[0], sums[1]);
  EXPECT_EQ(sums[1], sums[2]);
}

// Tests that a job of one learns: lesson 05's loop on 3,000 images, one epoch, beats chance well.
TEST_F(Lesson09Training, AJobOfOneLearns) {
  const course::ImageSet data{train().images.slice(0, 0, 3000), train().labels.slice(0, 0, 3000)};
  auto group = lesson09::make_group(c10::make_intrusive<c10d::HashStore>(), 0, 1, torch::kCPU,
                                    std::chrono::seconds(60));
  lesson09::ANN model = lesson09::train_data_parallel(*group, 0, 1, data, 1, 64, torch::kCPU,
                                                      lesson09::kSeed, std::chrono::seconds(60));
  torch::NoGradGuard no_grad;
  const auto predicted = std::get<1>(torch::max(model->forward(test().images), 1));
  EXPECT_GT(predicted.eq(test().labels).to(torch::kDouble).mean().item<double>(), 0.5);
}

// ---- NCCL on a GPU ------------------------------------------------------------------------------
// Tests a job of one on NCCL (any one-GPU server): the group forms, the lesson's collectives give
// their results, and the group shuts down in order.
TEST(Lesson09Nccl, JobOfOneOnTheGpu) {
  if (course::cuda_device_count() == 0) GTEST_SKIP() << "needs CUDA";
#ifndef GPU_LESSONS_WITH_NCCL
  GTEST_SKIP() << "this build has no NCCL";
#endif
  const torch::Device gpu(torch::kCUDA, 0);
  auto group = lesson09::make_group(c10::make_intrusive<c10d::HashStore>(), 0, 1, gpu,
                                    std::chrono::seconds(60));
  torch::Tensor grads = torch::arange(1000, torch::TensorOptions().device(gpu));
  lesson09::allreduce_sum(*group, grads, std::chrono::seconds(60));
  EXPECT_TRUE(torch::equal(grads.cpu(), torch::arange(1000, torch::kFloat)));
  lesson09::ANN model;
  model->to(gpu);
  const torch::Tensor before = torch::nn::utils::parameters_to_vector(model->parameters()).cpu();
  lesson09::broadcast_parameters(*group, model->parameters(), std::chrono::seconds(60));
  EXPECT_TRUE(
      torch::equal(torch::nn::utils::parameters_to_vector(model->parameters()).cpu(), before));
  course::shutdown_group(*group);
}

// Tests two NCCL ranks (threads of this process, one GPU each) summing a tensor; needs two GPUs.
TEST(Lesson09Nccl, TwoRanksOnTwoGpusAllreduce) {
  if (course::cuda_device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
#ifndef GPU_LESSONS_WITH_NCCL
  GTEST_SKIP() << "this build has no NCCL";
#endif
  auto store = c10::make_intrusive<c10d::HashStore>();
  on_ranks(2, [&](int rank) {
    const torch::Device gpu(torch::kCUDA, static_cast<c10::DeviceIndex>(rank));
    auto group = lesson09::make_group(store, rank, 2, gpu, std::chrono::seconds(60));
    torch::Tensor grads = torch::arange(1000, torch::TensorOptions().device(gpu)) * (rank + 1.0);
    lesson09::allreduce_sum(*group, grads, std::chrono::seconds(60));
    EXPECT_TRUE(torch::equal(grads.cpu(), torch::arange(1000, torch::kFloat) * 3.0f)) << rank;
    course::shutdown_group(*group);
  });
}

}  // namespace
