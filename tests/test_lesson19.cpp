// Tests of lesson 19: DeviceAdam against LibTorch's Adam, and the graphed step against the eager
// step (on a GPU), with the lesson's own functions and constants.
#include <gtest/gtest.h>

// The lesson is one file with its own main(); the tests include it for its functions.
#define GPU_LESSONS_NO_MAIN
#include "common/compare.h"
#include "cuda_graphs.cpp"
#include "cuda_test.h"
#include "fashion_mnist_test.h"

namespace {

// DeviceAdam and torch::optim::Adam fed the same gradients for `steps` steps, on `device`: the
// largest difference between their parameters. The gradients come from no model: a tenth of them
// exactly zero, the others of every size, independent of the parameters, so that any difference
// comes from the two optimizers, not from training feeding it back.
double device_adam_against_libtorch(const torch::Device& device, int steps) {
  torch::manual_seed(21);
  const auto on = torch::TensorOptions().device(device);
  const torch::Tensor start = torch::randn({4096}, on) * 0.1;
  torch::Tensor mine = start.clone().requires_grad_(), theirs = start.clone().requires_grad_();
  lesson19::DeviceAdam device_adam({mine}, lesson19::kLearningRate);
  torch::optim::Adam adam({theirs}, torch::optim::AdamOptions(lesson19::kLearningRate));
  for (int step = 0; step < steps; ++step) {
    const torch::Tensor g = torch::randn({4096}, on) *
                            torch::pow(10.0, torch::randint(-6, 1, {4096}, on)) *
                            (torch::rand({4096}, on) > 0.1);
    mine.mutable_grad() = g.clone();
    theirs.mutable_grad() = g.clone();
    device_adam.step();
    adam.step();
  }
  const auto& state =
      static_cast<const torch::optim::AdamParamState&>(*adam.state().begin()->second);
  EXPECT_EQ(state.step(), steps);
  EXPECT_EQ(device_adam.steps().item<double>(), steps);
  return course::max_abs_diff(mine, theirs);
}

// `steps` batches of random images and labels, on `device`.
lesson19::Batches random_batches(std::int64_t steps, const torch::Device& device) {
  torch::manual_seed(2);
  const auto on = torch::TensorOptions().device(device);
  return {torch::rand({steps * lesson19::kBatchSize, 784}, on),
          torch::randint(10, {steps * lesson19::kBatchSize}, on.dtype(torch::kLong))};
}

}  // namespace

// Tests that Adam with its step count and bias corrections on the device takes the same 1,000
// steps as LibTorch's Adam: parameters within 1e-6 (they move by up to 1 in all; each step may
// round its last bit differently, since the device version folds lr / bias1 into the divisor).
TEST(DeviceAdam, SameStepsAsLibTorchsAdamOnCpu) {
  EXPECT_LE(device_adam_against_libtorch(torch::kCPU, 1000), 1e-6);
}

// Tests that DeviceAdam's zero_grad() zeroes each gradient where it lies (the addresses a graph
// reads), where LibTorch 2.x's optimizer.zero_grad() would set it to none.
TEST(DeviceAdam, ZeroGradKeepsEachGradientInPlace) {
  course::ANN model;
  lesson19::DeviceAdam adam(model->parameters(), lesson19::kLearningRate);
  model->forward(torch::rand({4, 784})).sum().backward();
  std::vector<const void*> before;
  for (const auto& p : model->parameters()) before.push_back(p.grad().data_ptr());
  adam.zero_grad();
  const auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_TRUE(params[i].grad().defined());
    EXPECT_EQ(params[i].grad().data_ptr(), before[i]);
    EXPECT_EQ(params[i].grad().abs().sum().item<double>(), 0.0);
  }
}

// Tests the lesson's first check on random batches: DeviceAdam trains as LibTorch's Adam, within
// the lesson's tolerance.
TEST(DeviceAdam, TrainsAsLibTorchsAdam) {
  const lesson19::Batches batches = random_batches(20, torch::kCPU);
  EXPECT_LE(lesson19::device_adam_vs_libtorch(batches, 60, torch::kCPU, lesson19::kSeed),
            lesson19::kAdamTolerance);
}

// Tests that a CUDA graph needs a CUDA device: a clear error, not a crash.
TEST(GraphedStep, NeedsCuda) {
  course::ANN model;
  lesson19::DeviceAdam adam(model->parameters(), lesson19::kLearningRate);
  EXPECT_THROW(lesson19::GraphedStep(model, adam, 64, torch::kCPU), course::CourseError);
}

// Tests the lesson's run on the CPU with the real data: its checks pass, and the graph says it
// was skipped rather than failing.
TEST_F(FashionMnistTest, LessonPassesOnCpu) {
  course::Verdict verdict;
  lesson19::run_lesson(course::take(train(), 5000), lesson19::kQuickSteps, torch::kCPU,
                       lesson19::kSeed, verdict);
  EXPECT_TRUE(verdict.passed());
  EXPECT_EQ(verdict.checks(), 1);  // DeviceAdam's; the graph's needs CUDA
}

// Tests DeviceAdam against LibTorch's Adam on the GPU too.
TEST_F(CudaTest, DeviceAdamSameStepsAsLibTorchsAdam) {
  EXPECT_LE(device_adam_against_libtorch(device, 1000), 1e-6);
}

// Tests the graphed step: captured after its warm-up, and its losses equal the eager step's on
// the same batches over many steps (a host number frozen at capture would show within a few).
TEST_F(CudaTest, GraphedStepEqualsEagerStep) {
  const lesson19::Batches batches = random_batches(50, device);
  EXPECT_LE(lesson19::graphed_vs_eager(batches, lesson19::kSteps, device, lesson19::kSeed),
            lesson19::kGraphTolerance);
}

// Tests that replays train: the step count on the device counts every replay, and the loss falls.
TEST_F(CudaTest, ReplaysCountAndTrain) {
  const lesson19::Batches batches = random_batches(8, device);
  course::ANN model;
  model->to(device);
  lesson19::DeviceAdam adam(model->parameters(), lesson19::kLearningRate);
  lesson19::GraphedStep graph(model, adam, lesson19::kBatchSize, device);
  graph.images.copy_(batches.images_of(0));
  graph.labels.copy_(batches.labels_of(0));
  graph.step();
  const double first = graph.loss.item<double>();
  for (int i = 1; i < 100; ++i) graph.step();
  EXPECT_TRUE(graph.captured());
  EXPECT_EQ(adam.steps().item<double>(), 100);
  EXPECT_LT(graph.loss.item<double>(), first);
}
