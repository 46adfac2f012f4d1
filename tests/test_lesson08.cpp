// Tests of lesson 08: the AMP loop (autocast over the forward pass, the scaler's scale, step and
// update), what autocast does op by op, the lesson's checks of the scaler, and the accuracy of the
// tutorial's program with the AMP loop against fp32.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

// The lesson is one file with its own main(); the tests include it for its functions.
#define GPU_LESSONS_NO_MAIN
#include "cuda_test.h"
#include "fashion_mnist_test.h"
#include "mixed_precision.cpp"

namespace {

torch::ScalarType dtype_of(const std::vector<lesson08::OpDtype>& rows, const std::string& op) {
  for (const auto& row : rows) {
    if (row.op == op) return row.dtype;
  }
  ADD_FAILURE() << "no row for " << op;
  return torch::kFloat;
}

void expect_policy(const torch::Device& device, torch::ScalarType low) {
  const auto rows = lesson08::op_dtypes(device, low);
  EXPECT_EQ(dtype_of(rows, "linear"), low);
  EXPECT_EQ(dtype_of(rows, "matmul"), low);
  EXPECT_EQ(dtype_of(rows, "cross_entropy"), torch::kFloat);
  EXPECT_EQ(dtype_of(rows, "mse_loss"), torch::kFloat);
  EXPECT_EQ(dtype_of(rows, "weight gradient"), torch::kFloat);
  EXPECT_FALSE(lesson08::autocast_enabled(device.type()));  // the guard switched it off again
}

// Lesson 05's ANN, noting what its forward pass saw: whether autocast was on, the logits' dtype.
struct ProbeImpl : torch::nn::Module {
  ProbeImpl() : ann(register_module("ann", lesson08::ANN())) {}
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor logits = ann->forward(x);
    autocast_on.push_back(lesson08::autocast_enabled(x.device().type()));
    logits_dtype.push_back(logits.scalar_type());
    return logits;
  }
  lesson08::ANN ann;
  std::vector<bool> autocast_on;
  std::vector<torch::ScalarType> logits_dtype;
};
TORCH_MODULE(Probe);

// `n` batches of 8 random images and labels, on the CPU.
std::vector<torch::data::Example<>> batches(int n) {
  torch::manual_seed(3);
  std::vector<torch::data::Example<>> out;
  for (int i = 0; i < n; ++i) {
    out.push_back({torch::rand({8, 1, 28, 28}), torch::randint(10, {8}, torch::kLong)});
  }
  return out;
}

// The parameters of lesson 05's ANN after one train_epoch over `data` with SGD and `scaler`.
std::vector<torch::Tensor> trained_with(lesson08::GradScaler& scaler,
                                        std::vector<torch::data::Example<>> data) {
  torch::manual_seed(lesson08::kSeed);
  lesson08::ANN model;
  torch::nn::CrossEntropyLoss criterion;
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  lesson08::train_epoch(model, data, criterion, sgd, scaler, torch::kCPU, torch::kBFloat16,
                        /*use_amp=*/true);
  std::vector<torch::Tensor> params;
  for (const auto& p : model->parameters()) params.push_back(p.detach().clone());
  return params;
}

}  // namespace

// Tests the CPU autocast policy the lesson prints: bf16 matmuls, fp32 losses and gradients.
TEST(OpDtypes, CpuBf16Policy) { expect_policy(torch::kCPU, torch::kBFloat16); }

// Tests the lesson's own check of the policy on the CPU: one claim, which holds.
TEST(OpDtypes, LessonCheckPassesOnCpu) {
  course::Verdict verdict;
  lesson08::check_policy(torch::kCPU, verdict);
  EXPECT_EQ(verdict.checks(), 1);
  EXPECT_TRUE(verdict.passed());
}

// Tests that the AMP loop runs the forward pass under autocast (bf16 logits on the CPU) when
// use_amp is on, in fp32 when it is off, and leaves autocast off after each step.
TEST(AmpLoop, ForwardPassUnderAutocast) {
  for (const bool use_amp : {true, false}) {
    Probe model;
    torch::nn::CrossEntropyLoss criterion;
    torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
    lesson08::GradScalerOptions options;
    options.enabled = false;
    lesson08::GradScaler scaler(torch::kCPU, options);
    auto data = batches(2);
    lesson08::train_epoch(model, data, criterion, adam, scaler, torch::kCPU, torch::kBFloat16,
                          use_amp);
    EXPECT_EQ(model->autocast_on, std::vector<bool>(2, use_amp));
    const torch::ScalarType expected = use_amp ? torch::kBFloat16 : torch::kFloat;
    EXPECT_EQ(model->logits_dtype, std::vector<torch::ScalarType>(2, expected));
    EXPECT_FALSE(lesson08::autocast_enabled(torch::kCPU));
  }
}

// Tests that the loop goes through the scaler: with a scaler whose scale doubles after every
// clean step, the parameters are the ones an unscaled loop gives (the loss scaled by a power of
// two, the gradients unscaled, the step taken) and the scale doubled once per batch (update()).
TEST(AmpLoop, ScalesStepsAndUpdatesThroughTheScaler) {
  lesson08::GradScalerOptions off;
  off.enabled = false;
  lesson08::GradScaler plain(torch::kCPU, off);
  const auto expected = trained_with(plain, batches(3));

  lesson08::GradScalerOptions every_step;
  every_step.growth_interval = 1;
  lesson08::GradScaler scaler(torch::kCPU, every_step);
  const auto got = trained_with(scaler, batches(3));
  ASSERT_EQ(got.size(), expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(torch::allclose(got[i], expected[i], 1e-5, 1e-7)) << "parameter " << i;
  }
  EXPECT_EQ(scaler.get_scale(), std::ldexp(every_step.init_scale, 3));
}

