// Tests of lesson 21: each faster form against the form before it, the shuffle on the device, the
// fused step's operators, and the graphed epoch (on a GPU), with the lesson's own functions and
// constants.
#include <gtest/gtest.h>

// The lesson is one file with its own main(); the tests include it for its functions.
#define GPU_LESSONS_NO_MAIN
#include "common/compare.h"
#include "cuda_test.h"
#include "fashion_mnist_test.h"
#include "fastest_epoch.cpp"

namespace {

// `samples` random images and labels, as a training split.
course::ImageSet random_images(std::int64_t samples) {
  torch::manual_seed(3);
  return {torch::rand({samples, 28, 28}), torch::randint(10, {samples}, torch::kLong)};
}

// `steps` batches of `data` in one shuffled order, on the CPU.
lesson21::EpochData shuffled_batches(const course::ImageSet& data, int steps) {
  lesson21::DeviceShuffler shuffler(data, torch::kCPU);
  lesson21::EpochData batches(steps * lesson21::kBatchSize, lesson21::kBatchSize, torch::kCPU);
  shuffler.shuffle(batches);
  return batches;
}

// `step` on each of `batches`; each step's loss.
torch::Tensor train_steps(lesson21::EpochData& batches, const lesson21::Step& step) {
  for (std::int64_t k = 0; k < batches.steps(); ++k)
    step(batches.batch_images[k], batches.batch_labels[k], batches.loss_slots[k]);
  return batches.losses.clone();
}

}  // namespace

// Tests that an epoch's batches are slices of 64 covering every sample once, the last one smaller,
// each with a slot for its loss.
TEST(EpochData, SlicesOfTheBatchSizeAndASmallerLastOne) {
  lesson21::EpochData epoch(150, 64, torch::kCPU);
  ASSERT_EQ(epoch.steps(), 3);
  EXPECT_EQ(epoch.batch_images[0].size(0), 64);
  EXPECT_EQ(epoch.batch_images[2].size(0), 22);
  EXPECT_EQ(epoch.batch_labels[2].size(0), 22);
  EXPECT_EQ(epoch.losses.size(0), 3);
  // Views into the epoch's own tensors: a shuffle into them is what each step reads.
  EXPECT_EQ(epoch.batch_images[1].data_ptr(), epoch.images[64].data_ptr());
  EXPECT_EQ(epoch.loss_slots[2].data_ptr(), epoch.losses[2].data_ptr());
}

// Tests that the shuffle draws as LibTorch's RandomSampler does (an order as it is made, another
// per epoch, from the global generator), so that on the CPU the resident form sees lesson 05's
// batches; and that it writes every sample once.
TEST(DeviceShuffler, DrawsTheSamplersOrdersAndKeepsEverySample) {
  const course::ImageSet data = random_images(200);
  torch::manual_seed(11);
  lesson21::DeviceShuffler shuffler(data, torch::kCPU);
  lesson21::EpochData epoch(200, 64, torch::kCPU);
  shuffler.shuffle(epoch);
  torch::manual_seed(11);
  torch::randperm(200, torch::kLong);  // the sampler's order as it is made
  const torch::Tensor order = torch::randperm(200, torch::kLong);  // and the first epoch's
  EXPECT_TRUE(torch::equal(epoch.labels, data.labels.index_select(0, order)));
  EXPECT_TRUE(torch::equal(epoch.images, data.images.reshape({-1, 784}).index_select(0, order)));
}

// Tests that the fused step trains as the tutorial's step on the same batches, within the lesson's
// tolerance.
TEST(Forms, FusedTrainsAsTheTutorial) {
  lesson21::EpochData batches = shuffled_batches(random_images(640), 10);
  lesson21::Trainer tutorial = lesson21::make_trainer(torch::kCPU, lesson21::kSeed);
  lesson21::FlatTrainer fused = lesson21::make_flat_trainer(torch::kCPU, lesson21::kSeed);
  const torch::Tensor expected = train_steps(
      batches, [&](auto& x, auto& y, auto l) { lesson21::tutorial_step(tutorial, x, y, l); });
  const torch::Tensor by_fused =
      train_steps(batches, [&](auto& x, auto& y, auto l) { lesson21::fused_step(fused, x, y, l); });
  EXPECT_LE(lesson21::relative_difference(by_fused, expected), lesson21::kStepTolerance);
}

// Tests that the fused step computes autograd's loss and gradients, on a batch of another size too
// (an epoch's last: buffers of its own). Gradients, not parameters: Adam's first step moves each
// parameter by about lr whatever its gradient's size, so a gradient near zero rounded otherwise
// may move its parameter otherwise.
TEST(Forms, FusedStepGivesAutogradsGradientsOnASmallerBatch) {
  lesson21::Trainer tutorial = lesson21::make_trainer(torch::kCPU, lesson21::kSeed);
  lesson21::FlatTrainer fused = lesson21::make_flat_trainer(torch::kCPU, lesson21::kSeed);
  const torch::Tensor x = torch::rand({22, 784}), y = torch::randint(10, {22}, torch::kLong);
  torch::Tensor expected = torch::zeros({}), got = torch::zeros({});
  lesson21::tutorial_step(tutorial, x, y, expected);
  lesson21::fused_step(fused, x, y, got);
  EXPECT_EQ(fused.buffers.count(22), 1u);
  EXPECT_NEAR(got.item<double>(), expected.item<double>(), 1e-6);
  std::vector<torch::Tensor> grads;  // autograd's, in the flat tensor's order (parameters())
  for (const auto& p : tutorial.model->parameters()) grads.push_back(p.grad().flatten());
  EXPECT_LE(course::max_abs_diff(fused.flat.gradients, torch::cat(grads)), 1e-6);
}

