// smi_view.cpp: smi_view, SmiWatch, show_smi_view and mem_get_info. NVML's few functions used here
// are declared by hand, with the layouts of NVML's own header (nvml.h, which neither Debian's CUDA
// packages nor the wheels ship), and looked up with dlsym in libnvidia-ml.so.1, the driver's copy.
#include "smi_view.h"

#include <dlfcn.h>
#include <unistd.h>  // defines: getpid

#include <cstdio>
#include <iostream>
#include <string>

#ifdef GPU_LESSONS_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>  // defines: c10::cuda::CUDAGuard
#include <c10/util/Exception.h>  // defines: TORCH_CHECK
#include <cuda_runtime_api.h>    // defines: cudaMemGetInfo
#endif

#include "common/device.h"  // defines: list_gpus, cuda_device_count, why_no_cuda, format_bytes

namespace lesson07 {
namespace {

using nvmlReturn_t = int;
using nvmlDevice_t = void*;
constexpr nvmlReturn_t kSuccess = 0;
constexpr nvmlReturn_t kInsufficientSize = 7;        // NVML_ERROR_INSUFFICIENT_SIZE
constexpr unsigned long long kNotAvailable = ~0ULL;  // NVML_VALUE_NOT_AVAILABLE

struct nvmlMemory_t {  // nvmlMemory_t (v1)
  unsigned long long total, free, used;
};
struct nvmlProcessInfo_t {  // nvmlProcessInfo_v2_t, what the _v2 and _v3 process queries fill
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};

struct Nvml {
  void* library = nullptr;
  std::string why_not;
  nvmlReturn_t (*init)() = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*by_uuid)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*memory_info)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*processes)(nvmlDevice_t, unsigned int*, nvmlProcessInfo_t*) = nullptr;
  nvmlReturn_t (*process_name)(unsigned int, char*, unsigned int) = nullptr;
};

template <typename F>
bool find(Nvml& nvml, F& function, const char* name) {
  function = reinterpret_cast<F>(dlsym(nvml.library, name));
  if (function == nullptr && nvml.why_not.empty()) {
    nvml.why_not =
        std::string("the NVIDIA driver's libnvidia-ml.so.1 has no ") + name + ": update the driver";
  }
  return function != nullptr;
}

//! [nvml-load]
// Loaded and initialised once; never unloaded (NVML's own threads may outlive a dlclose).
const Nvml& nvml() {
  static const Nvml instance = [] {
    Nvml n;
    n.library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (n.library == nullptr) {
      n.why_not = std::string("no NVIDIA management library (") + dlerror() +
                  "): it comes with the NVIDIA driver";
      return n;
    }
    bool ok = find(n, n.init, "nvmlInit_v2") && find(n, n.error_string, "nvmlErrorString") &&
              find(n, n.by_uuid, "nvmlDeviceGetHandleByUUID") &&
              find(n, n.memory_info, "nvmlDeviceGetMemoryInfo") &&
              find(n, n.process_name, "nvmlSystemGetProcessName");
    n.processes = reinterpret_cast<decltype(n.processes)>(
        dlsym(n.library, "nvmlDeviceGetComputeRunningProcesses_v3"));
    if (ok && n.processes == nullptr) {  // drivers before 510 have only the _v2 query
      ok = find(n, n.processes, "nvmlDeviceGetComputeRunningProcesses_v2");
    }
    if (ok) {
      const nvmlReturn_t status = n.init();
      if (status != kSuccess) n.why_not = std::string("nvmlInit failed: ") + n.error_string(status);
    }
    return n;
  }();
  return instance;
}
//! [nvml-load]

std::string failed(const Nvml& n, const char* what, nvmlReturn_t status) {
  return std::string(what) + " failed: " + n.error_string(status);
}

}  // namespace

SmiView smi_view(const c10::Device& device) {
  SmiView view;
  if (!device.is_cuda()) {
    view.why_not = "needs CUDA";
    return view;
  }
  if (course::cuda_device_count() == 0) {
    view.why_not = "needs CUDA: " + course::why_no_cuda();
    return view;
  }
  const Nvml& n = nvml();
  if (!n.why_not.empty()) {
    view.why_not = n.why_not;
    return view;
  }
  // NVML numbers GPUs its own way (CUDA_VISIBLE_DEVICES does not renumber them): the UUID names
  // the same GPU in both.
  const std::vector<course::GpuInfo> gpus = course::list_gpus();
  const auto index = static_cast<size_t>(device.has_index() ? device.index() : 0);
  if (index >= gpus.size() || gpus[index].uuid.empty()) {
    view.why_not = "no UUID for " + device.str();
    return view;
  }
  nvmlDevice_t handle = nullptr;
  nvmlReturn_t status = n.by_uuid(gpus[index].uuid.c_str(), &handle);
  if (status != kSuccess) {
    view.why_not = failed(n, "nvmlDeviceGetHandleByUUID", status);
    return view;
  }
  nvmlMemory_t memory{};
  status = n.memory_info(handle, &memory);
  if (status != kSuccess) {
    view.why_not = failed(n, "nvmlDeviceGetMemoryInfo", status);
    return view;
  }
  view.total = static_cast<std::int64_t>(memory.total);
  view.used = static_cast<std::int64_t>(memory.used);
  view.free = static_cast<std::int64_t>(memory.free);
  // Ask with room for what was there a moment ago; processes may start in between, so retry.
  std::vector<nvmlProcessInfo_t> infos(16);
  unsigned int count = 0;
  for (int attempt = 0; attempt < 4; ++attempt) {
    count = static_cast<unsigned int>(infos.size());
    status = n.processes(handle, &count, infos.data());
    if (status != kInsufficientSize) break;
    infos.resize(count + 16);
  }
  if (status != kSuccess) {
    view.why_not = failed(n, "nvmlDeviceGetComputeRunningProcesses", status);
    return view;
  }
  for (unsigned int i = 0; i < count; ++i) {
    GpuProcess p;
    p.pid = infos[i].pid;
    if (infos[i].usedGpuMemory != kNotAvailable) {
      p.bytes = static_cast<std::int64_t>(infos[i].usedGpuMemory);
    }
    char name[256] = {};
    if (n.process_name(p.pid, name, sizeof name) == kSuccess) p.name = name;
    view.processes.push_back(p);
  }
  view.available = true;
  return view;
}