// Tests that the parameters, their gradients and the loss stay fp32 under the AMP loop, and
// that the step changed the parameters.
TEST(AmpLoop, ParametersAndGradientsStayFp32) {
  torch::manual_seed(lesson08::kSeed);
  lesson08::ANN model;
  torch::nn::CrossEntropyLoss criterion;
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
  lesson08::GradScaler scaler(torch::kCPU);
  auto data = batches(1);
  const torch::Tensor before = model->fc1->weight.detach().clone();
  const torch::Tensor loss = lesson08::train_epoch(model, data, criterion, adam, scaler,
                                                   torch::kCPU, torch::kBFloat16, /*use_amp=*/true);
  EXPECT_EQ(loss.scalar_type(), torch::kFloat);
  EXPECT_TRUE(std::isfinite(loss.item<double>()));
  for (const auto& p : model->parameters()) {
    EXPECT_EQ(p.scalar_type(), torch::kFloat);
    EXPECT_EQ(p.grad().scalar_type(), torch::kFloat);
  }
  EXPECT_FALSE(torch::equal(before, model->fc1->weight.detach()));
}

// Tests the lesson's own check of the scaler on the CPU: three claims, which hold.
TEST(Scaler, LessonCheckPassesOnCpu) {
  course::Verdict verdict;
  lesson08::check_scaler(torch::kCPU, verdict);
  EXPECT_EQ(verdict.checks(), 3);
  EXPECT_TRUE(verdict.passed());
}

// Tests the page's claim about fp16's range: a 1e-8 gradient stored in fp16 is 0, the same
// gradient scaled by the scaler's first scale before it is stored survives, and the lesson's
// check says so.
TEST(Fp16Range, SmallGradientsNeedTheScale) {
  EXPECT_EQ(torch::tensor({1e-8f}).to(torch::kHalf).item<float>(), 0.0f);
  const double scale = lesson08::GradScalerOptions().init_scale;
  EXPECT_NEAR(
      torch::tensor({1e-8f * static_cast<float>(scale)}).to(torch::kHalf).item<float>() / scale,
      1e-8, 1e-10);
  course::Verdict verdict;
  lesson08::check_fp16_range(verdict);
  EXPECT_EQ(verdict.checks(), 1);
  EXPECT_TRUE(verdict.passed());
}

// Tests that the timing gives a time per step for each run.
TEST(TimeStep, GivesATimePerStep) {
  const course::Timing t = lesson08::time_step(/*batch=*/8, torch::kCPU, torch::kBFloat16,
                                               /*use_amp=*/true);
  EXPECT_EQ(t.runs, lesson08::kTimedRuns);
  EXPECT_GT(t.min_s, 0);
  EXPECT_LE(t.min_s, t.median_s);
  EXPECT_LE(t.median_s, t.max_s);
}

// ---- the tutorial's program, with Fashion-MNIST ------------------------------------------------
namespace {

// The first kQuickSamples training images: the lesson's --quick run.
course::FashionMNIST quick_train(const course::ImageSet& train) {
  return course::FashionMNIST(course::ImageSet{train.images.slice(0, 0, lesson08::kQuickSamples),
                                               train.labels.slice(0, 0, lesson08::kQuickSamples)});
}

// The test accuracy of the lesson's program after one epoch on the quick training set.
double accuracy(const course::ImageSet& train, const course::ImageSet& test,
                const torch::Device& device, torch::ScalarType dtype, bool use_amp) {
  return lesson08::run_program(quick_train(train), course::FashionMNIST(test), /*epochs=*/1, device,
                               dtype, use_amp, lesson08::kSeed);
}

}  // namespace

// Tests that the AMP loop in bf16 on the CPU stays within the lesson's margin of fp32.
TEST_F(FashionMnistTest, Bf16WithinMarginOnCpu) {
  const double fp32 = accuracy(train(), test(), torch::kCPU, torch::kBFloat16, /*use_amp=*/false);
  const double bf16 = accuracy(train(), test(), torch::kCPU, torch::kBFloat16, /*use_amp=*/true);
  EXPECT_GT(fp32, 0.7);
  EXPECT_GE(bf16, fp32 - lesson08::kAccuracyMargin);
}

// Tests the CUDA policies (fp16 and bf16) and the lesson's checks on the GPU.
TEST_F(CudaTest, PoliciesAndChecksOnGpu) {
  expect_policy(device, torch::kHalf);
  expect_policy(device, torch::kBFloat16);
  course::Verdict verdict;
  lesson08::check_policy(device, verdict);
  lesson08::check_scaler(device, verdict);
  EXPECT_EQ(verdict.checks(), 5);
  EXPECT_TRUE(verdict.passed());
}

// Tests the AMP loop in fp16, with the scaler, on the GPU against fp32.
TEST_F(CudaTest, Fp16WithinMargin) {
  std::string why;
  const FashionMnistSplits* data = fashion_mnist(&why);
  if (data == nullptr) GTEST_SKIP() << why;
  const double fp32 = accuracy(data->train, data->test, device, torch::kHalf, /*use_amp=*/false);
  const double fp16 = accuracy(data->train, data->test, device, torch::kHalf, /*use_amp=*/true);
  EXPECT_GE(fp16, fp32 - lesson08::kAccuracyMargin);
}
