// Lesson 07 — memory management: measure it, free it, and survive running out of it.
//
// You will learn:
//   - the tutorial's tips, line for line: a large tensor deleted (in C++: its last handle let go),
//     torch.cuda.empty_cache(), nvidia-smi to watch it (--watch), and the memory read before and
//     after each (torch.cuda.memory_allocated(): not in the tutorial, but how to see its effect);
//   - to read allocated memory (held by live tensors) and reserved (held by the allocator: on
//     CUDA, allocated plus its cache), their peaks and the allocations, with the caching
//     allocator's own API (torch.cuda.memory_allocated() is CUDACachingAllocator::getDeviceStats);
//   - what a training step costs, and how it grows with the batch (the activations kept for
//     backward); a freed tensor's memory goes back to the allocator, not the device;
//   - out of memory is an exception (c10::OutOfMemoryError) to catch and recover from with a
//     smaller batch. On the CPU a budget on the course's counting allocator stands in for a full
//     GPU, so the same loop runs (and is tested) anywhere.
//
// Run:    build/bin/lesson07_memory_management [--device auto|cpu|cuda|cuda:N] [--quick] [--watch]
// Checks: the deleted tensor's memory returns to the baseline; peak memory grows with the batch
//         size; the OOM loop ends on a batch that fits after at least one failure. Exit 0 PASS,
//         1 FAIL, 2 bad flag.
#include <torch/torch.h>  // defines: torch::nn, torch::optim, c10::OutOfMemoryError

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

// GPU_LESSONS_WITH_CUDA: CMake defines it when this LibTorch has CUDA.
#ifdef GPU_LESSONS_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>  // defines: getDeviceStats, resetPeakStats, emptyCache
#endif

#include "common/cli.h"      // defines: Cli, start_lesson
#include "common/device.h"   // defines: format_bytes
#include "common/verdict.h"  // defines: Verdict, error_message, report_error
#include "memory/memory.h"   // defines: MemoryStats, the CPU's meter and budget
#include "smi_view.h"        // defines: show_smi_view, SmiWatch (nvidia-smi's view), mem_get_info
#include "training_state.h"  // defines: training_state_bytes

namespace lesson07 {

// ---- knobs -----------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 7;
constexpr std::int64_t kHidden = 1024;  // wide enough that activations dominate a step's memory
const std::vector<std::int64_t> kBatchSizes = {64, 256, 1024, 4096};
constexpr std::int64_t kFreeBytes = 256 << 20;     // my_large_tensor, in the tutorial's tips
constexpr std::int64_t kCpuBudget = 256 << 20;     // CPU: allocations past this throw OOM
constexpr std::int64_t kCpuOomStartBatch = 65536;  // CPU: first batch the OOM loop tries
constexpr int kWatchSeconds = 5;                   // --watch: how long steps train, watched

std::string mib(std::int64_t bytes) { return course::format_bytes(static_cast<double>(bytes)); }

// ---- 1. The tutorial's memory tips -------------------------------------------------------------
// torch.cuda.memory_allocated(), memory_reserved() and the rest: the caching allocator's own API,
// in section 3 (declared here, so that the tutorial's part can come first).
course::MemoryStats read_memory(const torch::Device& device);

/// Allocated and reserved memory around the tutorial's lines.
struct FreeFacts {
  std::int64_t allocated_before = 0;      ///< before the tensor is made
  std::int64_t allocated_with = 0;        ///< while it lives
  std::int64_t allocated_after = 0;       ///< after its last handle is let go
  std::int64_t reserved_with = 0;         ///< the allocator's hold while it lives
  std::int64_t reserved_after_free = 0;   ///< ... after it is freed (CUDA keeps the block)
  std::int64_t reserved_after_empty = 0;  ///< ... after emptyCache() (torch.cuda.empty_cache())
};

//! [tutorial]
FreeFacts free_then_empty(const torch::Device& device, std::int64_t bytes) {
  FreeFacts f;
  if (device.is_cuda()) torch::cuda::synchronize(device.index());  // torch.cuda.synchronize()
  // torch.cuda.memory_allocated() and memory_reserved(), before, with and after the tensor
  f.allocated_before = read_memory(device).allocated;
  torch::Tensor my_large_tensor = torch::empty({bytes / 4}, torch::TensorOptions().device(device));
  f.allocated_with = read_memory(device).allocated;
  f.reserved_with = read_memory(device).reserved;

  // del my_large_tensor: a C++ tensor dies with its last handle, at the end of the handle's scope
  // or, as here, when the handle is emptied. Its block goes back to the allocator (CUDA keeps it).
  my_large_tensor = torch::Tensor();
  f.allocated_after = read_memory(device).allocated;
  f.reserved_after_free = read_memory(device).reserved;

  // >>> lab: return the allocator's unused cached blocks to the driver (torch.cuda.empty_cache())
#ifdef GPU_LESSONS_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();  // torch.cuda.empty_cache()
#endif
  // <<< lab
  f.reserved_after_empty = read_memory(device).reserved;
  return f;
}
//! [tutorial]

// ---- 2. A model and its training state ---------------------------------------------------------
/// A wider MLP: 784 -> 1024 -> ReLU -> 1024 -> ReLU -> 10.
struct NetImpl : torch::nn::Module {
  NetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(784, kHidden))),
        fc2(register_module("fc2", torch::nn::Linear(kHidden, kHidden))),
        fc3(register_module("fc3", torch::nn::Linear(kHidden, 10))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = torch::relu(fc1(x));  // one statement per layer: see lesson 06
    h = torch::relu(fc2(h));
    return fc3(h);
  }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Net);

