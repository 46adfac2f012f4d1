// autocast.cpp: the autocast switch. LibTorch 2.4 replaced the per-device functions
// (set_enabled for CUDA, set_cpu_enabled, set_autocast_gpu_dtype, ...) with functions taking a
// device type and deprecated the old ones; this file is the only place that knows.
#include "common/autocast.h"

#include <ATen/autocast_mode.h>  // defines: at::autocast::*

#include "common/version.h"  // defines: GPU_LESSONS_TORCH_AT_LEAST

#define GPU_LESSONS_AUTOCAST_BY_DEVICE_TYPE GPU_LESSONS_TORCH_AT_LEAST(2, 4)

namespace course {
namespace {

bool get_enabled(c10::DeviceType type) {
#if GPU_LESSONS_AUTOCAST_BY_DEVICE_TYPE
  return at::autocast::is_autocast_enabled(type);
#else
  return type == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
#endif
}

void set_enabled(c10::DeviceType type, bool enabled) {
#if GPU_LESSONS_AUTOCAST_BY_DEVICE_TYPE
  at::autocast::set_autocast_enabled(type, enabled);
#else
  if (type == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(enabled);
  } else {
    at::autocast::set_enabled(enabled);
  }
#endif
}

c10::ScalarType get_dtype(c10::DeviceType type) {
#if GPU_LESSONS_AUTOCAST_BY_DEVICE_TYPE
  return at::autocast::get_autocast_dtype(type);
#else
  return type == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                      : at::autocast::get_autocast_gpu_dtype();
#endif
}

void set_dtype(c10::DeviceType type, c10::ScalarType dtype) {
#if GPU_LESSONS_AUTOCAST_BY_DEVICE_TYPE
  at::autocast::set_autocast_dtype(type, dtype);
#else
  if (type == c10::DeviceType::CPU) {
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
#endif
}

}  // namespace

AutocastGuard::AutocastGuard(c10::DeviceType device_type, c10::ScalarType dtype)
    : device_type_(device_type),
      previous_enabled_(get_enabled(device_type)),
      previous_dtype_(get_dtype(device_type)) {
  set_dtype(device_type_, dtype);
  set_enabled(device_type_, true);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  // Autocast caches the low-precision copies of weights while it is on; drop them at the end.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set_enabled(device_type_, previous_enabled_);
  set_dtype(device_type_, previous_dtype_);
}

bool autocast_enabled(c10::DeviceType device_type) { return get_enabled(device_type); }

}  // namespace course
