// bench_checkpoint: the costs of checkpoints. Saving and loading a model of a few hundred MB, from
// and to the CPU and the GPU (lesson 13's atomic save with fsync against lesson 10's in-place
// save_to(path)), and lesson 16's activation checkpointing: step time and peak memory against the
// plain step. GPU timings synchronize before reading the clock; files go to $TMPDIR (default
// /tmp), so disk speed is part of a save.
//
// Run: build/bin/bench_checkpoint --benchmark_out=checkpoint.json --benchmark_out_format=json
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>

#include "bench.h"
#include "memory/memory.h"
#include "write_atomically.h"  // defines: lesson 13's write_atomically
// Lesson 16 is one file with its own main(); the benchmark includes it for its functions.
#define GPU_LESSONS_NO_MAIN
#include "activation_checkpointing.cpp"

namespace {

namespace fs = std::filesystem;

// A model of `megabytes` MiB of fp32 parameters: Linear(2048, 2048) layers of 16 MiB each.
torch::nn::Sequential make_big_model(std::int64_t megabytes, const torch::Device& device) {
  torch::nn::Sequential model;
  for (std::int64_t i = 0; i < megabytes / 16; ++i) {
    model->push_back(torch::nn::Linear(torch::nn::LinearOptions(2048, 2048).bias(false)));
  }
  model->to(device);
  return model;
}

torch::serialize::OutputArchive archive_of(torch::nn::Sequential& model) {
  torch::serialize::OutputArchive archive;
  for (const auto& p : model->named_parameters()) archive.write(p.key(), p.value());
  return archive;
}

std::string scratch_file(const char* name) {
  return (fs::temp_directory_path() /
          (std::string("bench_checkpoint-") + std::to_string(::getpid()) + "-" + name))
      .string();
}

// ---- save and load -----------------------------------------------------------------------------
void save(benchmark::State& state, const torch::Device& device) {
  const std::int64_t megabytes = state.range(0);
  const bool atomic = state.range(1) != 0;
  torch::nn::Sequential model = make_big_model(megabytes, device);
  const std::string path = scratch_file("save.pt");
  bench::run_timed(state, device, [&] {
    // The archive is built inside the timed region: on a GPU it copies every tensor to the host.
    torch::serialize::OutputArchive archive = archive_of(model);
    if (atomic) {
      lesson13::write_atomically(path, [&](const lesson13::Sink& sink) { archive.save_to(sink); });
    } else {
      archive.save_to(path);
    }
  });
  state.SetBytesProcessed(state.iterations() * megabytes * (1 << 20));
  fs::remove(path);
}

void load(benchmark::State& state, const torch::Device& device) {
  const std::int64_t megabytes = state.range(0);
  torch::nn::Sequential model = make_big_model(megabytes, device);
  const std::string path = scratch_file("load.pt");
  archive_of(model).save_to(path);
  const auto named = model->named_parameters();
  bench::run_timed(state, device, [&] {
    torch::serialize::InputArchive archive;
    archive.load_from(path, device);  // from the page cache after the first run
    torch::NoGradGuard no_grad;
    for (const auto& p : named) {
      torch::Tensor t;
      archive.read(p.key(), t);
      p.value().copy_(t);
    }
  });
  state.SetBytesProcessed(state.iterations() * megabytes * (1 << 20));
  fs::remove(path);
}

void BM_SaveCpu(benchmark::State& state) { save(state, torch::kCPU); }
void BM_SaveCuda(benchmark::State& state) {
  c10::Device device(torch::kCPU);
  if (bench::gpu_or_skip(state, device)) save(state, device);
}
void BM_LoadCpu(benchmark::State& state) { load(state, torch::kCPU); }
void BM_LoadCuda(benchmark::State& state) {
  c10::Device device(torch::kCPU);
  if (bench::gpu_or_skip(state, device)) load(state, device);
}

// ---- activation checkpointing -------------------------------------------------------------------
void activation(benchmark::State& state, const torch::Device& device) {
  course::install_counting_cpu_allocator();
  const bool checkpointed = state.range(0) != 0;
  const int depth = static_cast<int>(state.range(1));
  const std::int64_t batch = state.range(2);
  torch::manual_seed(lesson16::kSeed);
  lesson16::DeepMlp model(depth, lesson16::kDeepWidth);
  const lesson16::StepCost cost = lesson16::measure_step(model, batch, checkpointed, device);
  const auto options = torch::TensorOptions().device(device);
  const torch::Tensor x = torch::randn({batch, lesson16::kDeepWidth}, options);
  const torch::Tensor y = torch::randint(0, 10, {batch}, options.dtype(torch::kLong));
  bench::run_timed(state, device, [&] {
    for (auto& p : model->parameters()) p.mutable_grad().zero_();
    torch::nn::functional::cross_entropy(model->forward(x, checkpointed), y).backward();
  });
  state.SetItemsProcessed(state.iterations() * batch);
  state.counters["peak_bytes"] = static_cast<double>(cost.peak_bytes);
}

void BM_ActivationCpu(benchmark::State& state) { activation(state, torch::kCPU); }
void BM_ActivationCuda(benchmark::State& state) {
  c10::Device device(torch::kCPU);
  if (bench::gpu_or_skip(state, device)) activation(state, device);
}

void save_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"mb", "atomic"});
  for (const std::int64_t mb : {16, 256}) {
    for (const std::int64_t atomic : {0, 1}) b->Args({mb, atomic});
  }
}

void activation_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"checkpointed", "depth", "batch"});
  for (const std::int64_t depth : {8, 16}) {
    for (const std::int64_t batch : {256, 1024}) {
      for (const std::int64_t checkpointed : {0, 1}) b->Args({checkpointed, depth, batch});
    }
  }
}

}  // namespace

BENCHMARK(BM_SaveCpu)
    ->Apply(save_args)
    ->Iterations(3)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SaveCuda)
    ->Apply(save_args)
    ->Iterations(3)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LoadCpu)
    ->ArgName("mb")
    ->Arg(16)
    ->Arg(256)
    ->Iterations(3)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LoadCuda)
    ->ArgName("mb")
    ->Arg(16)
    ->Arg(256)
    ->Iterations(3)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ActivationCpu)->Apply(activation_args)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ActivationCuda)
    ->Apply(activation_args)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
