// bench_distributed: lesson 09's collectives and step on real c10d groups. Each benchmark thread
// is one rank (Gloo ranks talk over TCP loopback, as two processes on one host would; NCCL ranks
// each drive their own GPU):
//   - all-reduce time and bandwidth against message size, 4 KiB .. 64 MiB (Gloo on the CPU; NCCL
//     on the GPUs). algbw = bytes / time; busbw = algbw * 2(n-1)/n, the link traffic a ring
//     all-reduce needs, comparable across world sizes (nccl-tests' convention);
//   - lesson 09's training step (batch 64 per rank, the gradients' bucket all-reduced) for world
//   size 1
//     against 2. On the CPU each rank gets one core, so the two worlds use 1 and 2 cores.
//
// Run: build/bin/bench_distributed --benchmark_out=distributed.json --benchmark_out_format=json
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <array>
#include <atomic>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "bench.h"
#include "common/cli.h"  // defines: available_cores
#include "common/device.h"

// The lesson is one file with its own main(); the benchmark includes it for its functions.
#define GPU_LESSONS_NO_MAIN
#include "data_parallel.cpp"

namespace {

constexpr std::chrono::milliseconds kTimeout{120000};  // a collective that waits this long failed

// One group per benchmark run, shared by its threads: the threads of a run meet in one
// HashStore under a prefix of their own. Runs follow each other, and every thread of a run with
// n threads counts once in the counter of n, so calls / n numbers the runs with n threads.
c10::intrusive_ptr<course::CommGroup> group_for(benchmark::State& state,
                                                const torch::Device& device) {
  static auto store = c10::make_intrusive<c10d::HashStore>();
  static std::array<std::atomic<int>, 64> calls{};
  const int world = state.threads();
  const int run = calls.at(world)++ / world;
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(
      "world" + std::to_string(world) + "/run" + std::to_string(run), store);
  return lesson09::make_group(prefixed, state.thread_index(), world, device, kTimeout);
}

// The device of this thread's rank, or false (and the run skipped) when there is none.
bool rank_device(benchmark::State& state, bool cuda, torch::Device& device) {
  if (cuda) {
    if (course::cuda_device_count() < state.threads()) {
      state.SkipWithError(
          ("needs " + std::to_string(state.threads()) +
           " GPU(s): " + (course::cuda_device_count() > 0 ? "fewer found" : course::why_no_cuda()))
              .c_str());
      return false;
    }
    device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(state.thread_index()));
  } else {
    device = torch::kCPU;
  }
  return true;  // a build without the device's backend: make_group says so, and the run is skipped
}

// Every rank must make the same number of calls (each is a collective), so the count per clock
// read is fixed rather than calibrated by each rank on its own: several on a GPU, where one call
// per synchronize would time the synchronize.
int calls_per_sync(const torch::Device& device) { return device.is_cuda() ? 16 : 1; }

// Runs a benchmark body; a c10d error (a group that cannot form, a backend this build has not got)
// ends the run with its message.
void guarded(benchmark::State& state, void (*body)(benchmark::State&, bool), bool cuda) {
  try {
    body(state, cuda);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// ---- all-reduce against message size ------------------------------------------------------------
void allreduce(benchmark::State& state, bool cuda) {
  torch::Device device(torch::kCPU);
  if (!rank_device(state, cuda, device)) return;
  auto group = group_for(state, device);
  const std::int64_t bytes = state.range(0);
  torch::Tensor buffer = torch::ones({bytes / 4}, torch::TensorOptions().device(device));
  bench::run_timed(
      state, device, [&] { lesson09::allreduce_sum(*group, buffer, kTimeout); },
      calls_per_sync(device));
  // Bytes per second, averaged over the ranks (each rank reduces the same buffer).
  const int n = state.threads();
  const auto per_rank = benchmark::Counter::Flags(benchmark::Counter::kIsIterationInvariantRate |
                                                  benchmark::Counter::kAvgThreads);
  state.counters["algbw"] =
      benchmark::Counter(static_cast<double>(bytes), per_rank, benchmark::Counter::kIs1024);
  state.counters["busbw"] = benchmark::Counter(static_cast<double>(bytes) * 2.0 * (n - 1) / n,
                                               per_rank, benchmark::Counter::kIs1024);
}
void BM_AllreduceGloo(benchmark::State& state) { guarded(state, allreduce, false); }
void BM_AllreduceNccl(benchmark::State& state) { guarded(state, allreduce, true); }

// ---- lesson 09's step: world size 1 against 2 ------------------------------------------------
void step(benchmark::State& state, bool cuda) {
  torch::Device device(torch::kCPU);
  if (!rank_device(state, cuda, device)) return;
  if (!cuda) at::set_num_threads(1);  // one core per rank
  auto group = group_for(state, device);
  const std::int64_t batch = state.range(0);
  lesson09::ANN model;
  model->to(device);
  lesson09::broadcast_parameters(*group, model->parameters(), kTimeout);
  torch::optim::Adam optimizer(model->parameters(),
                               torch::optim::AdamOptions(lesson09::kLearningRate));
  const auto on = torch::TensorOptions().device(device);
  const torch::Tensor images = torch::rand({batch, 784}, on);
  const torch::Tensor labels = torch::randint(10, {batch}, on.dtype(torch::kLong));
  bench::run_timed(
      state, device,
      [&] {
        optimizer.zero_grad();
        torch::nn::functional::cross_entropy(model->forward(images), labels).backward();
        lesson09::allreduce_gradients(*group, model->parameters(), kTimeout);
        optimizer.step();
      },
      calls_per_sync(device));
  // Samples per second of the whole job: every rank takes `batch` samples per step.
  state.counters["job_samples/s"] =
      benchmark::Counter(static_cast<double>(batch * state.threads()),
                         benchmark::Counter::Flags(benchmark::Counter::kIsIterationInvariantRate |
                                                   benchmark::Counter::kAvgThreads));
  if (!cuda) at::set_num_threads(course::available_cores());
}
void BM_StepGloo(benchmark::State& state) { guarded(state, step, false); }
void BM_StepNccl(benchmark::State& state) { guarded(state, step, true); }

void message_sizes(benchmark::internal::Benchmark* b) {
  b->ArgName("bytes");
  for (std::int64_t bytes = 4 << 10; bytes <= (64 << 20); bytes *= 4) b->Arg(bytes);
}

}  // namespace

BENCHMARK(BM_AllreduceGloo)->Apply(message_sizes)->Threads(2)->UseManualTime();
BENCHMARK(BM_AllreduceNccl)->Apply(message_sizes)->Threads(1)->Threads(2)->UseManualTime();
BENCHMARK(BM_StepGloo)->ArgName("batch")->Arg(64)->Threads(1)->Threads(2)->UseManualTime();
BENCHMARK(BM_StepNccl)->ArgName("batch")->Arg(64)->Threads(1)->Threads(2)->UseManualTime();