// ---- 3. Reading the allocator ------------------------------------------------------------------
/// The memory of `device`: on CUDA the caching allocator's statistics, read with its own API; on
/// the CPU the course's counting allocator (memory/memory.h), which LibTorch does not have.
//! [read-memory]
course::MemoryStats read_memory(const torch::Device& device) {
#ifdef GPU_LESSONS_WITH_CUDA
  if (device.is_cuda()) {
    // Python's torch.cuda.memory_allocated(d), max_memory_allocated(d), memory_reserved(d) and
    // max_memory_reserved(d) all read this one structure (torch.cuda.memory_stats(d) prints it).
    // The allocator exists once CUDA is initialised: here the model's move has done that.
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    course::MemoryStats m;  // element [0] of each array: the small and the large pool together
    m.allocated = stats.allocated_bytes[0].current;    // memory_allocated()
    m.peak_allocated = stats.allocated_bytes[0].peak;  // max_memory_allocated()
    m.reserved = stats.reserved_bytes[0].current;      // memory_reserved()
    m.peak_reserved = stats.reserved_bytes[0].peak;    // max_memory_reserved()
    m.allocations = stats.allocation[0].allocated;     // allocations since the last reset
    return m;
  }
#endif
  return course::memory_stats(device);  // the CPU has no caching allocator: the course counts
}

/// Starts a new peak and allocation count (Python: torch.cuda.reset_peak_memory_stats() and
/// torch.cuda.reset_accumulated_memory_stats()).
void reset_peak(const torch::Device& device) {
#ifdef GPU_LESSONS_WITH_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());  // reset_peak_memory_stats()
    c10::cuda::CUDACachingAllocator::resetAccumulatedStats(device.index());  // the counts
    return;
  }
#endif
  course::reset_peak_memory(device);
}
//! [read-memory]

/// One training step on a random batch made on `device`: forward, loss, backward, Adam.
void train_step(Net& model, torch::optim::Optimizer& optimizer, std::int64_t batch,
                const torch::Device& device) {
  const auto on = torch::TensorOptions().device(device);
  const torch::Tensor x = torch::rand({batch, 784}, on);
  const torch::Tensor y = torch::randint(10, {batch}, on.dtype(torch::kLong));
  // set_to_none frees the gradients between steps, so that they are not part of the next step's
  // memory (LibTorch 1.13's default keeps them, zeroed; 2.x frees them).
  model->zero_grad(/*set_to_none=*/true);
  torch::nn::functional::cross_entropy(model->forward(x), y).backward();
  optimizer.step();
}

/// The memory one training step takes.
struct StepMemory {
  std::int64_t batch = 0;
  std::int64_t peak = 0;         ///< peak allocated during the step, above what was there before
  std::int64_t activations = 0;  ///< held after forward by the graph (and the batch) for backward
  /// Activation bytes each sample adds: what makes a bigger batch cost more.
  double bytes_per_sample() const { return batch ? static_cast<double>(activations) / batch : 0; }
};

// ---- 4. What a step costs, and running out -----------------------------------------------------
//! [measure-step]
StepMemory measure_step(Net& model, torch::optim::Optimizer& optimizer, std::int64_t batch,
                        const torch::Device& device) {
  StepMemory result;
  result.batch = batch;
  model->zero_grad(/*set_to_none=*/true);
  if (device.is_cuda()) torch::cuda::synchronize(device.index());  // torch.cuda.synchronize()
  reset_peak(device);
  const std::int64_t before = read_memory(device).allocated;
  {
    const auto on = torch::TensorOptions().device(device);
    const torch::Tensor x = torch::rand({batch, 784}, on);
    const torch::Tensor y = torch::randint(10, {batch}, on.dtype(torch::kLong));
    const torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    // The graph now holds every activation backward needs: this is what a bigger batch costs.
    result.activations = read_memory(device).allocated - before;
    loss.backward();
    optimizer.step();
  }
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
  result.peak = read_memory(device).peak_allocated - before;
  return result;
}
//! [measure-step]

