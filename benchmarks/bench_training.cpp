// bench_training: lesson 05's epoch (the tutorial's loop on LibTorch's data loader, 0 and 2
// workers) beside each of lessons 11's and 12's faster forms, in samples per second: an epoch of
// the tutorial's step fed by the pinned or the resident loader (batch sizes 64..4096; the pinned
// loader also with 0, 1 and 2 worker threads), an epoch of the flat and of the manual form, and
// (GPU) an epoch of lesson 19's step captured in a CUDA graph, at batch 64; the training step
// alone (the tutorial's against the flat one) on the CPU and the GPU; on the GPU also lesson 19's
// step eager against captured in a CUDA graph (batch 64 and 1024); an epoch of lesson 21's fused
// form, and (GPU) of its whole epoch in one CUDA graph; the CPU step with 1, 2, 4 and 16 LibTorch
// threads (what more threads than cores cost).
// GPU timings synchronize before reading the clock.
//
// Run: build/bin/bench_training --benchmark_out=training.json --benchmark_out_format=json
// The epoch benchmarks read Fashion-MNIST (--data-dir is not a benchmark flag: set
// GPU_LESSONS_DATA_DIR, or install dataset-fashion-mnist).
#include <torch/torch.h>

#include "bench.h"
#include "common/cli.h"  // defines: CpuThreads, available_cores
#include "common/data.h"
// Lessons 05, 11, 12, 19 and 21 are one file each with its own main(): their functions, without
// the mains.
#define GPU_LESSONS_NO_MAIN
#include "cuda_graphs.cpp"
#include "fast_training_loop.cpp"
#include "fastest_epoch.cpp"
#include "fewer_operators.cpp"
#include "training_loop.cpp"

