// grad_scaler.h defines: GradScaler, PyTorch's torch.amp.GradScaler (loss scaling for fp16
// training) in C++, which LibTorch lacks: scale(loss), unscale_(optimizer), step(optimizer),
// update(), get_scale(), with Python's defaults and its enabled=False pass-through.
//
// What it computes, as Python's does: scale() multiplies the loss by the scale (2^16 at first),
// so that small fp16 gradients do not flush to zero; unscale_() multiplies every gradient by
// 1/scale and notes whether any is inf or NaN, with at::_amp_foreach_non_finite_check_and_unscale_;
// step() reads that note (.item(): it waits for the device) and calls optimizer.step() only when
// all were finite; update() halves the scale after an overflow and doubles it after
// growth_interval clean steps, with at::_amp_update_scale_. Those two fused operators have CPU
// kernels from LibTorch 2.3 on; before that, on the CPU, the same arithmetic runs as ordinary
// tensor operations.
// One scaler serves one optimizer (Python's keeps a state per optimizer).
#pragma once

#include <c10/core/Device.h>        // defines: c10::Device
#include <torch/optim/optimizer.h>  // defines: torch::optim::Optimizer

#include <cstdint>

namespace lesson08 {

//! [options]
/// torch.amp.GradScaler's arguments and defaults.
struct GradScalerOptions {
  double init_scale = 65536.0;  ///< 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;  ///< clean steps before the scale grows
  /// false: scale() returns the loss, step() calls optimizer.step(), update() does nothing:
  /// `GradScaler(enabled=use_amp)`, for loops that run in fp32 or bf16 as well.
  bool enabled = true;
};
//! [options]

class GradScaler {
 public:
  /// torch.amp.GradScaler(device.type, ...): the scale lives on `device`, with the gradients.
  explicit GradScaler(const c10::Device& device, GradScalerOptions options = {});
  /// torch.amp.GradScaler(device.type, enabled=enabled), the other arguments Python's defaults.
  GradScaler(const c10::Device& device, bool enabled);

  /// loss * scale (the loss itself when disabled).
  at::Tensor scale(const at::Tensor& loss) const;
  /// Divides the gradients of `optimizer`'s parameters by the scale, in place, and notes whether
  /// any is inf or NaN. At most once between two update()s, and before step(); std::logic_error
  /// otherwise, with Python's message.
  void unscale_(torch::optim::Optimizer& optimizer);
  /// Unscales (unless unscale_() was called), then calls optimizer.step() unless a gradient was
  /// inf or NaN. Returns whether it stepped (Python returns step()'s result, or None).
  bool step(torch::optim::Optimizer& optimizer);
  /// The scale for the next iteration: backoff_factor times after an overflow, growth_factor
  /// times after growth_interval clean steps in a row.
  void update();

  /// The current scale (1.0 when disabled); .item(): waits for the device.
  double get_scale() const;
  /// The clean steps since the scale last changed (Python's _get_growth_tracker()).
  std::int64_t get_growth_tracker() const;
  bool is_enabled() const { return options_.enabled; }

 private:
  enum class State { kReady, kUnscaled, kStepped };
  c10::Device device_;
  GradScalerOptions options_;
  at::Tensor scale_;           // float32, 0-dim, on the device
  at::Tensor growth_tracker_;  // int32, 0-dim, on the device
  at::Tensor found_inf_;       // float32, 0-dim: 1 when the last unscale_() saw inf or NaN
  State state_ = State::kReady;
};

}  // namespace lesson08
