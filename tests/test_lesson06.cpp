// Tests of lesson 06: graphs, inference tensors, peak memory and dropout under each mode.
#include <gtest/gtest.h>

// The lesson is one file with its own main(); the tests include it for its functions.
#define GPU_LESSONS_NO_MAIN
#include "cuda_test.h"
#include "no_grad_eval.cpp"

namespace {

void expect_lesson_facts(const torch::Device& device) {
  course::install_counting_cpu_allocator();  // the CPU's meter, as the lesson's first read does
  torch::manual_seed(lesson06::kSeed);
  lesson06::ANN model;
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

// `n` random images with random labels, as the tutorial's test loader gives them.
course::ImageSet random_images(std::int64_t n) {
  return course::ImageSet{torch::rand({n, 28, 28}), torch::randint(10, {n}, torch::kLong)};
}

// The tutorial's accuracy counted again, batch by batch as its loader cuts them, with the
// model's own forward: the same shapes, so the same logits to the bit.
double accuracy_counted(lesson06::ANN& model, const course::ImageSet& set) {
  torch::NoGradGuard no_grad;
  model->eval();
  std::int64_t correct = 0;
  for (std::int64_t start = 0; start < set.labels.size(0); start += lesson06::kBatchSize) {
    const torch::Tensor logits =
        model->forward(set.images.slice(0, start, start + lesson06::kBatchSize).unsqueeze(1));
    correct += (logits.argmax(1) == set.labels.slice(0, start, start + lesson06::kBatchSize))
                   .sum()
                   .item<std::int64_t>();
  }
  return static_cast<double>(correct) / static_cast<double>(set.labels.size(0));
}

}  // namespace

// Tests the tutorial's loop: no graph recorded, every image counted once, and the accuracy that
// the model's predictions give.
TEST(Tutorial, EvaluatesWithoutAGraph) {
  torch::manual_seed(lesson06::kSeed);
  lesson06::ANN model;
  model->train();                                   // the loop itself must switch to eval mode
  const course::ImageSet set = random_images(200);  // batches of 64, 64, 64 and 8
  auto loader = lesson06::make_test_loader(course::FashionMNIST(set));
  const lesson06::Evaluation evaluation = lesson06::tutorial_evaluate(model, *loader, torch::kCPU);
  EXPECT_FALSE(evaluation.recorded_graph);
  EXPECT_FALSE(model->is_training());
  EXPECT_EQ(evaluation.accuracy, accuracy_counted(model, set));
}

// Tests the graph, memory and inference facts on the CPU.
TEST(Modes, GraphAndMemoryOnCpu) { expect_lesson_facts(torch::kCPU); }

// Tests that all three modes compute the same logits.
TEST(Modes, SameLogits) {
  torch::manual_seed(lesson06::kSeed);
  lesson06::ANN model;
  model->eval();
  const torch::Tensor x = torch::rand({1200, 784});
  const torch::Tensor a = lesson06::evaluate_in_mode(model, x, lesson06::Mode::kGrad).detach();
  EXPECT_EQ(a.size(0), 1200);
  EXPECT_TRUE(torch::equal(a, lesson06::evaluate_in_mode(model, x, lesson06::Mode::kNoGrad)));
  EXPECT_TRUE(torch::equal(a, lesson06::evaluate_in_mode(model, x, lesson06::Mode::kInference)));
}

// Tests that autograd refuses an inference tensor, with LibTorch's message.
TEST(InferenceMode, TensorCannotBeSavedForBackward) {
  lesson06::ANN model;
  const std::string error = lesson06::inference_tensor_error(model, torch::rand({4, 784}));
  EXPECT_NE(error.find("Inference tensors cannot be saved for backward"), std::string::npos)
      << error;
}

// Tests dropout: different outputs in train mode, identical ones in eval mode.
TEST(Dropout, TrainDiffersEvalRepeats) {
  lesson06::ANN model;
  const torch::Tensor x = torch::rand({64, 784});
  EXPECT_FALSE(lesson06::repeat_is_identical(model, x, /*train_mode=*/true));
  EXPECT_TRUE(lesson06::repeat_is_identical(model, x, /*train_mode=*/false));
  EXPECT_FALSE(model->is_training());
}

// Tests the same facts on the GPU, measured with the CUDA caching allocator's statistics.
TEST_F(CudaTest, GraphAndMemoryOnGpu) {
  expect_lesson_facts(device);
  torch::manual_seed(lesson06::kSeed);
  lesson06::ANN model;
  model->to(device);
  auto loader = lesson06::make_test_loader(course::FashionMNIST(random_images(200)));
  EXPECT_FALSE(lesson06::tutorial_evaluate(model, *loader, device).recorded_graph);
}
