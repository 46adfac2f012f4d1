// epoch_floors.h defines: what lesson 23 measures of its operator beside its time: where a step's
// time goes (each phase's, from the operator's clock), and on a GPU the kernels an epoch runs
// (LibTorch's profiler, lesson 20's, with the CUDA activity on), the grid the kernel runs as, and
// what one grid barrier costs (a kernel of nothing but barriers, timed).
#pragma once

#include <torch/csrc/autograd/profiler_kineto.h>  // defines: the profiler
#include <torch/torch.h>                          // defines: torch::Device

#include <cstdio>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#ifdef GPU_LESSONS_WITH_CUDA         // CMake defines it when this LibTorch has CUDA
#include <c10/cuda/CUDAException.h>  // defines: C10_CUDA_CHECK
#include <c10/cuda/CUDAGuard.h>      // defines: c10::cuda::CUDAGuard
#include <c10/cuda/CUDAStream.h>     // defines: c10::cuda::getCurrentCUDAStream
#endif

#include "common/device.h"  // defines: synchronize
#include "common/timing.h"  // defines: time_median
#include "epoch_kernel.h"   // defines: grid_blocks, launch_grid_syncs

namespace lesson23 {

//! [floors]
// Each phase's median time over the steps, in microseconds, from the clock the operator filled
// (the start, then the end of each phase of each step, in nanoseconds).
inline std::vector<double> phase_medians_us(const torch::Tensor& clock) {
  const torch::Tensor times = clock.cpu().to(torch::kDouble);  // .cpu() waits for the device
  const std::int64_t n = times.size(0) - 1;
  const torch::Tensor took = (times.narrow(0, 1, n) - times.narrow(0, 0, n)) / 1e3;
  const torch::Tensor medians =
      std::get<0>(took.view({-1, epoch_kernel::kGridSyncsPerStep}).median(/*dim=*/0)).contiguous();
  return {medians.data_ptr<double>(), medians.data_ptr<double>() + medians.numel()};
}

// On CUDA, the kernels `work` runs on the GPU, as the profiler records them (torch.profiler with
// ProfilerActivity.CUDA): all of them, and the course's own (train_epoch_kernel).
inline std::pair<int, int> kernels_of(const std::function<void()>& work,
                                      const torch::Device& device) {
  namespace profiler = torch::autograd::profiler;
  namespace impl = torch::profiler::impl;
  const impl::ProfilerConfig config(impl::ProfilerState::KINETO);
  const std::set<impl::ActivityType> activities = {impl::ActivityType::CPU,
                                                   impl::ActivityType::CUDA};
  profiler::prepareProfiler(config, activities);
  profiler::enableProfiler(config, activities);
  work();
  course::synchronize(device);  // its kernels are done, and recorded
  const auto result = profiler::disableProfiler();
  int all = 0, ours = 0;
  for (const auto& event : result->events()) {
    const std::string name = event.name();
    if (event.deviceType() != c10::DeviceType::CUDA || name.rfind("Memcpy", 0) == 0 ||
        name.rfind("Memset", 0) == 0)
      continue;  // host work, copies and fills
    ++all;
    if (name.find("train_epoch_kernel") != std::string::npos) ++ours;
  }
  return {all, ours};
}

// On CUDA, the grid the kernel runs as on this GPU, and what one grid barrier costs: the same grid
// running a kernel of `syncs` barriers and nothing else, the median of 5 runs, per barrier.
struct Grid {
  int blocks = 0;
  double seconds_per_sync = 0;
};
inline Grid measure_grid([[maybe_unused]] const torch::Device& device, [[maybe_unused]] int syncs) {
#ifdef GPU_LESSONS_WITH_CUDA
  const c10::cuda::CUDAGuard on_device(device);  // the GPU the lesson runs on
  cudaError_t error = cudaSuccess;
  const int blocks = epoch_kernel::grid_blocks(&error);
  C10_CUDA_CHECK(error);
  const auto launch = [&] {
    C10_CUDA_CHECK(epoch_kernel::launch_grid_syncs(syncs, c10::cuda::getCurrentCUDAStream()));
  };
  return {blocks, course::time_median(launch, device, 2, 5).median_s / syncs};
#else
  return {};  // no CUDA in this LibTorch: never called
#endif
}

// On CUDA, the kernels of one call of `epoch`, the kernel's grid and the barriers' floor of an
// epoch of `steps` steps (kGridSyncsPerStep a step, each at what one of `syncs` in a row costs).
inline void print_gpu_floors(const std::function<void()>& epoch, const torch::Device& device,
                             double steps, int syncs) {
  using epoch_kernel::kGridSyncsPerStep;
  const auto [all, ours] = kernels_of(epoch, device);
  const Grid grid = measure_grid(device, syncs);
  std::printf(
      "  the kernel's grid: %d blocks (one per SM) x %d threads, %u bytes of shared memory "
      "a block\n  kernels in one epoch: %d on the GPU, %d of them ours (the others: the "
      "shuffle and the loss's mean)\n  grid barriers: %d per step x %.0f steps x %.2f us "
      "each (a kernel of %d, timed) = %.1f ms per epoch (the barriers' floor)\n",
      grid.blocks, epoch_kernel::kThreads, epoch_kernel::kSharedBytes, all, ours, kGridSyncsPerStep,
      steps, grid.seconds_per_sync * 1e6, syncs,
      kGridSyncsPerStep * steps * grid.seconds_per_sync * 1e3);
}
//! [floors]

}  // namespace lesson23