namespace {

// FLOPs of one training sample: forward 2·W, backward 2·W for the weight gradients plus 2·W'
// for the input gradients of layers 2 and 3 (the images need no gradient). W = 109,184 weights.
constexpr double kForwardFlops = 2.0 * (784 * 128 + 128 * 64 + 64 * 10);
constexpr double kTrainFlopsPerSample = 2 * kForwardFlops + 2.0 * (128 * 64 + 64 * 10);

const course::ImageSet* train_set(benchmark::State& state) {
  static course::ImageSet data;
  static std::string error;
  if (!data.images.defined() && error.empty()) {
    try {
      data = course::load_fashion_mnist(course::find_fashion_mnist(""), /*train=*/true);
    } catch (const course::DataError& e) {
      error = e.what();
    }
  }
  if (!error.empty()) {
    state.SkipWithError(error.c_str());
    return nullptr;
  }
  return &data;
}

// ---- one training step on a fixed batch: the tutorial's step against lesson 12's flat one -----
void train_step(benchmark::State& state, const c10::Device& device) {
  const bool flat = state.range(0) != 0;
  const std::int64_t batch = state.range(1);
  const auto on = torch::TensorOptions().device(device);
  const torch::Tensor images = torch::rand({batch, 784}, on);
  const torch::Tensor labels = torch::randint(10, {batch}, on.dtype(torch::kLong));
  const lesson12::Batch on_device{images, labels};
  if (flat) {  // the lesson's own steps
    lesson12::FlatTrainer trainer = lesson12::make_flat_trainer(device, lesson12::kSeed);
    bench::run_timed(state, device, [&] { lesson12::flat_step(trainer, on_device); });
  } else {
    lesson12::Trainer trainer = lesson12::make_trainer(device, lesson12::kSeed);
    bench::run_timed(state, device, [&] { lesson12::tutorial_step(trainer, on_device); });
  }
  state.SetLabel(flat ? "flat" : "tutorial");
  state.SetItemsProcessed(state.iterations() * batch);
  state.counters["FLOP/s"] = benchmark::Counter(kTrainFlopsPerSample * batch,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

void BM_TrainStepCpu(benchmark::State& state) { train_step(state, torch::kCPU); }

// The tutorial's step on the CPU with `threads` LibTorch threads, whatever the cores: more threads
// than cores take turns on them, and each waits for the slowest at every operator's end.
void BM_TrainStepThreadsCpu(benchmark::State& state) {
  course::CpuThreads threads(static_cast<int>(state.range(0)));
  const std::int64_t batch = state.range(1);
  const torch::Tensor images = torch::rand({batch, 784});
  const torch::Tensor labels = torch::randint(10, {batch}, torch::kLong);
  lesson11::Trainer trainer = lesson11::make_trainer(torch::kCPU, lesson11::kSeed);
  bench::run_timed(state, torch::kCPU, [&] {
    lesson11::tutorial_step(trainer, lesson11::Batch{images, labels});
  });
  state.SetLabel(std::to_string(course::available_cores()) + " cores");
  state.SetItemsProcessed(state.iterations() * batch);
}
void BM_TrainStepCuda(benchmark::State& state) {
  c10::Device device(torch::kCPU);
  if (bench::gpu_or_skip(state, device)) train_step(state, device);
}

// ---- lesson 19's step, with Adam's step count on the device: eager against a CUDA graph ---------
// Both run the same kernels (DeviceAdam); the graph launches them all at once.
void BM_DeviceAdamStepCuda(benchmark::State& state) {
  c10::Device device(torch::kCPU);
  if (!bench::gpu_or_skip(state, device)) return;
  const bool graphed = state.range(0) != 0;
  const std::int64_t batch = state.range(1);
  course::ANN model = lesson19::seeded_model(device, lesson19::kSeed);
  lesson19::DeviceAdam adam(model->parameters(), lesson19::kLearningRate);
  lesson19::GraphedStep graph(model, adam, batch, device);
  graph.images.copy_(torch::rand({batch, 784}));
  graph.labels.copy_(torch::randint(10, {batch}, torch::kLong));
  if (graphed) {
    for (int i = 0; i <= lesson19::kGraphWarmupSteps; ++i) graph.step();  // warm up, capture
    bench::run_timed(state, device, [&] { graph.step(); });
  } else {
    bench::run_timed(state, device,
                     [&] { lesson19::device_adam_step(model, adam, graph.images, graph.labels); });
  }
  state.SetLabel(graphed ? "graphed" : "eager");
  state.SetItemsProcessed(state.iterations() * batch);
}

// ---- one epoch of Fashion-MNIST: the tutorial's step, fed by either loader ---------------------
void epoch(benchmark::State& state, const c10::Device& device, const std::string& loader_name,
           std::int64_t batch, int workers) {
  const course::ImageSet* data = train_set(state);
  if (data == nullptr) return;
  lesson11::Trainer trainer = lesson11::make_trainer(device, lesson11::kSeed);
  lesson11::Loader loader(loader_name, *data, batch, device, workers);
  bench::run_timed(state, device, [&] { lesson11::train_epoch_loaded(trainer, loader, device); });
  state.SetLabel(loader_name);
  state.SetItemsProcessed(state.iterations() * data->labels.size(0));
  state.counters["FLOP/s"] =
      benchmark::Counter(kTrainFlopsPerSample * static_cast<double>(data->labels.size(0)),
                         benchmark::Counter::kIsIterationInvariantRate);
}

void epoch(benchmark::State& state, const c10::Device& device) {
  epoch(state, device, state.range(0) == 0 ? "pinned" : "resident", state.range(1), 0);
}

// The pinned loader with 0, 1 or 2 threads gathering ahead (DataLoader's num_workers): what
// background loading buys when gathering a batch costs little beside its step.
void BM_EpochWorkersCpu(benchmark::State& state) {
  epoch(state, torch::kCPU, "pinned", state.range(1), static_cast<int>(state.range(0)));
}

// ---- one epoch of lesson 12's flat form, or of its manual one, on its resident batches --------
void flat_epoch(benchmark::State& state, const c10::Device& device, bool manual) {
  const course::ImageSet* data = train_set(state);
  if (data == nullptr) return;
  const std::int64_t batch = state.range(0);
  lesson12::FlatTrainer trainer = lesson12::make_flat_trainer(device, lesson12::kSeed);
  lesson12::ResidentBatches batches(*data, batch, device);
  std::function<torch::Tensor(const lesson12::Batch&)> step;  // empty: the flat step
  if (manual) step = [&](const lesson12::Batch& b) { return lesson12::manual_step(trainer, b); };
  bench::run_timed(state, device,
                   [&] { lesson12::train_epoch_flat(trainer, batches, device, step); });
  state.SetLabel(manual ? "manual" : "flat");
  state.SetItemsProcessed(state.iterations() * data->labels.size(0));
  state.counters["FLOP/s"] =
      benchmark::Counter(kTrainFlopsPerSample * static_cast<double>(data->labels.size(0)),
                         benchmark::Counter::kIsIterationInvariantRate);
}
void BM_FlatEpochCpu(benchmark::State& state) { flat_epoch(state, torch::kCPU, false); }
void BM_FlatEpochCuda(benchmark::State& state) {
  c10::Device device(torch::kCPU);
  if (bench::gpu_or_skip(state, device)) flat_epoch(state, device, false);
}
void BM_ManualEpochCpu(benchmark::State& state) { flat_epoch(state, torch::kCPU, true); }
void BM_ManualEpochCuda(benchmark::State& state) {
  c10::Device device(torch::kCPU);
  if (bench::gpu_or_skip(state, device)) flat_epoch(state, device, true);
}

// ---- one epoch of lesson 19's graphed step: its batches on the device, copied into the graph's --
// tensors and replayed (the full batches of 64 only: a graph has fixed shapes)
void BM_GraphedEpochCuda(benchmark::State& state) {
  c10::Device device(torch::kCPU);
  if (!bench::gpu_or_skip(state, device)) return;
  const course::ImageSet* data = train_set(state);
  if (data == nullptr) return;
  const lesson19::Batches batches = lesson19::device_batches(*data, device, lesson19::kSeed);
  course::ANN model = lesson19::seeded_model(device, lesson19::kSeed);
  lesson19::DeviceAdam adam(model->parameters(), lesson19::kLearningRate);
  lesson19::GraphedStep graph(model, adam, lesson19::kBatchSize, device);
  bench::run_timed(state, device, [&] {
    for (std::int64_t k = 0; k < batches.count(); ++k) {
      graph.images.copy_(batches.images_of(k));
      graph.labels.copy_(batches.labels_of(k));
      graph.step();
    }
  });
  state.SetLabel("graphed");
  state.SetItemsProcessed(state.iterations() * batches.count() * lesson19::kBatchSize);
}

// ---- one epoch of lesson 21's fused form, eager or its whole epoch in one CUDA graph ------------
void fused_epoch(benchmark::State& state, const c10::Device& device, bool graphed) {
  const course::ImageSet* data = train_set(state);
  if (data == nullptr) return;
  lesson21::FlatTrainer trainer = lesson21::make_flat_trainer(device, lesson21::kSeed);
  lesson21::DeviceShuffler shuffler(*data, device);
  lesson21::EpochData epoch(data->labels.size(0), lesson21::kBatchSize, device);
  std::optional<lesson21::GraphedEpoch> graph;
  const lesson21::Step step = [&](auto& x, auto& y, auto l) {
    lesson21::fused_step(trainer, x, y, l);
  };
  bench::run_timed(state, device, [&] {
    if (graphed) {
      lesson21::graphed_epoch(shuffler, epoch, trainer, graph, device);
    } else {
      lesson21::resident_epoch(shuffler, epoch, device, step);
    }
  });
  state.SetLabel(graphed ? "fused, graphed" : "fused");
  state.SetItemsProcessed(state.iterations() * data->labels.size(0));
  state.counters["FLOP/s"] =
      benchmark::Counter(kTrainFlopsPerSample * static_cast<double>(data->labels.size(0)),
                         benchmark::Counter::kIsIterationInvariantRate);
}
void BM_FusedEpochCpu(benchmark::State& state) { fused_epoch(state, torch::kCPU, false); }
void BM_FusedEpochCuda(benchmark::State& state) {
  c10::Device device(torch::kCPU);
  if (bench::gpu_or_skip(state, device)) fused_epoch(state, device, state.range(0) != 0);
}

// ---- one epoch of lesson 05's loop: LibTorch's data loader (RandomSampler, Stack<>, workers) ---
void tutorial_epoch(benchmark::State& state, const c10::Device& device) {
  const course::ImageSet* data = train_set(state);
  if (data == nullptr) return;
  torch::manual_seed(lesson05::kSeed);
  lesson05::ANN model;
  model->to(device);
  torch::nn::CrossEntropyLoss criterion;
  torch::optim::Adam optimizer(model->parameters(),
                               torch::optim::AdamOptions(lesson05::kLearningRate));
  auto loader = lesson05::make_train_loader(course::FashionMNIST(*data), state.range(1),
                                            static_cast<int>(state.range(0)));
  bench::run_timed(state, device,
                   [&] { lesson05::train_epoch(model, *loader, criterion, optimizer, device); });
  state.SetLabel("data loader");
  state.SetItemsProcessed(state.iterations() * data->labels.size(0));
}
void BM_TutorialEpochCpu(benchmark::State& state) { tutorial_epoch(state, torch::kCPU); }
void BM_TutorialEpochCuda(benchmark::State& state) {
  c10::Device device(torch::kCPU);
  if (bench::gpu_or_skip(state, device)) tutorial_epoch(state, device);
}

void BM_EpochCpu(benchmark::State& state) { epoch(state, torch::kCPU); }
void BM_EpochCuda(benchmark::State& state) {
  c10::Device device(torch::kCPU);
  if (bench::gpu_or_skip(state, device)) epoch(state, device);
}

}  // namespace

BENCHMARK(BM_TrainStepCpu)
    ->ArgNames({"flat", "batch"})
    ->ArgsProduct({{0, 1}, {64, 256, 1024, 4096}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_TrainStepThreadsCpu)
    ->ArgNames({"threads", "batch"})
    ->ArgsProduct({{1, 2, 4, 8, 16}, {64, 1024}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_TrainStepCuda)
    ->ArgNames({"flat", "batch"})
    ->ArgsProduct({{0, 1}, {64, 256, 1024, 4096}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DeviceAdamStepCuda)
    ->ArgNames({"graphed", "batch"})
    ->ArgsProduct({{0, 1}, {64, 1024}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_TutorialEpochCpu)
    ->ArgNames({"workers", "batch"})
    ->ArgsProduct({{0, 2}, {64}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TutorialEpochCuda)
    ->ArgNames({"workers", "batch"})
    ->ArgsProduct({{0, 2}, {64}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EpochCpu)
    ->ArgNames({"resident", "batch"})
    ->ArgsProduct({{0, 1}, {64, 256, 1024, 4096}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EpochWorkersCpu)
    ->ArgNames({"workers", "batch"})
    ->ArgsProduct({{0, 1, 2}, {64}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EpochCuda)
    ->ArgNames({"resident", "batch"})
    ->ArgsProduct({{0, 1}, {64, 256, 1024, 4096}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FlatEpochCpu)
    ->ArgNames({"batch"})
    ->Arg(64)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FlatEpochCuda)
    ->ArgNames({"batch"})
    ->Arg(64)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ManualEpochCpu)
    ->ArgNames({"batch"})
    ->Arg(64)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ManualEpochCuda)
    ->ArgNames({"batch"})
    ->Arg(64)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GraphedEpochCuda)
    ->ArgNames({"batch"})
    ->Arg(64)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FusedEpochCpu)
    ->ArgNames({"batch"})
    ->Arg(64)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FusedEpochCuda)
    ->ArgNames({"graphed"})
    ->Arg(0)
    ->Arg(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