//! [watch-thread]
SmiWatch::SmiWatch(const c10::Device& device, std::chrono::milliseconds period, std::ostream& out)
    : thread_([this, device, period, &out] { run(device, period, out); }) {}

SmiWatch::~SmiWatch() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

int SmiWatch::lines() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lines_;
}

void SmiWatch::run(c10::Device device, std::chrono::milliseconds period, std::ostream& out) {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    const SmiView view = smi_view(device);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    char line[256];
    if (!view.available) {
      std::snprintf(line, sizeof line, "  [nvidia-smi] nothing to watch: %s\n",
                    view.why_not.c_str());
    } else {
      std::int64_t mine = -1;  // this process, as the driver counts it (-1: not listed)
      for (const GpuProcess& p : view.processes) {
        if (p.pid == static_cast<unsigned>(getpid())) mine = p.bytes;
      }
      std::snprintf(
          line, sizeof line, "  [nvidia-smi %5.1f s] %s used of %s; this process %s\n", seconds,
          course::format_bytes(static_cast<double>(view.used)).c_str(),
          course::format_bytes(static_cast<double>(view.total)).c_str(),
          mine < 0 ? "not listed" : course::format_bytes(static_cast<double>(mine)).c_str());
    }
    out << line << std::flush;
    ++lines_;
    if (!view.available) return;  // nothing will change: one line is enough
    wake_.wait_for(lock, period, [this] { return stop_; });
  }
}
//! [watch-thread]

MemGetInfo mem_get_info(const c10::Device& device) {
  MemGetInfo memory;
#ifdef GPU_LESSONS_WITH_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDAGuard guard(device.index());
    size_t free_bytes = 0, total_bytes = 0;
    const cudaError_t status = cudaMemGetInfo(&free_bytes, &total_bytes);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();  // clear it, or the next kernel launch would report it
      TORCH_CHECK(false, "cudaMemGetInfo on ", device.str(),
                  " failed: ", cudaGetErrorString(status));
    }
    memory.free = static_cast<std::int64_t>(free_bytes);
    memory.total = static_cast<std::int64_t>(total_bytes);
  }
#endif
  (void)device;
  return memory;
}

//! [smi-view]
void show_smi_view(const c10::Device& device, const course::MemoryStats& mine) {
  const auto mib = [](std::int64_t bytes) {
    return course::format_bytes(static_cast<double>(bytes));
  };
  if (!device.is_cuda()) {
    std::cout << "\nnvidia-smi's view against the allocator's (skipped: needs CUDA)\n";
    return;
  }
  const SmiView smi = smi_view(device);  // what nvidia-smi reads: NVML
  if (!smi.available) {  // without NVML: the driver's total and free, and no process list
    const MemGetInfo dm = mem_get_info(device);
    std::cout << "\nnvidia-smi's process list (skipped: " << smi.why_not << ")\n";
    std::cout << "The driver: " << mib(dm.total - dm.free) << " used of " << mib(dm.total) << "\n";
    std::cout << "This process's allocator: " << mib(mine.reserved) << " reserved, "
              << mib(mine.allocated) << " allocated\n";
    return;
  }
  std::cout << "\nWhat nvidia-smi shows for " << device << ": " << mib(smi.used) << " used of "
            << mib(smi.total) << ", by " << smi.processes.size() << " process(es):\n";
  const GpuProcess* self = nullptr;  // this process in the list, if NVML lists it
  for (const GpuProcess& p : smi.processes) {
    const bool me = p.pid == static_cast<unsigned>(getpid());
    if (me) self = &p;
    std::cout << "  pid " << p.pid << "  " << (p.bytes < 0 ? "(not reported)" : mib(p.bytes))
              << "  " << p.name << (me ? "  <- this process" : "") << "\n";
  }
  std::cout << "This process's allocator: " << mib(mine.reserved) << " reserved, "
            << mib(mine.allocated) << " allocated\n";
  if (self != nullptr && self->bytes >= 0) {
    std::cout << "  nvidia-smi counts " << mib(self->bytes - mine.reserved)
              << " more for this process: its CUDA context (the kernels' code, the runtime's and "
                 "the libraries' own memory). The rest of 'used' belongs to the other processes "
                 "and the driver.\n";
  } else {
    std::cout << "  this process is not in the list with its memory: in a container NVML names "
                 "processes by the host's process IDs, or the driver keeps the figure back\n";
  }
}
//! [smi-view]

}  // namespace lesson07
