// Lesson 16 (going further) — activation checkpointing: trade recomputation for memory inside
// one training step (the syllabus's "gradient checkpointing").
//
// Backward needs what forward computed (each Linear's input, each ReLU's output, each dropout
// mask). For a deep model and a large batch those activations fill the memory (lesson 07 measures
// them). Checkpointing keeps only each segment's input and runs the segment again in backward.
// Python has torch.utils.checkpoint; LibTorch has nothing like it, so this lesson writes one: a
// custom autograd Function that recomputes its segment with the RNG replayed, so that dropout
// draws the same masks.
//
// You will learn:
//   - torch::autograd::Function: a forward that saves only its input, a backward that recomputes
//     and differentiates, the parameters passed in so that they get their gradients;
//   - why the RNG must be replayed (dropout), and what a step's peak memory and time become.
//
// Run:    build/bin/lesson16_activation_checkpointing [--device auto|cpu|cuda|cuda:N] [--quick]
//                                                     [--seed N]
// Checks: the same loss and gradients as the plain model within the fp32 tolerance
//         (course::tolerance_for), the first segment's too (its input requires no grad), and a
//         lower peak in every cell of the table. Exit 0 PASS, 1 FAIL, 2 bad flag.
#include <ATen/core/ivalue.h>  // defines: IValue::make_capsule
#include <torch/torch.h>       // defines: torch::autograd::Function, torch::nn

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <optional>
#include <vector>

#include "common/cli.h"        // defines: Cli, start_lesson
#include "common/compare.h"    // defines: max_rel_diff, tolerance_for
#include "common/device.h"     // defines: format_bytes, synchronize
#include "common/generator.h"  // defines: rng_state, set_rng_state
#include "common/report.h"     // defines: format
#include "common/timing.h"     // defines: Timing, time_median, timing_note
#include "common/verdict.h"    // defines: Verdict, report_error
#include "memory/memory.h"     // defines: memory_stats, reset_peak_memory

