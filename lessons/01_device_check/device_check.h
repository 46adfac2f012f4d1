// device_check.h: what lesson 01 teaches, callable from its tests. See device_check.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "common/compare.h"  // defines: course::tolerance_for

namespace lesson01 {

// ---- knobs -----------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 1;      // the probe's inputs derive from it
constexpr std::int64_t kProbeSize = 512;  // side of the square matmul run on the chosen device
// An fp32 matmul on two devices: the same sums in another order (common/compare.h says why 1e-5).
constexpr double kProbeTolerance = course::tolerance_for(torch::kFloat);

/// What this LibTorch build and this machine offer.
struct BuildInfo {
  std::string torch_version;  ///< TORCH_VERSION from torch/version.h
  bool cuda_compiled = false;  ///< this program was built against a CUDA LibTorch
  bool cuda_available = false;  ///< torch::cuda::is_available(): CUDA built in and a GPU visible
  int gpu_count = 0;
  bool cudnn_available = false;
};
BuildInfo build_info();

/// What one --device string turns into on this machine.
struct Resolution {
  std::string spec;     ///< the string, e.g. "cuda:1"
  bool accepted = false;  ///< false: the lesson would exit 2
  std::string outcome;  ///< "cuda:0", "cpu (fallback: ...)" or the error message
};
/// Resolves every form --device accepts (and one it does not), as the lesson prints them.
std::vector<Resolution> resolve_examples();

/// Multiplies two seeded random matrices on `device` and on the CPU; returns the largest
/// absolute difference, relative to the largest CPU value.
double probe_device(const torch::Device& device, std::uint64_t seed);

}  // namespace lesson01
