// version.h defines: GPU_LESSONS_TORCH_AT_LEAST(major, minor), the one test of the LibTorch
// version that the version shims in common/ use (torch/version.h's macros underneath).
#pragma once

#include <torch/version.h>  // defines: TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR

/// True when compiling against LibTorch major.minor or newer.
#define GPU_LESSONS_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||              \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
