// Tests of lesson 08: autocast's dtypes, the autocast guard, the gradient scaler, and training.
#include <gtest/gtest.h>

#include "cuda_test.h"
#include "fashion_mnist_test.h"
#include "mixed_precision.h"

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
  EXPECT_FALSE(lesson08::Autocast::enabled(device.type()));  // the guard switched it off again
}

// A tiny model and a scaler whose interval is short enough to watch.
struct ScalerRig {
  torch::nn::Linear layer{4, 2};
  std::unique_ptr<torch::optim::SGD> sgd;
  lesson08::GradScaler scaler;
  torch::Tensor x;
  explicit ScalerRig(const torch::Device& device)
      : scaler(device, [] {
          lesson08::GradScalerOptions o;
          o.growth_interval = 3;
          return o;
        }()) {
    layer->to(device);
    sgd = std::make_unique<torch::optim::SGD>(layer->parameters(), torch::optim::SGDOptions(0.1));
    x = torch::ones({2, 4}, torch::TensorOptions().device(device));
  }
  // One step; with `poison`, an inf lands in a gradient first. Returns whether it stepped.
  bool step(bool poison) {
    sgd->zero_grad();
    scaler.scale(layer(x).sum()).backward();
    if (poison) layer->weight.grad()[0][0] = std::numeric_limits<float>::infinity();
    const bool stepped = scaler.step(*sgd);
    scaler.update();
    return stepped;
  }
};

void expect_scaler_policy(const torch::Device& device) {
  ScalerRig rig(device);
  EXPECT_EQ(rig.scaler.current_scale(), 65536.0);
  const torch::Tensor before = rig.layer->weight.detach().clone();
  EXPECT_FALSE(rig.step(/*poison=*/true));
  EXPECT_TRUE(torch::equal(before, rig.layer->weight.detach()));  // the step was skipped
  EXPECT_EQ(rig.scaler.current_scale(), 32768.0);
  EXPECT_TRUE(rig.step(false));
  EXPECT_TRUE(rig.step(false));
  EXPECT_EQ(rig.scaler.clean_steps(), 2);
  EXPECT_EQ(rig.scaler.current_scale(), 32768.0);
  EXPECT_TRUE(rig.step(false));  // the third clean step: the scale grows
  EXPECT_EQ(rig.scaler.current_scale(), 65536.0);
  EXPECT_EQ(rig.scaler.clean_steps(), 0);
  EXPECT_FALSE(before.equal(rig.layer->weight.detach().to(before.device())));
}

}  // namespace

// Tests the CPU autocast policy the lesson prints: bf16 matmuls, fp32 losses and gradients.
TEST(Autocast, CpuBf16Policy) { expect_policy(torch::kCPU, torch::kBFloat16); }

// Tests that guards nest and restore the previous state.
TEST(Autocast, GuardsNestAndRestore) {
  EXPECT_FALSE(lesson08::Autocast::enabled(torch::kCPU));
  {
    lesson08::Autocast outer(torch::kCPU, torch::kBFloat16);
    {
      lesson08::Autocast inner(torch::kCPU, torch::kBFloat16);
      EXPECT_TRUE(lesson08::Autocast::enabled(torch::kCPU));
    }
    EXPECT_TRUE(lesson08::Autocast::enabled(torch::kCPU));
    EXPECT_EQ(torch::mm(torch::ones({2, 2}), torch::ones({2, 2})).scalar_type(), torch::kBFloat16);
  }
  EXPECT_FALSE(lesson08::Autocast::enabled(torch::kCPU));
  EXPECT_EQ(torch::mm(torch::ones({2, 2}), torch::ones({2, 2})).scalar_type(), torch::kFloat);
}

// Tests the scaler on the CPU: skip and back off on inf, grow after the interval.
TEST(GradScaler, PolicyOnCpu) { expect_scaler_policy(torch::kCPU); }

// Tests that unscaling gives back the gradients of the unscaled loss.
TEST(GradScaler, UnscaleRestoresGradients) {
  torch::manual_seed(1);
  torch::nn::Linear layer(8, 3);
  torch::optim::SGD sgd(layer->parameters(), torch::optim::SGDOptions(0.1));
  const torch::Tensor x = torch::randn({5, 8});
  layer(x).pow(2).sum().backward();
  const torch::Tensor expected = layer->weight.grad().clone();
  sgd.zero_grad();
  lesson08::GradScaler scaler(torch::kCPU);
  scaler.scale(layer(x).pow(2).sum()).backward();
  scaler.unscale(sgd);
  EXPECT_TRUE(torch::allclose(layer->weight.grad(), expected, 1e-5, 1e-6));
}

// ---- training, with Fashion-MNIST ----------------------------------------------------------------
// Tests that bf16 training on the CPU stays within the lesson's margin of fp32.
TEST_F(FashionMnistTest, Bf16WithinMarginOnCpu) {
  const auto spec = lesson08::quick(lesson08::kMlp);
  const auto fp32 = lesson08::train(spec, "fp32", train(), test(), torch::kCPU, lesson08::kSeed);
  const auto bf16 = lesson08::train(spec, "bf16", train(), test(), torch::kCPU, lesson08::kSeed);
  EXPECT_GT(fp32.accuracy, 0.7);
  EXPECT_GE(bf16.accuracy, fp32.accuracy - lesson08::kAccuracyMargin);
  EXPECT_EQ(bf16.skipped_steps, 0);
}

// Tests the CUDA policies (fp16 and bf16) and the fused scaler kernels.
TEST_F(CudaTest, PoliciesAndScalerOnGpu) {
  expect_policy(device, torch::kHalf);
  expect_policy(device, torch::kBFloat16);
  expect_scaler_policy(device);
}

// Tests fp16 training with the scaler on the GPU against fp32.
TEST_F(CudaTest, Fp16TrainingWithinMargin) {
  std::string why;
  const FashionMnistSplits* data = fashion_mnist(&why);
  if (data == nullptr) GTEST_SKIP() << why;
  const auto spec = lesson08::quick(lesson08::kWide);
  const auto fp32 = lesson08::train(spec, "fp32", data->train, data->test, device, lesson08::kSeed);
  const auto fp16 = lesson08::train(spec, "fp16", data->train, data->test, device, lesson08::kSeed);
  EXPECT_GE(fp16.accuracy, fp32.accuracy - lesson08::kAccuracyMargin);
}

// Tests the step the lesson trains with: under bf16 autocast the loss comes back in fp32, the
// optimizer steps, and the parameters it changed stay fp32.
TEST(TrainStep, Bf16StepKeepsFp32Parameters) {
  torch::manual_seed(lesson08::kSeed);
  lesson08::Mlp model(32, 16);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
  lesson08::GradScaler scaler(torch::kCPU);
  const torch::Tensor x = torch::rand({8, 784});
  const torch::Tensor y = torch::randint(10, {8}, torch::kLong);
  const torch::Tensor before = model->fc1->weight.detach().clone();
  bool taken = false;
  const torch::Tensor loss = lesson08::train_step(model, adam, scaler, "bf16", x, y, &taken);
  EXPECT_TRUE(taken);
  EXPECT_EQ(loss.scalar_type(), torch::kFloat);
  EXPECT_EQ(model->fc1->weight.scalar_type(), torch::kFloat);
  EXPECT_FALSE(torch::equal(before, model->fc1->weight.detach()));
  EXPECT_FALSE(lesson08::Autocast::enabled(torch::kCPU));
}
