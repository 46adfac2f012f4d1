// device.h defines: device choice from a --device string, a one-line description of a device,
// the list of CUDA GPUs with their properties, and synchronize() for honest timing.
#pragma once

#include <c10/core/Device.h>  // defines: c10::Device (torch::Device)

#include <cstdint>
#include <string>
#include <vector>

namespace course {

/// The result of resolving a --device string.
struct DeviceChoice {
  c10::Device device{c10::kCPU};
  std::string requested;  ///< the string the user gave ("auto", "cuda:1", ...)
  std::string fallback;   ///< why a CUDA request ended on the CPU; empty when it did not
};

/// What LibTorch reports about one CUDA GPU.
struct GpuInfo {
  int index = 0;
  std::string name;
  int major = 0;  ///< compute capability, major
  int minor = 0;  ///< compute capability, minor
  std::int64_t total_bytes = 0;
  int multiprocessors = 0;
  std::string uuid;  ///< "GPU-xxxxxxxx-xxxx-...", as nvidia-smi names it: the same on every process
};

/// True when this build was compiled against a LibTorch with CUDA.
bool cuda_compiled();

/// Number of CUDA GPUs LibTorch can use (0 on a CPU-only LibTorch or without a driver).
int cuda_device_count();

/// Why no GPU is usable, in one phrase ("this LibTorch was built without CUDA", ...).
std::string why_no_cuda();

/// Resolves `auto|cpu|cuda|cuda:N`.
/// - auto: cuda:0 when a GPU is usable, else cpu with the reason in `fallback`;
/// - cuda: the same, but asked for explicitly;
/// - cuda:N: exactly that GPU; an index past the GPU count throws UsageError;
/// - anything else throws UsageError naming the accepted forms.
DeviceChoice resolve_device(const std::string& spec);

/// Properties of every CUDA GPU (empty without CUDA).
std::vector<GpuInfo> list_gpus();

/// "cpu (2 threads)" or "cuda:0 (NVIDIA H100 80GB HBM3, sm_90, 79.1 GiB)".
std::string describe(const c10::Device& device);

/// Waits until all queued work on `device` has finished (no-op on the CPU). CUDA kernels run
/// asynchronously: without this, a clock read after a launch measures only the launch.
void synchronize(const c10::Device& device);

/// Bytes as "12.3 MiB".
std::string format_bytes(double bytes);

}  // namespace course
