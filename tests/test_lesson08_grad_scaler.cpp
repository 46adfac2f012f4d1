// Tests of lessons/08_mixed_precision/grad_scaler.h: torch.amp.GradScaler's policy (skip and back
// off on inf or NaN, grow after growth_interval clean steps), unscaling, the disabled pass-through
// and the misuses Python's scaler refuses; on the CPU and, with a GPU, on CUDA.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>

#include "cuda_test.h"
#include "grad_scaler.h"

namespace {

lesson08::GradScalerOptions interval(std::int64_t growth_interval) {
  lesson08::GradScalerOptions options;
  options.growth_interval = growth_interval;
  return options;
}

// A tiny model, SGD and a scaler whose growth interval is short enough to watch.
struct ScalerRig {
  torch::nn::Linear layer{4, 2};
  std::unique_ptr<torch::optim::SGD> sgd;
  lesson08::GradScaler scaler;
  torch::Tensor x;
  explicit ScalerRig(const torch::Device& device, lesson08::GradScalerOptions options = interval(3))
      : scaler(device, options) {
    layer->to(device);
    sgd = std::make_unique<torch::optim::SGD>(layer->parameters(), torch::optim::SGDOptions(0.1));
    x = torch::ones({2, 4}, torch::TensorOptions().device(device));
  }
  // One step; with `poison`, a gradient holds it (inf or NaN) first. Returns whether it stepped.
  bool step(float poison = 0) {
    sgd->zero_grad();
    scaler.scale(layer(x).sum()).backward();
    if (poison != 0 || std::isnan(poison)) layer->weight.grad()[0][0] = poison;
    const bool stepped = scaler.step(*sgd);
    scaler.update();
    return stepped;
  }
};

constexpr float kInf = std::numeric_limits<float>::infinity();

void expect_policy(const torch::Device& device) {
  ScalerRig rig(device);
  EXPECT_EQ(rig.scaler.get_scale(), 65536.0);
  const torch::Tensor before = rig.layer->weight.detach().clone();
  EXPECT_FALSE(rig.step(kInf));
  EXPECT_TRUE(torch::equal(before, rig.layer->weight.detach()));  // the step was skipped
  EXPECT_EQ(rig.scaler.get_scale(), 32768.0);
  EXPECT_EQ(rig.scaler.get_growth_tracker(), 0);
  EXPECT_FALSE(rig.step(std::numeric_limits<float>::quiet_NaN()));  // NaN too
  EXPECT_EQ(rig.scaler.get_scale(), 16384.0);
  EXPECT_TRUE(rig.step());
  EXPECT_TRUE(rig.step());
  EXPECT_EQ(rig.scaler.get_growth_tracker(), 2);
  EXPECT_EQ(rig.scaler.get_scale(), 16384.0);
  EXPECT_TRUE(rig.step());  // the third clean step: the scale grows, the count starts again
  EXPECT_EQ(rig.scaler.get_scale(), 32768.0);
  EXPECT_EQ(rig.scaler.get_growth_tracker(), 0);
  EXPECT_FALSE(before.equal(rig.layer->weight.detach()));
}

// The gradients of loss(x) for `layer`, scaled by `scaler` then unscaled, against plain ones.
void expect_unscaled_gradients(const torch::Device& device) {
  torch::manual_seed(1);
  torch::nn::Linear layer(8, 3);
  layer->to(device);
  torch::optim::SGD sgd(layer->parameters(), torch::optim::SGDOptions(0.1));
  const torch::Tensor x = torch::randn({5, 8}, torch::TensorOptions().device(device));
  layer(x).pow(2).sum().backward();
  const torch::Tensor expected = layer->weight.grad().clone();
  sgd.zero_grad();
  lesson08::GradScaler scaler(device);
  scaler.scale(layer(x).pow(2).sum()).backward();
  EXPECT_GT(layer->weight.grad().abs().max().item<double>(), 1000.0);  // scaled up
  scaler.unscale_(sgd);
  EXPECT_TRUE(torch::allclose(layer->weight.grad(), expected, 1e-5, 1e-6));
}

}  // namespace

