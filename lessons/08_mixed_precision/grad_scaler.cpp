// grad_scaler.cpp: torch.amp.GradScaler's arithmetic (see grad_scaler.h).
#include "grad_scaler.h"

#include <ATen/ATen.h>  // defines: at::_amp_foreach_non_finite_check_and_unscale_, ...

#include <stdexcept>
#include <vector>

#include "common/version.h"  // defines: GPU_LESSONS_TORCH_AT_LEAST

namespace lesson08 {
namespace {

// Whether LibTorch has the fused operators' kernels for `device` (CUDA always, the CPU from 2.3).
bool has_fused_kernels(const c10::Device& device) {
#if GPU_LESSONS_TORCH_AT_LEAST(2, 3)
  (void)device;
  return true;
#else
  return device.is_cuda();
#endif
}

}  // namespace

GradScaler::GradScaler(const c10::Device& device, GradScalerOptions options)
    : device_(device), options_(options) {
  const auto on = at::TensorOptions().device(device);
  scale_ = at::full({}, options.init_scale, on.dtype(at::kFloat));
  growth_tracker_ = at::zeros({}, on.dtype(at::kInt));
  found_inf_ = at::zeros({}, on.dtype(at::kFloat));
}

GradScaler::GradScaler(const c10::Device& device, bool enabled) : GradScaler(device) {
  options_.enabled = enabled;  // Python's defaults otherwise
}

at::Tensor GradScaler::scale(const at::Tensor& loss) const {
  if (!options_.enabled) return loss;
  return loss * scale_.to(loss.device());
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) return;
  if (state_ == State::kUnscaled) {
    throw std::logic_error(
        "unscale_() has already been called on this optimizer since the last "
        "update().");
  }
  if (state_ == State::kStepped) throw std::logic_error("unscale_() is being called after step().");
  std::vector<at::Tensor> grads;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (p.grad().scalar_type() == at::kHalf) {
        throw std::logic_error("Attempting to unscale FP16 gradients.");
      }
      grads.push_back(p.grad());
    }
  }
  //! [unscale]
  // 1/scale in double, then float: the scale is a power of two, so the product is exact.
  const at::Tensor inv_scale = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
  found_inf_.zero_();
  if (has_fused_kernels(device_)) {
    // One fused operator over all gradients: multiply by inv_scale, set found_inf on inf/NaN.
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf_, inv_scale);
  } else {
    for (auto& g : grads) {
      found_inf_.copy_(at::maximum(found_inf_, g.isfinite().logical_not().any().to(at::kFloat)));
      g.mul_(inv_scale);
    }
  }
  //! [unscale]
  state_ = State::kUnscaled;
}

//! [step-update]
bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  if (state_ == State::kStepped) {
    throw std::logic_error("step() has already been called since the last update().");
  }
  if (state_ == State::kReady) unscale_(optimizer);
  // .item() copies the note to the host, and on a GPU waits for the queued work first.
  const bool finite = found_inf_.item<float>() == 0.0f;
  if (finite) optimizer.step();
  state_ = State::kStepped;
  return finite;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  if (state_ == State::kReady)
    throw std::logic_error("No inf checks were recorded prior to update.");
  if (has_fused_kernels(device_)) {
    at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, options_.growth_factor,
                           options_.backoff_factor, options_.growth_interval);
  } else {
    // _amp_update_scale_'s rule: after an overflow, back off and restart the count; else count
    // the clean step, and after growth_interval of them grow (if the grown scale is finite).
    const at::Tensor found = found_inf_.gt(0);
    const at::Tensor clean = growth_tracker_ + 1;
    const at::Tensor grown = scale_ * options_.growth_factor;
    const at::Tensor grow = clean.eq(options_.growth_interval).logical_and(grown.isfinite());
    scale_.copy_(
        at::where(found, scale_ * options_.backoff_factor, at::where(grow, grown, scale_)));
    growth_tracker_.copy_(at::where(found.logical_or(clean.eq(options_.growth_interval)),
                                    at::zeros_like(clean), clean));
  }
  state_ = State::kReady;
}
//! [step-update]

double GradScaler::get_scale() const { return options_.enabled ? scale_.item<double>() : 1.0; }

std::int64_t GradScaler::get_growth_tracker() const {
  return options_.enabled ? growth_tracker_.item<std::int64_t>() : 0;
}

}  // namespace lesson08