/// One try of the out-of-memory loop.
struct OomAttempt {
  std::int64_t batch = 0;
  bool fit = false;
  std::string error;  ///< first line of the out-of-memory error, when it did not fit
};

/// Tries a training step at `start`, halving the batch after each out-of-memory error, until
/// a step fits (or the batch would drop below 1).
//! [oom-loop]
std::vector<OomAttempt> shrink_until_fits(Net& model, torch::optim::Optimizer& optimizer,
                                          std::int64_t start, const torch::Device& device) {
  std::vector<OomAttempt> attempts;
  for (std::int64_t batch = start; batch >= 1; batch /= 2) {
    OomAttempt attempt;
    attempt.batch = batch;
    // >>> lab: one step at `batch`; on c10::OutOfMemoryError: record it, drop grads, empty cache
    try {
      train_step(model, optimizer, batch, device);
      if (device.is_cuda()) torch::cuda::synchronize(device.index());
      attempt.fit = true;
    } catch (const c10::OutOfMemoryError& error) {
      // The failed step's tensors were freed as the exception unwound the stack. Drop any
      // partial gradients, and return the cache so the next try starts clean.
      attempt.error = course::error_message(error);
      model->zero_grad(/*set_to_none=*/true);
#ifdef GPU_LESSONS_WITH_CUDA
      if (device.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
    }
    // <<< lab
    attempts.push_back(attempt);
    if (attempt.fit) break;
  }
  return attempts;
}
//! [oom-loop]

// --watch: steps train for kWatchSeconds while another thread prints nvidia-smi's view each second.
//! [watch]
void watch_training(Net& model, torch::optim::Optimizer& optimizer, std::int64_t batch,
                    const torch::Device& device) {
  if (!device.is_cuda()) {
    std::cout << "\n--watch: skipped: nvidia-smi watches a GPU, not the " << device << "\n";
    return;
  }
  std::cout << "\n--watch: " << kWatchSeconds << " s of steps at batch " << batch << ":\n";
  const SmiWatch watch(device, std::chrono::seconds(1), std::cout);  // stops at the `}`
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(kWatchSeconds);
  while (std::chrono::steady_clock::now() < end) train_step(model, optimizer, batch, device);
}
//! [watch]

// ---- the program's steps (main, below, runs them in order) --------------------------------------
// The training state against the allocator after the first step (on CUDA: cuBLAS, the device).
void print_state(std::int64_t state, const course::MemoryStats& after_first_step,
                 const torch::Device& device) {
  std::cout << "Model and optimizer state: " << mib(state)
            << " in tensors (parameters, gradients, Adam's two moments)\n"
            << "The allocator after the first step: " << course::describe(after_first_step) << "\n";
  if (!device.is_cuda()) return;
  std::cout << "  allocated beyond the state: " << mib(after_first_step.allocated - state)
            << ", cuBLAS's workspaces (one per thread and stream that ran a matmul: this "
               "thread's forward, autograd's thread's backward)\n";
  const MemGetInfo dm = mem_get_info(device);  // torch.cuda.mem_get_info(): (free, total)
  std::cout << "Device: " << mib(dm.total) << " total, " << mib(dm.free) << " free\n";
}

// measure_step() at each batch size, one row of the table each.
std::vector<StepMemory> measure_batches(Net& model, torch::optim::Optimizer& optimizer,
                                        const std::vector<std::int64_t>& batches,
                                        const torch::Device& device) {
  std::cout << "\n  batch   step peak   kept for backward   kept per sample\n";
  std::vector<StepMemory> steps;
  for (std::int64_t batch : batches) {
    steps.push_back(measure_step(model, optimizer, batch, device));
    const StepMemory& s = steps.back();
    std::printf("  %5lld  %11s  %18s  %14.0f B\n", static_cast<long long>(batch),
                mib(s.peak).c_str(), mib(s.activations).c_str(), s.bytes_per_sample());
  }
  std::cout << "  (step peak: the step's largest moment, in backward or in Adam's step; kept for "
               "backward: what the graph holds after forward)\n";
  return steps;
}

// The first batch the OOM loop tries: on CUDA twice what the whole device could hold, at the
// measured cost per sample; on the CPU kCpuOomStartBatch, under a budget of kCpuBudget.
std::int64_t oom_start_batch(const torch::Device& device, double bytes_per_sample) {
  if (!device.is_cuda()) {
    course::set_cpu_memory_budget(read_memory(device).allocated + kCpuBudget);
    std::cout << "\nCPU memory budget: " << mib(kCpuBudget)
              << " above what is in use (the counting allocator enforces it)\n";
    return kCpuOomStartBatch;
  }
  const double total = static_cast<double>(mem_get_info(device).total);
  std::int64_t start = 1;
  while (start * bytes_per_sample < 2.0 * total) start *= 2;
  return start;
}

}  // namespace lesson07

