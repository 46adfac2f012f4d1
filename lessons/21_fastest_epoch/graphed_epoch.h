// graphed_epoch.h defines: GraphedEpoch, lesson 21's "graphed" form: a step (the lesson's fused
// step) for every batch of an epoch, captured once as one CUDA graph and replayed once per epoch.
#pragma once

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#ifdef GPU_LESSONS_WITH_CUDA         // CMake defines it when this LibTorch has CUDA
#include <ATen/cuda/CUDAGraph.h>     // defines: at::cuda::CUDAGraph (capture, replay)
#include <c10/cuda/CUDAFunctions.h>  // defines: c10::cuda::device_synchronize, C10_CUDA_CHECK
#include <c10/cuda/CUDAGuard.h>      // defines: c10::cuda::CUDAStreamGuard
#include <c10/cuda/CUDAStream.h>     // defines: c10::cuda::getStreamFromPool
#endif

#include "common/verdict.h"  // defines: CourseError
#include "common/version.h"  // defines: GPU_LESSONS_TORCH_AT_LEAST
#include "device_shuffle.h"  // defines: EpochData
#include "flat_trainer.h"    // defines: FlatTrainer

namespace lesson21 {

//! [graphed-epoch]
// A step the graph records, on one batch: the lesson passes its fused step (fastest_epoch.cpp).
using FlatStep = std::function<void(FlatTrainer& trainer, const torch::Tensor& images,
                                    const torch::Tensor& labels, torch::Tensor loss_out)>;

// `step` for every batch of `epoch`, captured once and replayed once per epoch: one launch for
// all its kernels. A capture records the GPU's work only: the loop, the map lookups and the ifs of
// the step run once, while capturing, and never at a replay. So what changes from epoch to epoch
// must be in tensors whose addresses never change: the graph reads `epoch`'s images and labels and
// writes its losses (shuffle into them before replay()), and Adam's step count is a tensor.
class GraphedEpoch {
 public:
  GraphedEpoch([[maybe_unused]] FlatTrainer& trainer, EpochData& epoch,
               [[maybe_unused]] const FlatStep& step) {
    const torch::Device device = epoch.losses.device();
    if (!device.is_cuda())
      throw course::CourseError("a CUDA graph needs a CUDA device, and this is " + device.str(),
                                "run with --device cuda on a machine with a GPU");
#ifdef GPU_LESSONS_WITH_CUDA
    // Warm-up steps on the capture stream: they make cuBLAS's handle and workspace, which cannot
    // be made while capturing, and the step's buffers for both batch sizes, so that the captured
    // steps only use them. The warm-up steps train, so the state is put back after them.
    const std::vector<torch::Tensor> state = {trainer.flat.values, trainer.exp_avg,
                                              trainer.exp_avg_sq, trainer.step};
    std::vector<torch::Tensor> saved;
    for (const auto& t : state) saved.push_back(t.clone());
    c10::cuda::device_synchronize();
    const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device.index());
    {
      c10::cuda::CUDAStreamGuard on_side_stream(side);
      for (int round = 0; round < 2; ++round)  // the first batch and the last (it may be smaller)
        for (const std::int64_t k : {std::int64_t{0}, epoch.steps() - 1})
          step(trainer, epoch.batch_images[k], epoch.batch_labels[k], epoch.loss_slots[k]);
      for (size_t i = 0; i < state.size(); ++i) state[i].detach().copy_(saved[i]);
      c10::cuda::device_synchronize();  // the capture starts from a GPU with nothing queued
#if GPU_LESSONS_TORCH_AT_LEAST(2, 8)  // the graph kept after the capture: its nodes can be counted
      graph_.emplace(/*keep_graph=*/true);
#else
      graph_.emplace();
#endif
      graph_->capture_begin();  // from here kernels are recorded, not run
      for (std::int64_t k = 0; k < epoch.steps(); ++k)
        step(trainer, epoch.batch_images[k], epoch.batch_labels[k], epoch.loss_slots[k]);
      graph_->capture_end();
#if GPU_LESSONS_TORCH_AT_LEAST(2, 8)
      C10_CUDA_CHECK(cudaGraphGetNodes(graph_->raw_cuda_graph(), nullptr, &kernels_));
      graph_->instantiate();
#endif
    }
    c10::cuda::device_synchronize();
#endif
  }
  std::size_t kernels() const { return kernels_; }  // the graph's nodes (0: not counted)
  void replay() {  // one epoch: every step's kernels, one launch from the host
#ifdef GPU_LESSONS_WITH_CUDA
    graph_->replay();
#endif
  }

 private:
  std::size_t kernels_ = 0;
#ifdef GPU_LESSONS_WITH_CUDA
  std::optional<at::cuda::CUDAGraph> graph_;
#endif
};
//! [graphed-epoch]

}  // namespace lesson21
