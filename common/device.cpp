// device.cpp: device choice and description; the CUDA-only parts are behind GPU_LESSONS_WITH_CUDA.
#include "common/device.h"

#include <ATen/Parallel.h>  // defines: at::get_num_threads
#include <torch/cuda.h>     // defines: torch::cuda::is_available, device_count, synchronize

#include <cstdio>
#include <cstring>
#include <regex>
#include <stdexcept>

#ifdef GPU_LESSONS_WITH_CUDA
#include <cuda_runtime_api.h>  // defines: cudaDeviceGetAttribute, cudaGetDeviceProperties
#endif

#include "common/verdict.h"  // defines: UsageError

namespace course {

bool cuda_compiled() {
#ifdef GPU_LESSONS_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
  // 1.13 returns size_t, 2.x c10::DeviceIndex: one cast serves both.
  return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
}

std::string why_no_cuda() {
  if (!cuda_compiled()) return "this LibTorch was built without CUDA";
  return "no CUDA GPU is visible (no driver, or CUDA_VISIBLE_DEVICES hides them)";
}

DeviceChoice resolve_device(const std::string& spec) {
  DeviceChoice choice;
  choice.requested = spec;
  const int count = cuda_device_count();
  if (spec == "cpu") return choice;
  if (spec == "auto" || spec == "cuda") {
    if (count > 0) {
      choice.device = c10::Device(c10::kCUDA, 0);
    } else {
      choice.fallback = why_no_cuda();
    }
    return choice;
  }
  static const std::regex kIndexed("cuda:([0-9]{1,3})");
  std::smatch match;
  if (std::regex_match(spec, match, kIndexed)) {
    const int index = std::stoi(match[1]);
    if (index >= count) {
      throw UsageError("--device " + spec + ": this machine has " + std::to_string(count) +
                           " usable CUDA GPU(s) (" +
                           (count ? "cuda:0..cuda:" + std::to_string(count - 1) : why_no_cuda()) +
                           ")",
                       "use --device auto (GPU if there is one, else CPU) or --device cpu");
    }
    choice.device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
    return choice;
  }
  throw UsageError("--device '" + spec + "' is not a device this course knows",
                   "use one of: auto, cpu, cuda, cuda:N (N = GPU index, from 0)");
}

#ifdef GPU_LESSONS_WITH_CUDA
namespace {

// Throws with CUDA's own words when a runtime call fails, and clears the error it leaves set.
void check_cuda(cudaError_t status, const char* call) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();
  throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorString(status));
}

int attribute(cudaDeviceAttr attr, int device) {
  int value = 0;
  check_cuda(cudaDeviceGetAttribute(&value, attr, device), "cudaDeviceGetAttribute");
  return value;
}

}  // namespace
#endif

std::vector<GpuInfo> list_gpus() {
  std::vector<GpuInfo> gpus;
#ifdef GPU_LESSONS_WITH_CUDA
  for (int i = 0; i < cuda_device_count(); ++i) {
    GpuInfo info;
    info.index = i;
    // Integer properties one by one: cudaDeviceGetAttribute's interface does not depend on the
    // layout of cudaDeviceProp, which changes between CUDA major versions.
    info.major = attribute(cudaDevAttrComputeCapabilityMajor, i);
    info.minor = attribute(cudaDevAttrComputeCapabilityMinor, i);
    info.multiprocessors = attribute(cudaDevAttrMultiProcessorCount, i);
    // The name and total memory have no attribute. This struct comes from the toolkit headers
    // this file was compiled with, filled by a CUDA runtime of the same major version (configure
    // insists that the toolkit and LibTorch's CUDA agree), so its layout is the right one.
    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, i), "cudaGetDeviceProperties");
    info.name = prop.name;
    info.total_bytes = static_cast<std::int64_t>(prop.totalGlobalMem);
    char uuid[64] = "GPU";
    for (int b = 0; b < 16; ++b) {
      std::snprintf(uuid + std::strlen(uuid), sizeof uuid - std::strlen(uuid),
                    (b == 4 || b == 6 || b == 8 || b == 10) ? "-%02x" : (b == 0 ? "-%02x" : "%02x"),
                    static_cast<unsigned char>(prop.uuid.bytes[b]));
    }
    info.uuid = uuid;
    gpus.push_back(info);
  }
#endif
  return gpus;
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  double value = bytes < 0 ? -bytes : bytes;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char text[48];
  std::snprintf(text, sizeof text, unit ? "%s%.1f %s" : "%s%.0f %s", bytes < 0 ? "-" : "", value,
                units[unit]);
  return text;
}

std::string describe(const c10::Device& device) {
  if (device.is_cpu()) {
    const int threads = at::get_num_threads();
    return "cpu (" + std::to_string(threads) + (threads == 1 ? " thread)" : " threads)");
  }
  if (device.is_cuda()) {
    for (const auto& gpu : list_gpus()) {
      if (gpu.index == device.index()) {
        return device.str() + " (" + gpu.name + ", sm_" + std::to_string(gpu.major) +
               std::to_string(gpu.minor) + ", " +
               format_bytes(static_cast<double>(gpu.total_bytes)) + ")";
      }
    }
  }
  return device.str();
}

void synchronize(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

}  // namespace course