// Tests what the fused form is for: fewer operators per step than the tutorial's step (counted by
// the lesson's own function).
TEST(Forms, FusedStepDispatchesFewerOperators) {
  const course::ImageSet data = random_images(128);
  const long long tutorial = lesson21::operators_per_step("resident", data, torch::kCPU, 1);
  const long long fused = lesson21::operators_per_step("fused", data, torch::kCPU, 1);
  EXPECT_LT(fused, tutorial / 2);
}

// Tests that the fused form uses LibTorch's fused Adam where this LibTorch has it for the CPU
// (2.4 and later), and that its step is LibTorch's Adam: 200 steps on gradients from no model.
TEST(FusedAdam, SameStepsAsLibTorchsAdam) {
  if (!lesson21::has_fused_adam(torch::kCPU)) GTEST_SKIP() << "this LibTorch has no CPU fused Adam";
  lesson21::FlatTrainer fused = lesson21::make_flat_trainer(torch::kCPU, lesson21::kSeed);
  torch::Tensor theirs = fused.flat.values.detach().clone().requires_grad_();
  torch::optim::Adam adam({theirs}, torch::optim::AdamOptions(lesson21::kLearningRate));
  torch::manual_seed(4);
  for (int i = 0; i < 200; ++i) {
    const torch::Tensor g = torch::randn_like(theirs) * 0.1;
    fused.flat.gradients.copy_(g);
    theirs.mutable_grad() = g.clone();
    fused.step.add_(1);
    at::_fused_adam_({fused.flat.values}, {fused.flat.gradients}, {fused.exp_avg},
                     {fused.exp_avg_sq}, {}, {fused.step}, lesson21::kLearningRate,
                     lesson21::kBeta1, lesson21::kBeta2, 0, lesson21::kEpsilon, false, false);
    adam.step();
  }
  EXPECT_EQ(fused.step.item<double>(), 200);
  EXPECT_LE(course::max_abs_diff(fused.flat.values, theirs), 1e-6);
}

// Tests that a graph asked for on the CPU is a clear error naming the fix.
TEST(GraphedEpoch, OnTheCpuSaysItNeedsCuda) {
  lesson21::FlatTrainer trainer = lesson21::make_flat_trainer(torch::kCPU, 1);
  lesson21::EpochData epoch(64, 64, torch::kCPU);
  try {
    lesson21::GraphedEpoch graph(trainer, epoch, lesson21::fused_step);
    FAIL() << "no error";
  } catch (const course::CourseError& error) {
    EXPECT_NE(std::string(error.what()).find("needs a CUDA device"), std::string::npos);
    EXPECT_NE(error.hint().find("--device cuda"), std::string::npos);
  }
}

// Tests the lesson's checks on the real data: each form's losses equal the form before it's.
class FormsOnFashionMnist : public FashionMnistTest {};
TEST_F(FormsOnFashionMnist, EachFormTrainsAsTheOneBefore) {
  const auto losses = lesson21::losses_on_same_batches(train(), 20, torch::kCPU, lesson21::kSeed);
  EXPECT_EQ(losses.count("graphed"), 0u);  // on the CPU: no graph
  EXPECT_LE(lesson21::relative_difference(losses.at("fused"), losses.at("tutorial")),
            lesson21::kStepTolerance);
}

// Tests, on a GPU, that the graphed epoch trains as the fused step run eagerly, and that a second
// replay carries on from the first (the step count and the moments on the device), as a second
// eager pass over the same batches does; and that the graph's kernels were counted.
class GraphedOnCuda : public CudaTest {};
TEST_F(GraphedOnCuda, GraphedEpochTrainsAsTheFusedStep) {
  const course::ImageSet data = random_images(64 * 30);
  double kernels = 0;
  const auto losses = lesson21::losses_on_same_batches(data, 30, device, lesson21::kSeed, &kernels);
  ASSERT_EQ(losses.count("graphed"), 1u);
  EXPECT_LE(lesson21::relative_difference(losses.at("graphed"), losses.at("fused")),
            lesson21::kStepTolerance);
  EXPECT_GE(kernels, 10);  // about twenty kernels a step (LibTorch 2.8 and later count them)
  lesson21::DeviceShuffler shuffler(data, device);
  lesson21::EpochData epoch(64 * 30, 64, device);
  shuffler.shuffle(epoch);
  lesson21::FlatTrainer eager = lesson21::make_flat_trainer(device, lesson21::kSeed);
  lesson21::FlatTrainer graphed = lesson21::make_flat_trainer(device, lesson21::kSeed);
  lesson21::GraphedEpoch graph(graphed, epoch, lesson21::fused_step);  // warm-up: state put back
  for (int pass = 0; pass < 2; ++pass) {
    graph.replay();
    const torch::Tensor by_graph = epoch.losses.clone();
    for (std::int64_t k = 0; k < epoch.steps(); ++k)
      lesson21::fused_step(eager, epoch.batch_images[k], epoch.batch_labels[k],
                           epoch.loss_slots[k]);
    EXPECT_LE(lesson21::relative_difference(by_graph, epoch.losses), lesson21::kStepTolerance)
        << "pass " << pass;
  }
  EXPECT_EQ(graphed.step.item<double>(), 60);
  EXPECT_EQ(eager.step.item<double>(), 60);
}
