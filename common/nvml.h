// nvml.h defines: smi_view, what nvidia-smi shows for one GPU (the driver's used and total memory,
// and every process using the GPU with its memory), read from the NVIDIA management library
// (NVML, the library nvidia-smi itself reads). NVML comes with the NVIDIA driver, not with CUDA's
// toolkit or LibTorch, so it is loaded at run time: a program that uses it still starts and runs
// on a machine without the driver, and smi_view then says why it has nothing to show.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/Device.h>  // defines: c10::Device

namespace course {

/// One process using the GPU, as nvidia-smi lists it.
struct GpuProcess {
  unsigned int pid = 0;     ///< as NVML sees it: inside a container, the host's process ID
  std::int64_t bytes = -1;  ///< GPU memory the process holds; -1 when the driver does not say
  std::string name;         ///< the process's command, when NVML may read it
};

/// What nvidia-smi shows for one GPU.
struct SmiView {
  bool available = false;
  std::string why_not;  ///< when not available: what is missing, and where to get it
  std::int64_t total = 0, used = 0, free = 0;  ///< the driver's view of the whole GPU, in bytes
  std::vector<GpuProcess> processes;           ///< every process with a CUDA context on it
};

/// The view of `device` (a CUDA device; anything else gives available = false, with the reason).
SmiView smi_view(const c10::Device& device);

}  // namespace course
