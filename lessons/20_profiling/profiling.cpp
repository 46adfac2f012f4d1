// Lesson 20 (going further) — profiling: where a training step's time goes, shown by LibTorch's
// own profiler (the one behind Python's torch.profiler), for lesson 05's loop and lesson 12's.
//
// Tutorial 004 says: minimize the data moved between host and device, prefer vectorized
// operations; lesson 11 adds: keep .item() out of the loop. Earlier lessons time each with a
// stopwatch. A profiler opens the step up: it records every ATen operator each step runs, with
// its thread, start and length, and on a GPU every kernel and copy.
//
// You will learn:
//   - to profile a few steps: prepareProfiler, enableProfiler, disableProfiler (Python's
//     `with profile(activities=[...], record_shapes=True) as prof:`);
//   - to read the op table Python prints with prof.key_averages().table(sort_by=...,
//     row_limit=10): calls, self time, total time;
//   - to write the trace (--trace FILE): a timeline for chrome://tracing or ui.perfetto.dev;
//   - to name a step's parts (forward, backward, optimizer.step) with ranges that the table and
//     the trace show, and on a GPU with NVTX ranges that Nsight Systems shows;
//   - what the profile proves: lesson 05's loop reads the loss (.item()) and copies its batch at
//     every step, lesson 12's does neither, and LibTorch's Adam runs its operators once per
//     parameter tensor where the flat step runs them once.
//
// Run:    build/bin/lesson20_profiling [--device auto|cpu|cuda|cuda:N] [--steps N] [--trace FILE]
//           [--sort self|total|device] [--data-dir DIR] [--quick]
// Checks: each loop holds one range of each part per profiled step; lesson 05's loop one
//         .item() per step, lesson 12's none; lesson 05's loop copies each batch to a GPU
//         (two host-to-device copies per step) where lesson 12's copies none (on the CPU: one
//         aten::to per step on the batch of images, which copies nothing, against none);
//         LibTorch's Adam runs its operators once per parameter tensor (six times the flat
//         step's). Exit 0 PASS, 1 FAIL,
//         2 bad flag, missing data or a trace that cannot be written.
#include <ATen/record_function.h>                 // defines: at::RecordFunction (RECORD_USER_SCOPE)
#include <torch/csrc/autograd/profiler_kineto.h>  // defines: prepareProfiler, enableProfiler, ...
#include <torch/torch.h>                          // defines: torch::nn, torch::optim, torch::data

#include <algorithm>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#ifdef GPU_LESSONS_WITH_CUDA   // CMake defines it when this LibTorch has CUDA
#include <nvtx3/nvToolsExt.h>  // defines: nvtxRangePushA, nvtxRangePop (header-only, CUDA toolkit)
#endif

#include "common/ann.h"              // defines: ANN, make_train_loader (lesson 05's)
#include "common/cli.h"              // defines: Cli, start_lesson
#include "common/data.h"             // defines: ImageSet, take
#include "common/device.h"           // defines: synchronize
#include "common/flat_parameters.h"  // defines: FlatParameters, flatten_parameters (lesson 12's)
#include "common/report.h"           // defines: format
#include "common/verdict.h"          // defines: Verdict, report_error
#include "key_averages.h"  // defines: Event, events_of, key_averages, print_table (the op table)
#include "profiler.h"      // defines: save_chrome_trace, check_trace_folder

