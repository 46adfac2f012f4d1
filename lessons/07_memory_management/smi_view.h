// smi_view.h defines: smi_view, what nvidia-smi shows for one GPU (the driver's used and total
// memory, and every process using the GPU with its memory), read from the NVIDIA management library
// (NVML, the library nvidia-smi itself reads). NVML comes with the NVIDIA driver, not with CUDA's
// toolkit or LibTorch, so it is loaded at run time: a program that uses it still starts and runs
// on a machine without the driver, and smi_view then says why it has nothing to show. Beside it:
// show_smi_view, which prints that view beside the lesson's allocator; SmiWatch, the view printed
// once a second (--watch); and mem_get_info, the driver's free and total memory through the CUDA
// runtime.
#pragma once

#include <c10/core/Device.h>  // defines: c10::Device

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "memory/memory.h"  // defines: MemoryStats

namespace lesson07 {

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

/// The driver's free and total memory of a CUDA device (zeros on the CPU), as the CUDA runtime
/// reads it (cudaMemGetInfo): Python's torch.cuda.mem_get_info(), which LibTorch's C++ API lacks.
/// Unlike smi_view, it needs no NVML. Throws c10::Error with CUDA's message when the driver cannot
/// tell.
struct MemGetInfo {
  std::int64_t free = 0;
  std::int64_t total = 0;
};
MemGetInfo mem_get_info(const c10::Device& device);

/// Prints nvidia-smi's view of `device` (used, total, each process) beside `mine`, this process's
/// allocator (read by the lesson), and what the difference is; without NVML, the driver's used
/// and total memory instead; on the CPU, that it is skipped.
void show_smi_view(const c10::Device& device, const course::MemoryStats& mine);

/// `watch -n 1 nvidia-smi` inside the program: while it lives, a thread writes one line of
/// smi_view(device) to `out` every `period` (the driver's used and total memory, and this
/// process's as the driver counts it); where there is no view, one line saying why, then nothing.
/// The destructor stops the thread and waits for it.
class SmiWatch {
 public:
  SmiWatch(const c10::Device& device, std::chrono::milliseconds period, std::ostream& out);
  ~SmiWatch();
  SmiWatch(const SmiWatch&) = delete;
  SmiWatch& operator=(const SmiWatch&) = delete;
  int lines() const;  ///< how many lines it has written so far

 private:
  void run(c10::Device device, std::chrono::milliseconds period, std::ostream& out);
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  int lines_ = 0;
  std::thread thread_;  // last: it starts once the members above exist
};

}  // namespace lesson07
