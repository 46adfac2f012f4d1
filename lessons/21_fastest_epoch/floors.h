// floors.h defines: what bounds lesson 21's forms, printed as its part 3: each form's operators
// per step and the time each costs, the compute floor (the epoch's arithmetic at the device's
// matmul rate) and, on CUDA, the launch floor (the graph's kernels at what a replayed kernel
// costs).
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#ifdef GPU_LESSONS_WITH_CUDA         // CMake defines it when this LibTorch has CUDA
#include <ATen/cuda/CUDAGraph.h>     // defines: at::cuda::CUDAGraph (capture, replay)
#include <c10/cuda/CUDAFunctions.h>  // defines: c10::cuda::device_synchronize
#include <c10/cuda/CUDAGuard.h>      // defines: c10::cuda::CUDAStreamGuard
#include <c10/cuda/CUDAStream.h>     // defines: c10::cuda::getStreamFromPool
#endif

#include "common/ann.h"     // defines: kTrainingFlopsPerSample
#include "common/report.h"  // defines: TimedRun
#include "common/timing.h"  // defines: time_median, matmul_rate

namespace lesson21 {

//! [replay-floor]
// On CUDA, what a graph costs per kernel it replays: a graph of 1,000 one-element kernels, each
// waiting for the one before (as a training step's do), the median of 5 replays per kernel.
inline double replay_seconds_per_kernel([[maybe_unused]] const torch::Device& device) {
#ifdef GPU_LESSONS_WITH_CUDA
  torch::Tensor x = torch::zeros({1}, torch::TensorOptions().device(device));
  at::cuda::CUDAGraph graph;
  {
    c10::cuda::CUDAStreamGuard on_side_stream(c10::cuda::getStreamFromPool(false, device.index()));
    x.add_(1);  // warm-up, before the capture
    c10::cuda::device_synchronize();
    graph.capture_begin();
    for (int i = 0; i < 1000; ++i) x.add_(1);
    graph.capture_end();
  }
  return course::time_median([&] { graph.replay(); }, device, 2, 5).median_s / 1000;
#else
  return 0;  // no CUDA in this LibTorch: never called
#endif
}
//! [replay-floor]

// Part 3: for each timed form (`rows`, its median epoch), its operators per step
// (`ops_per_step(name)`) and the time each took; the compute floor; with `kernels` per step in
// the graph (CUDA, 0: not counted), the launch floor beside the goal, `goal_ms` per epoch.
inline void print_floors(const std::vector<course::TimedRun>& rows,
                         const std::function<long long(const std::string&)>& ops_per_step,
                         std::int64_t samples, std::int64_t batch_size, double kernels,
                         double goal_ms, const torch::Device& device) {
  const double steps = static_cast<double>((samples + batch_size - 1) / batch_size);
  std::printf("\n3. operators per step, and the floor\n  %-9s %13s %13s\n", "form", "ops/step",
              "us per op");
  double fastest = 0;
  for (const auto& row : rows) {
    const long long ops = ops_per_step(row.name);
    fastest = fastest == 0 ? row.timing.median_s : std::min(fastest, row.timing.median_s);
    std::printf("  %-9s %13lld %13.2f\n", row.name.c_str(), ops,
                row.timing.median_s / steps / static_cast<double>(ops) * 1e6);
  }
  const double flops = course::kTrainingFlopsPerSample * static_cast<double>(samples);
  const double rate = course::matmul_rate(device);
  std::printf(
      "  compute floor: %.1f GFLOP per epoch at %.0f GFLOP/s (a 1024x1024 product on "
      "%s) = %.1f ms per epoch; the fastest form took %.1fx it\n",
      flops / 1e9, rate / 1e9, device.str().c_str(), flops / rate * 1e3, fastest / (flops / rate));
  if (kernels > 0) {
    const double per_kernel = replay_seconds_per_kernel(device);
    std::printf(
        "  launch floor: %.0f kernels per step in the graph x %.0f steps x %.2f us per kernel a "
        "graph replays = %.1f ms per epoch (the goal, the course's, about 1 us a kernel: "
        "%.0f ms)\n",
        kernels, steps, per_kernel * 1e6, kernels * steps * per_kernel * 1e3, goal_ms);
  }
}

}  // namespace lesson21