namespace lesson16 {

// ---- knobs -----------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 13;
// A deep MLP (width x width layers, ReLU, dropout), checkpointed in segments.
constexpr std::int64_t kDeepWidth = 512;
constexpr int kSegment = 4;       // layers recomputed together: one saved input per segment
constexpr double kDropout = 0.1;  // random, so recomputation must replay the RNG
constexpr int kTimedSteps = 3;    // median of this many steps per table cell

/// Layers of Linear(width, width) + ReLU + Dropout in segments of kSegment, then Linear(width, 10).
struct DeepMlpImpl : torch::nn::Module {
  DeepMlpImpl(int depth, std::int64_t width);
  /// With `checkpointed`, every segment runs through checkpoint().
  torch::Tensor forward(const torch::Tensor& x, bool checkpointed, bool preserve_rng = true);
  std::vector<torch::nn::Sequential> segments;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(DeepMlp);

/// One training step's cost (forward, loss, backward; no optimizer).
struct StepCost {
  std::int64_t peak_bytes = 0;  ///< peak allocated during the step, above what was live before
  course::Timing time;          ///< median and spread of kTimedSteps (after one warm-up step)
};

/// Loss and gradients of one step on a fixed batch, the RNG seeded with `seed` first.
struct StepResult {
  torch::Tensor loss;
  std::vector<torch::Tensor> gradients;  ///< in parameters() order
};

namespace {

// The segment a CheckpointFunction recomputes, kept in the autograd context (which holds
// IValues) as a capsule.
struct SegmentHolder : torch::CustomClassHolder {
  explicit SegmentHolder(torch::nn::Sequential s) : segment(std::move(s)) {}
  torch::nn::Sequential segment;
};

// The generators' states now; restore() puts them back.
struct RngStates {
  torch::Device device;
  torch::Tensor cpu, cuda;
  explicit RngStates(const torch::Device& d) : device(d), cpu(course::rng_state(torch::kCPU)) {
    if (d.is_cuda()) cuda = course::rng_state(d);
  }
  RngStates(const torch::Device& d, torch::Tensor c, torch::Tensor g)
      : device(d), cpu(std::move(c)), cuda(std::move(g)) {}
  void restore() const {
    course::set_rng_state(torch::kCPU, cpu);
    if (cuda.defined()) course::set_rng_state(device, cuda);
  }
};

//! [checkpoint-function]
struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  // Autograd runs forward with gradients off: the segment's activations are freed layer by layer.
  // Only the input is saved. The parameters come in as inputs too: that is what connects them to
  // this node, so they get gradients even when `input` requires none (the first segment's input
  // is the data). Had they been left out, backward would never run for such a segment and its
  // parameters would silently keep no gradient.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::nn::Sequential segment,
                               bool preserve_rng, const torch::Tensor& input,
                               torch::TensorList parameters) {
    (void)parameters;
    ctx->saved_data["segment"] =
        c10::IValue::make_capsule(c10::make_intrusive<SegmentHolder>(segment));
    ctx->saved_data["input_requires_grad"] = input.requires_grad();
    if (preserve_rng) {  // dropout in backward must draw the same numbers as here
      const RngStates now(input.device());
      ctx->saved_data["rng_cpu"] = now.cpu;
      if (now.cuda.defined()) ctx->saved_data["rng_cuda"] = now.cuda;
    }
    ctx->save_for_backward({input});
    return segment->forward(input);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto holder =
        c10::static_intrusive_pointer_cast<SegmentHolder>(ctx->saved_data["segment"].toCapsule());
    torch::nn::Sequential segment = holder->segment;
    const torch::Tensor input = ctx->get_saved_variables()[0];
    const std::vector<torch::Tensor> parameters = segment->parameters();
    // Run the segment again, this time recording a graph, from a detached copy of the input.
    torch::Tensor x =
        input.detach().requires_grad_(ctx->saved_data["input_requires_grad"].toBool());
    torch::Tensor output;
    {
      std::optional<RngStates> after;  // the RNG as backward found it, put back afterwards
      if (ctx->saved_data.count("rng_cpu") != 0) {
        after.emplace(x.device());
        const auto cuda = ctx->saved_data.count("rng_cuda") != 0
                              ? ctx->saved_data["rng_cuda"].toTensor()
                              : torch::Tensor();
        RngStates(x.device(), ctx->saved_data["rng_cpu"].toTensor(), cuda).restore();
      }
      torch::AutoGradMode enable_grad(true);
      output = segment->forward(x);
      if (after) after->restore();
    }
    // Differentiate the recomputed segment; the gradients go back through this node's inputs.
    std::vector<torch::Tensor> wrt;
    if (x.requires_grad()) wrt.push_back(x);
    for (const auto& p : parameters) {
      if (p.requires_grad()) wrt.push_back(p);
    }
    torch::autograd::variable_list grads;
    if (!wrt.empty() && grad_outputs[0].defined()) {
      grads = torch::autograd::grad({output}, wrt, {grad_outputs[0]}, /*retain_graph=*/false,
                                    /*create_graph=*/false, /*allow_unused=*/true);
    } else {
      grads.resize(wrt.size());
    }
    // One entry per forward argument: none for `segment` and `preserve_rng`, then the input's,
    // then each parameter's.
    torch::autograd::variable_list result = {torch::Tensor(), torch::Tensor()};
    std::size_t next = 0;
    result.push_back(x.requires_grad() ? grads[next++] : torch::Tensor());
    for (const auto& p : parameters)
      result.push_back(p.requires_grad() ? grads[next++] : torch::Tensor());
    return result;
  }
};
//! [checkpoint-function]

}  // namespace

// Runs `block` on `input` without keeping its activations; backward runs it again (with the RNG
// as it was, when `preserve_rng`) and differentiates that (torch.utils.checkpoint's job).
torch::Tensor checkpoint(torch::nn::Sequential block, const torch::Tensor& input,
                         bool preserve_rng) {
  const std::vector<torch::Tensor> parameters = block->parameters();
  return CheckpointFunction::apply(block, preserve_rng, input, torch::TensorList(parameters));
}

