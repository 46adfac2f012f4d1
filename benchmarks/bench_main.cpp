// bench_main.cpp: the main of every benchmark program: uses all cores, as the lessons do, and
// records LibTorch's version, threads and GPU in the JSON context.
#include <ATen/Parallel.h>
#include <torch/version.h>

#include <cstdlib>

#include "bench.h"
#include "common/cli.h"
#include "common/device.h"

namespace bench {

bool gpu_or_skip(benchmark::State& state, c10::Device& device) {
  if (course::cuda_device_count() == 0) {
    state.SkipWithError(("needs CUDA: " + course::why_no_cuda()).c_str());
    return false;
  }
  device = c10::Device(c10::kCUDA, 0);
  return true;
}

namespace {
double seconds_of(const c10::Device& device, const std::function<void()>& work, int calls) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) work();
  course::synchronize(device);  // the GPU runs asynchronously: wait before reading the clock
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace

void run_timed(benchmark::State& state, const c10::Device& device,
               const std::function<void()>& work, int calls_per_sync) {
  constexpr double kMinSeconds = 1e-3;  // per clock reading, on CUDA: sync and launch < 1%
  constexpr int kMaxCalls = 1024;
  work();  // warm-up: kernel selection, allocator caches, lazy initialization
  course::synchronize(device);
  int calls = calls_per_sync > 0 ? calls_per_sync : 1;
  if (calls_per_sync <= 0 && device.is_cuda()) {
    while (calls < kMaxCalls && seconds_of(device, work, calls) < kMinSeconds) calls *= 2;
  }
  // One iteration is one call, so that the Time column and --benchmark_min_time mean what they
  // say (an iteration that ran `calls` calls but reported one call's time made a run `calls`
  // times longer than asked: seen on an H200, where calls reached 128). The clock is read before
  // the first call of a batch and, after a synchronize, after its `calls`-th call or the run's
  // last; that batch's time goes to the iteration that ends it and 0 to the others, and the
  // library adds them up.
  using Clock = std::chrono::steady_clock;
  benchmark::IterationCount done = 0;
  int pending = 0;
  Clock::time_point start;
  for (auto _ : state) {
    if (pending == 0) start = Clock::now();  // a batch begins (after the threads' start barrier)
    work();
    ++done;
    if (++pending < calls && done < state.max_iterations) {
      state.SetIterationTime(0.0);
      continue;
    }
    course::synchronize(device);  // the GPU runs asynchronously: wait before reading the clock
    state.SetIterationTime(std::chrono::duration<double>(Clock::now() - start).count());
    pending = 0;
  }
  state.counters["calls_per_sync"] = benchmark::Counter(calls, benchmark::Counter::kAvgThreads);
}

}  // namespace bench

int main(int argc, char** argv) {
  const int cores = course::available_cores();
  at::set_num_threads(cores);
  benchmark::AddCustomContext("libtorch", TORCH_VERSION);
  benchmark::AddCustomContext("torch_threads", std::to_string(at::get_num_threads()));
  // What the threads run on: the cores this process may use (its affinity, at most its quota),
  // and how OpenMP's idle threads wait (spinning takes a core from a thread with work).
  benchmark::AddCustomContext("cores", std::to_string(cores));
  benchmark::AddCustomContext("cpu_quota_cores", std::to_string(course::cpu_quota_cores()));
  for (const char* name : {"OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"}) {
    if (const char* value = std::getenv(name)) benchmark::AddCustomContext(name, value);
  }
  benchmark::AddCustomContext("cuda_device", course::cuda_device_count() > 0
                                                 ? course::describe(c10::Device(c10::kCUDA, 0))
                                                 : "none (" + course::why_no_cuda() + ")");
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
