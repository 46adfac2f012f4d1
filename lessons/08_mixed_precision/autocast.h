// autocast.h defines: Autocast, Python's `with torch.autocast(device_type, dtype, enabled):` as a
// C++ guard object, and autocast_enabled(), torch.is_autocast_enabled(device_type).
//
// LibTorch has no autocast object, and the functions underneath changed names in 2.4. This guard
// makes exactly the calls Python's torch.autocast makes, through the names this LibTorch has:
//   on entry   LibTorch >= 2.4: at::autocast::set_autocast_dtype(device_type, dtype)
//                               at::autocast::set_autocast_enabled(device_type, enabled)
//              LibTorch 1.13:   at::autocast::set_autocast_cpu_dtype(dtype) and
//                               at::autocast::set_cpu_enabled(enabled) for the CPU,
//                               at::autocast::set_autocast_gpu_dtype(dtype) and
//                               at::autocast::set_enabled(enabled) for CUDA
//              then             at::autocast::increment_nesting()
//   on exit    at::autocast::clear_cache() when at::autocast::decrement_nesting() reaches 0 (the
//              outermost block drops the 16-bit copies of the weights it cached), then the
//              previous enabled state and dtype put back with the same set_ functions.
// Nothing else: which ops run in 16 bits is LibTorch's own policy for the device type.
#pragma once

#include <c10/core/DeviceType.h>  // defines: c10::DeviceType
#include <c10/core/ScalarType.h>  // defines: c10::ScalarType

namespace lesson08 {

/// While an Autocast lives, this thread runs the ops of `device_type` that autocast covers
/// (matmul, linear, convolution, ...) in `dtype`: kHalf or kBFloat16 (on the CPU kBFloat16 only
/// before LibTorch 2.4; std::invalid_argument otherwise). With `enabled` false it switches
/// autocast off for its scope instead, as `torch.autocast(..., enabled=False)` does, so that one
/// loop serves both fp32 and mixed precision. Guards nest; each puts back what it found.
class Autocast {
 public:
  Autocast(c10::DeviceType device_type, c10::ScalarType dtype, bool enabled = true);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  c10::DeviceType device_type_;
  bool previous_enabled_;
  c10::ScalarType previous_dtype_;
};

/// torch.is_autocast_enabled(device_type): whether autocast is on for `device_type` in this thread.
bool autocast_enabled(c10::DeviceType device_type);

}  // namespace lesson08