DeepMlpImpl::DeepMlpImpl(int depth, std::int64_t width) {
  for (int first = 0; first < depth; first += kSegment) {
    torch::nn::Sequential segment;
    for (int layer = first; layer < std::min(depth, first + kSegment); ++layer) {
      segment->push_back(torch::nn::Linear(width, width));
      segment->push_back(torch::nn::ReLU());
      segment->push_back(torch::nn::Dropout(kDropout));
    }
    segments.push_back(register_module("segment" + std::to_string(segments.size()), segment));
  }
  head = register_module("head", torch::nn::Linear(width, 10));
}

//! [deep-forward]
torch::Tensor DeepMlpImpl::forward(const torch::Tensor& x, bool checkpointed, bool preserve_rng) {
  torch::Tensor h = x;
  for (auto& segment : segments) {
    h = checkpointed ? checkpoint(segment, h, preserve_rng) : segment->forward(h);
  }
  return head(h);
}
//! [deep-forward]

namespace {

std::int64_t width_of(DeepMlp& model) { return model->head->options.in_features(); }

void zero_gradients(torch::nn::Module& model) {
  for (auto& p : model.parameters()) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
}

}  // namespace

StepCost measure_step(DeepMlp& model, std::int64_t batch, bool checkpointed,
                      const torch::Device& device) {
  model->to(device);
  model->train();
  const auto options = torch::TensorOptions().device(device);
  const torch::Tensor x = torch::randn({batch, width_of(model)}, options);
  const torch::Tensor y = torch::randint(0, 10, {batch}, options.dtype(torch::kLong));
  auto step = [&] {
    zero_gradients(*model);
    torch::nn::functional::cross_entropy(model->forward(x, checkpointed), y).backward();
  };
  step();  // warm-up: the gradients exist from here on, so the peak below is the step's own
  course::synchronize(device);
  course::reset_peak_memory(device);
  const std::int64_t before = course::memory_stats(device).allocated;
  step();
  course::synchronize(device);
  StepCost cost;
  cost.peak_bytes = course::memory_stats(device).peak_allocated - before;
  cost.time = course::time_median(step, device, /*warmup=*/0, kTimedSteps);
  return cost;
}

StepResult step_gradients(DeepMlp& model, const torch::Tensor& x, const torch::Tensor& y,
                          bool checkpointed, std::uint64_t seed, bool preserve_rng = true) {
  model->train();
  zero_gradients(*model);
  torch::manual_seed(seed);  // the same dropout masks for both ways
  StepResult result;
  result.loss =
      torch::nn::functional::cross_entropy(model->forward(x, checkpointed, preserve_rng), y);
  result.loss.backward();
  result.loss = result.loss.detach();
  for (const auto& p : model->parameters()) {
    result.gradients.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  }
  return result;
}