namespace lesson20 {

// ---- knobs -----------------------------------------------------------------------------------
//! [knobs]
constexpr std::uint64_t kSeed = 5;       // lesson 05's: the first weights and the batches' order
constexpr std::int64_t kBatchSize = 64;  // the tutorial's DataLoader(batch_size=64)
constexpr double kLearningRate = 1e-3;   // optim.Adam(model.parameters(), lr=0.001)
constexpr int kWorkers = 2;              // lesson 05's loader threads (num_workers=2)
// Steps each loop runs before the profile: the first steps make Adam's state and warm the
// allocator, work that later steps do not repeat.
constexpr int kWarmupSteps = 3;
constexpr int kSteps = 5, kQuickSteps = 3;  // --steps: steps each loop runs under the profiler
constexpr int kRowLimit = 10;               // key_averages().table(..., row_limit=10)
// The parts of a step that each loop marks with a range, in the order a step runs them.
const std::vector<std::string> kParts = {"forward", "backward", "optimizer.step"};
//! [knobs]

using course::ANN;  // the tutorial's ANN (fc1, fc2, out), lesson 05's weights from one seed

// ---- 1. named ranges -------------------------------------------------------------------------
//! [range]
// A range names a piece of work in the profile: Python's
// `with torch.profiler.record_function("forward"):`. RECORD_USER_SCOPE("forward") declares the
// same at::RecordFunction (at the user's scope) as a macro; as a member it ends with this object.
// It costs a flag test when no profiler is listening. With CUDA it is also an NVTX range, which
// `nsys profile` shows on its timeline above the kernels the range launched.
class Range {
 public:
  explicit Range(const char* name) : record_(at::RecordScope::USER_SCOPE) {
    if (record_.isActive()) record_.before(name);  // only while a profiler listens
#ifdef GPU_LESSONS_WITH_CUDA
    nvtxRangePushA(name);
#endif
  }
  ~Range() {
#ifdef GPU_LESSONS_WITH_CUDA
    nvtxRangePop();
#endif
  }  // record_ ends here: the range closes
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  at::RecordFunction record_;
};
//! [range]

// ---- 2. the two loops ------------------------------------------------------------------------
//! [tutorial-loop]
// Lesson 05's loop: LibTorch's data loader on the host, each batch moved to the device, the loss
// read with .item() at every step. Only the ranges are new.
struct TutorialLoop {
  ANN model;
  torch::nn::CrossEntropyLoss criterion;
  std::unique_ptr<torch::optim::Adam> optimizer;
  std::unique_ptr<course::TrainLoader> loader;
  // Where the loader's pass (an epoch) has got to, kept from one call to the next: LibTorch's
  // DataLoader refuses a second pass while one is unfinished.
  std::optional<torch::data::Iterator<torch::data::Example<>>> batch;
  double total_loss = 0;
};

void tutorial_steps(TutorialLoop& loop, int steps, const torch::Device& device) {
  for (int step = 0; step < steps; ++step) {
    {  // for features, labels in train_loader: (Python's profile names this range itself)
      Range range("DataLoader next");
      if (loop.batch) ++*loop.batch;
      if (!loop.batch || *loop.batch == loop.loader->end()) loop.batch = loop.loader->begin();
    }
    auto [features, labels] = **loop.batch;
    features = features.to(device);
    labels = labels.to(device);
    torch::Tensor loss;
    {
      Range range("forward");
      loss = loop.criterion(loop.model->forward(features), labels);
    }
    loop.optimizer->zero_grad();
    {
      // >>> lab: name this part "backward", as the other two parts are named
      Range range("backward");
      // <<< lab
      loss.backward();
    }
    {
      Range range("optimizer.step");
      loop.optimizer->step();
    }
    loop.total_loss += loss.item<double>();  // waits for the device, every step
  }
}
//! [tutorial-loop]

//! [fast-loop]
// Lesson 12's fast loop ("flat"): the images already on the device, every parameter in one
// tensor (Adam steps over that one tensor), the loss summed on the device. Its batches are the
// first images in order: a profile needs steps, not an epoch's shuffle.
struct FastLoop {
  ANN model;
  course::FlatParameters flat;  // lesson 12's: common/flat_parameters.h
  std::unique_ptr<torch::optim::Adam> optimizer;
  torch::Tensor images, labels;  // resident: on the device before the first step
  torch::Tensor loss_sum;        // on the device; read once, after the profile
};

void fast_steps(FastLoop& loop, int first, int steps) {
  for (int k = first; k < first + steps; ++k) {
    const torch::Tensor images = loop.images.narrow(0, k * kBatchSize, kBatchSize);
    const torch::Tensor labels = loop.labels.narrow(0, k * kBatchSize, kBatchSize);
    loop.flat.gradients.zero_();  // zero_grad() for every parameter at once
    torch::Tensor loss;
    {
      Range range("forward");
      loss = torch::nn::functional::cross_entropy(loop.model->forward(images), labels);
    }
    {
      Range range("backward");
      loss.backward();
    }
    {
      Range range("optimizer.step");
      loop.optimizer->step();
    }
    loop.loss_sum += loss.detach();  // no .item(): the sum stays on the device
  }
}
//! [fast-loop]

// Both loops from the same first weights (the seed), the model moved before its optimizer.
TutorialLoop make_tutorial_loop(const course::FashionMNIST& train, const torch::Device& device) {
  torch::manual_seed(kSeed);
  TutorialLoop loop;
  loop.model->to(device);
  loop.optimizer = std::make_unique<torch::optim::Adam>(loop.model->parameters(),
                                                        torch::optim::AdamOptions(kLearningRate));
  loop.loader = course::make_train_loader(train, kBatchSize, kWorkers);
  return loop;
}

FastLoop make_fast_loop(const course::ImageSet& train, int steps, const torch::Device& device) {
  torch::manual_seed(kSeed);
  FastLoop loop;
  loop.model->to(device);
  loop.flat = course::flatten_parameters(*loop.model);
  loop.optimizer = std::make_unique<torch::optim::Adam>(
      std::vector<torch::Tensor>{loop.flat.values}, torch::optim::AdamOptions(kLearningRate));
  const course::ImageSet used = course::take(train, (kWarmupSteps + steps) * kBatchSize);
  loop.images = used.images.to(device);  // the one copy, before any step
  loop.labels = used.labels.to(device);
  loop.loss_sum = torch::zeros({}, torch::dtype(torch::kDouble).device(device));
  return loop;
}

// ---- 3. the profile --------------------------------------------------------------------------
//! [profile]
namespace profiler = torch::autograd::profiler;  // torch.profiler's C++ side
namespace impl = torch::profiler::impl;

// Profiles one call of `steps`: every operator it runs on this thread (the ones autograd runs for
// it on a thread of its own too), and with CUDA every kernel and copy. The device finishes the
// work before the profile ends, so that its kernels are in it.
std::unique_ptr<profiler::ProfilerResult> profile(const std::function<void()>& steps,
                                                  const torch::Device& device) {
  // with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True):
  const impl::ProfilerConfig config(impl::ProfilerState::KINETO, /*report_input_shapes=*/true);
  std::set<impl::ActivityType> activities = {impl::ActivityType::CPU};
  if (device.is_cuda()) activities.insert(impl::ActivityType::CUDA);
  profiler::prepareProfiler(config, activities);
  profiler::enableProfiler(config, activities);  // from here, every operator is recorded
  try {
    steps();
    course::synchronize(device);
  } catch (...) {
    profiler::disableProfiler();  // an error: stop recording, then let the error go on
    throw;
  }
  return profiler::disableProfiler();  // the events, and the trace to save
}
//! [profile]

// ---- 4. reading the profile ----------------------------------------------------------------
// The op table (Python's prof.key_averages().table(), which LibTorch's C++ lacks) is beside this
// file, in key_averages.cpp; here, what each loop's events show.
//! [facts]
// What one loop's profile shows: counts of events by name, and of operators on the batch.
struct LoopFacts {
  std::map<std::string, std::int64_t> ranges;  // each part's ranges
  std::int64_t operators = 0;                  // ATen operators ("aten::...") in all
  std::int64_t item_reads = 0;                 // aten::_local_scalar_dense: what .item() runs
  std::int64_t image_moves = 0;                // aten::to on a batch of images: .to(device)
  std::int64_t image_copies = 0;    // aten::_to_copy on a batch of images: a move that copies
  std::int64_t host_to_device = 0;  // the device's copies from the host ("Memcpy HtoD ...")
  std::int64_t adam_updates = 0;    // aten::addcdiv_: Adam's last operator, once per tensor
};

LoopFacts facts_of(const std::vector<Event>& events) {
  LoopFacts facts;
  for (const std::string& part : kParts) facts.ranges[part] = 0;
  for (const Event& e : events) {
    const bool images = !e.input.empty() && e.input[0] == kBatchSize &&
                        c10::multiply_integers(e.input) == kBatchSize * 28 * 28;
    // On a GPU, Kineto adds a device event of the same name for each range that launched
    // kernels (its span on the GPU): a range is counted where it ran, on the host.
    if (!e.on_device && facts.ranges.count(e.name)) ++facts.ranges[e.name];
    facts.operators += !e.on_device && e.name.rfind("aten::", 0) == 0;
    facts.item_reads += e.name == "aten::_local_scalar_dense";
    facts.image_moves += e.name == "aten::to" && images;
    facts.image_copies += e.name == "aten::_to_copy" && images;
    facts.host_to_device += e.on_device && e.name.rfind("Memcpy HtoD", 0) == 0;
    facts.adam_updates += e.name == "aten::addcdiv_";
  }
  return facts;
}
//! [facts]

// ---- 5. the checks ---------------------------------------------------------------------------
//! [checks]
void check_profile(const LoopFacts& tutorial, const LoopFacts& fast, int steps,
                   std::int64_t parameter_tensors, const torch::Device& device,
                   course::Verdict& verdict) {
  const auto n = [](std::int64_t v) { return static_cast<long long>(v); };
  for (const auto* loop : {&tutorial, &fast}) {
    std::string counts;
    bool each = true;
    for (const std::string& part : kParts) {
      counts += course::format("%s%s %lld", counts.empty() ? "" : ", ", part.c_str(),
                               n(loop->ranges.at(part)));
      each = each && loop->ranges.at(part) == steps;
    }
    verdict.check(each,
                  std::string(loop == &tutorial ? "lesson 05's" : "lesson 12's") +
                      " loop has one range of each part per step",
                  counts + course::format(" in %d steps", steps));
  }
  verdict.check(tutorial.item_reads == steps && fast.item_reads == 0,
                "lesson 05's loop reads the loss at every step, lesson 12's never",
                course::format("aten::_local_scalar_dense: %lld and %lld in %d steps each",
                               n(tutorial.item_reads), n(fast.item_reads), steps));
  if (device.is_cuda()) {
    verdict.check(tutorial.host_to_device >= 2 * steps && fast.host_to_device == 0,
                  "lesson 05's loop copies each batch to the device, lesson 12's copies none",
                  course::format("Memcpy HtoD: %lld and %lld in %d steps each",
                                 n(tutorial.host_to_device), n(fast.host_to_device), steps));
  } else {  // .to(kCPU) of a tensor on the CPU hands the same tensor back: nothing is copied
    verdict.check(
        tutorial.image_moves == steps && fast.image_moves == 0 && tutorial.image_copies == 0,
        "lesson 05's loop moves each batch (no copy on the CPU), lesson 12's never",
        course::format("aten::to on a batch of images: %lld and %lld in %d steps each; "
                       "aten::_to_copy on one: %lld",
                       n(tutorial.image_moves), n(fast.image_moves), steps,
                       n(tutorial.image_copies)));
  }
  verdict.check(
      tutorial.adam_updates == parameter_tensors * steps && fast.adam_updates == steps,
      "LibTorch's Adam runs its operators once per parameter tensor",
      course::format("aten::addcdiv_: %lld over %lld tensors and %lld over the flat "
                     "one, in %d steps each",
                     n(tutorial.adam_updates), n(parameter_tensors), n(fast.adam_updates), steps));
}
//! [checks]

// "trace.json" -> "trace-lesson05.json": one trace per loop.
std::string trace_file(const std::string& trace, const char* loop) {
  const bool json = trace.size() > 5 && trace.compare(trace.size() - 5, 5, ".json") == 0;
  return (json ? trace.substr(0, trace.size() - 5) : trace) + "-" + loop + ".json";
}

// ---- the lesson ------------------------------------------------------------------------------
// Both loops warmed up, then `steps` of each profiled, one profile per loop.
struct Profiles {
  std::unique_ptr<profiler::ProfilerResult> tutorial, fast;
  std::int64_t parameter_tensors = 0;       // the model's: six (a weight and a bias per layer)
  double tutorial_loss = 0, fast_loss = 0;  // the mean loss of the steps each loop ran
};

Profiles profile_loops(const course::FashionMNIST& train, int steps, const torch::Device& device) {
  TutorialLoop tutorial = make_tutorial_loop(train, device);
  FastLoop fast = make_fast_loop(train.images(), steps, device);
  tutorial_steps(tutorial, kWarmupSteps, device);  // warm-up, not profiled
  fast_steps(fast, 0, kWarmupSteps);
  Profiles profiles;
  profiles.tutorial = profile([&] { tutorial_steps(tutorial, steps, device); }, device);
  profiles.fast = profile([&] { fast_steps(fast, kWarmupSteps, steps); }, device);
  profiles.parameter_tensors = static_cast<std::int64_t>(tutorial.model->parameters().size());
  profiles.tutorial_loss = tutorial.total_loss / (kWarmupSteps + steps);
  profiles.fast_loss = fast.loss_sum.item<double>() / (kWarmupSteps + steps);  // its one read
  return profiles;
}

void run_lesson(const course::FashionMNIST& train, int steps, std::string sort_by,
                const std::string& trace, const torch::Device& device, course::Verdict& verdict) {
  if (sort_by.empty()) sort_by = device.is_cuda() ? "device" : "self";
  std::cout << "\n1. " << steps << " steps of each loop under the profiler, one profile each "
            << "(after " << kWarmupSteps << " steps each to warm up)\n";
  const Profiles profiles = profile_loops(train, steps, device);
  const std::vector<Event> t_events = events_of(*profiles.tutorial);
  const std::vector<Event> f_events = events_of(*profiles.fast);
  const LoopFacts t = facts_of(t_events), f = facts_of(f_events);
  std::printf("  events: %zu (lesson 05's loop), %zu (lesson 12's loop)\n", t_events.size(),
              f_events.size());
  std::printf("  ATen operators per step: %.0f (lesson 05's loop), %.0f (lesson 12's loop)\n",
              static_cast<double>(t.operators) / steps, static_cast<double>(f.operators) / steps);
  std::printf("  mean loss of the %d steps each ran: %.4f (lesson 05's loop), %.4f (lesson 12's)\n",
              kWarmupSteps + steps, profiles.tutorial_loss, profiles.fast_loss);
  std::cout << "\n2. lesson 05's loop: the op table by " << sort_by << " time, " << kRowLimit
            << " rows\n";
  print_table(key_averages(t_events), sort_by, kRowLimit);
  std::cout << "\n   lesson 12's loop: the op table by " << sort_by << " time, " << kRowLimit
            << " rows\n";
  print_table(key_averages(f_events), sort_by, kRowLimit);
  std::cout << "\n3. what the profiles show\n";
  check_profile(t, f, steps, profiles.parameter_tensors, device, verdict);
  if (!trace.empty()) {
    std::cout << "\n4. the traces: open them in chrome://tracing or ui.perfetto.dev\n";
    for (auto [result, loop] : {std::pair{profiles.tutorial.get(), "lesson05"},
                                std::pair{profiles.fast.get(), "lesson12"}}) {
      const std::string file = trace_file(trace, loop);
      const bool kineto = save_chrome_trace(*result, file);
      std::cout << "  " << file
                << (kineto ? " (Kineto's)"
                           : " (this LibTorch has no Kineto: "
                             "written from the events)")
                << "\n";
    }
  }
}

}  // namespace lesson20