// Tests the policy on the CPU: skip and back off on inf and on NaN, grow after the interval.
TEST(GradScaler, PolicyOnCpu) { expect_policy(torch::kCPU); }

// Tests that unscale_() gives back the gradients of the unscaled loss.
TEST(GradScaler, UnscaleRestoresGradients) { expect_unscaled_gradients(torch::kCPU); }

// Tests that a grown scale that would overflow fp32 is not taken (the count restarts all the same).
TEST(GradScaler, DoesNotGrowPastFloatRange) {
  lesson08::GradScalerOptions options = interval(1);
  options.init_scale = std::ldexp(1.0, 127);  // the largest power of two a float holds
  lesson08::GradScaler scaler(torch::kCPU, options);
  torch::nn::Linear layer(4, 2);
  torch::optim::SGD sgd(layer->parameters(), torch::optim::SGDOptions(0.1));
  scaler.scale(layer(torch::ones({2, 4})).sum() * 1e-3).backward();  // finite scaled gradients
  EXPECT_TRUE(scaler.step(sgd));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), std::ldexp(1.0, 127));
  EXPECT_EQ(scaler.get_growth_tracker(), 0);
}

// Tests GradScaler(enabled=False): the loss unscaled, every step taken, the scale 1 and fixed.
TEST(GradScaler, DisabledPassesThrough) {
  lesson08::GradScalerOptions options;
  options.enabled = false;
  ScalerRig rig(torch::kCPU, options);
  EXPECT_FALSE(rig.scaler.is_enabled());
  const torch::Tensor loss = torch::tensor(2.5f);
  EXPECT_TRUE(rig.scaler.scale(loss).is_same(loss));
  EXPECT_TRUE(rig.step());
  EXPECT_TRUE(rig.step(kInf));  // nothing is checked: the step is taken
  EXPECT_EQ(rig.scaler.get_scale(), 1.0);
  // GradScaler(device, enabled): Python's GradScaler(device, enabled=...), its other defaults.
  EXPECT_FALSE(lesson08::GradScaler(torch::kCPU, /*enabled=*/false).is_enabled());
  const lesson08::GradScaler on(torch::kCPU, /*enabled=*/true);
  EXPECT_TRUE(on.is_enabled());
  EXPECT_EQ(on.get_scale(), lesson08::GradScalerOptions().init_scale);
}

// Tests the misuses Python's scaler refuses, with its messages.
TEST(GradScaler, RefusesMisuse) {
  ScalerRig rig(torch::kCPU);
  EXPECT_THROW(rig.scaler.update(), std::logic_error);  // no inf check before update()
  rig.scaler.scale(rig.layer(rig.x).sum()).backward();
  rig.scaler.unscale_(*rig.sgd);
  try {
    rig.scaler.unscale_(*rig.sgd);
    ADD_FAILURE() << "a second unscale_() went through";
  } catch (const std::logic_error& error) {
    EXPECT_NE(std::string(error.what()).find("already been called"), std::string::npos);
  }
  EXPECT_TRUE(rig.scaler.step(*rig.sgd));  // after unscale_(): steps without unscaling again
  EXPECT_THROW(rig.scaler.step(*rig.sgd), std::logic_error);
  EXPECT_THROW(rig.scaler.unscale_(*rig.sgd), std::logic_error);
  rig.scaler.update();
  EXPECT_TRUE(rig.step());  // ready again after update()
}

// Tests that fp16 gradients are refused: the parameters must stay fp32.
TEST(GradScaler, RefusesHalfGradients) {
  torch::nn::Linear layer(4, 2);
  layer->to(torch::kHalf);
  torch::optim::SGD sgd(layer->parameters(), torch::optim::SGDOptions(0.1));
  for (auto& p : layer->parameters()) p.mutable_grad() = torch::ones_like(p);
  lesson08::GradScaler scaler(torch::kCPU);
  EXPECT_THROW(scaler.unscale_(sgd), std::logic_error);
}

// Tests the policy and unscaling on CUDA (LibTorch's fused kernels).
TEST_F(CudaTest, ScalerOnCuda) {
  expect_policy(device);
  expect_unscaled_gradients(device);
}