//! [activation-part]
void compare_plain_and_checkpointed(const torch::Device& device, bool quick, std::uint64_t seed,
                                    course::Verdict& verdict) {
  // 1. The same loss and gradients, with dropout on, from the same seed.
  const std::int64_t width = quick ? kDeepWidth / 2 : kDeepWidth;
  const int check_depth = 2 * kSegment;
  torch::manual_seed(seed);
  DeepMlp model(check_depth, width);
  model->to(device);
  const auto on = torch::TensorOptions().device(device);
  const torch::Tensor x = torch::randn({64, width}, on);  // data: requires no grad
  const torch::Tensor y = torch::randint(0, 10, {64}, on.dtype(torch::kLong));
  const StepResult plain = step_gradients(model, x, y, /*checkpointed=*/false, seed);
  const StepResult kept = step_gradients(model, x, y, /*checkpointed=*/true, seed);
  const StepResult no_replay = step_gradients(model, x, y, true, seed, /*preserve_rng=*/false);
  const double tolerance = course::tolerance_for(torch::kFloat);
  const double diff = std::max(course::max_rel_diff(plain.loss, kept.loss),
                               course::max_rel_diff(plain.gradients, kept.gradients));
  std::printf(
      "depth %d, width %lld, dropout %.1f, segments of %d layers: loss and gradients, "
      "max relative diff %.3g (tolerance %.0e)\n",
      check_depth, static_cast<long long>(width), kDropout, kSegment, diff, tolerance);
  std::printf(
      "without replaying the RNG in backward, dropout draws other masks: gradients "
      "differ by %.3g\n",
      course::max_rel_diff(plain.gradients, no_replay.gradients));
  char evidence[64];
  std::snprintf(evidence, sizeof evidence, "max relative diff %.3g", diff);
  verdict.check(diff <= tolerance,
                "activation checkpointing gives the same loss and gradients, the first "
                "segment's too (its input requires no grad)",
                evidence);

  // 2. The peak of a step, and its time, without and with checkpointing.
  const std::vector<int> depths = quick ? std::vector<int>{8} : std::vector<int>{8, 16};
  const std::vector<std::int64_t> batches =
      quick ? std::vector<std::int64_t>{256} : std::vector<std::int64_t>{256, 1024};
  std::printf("\n%6s %6s %12s %12s %6s %-22s %-22s %6s\n", "depth", "batch", "peak, plain",
              "peak, ckpt", "ratio", "step, plain: ms", "step, ckpt: ms", "extra");
  bool lower = true;
  std::vector<course::Timing> timings;
  const auto ms = [](const course::Timing& t) {  // "46.2 (44.0-50.1)": median (fastest-slowest)
    return course::format("%.1f (%.1f-%.1f)", t.median_s * 1e3, t.min_s * 1e3, t.max_s * 1e3);
  };
  for (const int depth : depths) {
    torch::manual_seed(seed);
    DeepMlp deep(depth, width);
    for (const std::int64_t batch : batches) {
      const StepCost without = measure_step(deep, batch, false, device);
      const StepCost with = measure_step(deep, batch, true, device);
      lower = lower && with.peak_bytes < without.peak_bytes;
      std::printf("%6d %6lld %12s %12s %5.2fx %-22s %-22s %+5.0f%%\n", depth,
                  static_cast<long long>(batch),
                  course::format_bytes(static_cast<double>(without.peak_bytes)).c_str(),
                  course::format_bytes(static_cast<double>(with.peak_bytes)).c_str(),
                  static_cast<double>(with.peak_bytes) / static_cast<double>(without.peak_bytes),
                  ms(without.time).c_str(), ms(with.time).c_str(),
                  (with.time.median_s / without.time.median_s - 1) * 100);
      timings.insert(timings.end(), {without.time, with.time});
    }
  }
  std::cout << "(peak: bytes allocated during one step above those live before it; step: "
               "forward + backward, median (fastest-slowest) of "
            << kTimedSteps << ")\n"
            << course::timing_note(timings);
  verdict.check(lower, "activation checkpointing lowers every step's peak memory");
}
//! [activation-part]

}  // namespace lesson16

// ---- main --------------------------------------------------------------------------------------
#ifndef GPU_LESSONS_NO_MAIN  // tests/test_lesson16.cpp includes this file for its functions
int main(int argc, char** argv) try {
  course::CommonOptions options;
  options.seed = lesson16::kSeed;
  course::Cli cli("lesson16_activation_checkpointing",
                  "Lesson 16: activation checkpointing, the same gradients for less memory.",
                  options);
  if (auto code = cli.parse(argc, argv)) return *code;
  const torch::Device device = course::start_lesson(options);
  course::Verdict verdict;
  lesson16::compare_plain_and_checkpointed(device, options.quick, options.seed, verdict);
  return verdict.finish("lesson 16 on " + device.str());
} catch (...) {
  return course::report_error();
}
#endif