// ---- main ---------------------------------------------------------------------------------------
#ifndef GPU_LESSONS_NO_MAIN  // tests/test_lesson20.cpp includes this file
int main(int argc, char** argv) try {
  using namespace lesson20;
  course::CommonOptions options;
  options.seed = kSeed;
  int steps = 0;  // 0: kSteps, or kQuickSteps with --quick
  std::string trace, sort_by;
  course::Cli cli("lesson20_profiling",
                  "Lesson 20: where lesson 05's and lesson 12's training steps spend their time.",
                  options);
  cli.add_data_dir();
  cli.add_option("--steps", steps, "steps of each loop to profile (0 = 5, or 3 with --quick)", 0,
                 200);
  cli.add_path(
      "--trace", trace,
      "write each loop's profile as a Chrome trace: FILE-lesson05.json, FILE-lesson12.json");
  cli.add_option("--sort", sort_by, "the op table's order (default: self, or device on CUDA)",
                 {"self", "total", "device"});
  if (auto code = cli.parse(argc, argv)) return *code;
  const torch::Device device = course::start_lesson(options);
  if (steps == 0) steps = options.quick ? kQuickSteps : kSteps;
  if (!trace.empty()) check_trace_folder(trace);  // before the run, not after it
  const course::FashionMNIST train(options.data_dir, /*train=*/true);
  std::cout << "Fashion-MNIST: " << *train.size() << " training images; the tutorial's ANN, batch "
            << kBatchSize << "\n";
  course::Verdict verdict;
  run_lesson(train, steps, sort_by, trace, device, verdict);
  return verdict.finish("lesson 20 on " + device.str());
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
#endif
