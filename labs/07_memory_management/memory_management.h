// memory_management.h: what lesson 07 teaches, callable from its tests and benchmarks.
// See memory_management.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "common/memory.h"  // defines: course::MemoryStats

namespace lesson07 {

// ---- knobs -----------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 7;
constexpr std::int64_t kHidden = 1024;  // wide enough that activations dominate a step's memory
const std::vector<std::int64_t> kBatchSizes = {64, 256, 1024, 4096};
constexpr std::int64_t kFreeBytes = 256 << 20;      // the tensor freed in the free/empty demo
constexpr std::int64_t kCpuBudget = 256 << 20;      // CPU: allocations past this throw OOM
constexpr std::int64_t kCpuOomStartBatch = 65536;   // CPU: first batch the OOM loop tries

/// A wider MLP: 784 -> 1024 -> ReLU -> 1024 -> ReLU -> 10.
struct NetImpl : torch::nn::Module {
  NetImpl();
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(Net);

/// Bytes in the tensors that make up the model's training state: parameters, their gradients
/// and the optimizer's state (Adam: two moments per parameter).
std::int64_t state_bytes(Net& model, torch::optim::Adam& optimizer);

/// The memory of `device`: on CUDA the caching allocator's statistics, read with its own API; on
/// the CPU the course's counting allocator (common/memory.h), which LibTorch does not have.
course::MemoryStats read_memory(const torch::Device& device);
/// Starts a new peak and allocation count (torch.cuda.reset_peak_memory_stats()).
void reset_peak(const torch::Device& device);

/// One training step on a random batch made on `device`: forward, loss, backward, Adam.
void train_step(Net& model, torch::optim::Optimizer& optimizer, std::int64_t batch,
                const torch::Device& device);

/// The memory one training step takes.
struct StepMemory {
  std::int64_t batch = 0;
  std::int64_t peak = 0;         ///< peak allocated during the step, above what was there before
  std::int64_t activations = 0;  ///< held after forward by the graph (and the batch) for backward
  /// Activation bytes each sample adds: what makes a bigger batch cost more.
  double bytes_per_sample() const { return batch ? static_cast<double>(activations) / batch : 0; }
};
StepMemory measure_step(Net& model, torch::optim::Optimizer& optimizer, std::int64_t batch,
                        const torch::Device& device);

/// What freeing a tensor and emptying the cache do to allocated and reserved memory.
struct FreeFacts {
  std::int64_t allocated_before = 0, allocated_with = 0, allocated_after = 0;
  std::int64_t reserved_with = 0, reserved_after_free = 0, reserved_after_empty = 0;
};
FreeFacts free_then_empty(const torch::Device& device, std::int64_t bytes);

/// One try of the out-of-memory loop.
struct OomAttempt {
  std::int64_t batch = 0;
  bool fit = false;
  std::string error;  ///< first line of the out-of-memory error, when it did not fit
};
/// Tries a training step at `start`, halving the batch after each out-of-memory error, until
/// a step fits (or the batch would drop below 1).
std::vector<OomAttempt> shrink_until_fits(Net& model, torch::optim::Optimizer& optimizer,
                                          std::int64_t start, const torch::Device& device);

/// Prints what nvidia-smi shows for `device` (the driver's used and total, every process on the
/// GPU with its memory) beside this process's allocator; on the CPU, that it is skipped.
void show_smi_view(const torch::Device& device);

}  // namespace lesson07
