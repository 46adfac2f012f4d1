// autocast.h defines: AutocastGuard, a scoped switch for autocast (mixed precision) on the CPU or
// CUDA, with one interface over LibTorch 1.13's per-device functions and 2.4+'s device-type API.
#pragma once

#include <c10/core/DeviceType.h>  // defines: c10::DeviceType
#include <c10/core/ScalarType.h>  // defines: c10::ScalarType

namespace course {

/// While alive, eligible ops on `device_type` (matmul, linear, conv, ...) run in `dtype`
/// (kHalf or kBFloat16; LibTorch 1.13's CPU autocast supports kBFloat16 only). Restores the
/// previous state on destruction and clears autocast's cast cache when the outermost guard ends.
class AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType device_type, c10::ScalarType dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_type_;
  bool previous_enabled_;
  c10::ScalarType previous_dtype_;
};

/// Whether autocast is on for `device_type` in this thread.
bool autocast_enabled(c10::DeviceType device_type);

}  // namespace course
