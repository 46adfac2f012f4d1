// Tests of lesson 16, activation checkpointing: the same loss and gradients as the plain model,
// the RNG replayed for dropout, parameters reached without an input that requires grad, a lower
// peak memory, and the same on a real GPU.
#include <gtest/gtest.h>

// The lesson is one file with its own main(); the tests include it for its functions.
#define GPU_LESSONS_NO_MAIN
#include "activation_checkpointing.cpp"
#include "cuda_test.h"
#include "memory/memory.h"

namespace {

const torch::Device kCpu(torch::kCPU);

// Tests that checkpointed segments give the loss and gradients of the plain model, with dropout
// on, in fp32 and fp64, including the first segment whose input requires no grad.
TEST(ActivationCheckpointing, SameLossAndGradients) {
  for (const auto dtype : {torch::kFloat, torch::kDouble}) {
    torch::manual_seed(1);
    lesson16::DeepMlp model(/*depth=*/3 * lesson16::kSegment, /*width=*/64);
    model->to(dtype);
    const torch::Tensor x = torch::randn({32, 64}, dtype);
    const torch::Tensor y = torch::randint(0, 10, {32});
    ASSERT_FALSE(x.requires_grad());
    const auto plain = lesson16::step_gradients(model, x, y, false, 5);
    const auto kept = lesson16::step_gradients(model, x, y, true, 5);
    const double tolerance = course::tolerance_for(dtype);
    EXPECT_LE((plain.loss - kept.loss).abs().item<double>(), tolerance);
    EXPECT_LE(course::max_abs_diff(plain.gradients, kept.gradients), tolerance);
    // The first segment's weight: nothing upstream requires grad, yet it has its gradient.
    const torch::Tensor first = model->segments[0]->parameters()[0];
    ASSERT_TRUE(first.grad().defined());
    EXPECT_GT(first.grad().abs().sum().item<double>(), 0.0);
  }
}

// Tests that the input's gradient is returned when the input requires grad.
TEST(ActivationCheckpointing, InputGradient) {
  torch::manual_seed(2);
  lesson16::DeepMlp model(lesson16::kSegment, 32);
  model->eval();  // no dropout: the two forwards below draw no random numbers
  const torch::Tensor x0 = torch::randn({8, 32});
  torch::Tensor a = x0.clone().requires_grad_(true), b = x0.clone().requires_grad_(true);
  model->forward(a, false).sum().backward();
  model->forward(b, true).sum().backward();
  ASSERT_TRUE(b.grad().defined());
  EXPECT_LE((a.grad() - b.grad()).abs().max().item<double>(), 1e-5);
}

// Tests that replaying the RNG is what makes dropout match, and that backward leaves the
// generator where forward left it (the recomputation draws from a restored copy).
TEST(ActivationCheckpointing, RngReplay) {
  torch::manual_seed(3);
  lesson16::DeepMlp model(2 * lesson16::kSegment, 64);
  const torch::Tensor x = torch::randn({32, 64});
  const torch::Tensor y = torch::randint(0, 10, {32});
  const auto plain = lesson16::step_gradients(model, x, y, false, 9);
  const auto no_replay = lesson16::step_gradients(model, x, y, true, 9, /*preserve_rng=*/false);
  EXPECT_GT(course::max_abs_diff(plain.gradients, no_replay.gradients), 1e-4);

  model->train();
  torch::manual_seed(4);
  torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x, true), y);
  const torch::Tensor after_forward = torch::rand({4});
  torch::manual_seed(4);
  loss = torch::nn::functional::cross_entropy(model->forward(x, true), y);
  loss.backward();
  EXPECT_TRUE(torch::equal(torch::rand({4}), after_forward));
}

// Tests that checkpointing lowers a step's peak CPU memory on a model deep enough to matter.
TEST(ActivationCheckpointing, LowersPeakMemory) {
  course::install_counting_cpu_allocator();
  torch::manual_seed(5);
  lesson16::DeepMlp model(16, 256);
  const lesson16::StepCost plain = lesson16::measure_step(model, 512, false, kCpu);
  const lesson16::StepCost kept = lesson16::measure_step(model, 512, true, kCpu);
  EXPECT_GT(plain.peak_bytes, 0);
  EXPECT_LT(kept.peak_bytes, plain.peak_bytes * 6 / 10)
      << kept.peak_bytes << " vs " << plain.peak_bytes;
}

// Tests the same gradients on CUDA, where the CUDA generator is replayed.
TEST_F(CudaTest, ActivationCheckpointingSameGradients) {
  torch::manual_seed(6);
  lesson16::DeepMlp model(2 * lesson16::kSegment, 128);
  model->to(device);
  const torch::Tensor x = torch::randn({64, 128}, device);
  const auto labels = torch::TensorOptions(device).dtype(torch::kLong);  // a device alone: floats
  const torch::Tensor y = torch::randint(0, 10, {64}, labels);
  const auto plain = lesson16::step_gradients(model, x, y, false, 7);
  const auto kept = lesson16::step_gradients(model, x, y, true, 7);
  EXPECT_LE(course::max_abs_diff(plain.gradients, kept.gradients), 1e-5);
}

}  // namespace
