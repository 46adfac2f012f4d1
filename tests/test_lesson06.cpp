// Tests of lesson 06: graphs, inference tensors, peak memory and dropout under each mode.
#include <gtest/gtest.h>

// The lesson is one file with its own main(); the tests include it for its functions.
#define GPU_LESSONS_NO_MAIN
#include "cuda_test.h"
#include "no_grad_eval.cpp"

namespace {

void expect_lesson_facts(const torch::Device& device) {
  torch::manual_seed(lesson06::kSeed);
  lesson06::Classifier model;
  model->to(device);
  const torch::Tensor x = torch::rand({lesson06::kQuickSamples, 784}).to(device);
  using lesson06::Mode;
  const auto grad = lesson06::measure_pass(model, x, Mode::kGrad, device, 1);
  const auto no_grad = lesson06::measure_pass(model, x, Mode::kNoGrad, device, 1);
  const auto inference = lesson06::measure_pass(model, x, Mode::kInference, device, 1);
  EXPECT_TRUE(grad.requires_grad);
  EXPECT_TRUE(grad.has_grad_fn);
  EXPECT_FALSE(no_grad.requires_grad);
  EXPECT_FALSE(no_grad.has_grad_fn);
  EXPECT_FALSE(no_grad.is_inference);
  EXPECT_FALSE(inference.requires_grad);
  EXPECT_FALSE(inference.has_grad_fn);
  EXPECT_TRUE(inference.is_inference);
  // The graph keeps every batch's activations (128 + 64 floats a sample, at least).
  EXPECT_GE(grad.kept_bytes, lesson06::kQuickSamples * (128 + 64) * 4);
  EXPECT_LT(no_grad.peak_bytes, grad.peak_bytes);
  EXPECT_LT(inference.peak_bytes, grad.peak_bytes);
  // Without a graph only the logits (10 floats a sample) stay.
  EXPECT_LE(no_grad.kept_bytes, lesson06::kQuickSamples * 10 * 4 + 4096);
}

}  // namespace

// Tests the graph, memory and inference facts on the CPU.
TEST(Modes, GraphAndMemoryOnCpu) { expect_lesson_facts(torch::kCPU); }

// Tests that all three modes compute the same logits.
TEST(Modes, SameLogits) {
  torch::manual_seed(lesson06::kSeed);
  lesson06::Classifier model;
  model->eval();
  const torch::Tensor x = torch::rand({1200, 784});
  const torch::Tensor a = lesson06::evaluate_in_mode(model, x, lesson06::Mode::kGrad).detach();
  EXPECT_EQ(a.size(0), 1200);
  EXPECT_TRUE(torch::equal(a, lesson06::evaluate_in_mode(model, x, lesson06::Mode::kNoGrad)));
  EXPECT_TRUE(torch::equal(a, lesson06::evaluate_in_mode(model, x, lesson06::Mode::kInference)));
}

// Tests that autograd refuses an inference tensor, with LibTorch's message.
TEST(InferenceMode, TensorCannotBeSavedForBackward) {
  lesson06::Classifier model;
  const std::string error = lesson06::inference_tensor_error(model, torch::rand({4, 784}));
  EXPECT_NE(error.find("Inference tensors cannot be saved for backward"), std::string::npos)
      << error;
}

// Tests dropout: different outputs in train mode, identical ones in eval mode.
TEST(Dropout, TrainDiffersEvalRepeats) {
  lesson06::Classifier model;
  const torch::Tensor x = torch::rand({64, 784});
  EXPECT_FALSE(lesson06::repeat_is_identical(model, x, /*train_mode=*/true));
  EXPECT_TRUE(lesson06::repeat_is_identical(model, x, /*train_mode=*/false));
  EXPECT_FALSE(model->is_training());
}

// Tests the same facts on the GPU, measured with the CUDA caching allocator's statistics.
TEST_F(CudaTest, GraphAndMemoryOnGpu) { expect_lesson_facts(device); }
