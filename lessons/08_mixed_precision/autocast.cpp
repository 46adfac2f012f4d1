// autocast.cpp: the autocast guard, by LibTorch version (see autocast.h).
#include "autocast.h"

#include <ATen/autocast_mode.h>  // defines: at::autocast::set_autocast_enabled, ...
#include <c10/core/Device.h>     // defines: c10::DeviceTypeName

#include <stdexcept>
#include <string>

#include "common/version.h"  // defines: GPU_LESSONS_TORCH_AT_LEAST

namespace lesson08 {
namespace {

// The types and devices this guard takes: the ones the course's two LibTorch versions support.
void check(c10::DeviceType type, c10::ScalarType dtype) {
  if (type != c10::kCPU && type != c10::kCUDA) {
    throw std::invalid_argument("Autocast: device type " + c10::DeviceTypeName(type) +
                                " is not supported (cpu or cuda)");
  }
  if (dtype != c10::kHalf && dtype != c10::kBFloat16) {
    throw std::invalid_argument(std::string("Autocast: dtype ") + c10::toString(dtype) +
                                " is not a 16-bit type (Half or BFloat16)");
  }
#if !GPU_LESSONS_TORCH_AT_LEAST(2, 4)
  if (type == c10::kCPU && dtype != c10::kBFloat16) {
    throw std::invalid_argument("Autocast: this LibTorch's CPU autocast supports BFloat16 only");
  }
#endif
}

//! [autocast-set]
#if GPU_LESSONS_TORCH_AT_LEAST(2, 4)
void set(c10::DeviceType type, bool enabled, c10::ScalarType dtype) {
  at::autocast::set_autocast_dtype(type, dtype);
  at::autocast::set_autocast_enabled(type, enabled);
}
c10::ScalarType dtype_of(c10::DeviceType type) { return at::autocast::get_autocast_dtype(type); }
#else  // before 2.4: one set of functions for the CPU, another for CUDA
void set(c10::DeviceType type, bool enabled, c10::ScalarType dtype) {
  if (type == c10::kCPU) {
    at::autocast::set_autocast_cpu_dtype(dtype);
    at::autocast::set_cpu_enabled(enabled);
  } else {
    at::autocast::set_autocast_gpu_dtype(dtype);
    at::autocast::set_enabled(enabled);
  }
}
c10::ScalarType dtype_of(c10::DeviceType type) {
  return type == c10::kCPU ? at::autocast::get_autocast_cpu_dtype()
                           : at::autocast::get_autocast_gpu_dtype();
}
#endif
//! [autocast-set]

}  // namespace

bool autocast_enabled(c10::DeviceType type) {
#if GPU_LESSONS_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(type);
#else
  return type == c10::kCPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
#endif
}

//! [autocast-guard]
Autocast::Autocast(c10::DeviceType type, c10::ScalarType dtype, bool enabled) : device_type_(type) {
  check(type, dtype);
  previous_enabled_ = autocast_enabled(type);
  previous_dtype_ = dtype_of(type);
  set(type, enabled, dtype);
  at::autocast::increment_nesting();
}

Autocast::~Autocast() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set(device_type_, previous_enabled_, previous_dtype_);
}
//! [autocast-guard]

}  // namespace lesson08
