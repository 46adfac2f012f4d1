// mixed_precision.h: what lesson 08 teaches, callable from its tests and benchmarks.
// See mixed_precision.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "common/data.h"    // defines: course::ImageSet
#include "common/timing.h"  // defines: course::Timing

namespace lesson08 {

// ---- knobs -----------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 8;
constexpr double kAccuracyMargin = 0.01;  // mixed precision within 1 point of fp32
constexpr double kLearningRate = 1e-3;

/// A training configuration: the lesson 05 MLP, or a wider one where matmuls dominate.
struct ModelSpec {
  std::string name;
  std::int64_t hidden1, hidden2;
  std::int64_t batch;
  int epochs;
  std::int64_t samples;  ///< training images used (the first ones of the 60,000)
};
const ModelSpec kMlp{"mlp", 128, 64, 64, 2, 60000};
const ModelSpec kWide{"wide", 1024, 1024, 256, 1, 20000};
/// With --quick: fewer samples, one epoch.
ModelSpec quick(const ModelSpec& spec);

struct MlpImpl : torch::nn::Module {
  MlpImpl(std::int64_t hidden1, std::int64_t hidden2);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(Mlp);

// ---- autocast ------------------------------------------------------------------------------
/// `with torch.autocast(device_type, dtype=...):` in C++. While an Autocast is alive, eligible
/// ops on `device_type` (matmul, linear, conv, ...) run in `dtype` (kHalf or kBFloat16; LibTorch
/// 1.13's CPU autocast knows kBFloat16 only). At the end of its scope the previous state comes
/// back, and the outermost one drops autocast's cached casts of the weights.
class Autocast {
 public:
  Autocast(c10::DeviceType device_type, c10::ScalarType dtype);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;
  /// torch.is_autocast_enabled(device_type): whether autocast is on in this thread.
  static bool enabled(c10::DeviceType device_type);

 private:
  c10::DeviceType device_type_;
  bool previous_enabled_;
  c10::ScalarType previous_dtype_;
};

/// The low-precision type autocast uses: kHalf or kBFloat16 on CUDA, kBFloat16 on the CPU.
/// "fp32" means no autocast.
torch::ScalarType precision_dtype(const std::string& precision);

/// The dtype of each op's result under autocast on `device` (and of a parameter's gradient).
struct OpDtype {
  std::string op;
  torch::ScalarType dtype;
};
std::vector<OpDtype> op_dtypes(const torch::Device& device, torch::ScalarType low);

// ---- gradient scaling ----------------------------------------------------------------------------
/// PyTorch's GradScaler policy (defaults included).
struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;  // clean steps before the scale grows
};

/// Loss scaling for fp16: multiply the loss so small gradients do not flush to zero, divide the
/// gradients back before the step, skip steps whose gradients overflowed, and adapt the scale.
/// On CUDA it uses LibTorch's fused _amp_* kernels; on the CPU (no kernels there in 1.13) the
/// same arithmetic in ordinary tensor ops.
class GradScaler {
 public:
  GradScaler(const torch::Device& device, GradScalerOptions options = {});
  /// loss * scale.
  torch::Tensor scale(const torch::Tensor& loss) const;
  /// Divides every gradient of `optimizer` by the scale and records whether any is inf/NaN.
  void unscale(torch::optim::Optimizer& optimizer);
  /// Unscales (if not done yet), then steps unless a gradient was inf/NaN. Returns whether it
  /// stepped. Reading the inf/NaN flag waits for the device, as PyTorch's GradScaler does.
  bool step(torch::optim::Optimizer& optimizer);
  /// Backs off after an overflow; grows after growth_interval clean steps.
  void update();
  double current_scale() const;
  std::int64_t clean_steps() const;

 private:
  torch::Device device_;
  GradScalerOptions options_;
  torch::Tensor scale_;           // float32 [1] on the device
  torch::Tensor growth_tracker_;  // int32 [1]: clean steps since the last change
  torch::Tensor found_inf_;       // float32 [1]: 1 if the last unscale saw inf/NaN
  bool unscaled_ = false;
};

// ---- training ------------------------------------------------------------------------------------
/// One training step on the batch (x, y) in `precision` ("fp32", "bf16" or "fp16"): the forward
/// pass and the loss under autocast when mixed, backward and the step outside it, through the
/// scaler for fp16. Returns the loss; `taken` says whether the optimizer stepped.
torch::Tensor train_step(Mlp& model, torch::optim::Optimizer& optimizer, GradScaler& scaler,
                         const std::string& precision, const torch::Tensor& x,
                         const torch::Tensor& y, bool* taken = nullptr);

struct TrainResult {
  double accuracy = 0;
  double final_loss = 0;
  std::int64_t skipped_steps = 0;  ///< steps the scaler skipped (fp16)
};
/// Trains `spec` in `precision` ("fp32", "bf16" or "fp16"; fp16 uses the GradScaler) and
/// evaluates on `test` under the same precision.
TrainResult train(const ModelSpec& spec, const std::string& precision,
                  const course::ImageSet& train_set, const course::ImageSet& test,
                  const torch::Device& device, std::uint64_t seed);

/// The time of one training step of `spec` in `precision` on one batch of `train_set`: median,
/// fastest and slowest of `runs` runs of as many steps as fill about kTimedRunSeconds (at most
/// kMaxTimedSteps), after two warm-up steps.
constexpr double kTimedRunSeconds = 0.2;
constexpr int kMaxTimedSteps = 50;
constexpr int kTimedRuns = 5;
course::Timing time_step(const ModelSpec& spec, const std::string& precision,
                         const course::ImageSet& train_set, const torch::Device& device,
                         int runs = kTimedRuns);

}  // namespace lesson08