// ---- main ---------------------------------------------------------------------------------------
#ifndef GPU_LESSONS_NO_MAIN  // tests/test_lesson07.cpp and benchmarks/bench_memory.cpp include it
int main(int argc, char** argv) try {
  using namespace lesson07;
  course::CommonOptions options;
  options.seed = kSeed;
  course::Cli cli("lesson07_memory_management",
                  "Lesson 07: memory of a training step, freeing it, and recovering from OOM.",
                  options);
  bool watch = false;
  cli.add_flag("--watch", watch, "print nvidia-smi's view once a second while steps train (CUDA)");
  if (auto code = cli.parse(argc, argv)) return *code;
  // The tutorials' device line:
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  device = course::start_lesson(options, device);  // --device may override it; printed first
  course::install_counting_cpu_allocator();        // the CPU's memory meter, counted from here on
  course::Verdict verdict;

  torch::manual_seed(options.seed);
  Net model;
  model->to(device);  // on CUDA, the first tensor there also starts the caching allocator

  std::cout << "The tutorial's memory tips (tutorial 003, parts 4.2 and 5), a " << mib(kFreeBytes)
            << " tensor on " << device << ":\n";
  const FreeFacts f = free_then_empty(device, kFreeBytes);
  std::cout << "  allocated " << mib(f.allocated_before) << " -> " << mib(f.allocated_with)
            << " -> after the delete " << mib(f.allocated_after) << "\n";
  std::cout << "  reserved while alive " << mib(f.reserved_with) << ", after the delete "
            << mib(f.reserved_after_free) << ", after emptyCache " << mib(f.reserved_after_empty);
  if (!device.is_cuda()) std::cout << "  (the CPU has no cache: reserved = allocated)";
  std::cout << "\n";
  verdict.check(f.allocated_with - f.allocated_before >= kFreeBytes &&
                    f.allocated_after == f.allocated_before,
                "the deleted tensor's memory returns to the baseline");
  std::cout << "  Watch it: watch -n 1 nvidia-smi in a terminal, or this lesson with --watch\n\n";

  reset_peak(device);  // the peaks from here on leave the tutorial's tensor out
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-3));
  train_step(model, optimizer, 8, device);  // Adam's state exists from here on
  const std::int64_t state = training_state_bytes(*model, optimizer);
  const course::MemoryStats after_first_step = read_memory(device);
  print_state(state, after_first_step, device);

  // ---- peak memory of a training step against the batch size --------------------------------
  std::vector<std::int64_t> batches = kBatchSizes;
  if (options.quick) batches.resize(3);
  const std::vector<StepMemory> steps = measure_batches(model, optimizer, batches, device);
  bool grows = true;  // each batch's peak above the one before it
  for (size_t i = 1; i < steps.size(); ++i) {
    if (steps[i].peak <= steps[i - 1].peak) grows = false;
  }
  verdict.check(grows, "peak memory of a step grows with the batch size",
                mib(steps.front().peak) + " at " + std::to_string(steps.front().batch) + " to " +
                    mib(steps.back().peak) + " at " + std::to_string(steps.back().batch));

  // ---- out of memory, caught and recovered ------------------------------------------------------
  const std::int64_t start = oom_start_batch(device, steps.back().bytes_per_sample());
  std::cout << "\nOut of memory: start at batch " << start << ", halve until a step fits\n";
  const std::vector<OomAttempt> attempts = shrink_until_fits(model, optimizer, start, device);
  course::set_cpu_memory_budget(0);
  for (const auto& a : attempts) {
    std::cout << "  batch " << a.batch << ": " << (a.fit ? "fits" : "out of memory: " + a.error)
              << "\n";
  }
  verdict.check(attempts.size() >= 2 && attempts.back().fit,
                "the OOM loop recovers and ends on a batch that fits",
                std::to_string(attempts.size()) + " attempts, batch " +
                    std::to_string(attempts.back().batch));

  // ---- what nvidia-smi shows ------------------------------------------------------------------
  if (watch) watch_training(model, optimizer, attempts.back().batch, device);
  show_smi_view(device, read_memory(device));  // nvidia-smi's view beside this allocator's
  return verdict.finish("lesson 07 on " + device.str());
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
#endif
