// Lesson 08 — mixed precision: autocast, a gradient scaler written in C++, and what they buy.
//
// You will learn:
//   - autocast runs eligible ops (matmul, linear, conv) in a 16-bit type and keeps the ones that
//     need range or accuracy (losses, reductions) in fp32; the parameters, their gradients and
//     the optimizer stay fp32. Which op does what is printed, not assumed: the CPU and CUDA
//     policies differ;
//   - fp16 has a narrow range: small gradients flush to zero. Scale the loss up, unscale the
//     gradients before the step, skip steps that overflowed and adapt the scale: PyTorch's
//     GradScaler, which LibTorch lacks, written here (bf16 has fp32's range and needs none);
//   - on a GPU, tensor cores make 16-bit matmuls several times faster; on a CPU it depends on
//     the CPU (this lesson measures it rather than promising it).
//
// Run:    build/bin/lesson08_mixed_precision [--device ...] [--data-dir DIR] [--quick]
// Checks: under autocast linear/matmul give 16-bit results and cross-entropy fp32, gradients
//         stay fp32; the scaler skips a step with an inf gradient and halves its scale, and grows
//         it after clean steps; mixed-precision accuracy is within kAccuracyMargin of fp32.
//         Exit 0 PASS, 1 FAIL, 2 bad flag or missing data.
#include "mixed_precision.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>

#include <ATen/autocast_mode.h>  // defines: at::autocast::set_autocast_enabled, ...

#include "common/cli.h"      // defines: Cli, start_lesson
#include "common/timing.h"   // defines: time_median, describe, looks_busy
#include "common/verdict.h"  // defines: Verdict
#include "common/version.h"  // defines: GPU_LESSONS_TORCH_AT_LEAST

namespace lesson08 {

ModelSpec quick(const ModelSpec& spec) {
  ModelSpec q = spec;
  q.epochs = 1;
  q.samples = spec.name == "mlp" ? 10000 : 5000;
  return q;
}

MlpImpl::MlpImpl(std::int64_t hidden1, std::int64_t hidden2) {
  fc1 = register_module("fc1", torch::nn::Linear(784, hidden1));
  fc2 = register_module("fc2", torch::nn::Linear(hidden1, hidden2));
  fc3 = register_module("fc3", torch::nn::Linear(hidden2, 10));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  torch::Tensor h = torch::relu(fc1(x));
  h = torch::relu(fc2(h));
  return fc3(h);
}

torch::ScalarType precision_dtype(const std::string& precision) {
  if (precision == "fp16") return torch::kHalf;
  if (precision == "bf16") return torch::kBFloat16;
  return torch::kFloat;
}

// ---- autocast: `with torch.autocast(...)` as a guard object -------------------------------------
//! [autocast]
// Autocast is a per-thread switch with a 16-bit type per device type. Python's `with` block sets
// both and restores them on exit; in C++ an object does it in its constructor and destructor.
// LibTorch 2.4 replaced the per-device functions (set_enabled for CUDA, set_cpu_enabled, ...)
// with ones that take the device type: the version check below picks what the LibTorch has.
#if GPU_LESSONS_TORCH_AT_LEAST(2, 4)
bool Autocast::enabled(c10::DeviceType type) { return at::autocast::is_autocast_enabled(type); }

Autocast::Autocast(c10::DeviceType type, c10::ScalarType dtype)
    : device_type_(type),
      previous_enabled_(at::autocast::is_autocast_enabled(type)),
      previous_dtype_(at::autocast::get_autocast_dtype(type)) {
  at::autocast::set_autocast_dtype(type, dtype);
  at::autocast::set_autocast_enabled(type, true);
  at::autocast::increment_nesting();
}

Autocast::~Autocast() {
  // While autocast is on it caches the 16-bit copies of the weights; the outermost scope drops
  // them.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_type_, previous_enabled_);
  at::autocast::set_autocast_dtype(device_type_, previous_dtype_);
}
#else   // LibTorch 1.13: one function for the CPU, another for CUDA
bool Autocast::enabled(c10::DeviceType type) {
  return type == c10::kCPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
}

Autocast::Autocast(c10::DeviceType type, c10::ScalarType dtype)
    : device_type_(type),
      previous_enabled_(enabled(type)),
      previous_dtype_(type == c10::kCPU ? at::autocast::get_autocast_cpu_dtype()
                                        : at::autocast::get_autocast_gpu_dtype()) {
  if (type == c10::kCPU) {
    at::autocast::set_autocast_cpu_dtype(dtype);
    at::autocast::set_cpu_enabled(true);
  } else {
    at::autocast::set_autocast_gpu_dtype(dtype);
    at::autocast::set_enabled(true);
  }
  at::autocast::increment_nesting();
}

Autocast::~Autocast() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  if (device_type_ == c10::kCPU) {
    at::autocast::set_cpu_enabled(previous_enabled_);
    at::autocast::set_autocast_cpu_dtype(previous_dtype_);
  } else {
    at::autocast::set_enabled(previous_enabled_);
    at::autocast::set_autocast_gpu_dtype(previous_dtype_);
  }
}
#endif
//! [autocast]

// ---- what autocast does, op by op ---------------------------------------------------------------
//! [op-dtypes]
std::vector<OpDtype> op_dtypes(const torch::Device& device, torch::ScalarType low) {
  torch::manual_seed(kSeed);
  torch::nn::Linear layer(8, 4);
  layer->to(device);
  const auto on = torch::TensorOptions().device(device);
  const torch::Tensor x = torch::randn({16, 8}, on);
  const torch::Tensor y = torch::randint(4, {16}, on.dtype(torch::kLong));
  std::vector<OpDtype> rows;
  torch::Tensor loss;
  {
    Autocast autocast(device.type(), low);  // with torch.autocast(device.type, dtype=low):
    const torch::Tensor logits = layer(x);
    rows.push_back({"linear", logits.scalar_type()});
    rows.push_back({"matmul", torch::matmul(x, x.t()).scalar_type()});
    rows.push_back({"relu", torch::relu(logits).scalar_type()});
    rows.push_back({"softmax", torch::softmax(logits, 1).scalar_type()});
    rows.push_back({"log_softmax", torch::log_softmax(logits, 1).scalar_type()});
    rows.push_back({"sum", logits.sum().scalar_type()});
    rows.push_back({"mse_loss", torch::mse_loss(logits, torch::zeros_like(logits)).scalar_type()});
    loss = torch::nn::functional::cross_entropy(logits, y);
    rows.push_back({"cross_entropy", loss.scalar_type()});
  }
  loss.backward();  // outside autocast: backward runs each op in the dtype its forward used
  rows.push_back({"weight gradient", layer->weight.grad().scalar_type()});
  return rows;
}
//! [op-dtypes]

// ---- the gradient scaler ------------------------------------------------------------------------
GradScaler::GradScaler(const torch::Device& device, GradScalerOptions options)
    : device_(device), options_(options) {
  const auto on = torch::TensorOptions().device(device);
  scale_ = torch::full({}, options.init_scale, on.dtype(torch::kFloat));
  growth_tracker_ = torch::zeros({}, on.dtype(torch::kInt));
  found_inf_ = torch::zeros({}, on.dtype(torch::kFloat));
}

//! [scaler]
torch::Tensor GradScaler::scale(const torch::Tensor& loss) const { return loss * scale_; }

void GradScaler::unscale(torch::optim::Optimizer& optimizer) {
  std::vector<torch::Tensor> grads;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      if (p.grad().defined()) grads.push_back(p.grad());
    }
  }
  const torch::Tensor inv_scale = scale_.to(torch::kDouble).reciprocal().to(torch::kFloat);
  found_inf_.zero_();
  if (device_.is_cuda()) {
    // One fused kernel over all gradients: multiply by inv_scale, flag any inf/NaN.
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf_, inv_scale);
  } else {
    // LibTorch 1.13 has no CPU kernel for it: the same arithmetic with ordinary ops.
    for (auto& g : grads) {
      found_inf_ = torch::maximum(found_inf_, g.isfinite().logical_not().any().to(torch::kFloat));
      g.mul_(inv_scale);
    }
  }
  unscaled_ = true;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!unscaled_) unscale(optimizer);
  // .item() copies the flag to the host and waits for the device: the price of skipping.
  const bool finite = found_inf_.item<float>() == 0.0f;
  if (finite) optimizer.step();
  return finite;
}

void GradScaler::update() {
  if (device_.is_cuda()) {
    at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, options_.growth_factor,
                           options_.backoff_factor, options_.growth_interval);
  } else {
    // _amp_update_scale_'s rule: back off on overflow; after growth_interval clean steps, grow
    // (if the grown scale is finite); count clean steps in between.
    const torch::Tensor found = found_inf_.gt(0);
    const torch::Tensor clean = torch::where(found, torch::zeros_like(growth_tracker_),
                                             growth_tracker_ + 1);
    const torch::Tensor grown = scale_ * options_.growth_factor;
    const torch::Tensor grow = clean.eq(options_.growth_interval).logical_and(grown.isfinite());
    scale_ = torch::where(found, scale_ * options_.backoff_factor,
                          torch::where(grow, grown, scale_));
    growth_tracker_ = torch::where(clean.eq(options_.growth_interval),
                                   torch::zeros_like(clean), clean);
  }
  unscaled_ = false;
}
//! [scaler]

double GradScaler::current_scale() const { return scale_.item<double>(); }
std::int64_t GradScaler::clean_steps() const { return growth_tracker_.item<std::int64_t>(); }

// ---- training in fp32 or mixed precision --------------------------------------------------------
//! [step]
torch::Tensor train_step(Mlp& model, torch::optim::Optimizer& optimizer, GradScaler& scaler,
                         const std::string& precision, const torch::Tensor& x,
                         const torch::Tensor& y, bool* taken) {
  optimizer.zero_grad();
  torch::Tensor loss;
  {
    std::optional<Autocast> autocast;  // `with torch.autocast(...)`, for the mixed precisions
    if (precision != "fp32") autocast.emplace(x.device().type(), precision_dtype(precision));
    loss = torch::nn::functional::cross_entropy(model->forward(x), y);
  }  // autocast covers the forward pass and the loss only
  bool stepped = true;
  if (precision == "fp16") {  // bf16 has fp32's range: only fp16 needs the scaler
    scaler.scale(loss).backward();
    stepped = scaler.step(optimizer);
    scaler.update();
  } else {
    loss.backward();
    optimizer.step();
  }
  if (taken != nullptr) *taken = stepped;
  return loss;
}
//! [step]

//! [train]
TrainResult train(const ModelSpec& spec, const std::string& precision,
                  const course::ImageSet& train_set, const course::ImageSet& test,
                  const torch::Device& device, std::uint64_t seed) {
  const std::int64_t n = std::min<std::int64_t>(spec.samples, train_set.labels.size(0));
  const torch::Tensor images = train_set.images.slice(0, 0, n).reshape({n, 784}).to(device);
  const torch::Tensor labels = train_set.labels.slice(0, 0, n).to(device);

  torch::manual_seed(seed);
  Mlp model(spec.hidden1, spec.hidden2);
  model->to(device);  // the parameters stay fp32: autocast casts copies for each op
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(kLearningRate));
  GradScaler scaler(device);
  TrainResult result;
  for (int epoch = 0; epoch < spec.epochs; ++epoch) {
    model->train();
    const torch::Tensor order =
        torch::randperm(n, torch::TensorOptions().dtype(torch::kLong).device(device));
    torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().device(device));
    for (std::int64_t start = 0; start < n; start += spec.batch) {
      const torch::Tensor idx = order.slice(0, start, start + spec.batch);
      bool taken = true;
      const torch::Tensor loss = train_step(model, optimizer, scaler, precision,
                                            images.index_select(0, idx),
                                            labels.index_select(0, idx), &taken);
      if (!taken) ++result.skipped_steps;
      loss_sum += loss.detach() * static_cast<double>(idx.size(0));
    }
    result.final_loss = loss_sum.item<double>() / static_cast<double>(n);
  }

  model->eval();
  torch::NoGradGuard no_grad;
  std::optional<Autocast> autocast;
  if (precision != "fp32") autocast.emplace(device.type(), precision_dtype(precision));
  const torch::Tensor x = test.images.reshape({-1, 784}).to(device);
  const torch::Tensor correct =
      model->forward(x).argmax(1).eq(test.labels.to(device)).sum();
  result.accuracy = correct.item<double>() / static_cast<double>(test.labels.size(0));
  return result;
}
//! [train]

course::Timing time_step(const ModelSpec& spec, const std::string& precision,
                         const course::ImageSet& train_set, const torch::Device& device,
                         int runs) {
  torch::manual_seed(kSeed);
  Mlp model(spec.hidden1, spec.hidden2);
  model->to(device);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(kLearningRate));
  GradScaler scaler(device);
  const torch::Tensor x = train_set.images.slice(0, 0, spec.batch).reshape({-1, 784}).to(device);
  const torch::Tensor y = train_set.labels.slice(0, 0, spec.batch).to(device);
  const auto step = [&] { train_step(model, optimizer, scaler, precision, x, y); };
  step();  // the first step allocates Adam's state and warms the kernels up
  course::Stopwatch watch(device);
  step();
  const int steps = std::clamp(static_cast<int>(kTimedRunSeconds / watch.seconds()), 1,
                               kMaxTimedSteps);
  course::Timing t = course::time_median(
      [&] {
        for (int i = 0; i < steps; ++i) step();
      },
      device, /*warmup=*/0, runs);
  t.median_s /= steps;
  t.min_s /= steps;
  t.max_s /= steps;
  return t;
}

}  // namespace lesson08

// ---- main ---------------------------------------------------------------------------------------
namespace {

// The scaler's two behaviours on a tiny model: an inf gradient is skipped and halves the scale;
// clean steps grow it.
void demonstrate_scaler(const torch::Device& device, course::Verdict& verdict) {
  using lesson08::GradScaler;
  torch::manual_seed(lesson08::kSeed);
  torch::nn::Linear layer(4, 2);
  layer->to(device);
  torch::optim::SGD sgd(layer->parameters(), torch::optim::SGDOptions(0.1));
  lesson08::GradScalerOptions options;
  options.growth_interval = 3;  // grow after 3 clean steps, to see it happen
  GradScaler scaler(device, options);
  const torch::Tensor x = torch::ones({2, 4}, torch::TensorOptions().device(device));

  //! [inject-inf]
  sgd.zero_grad();
  scaler.scale(layer(x).sum()).backward();
  layer->weight.grad()[0][0] = std::numeric_limits<float>::infinity();  // an overflow
  const torch::Tensor before = layer->weight.detach().clone();
  const double scale_before = scaler.current_scale();
  const bool stepped = scaler.step(sgd);
  scaler.update();
  //! [inject-inf]
  const bool unchanged = torch::equal(before, layer->weight.detach());
  std::printf("GradScaler: inf gradient -> step %s, scale %.0f -> %.0f\n",
              stepped ? "taken" : "skipped", scale_before, scaler.current_scale());
  verdict.check(!stepped && unchanged, "the scaler skips a step whose gradients hold an inf");
  verdict.check(scaler.current_scale() == scale_before * options.backoff_factor,
                "and halves its scale");

  const double backed_off = scaler.current_scale();
  for (int i = 0; i < options.growth_interval; ++i) {
    sgd.zero_grad();
    scaler.scale(layer(x).sum()).backward();
    scaler.step(sgd);
    scaler.update();
  }
  std::printf("GradScaler: %lld clean steps -> scale %.0f -> %.0f\n",
              static_cast<long long>(options.growth_interval), backed_off, scaler.current_scale());
  verdict.check(scaler.current_scale() == backed_off * options.growth_factor,
                "after growth_interval clean steps the scale doubles");
}

}  // namespace

int lesson_main(int argc, char** argv) {
  using namespace lesson08;
  course::CommonOptions options;
  options.seed = kSeed;
  course::Cli cli("lesson08_mixed_precision",
                  "Lesson 08: autocast, a C++ gradient scaler, and mixed-precision training.",
                  options);
  cli.add_data_dir();
  if (auto code = cli.parse(argc, argv)) return *code;
  const torch::Device device = course::start_lesson(options);
  course::Verdict verdict;

  // LibTorch 1.13's CPU autocast knows bf16 only; CUDA has fp16 (with tensor cores and the
  // scaler) and bf16.
  std::vector<std::string> precisions = {"bf16"};
  if (device.is_cuda()) precisions = {"fp16", "bf16"};

  std::cout << "Under autocast on " << device << ", op by op:\n";
  for (const auto& precision : precisions) {
    const auto rows = op_dtypes(device, precision_dtype(precision));
    std::cout << "  " << precision << ":";
    bool low_matmul = true, fp32_loss = false, fp32_grad = false;
    for (const auto& row : rows) {
      std::cout << " " << row.op << "=" << c10::toString(row.dtype) << ";";
      if (row.op == "linear" || row.op == "matmul") low_matmul &= row.dtype != torch::kFloat;
      if (row.op == "cross_entropy") fp32_loss = row.dtype == torch::kFloat;
      if (row.op == "weight gradient") fp32_grad = row.dtype == torch::kFloat;
    }
    std::cout << "\n";
    verdict.check(low_matmul && fp32_loss && fp32_grad,
                  precision + ": linear/matmul in 16 bits, cross-entropy and gradients in fp32");
  }

  std::cout << "\n";
  demonstrate_scaler(device, verdict);

  const auto folder = course::find_fashion_mnist(options.data_dir);
  const course::ImageSet train_set = course::load_fashion_mnist(folder, true);
  const course::ImageSet test = course::load_fashion_mnist(folder, false);
  std::cout << "\nmodel  precision  samples x epochs  accuracy  vs fp32\n";
  std::vector<ModelSpec> specs = {kMlp, kWide};
  if (options.quick) specs = {quick(kMlp), quick(kWide)};
  for (const ModelSpec& spec : specs) {
    const TrainResult fp32 = train(spec, "fp32", train_set, test, device, options.seed);
    std::printf("%-6s %-10s %7lld x %d %9.4f\n", spec.name.c_str(), "fp32",
                static_cast<long long>(spec.samples), spec.epochs, fp32.accuracy);
    for (const auto& precision : precisions) {
      const TrainResult mixed = train(spec, precision, train_set, test, device, options.seed);
      std::printf("%-6s %-10s %7lld x %d %9.4f %+8.4f", spec.name.c_str(), precision.c_str(),
                  static_cast<long long>(spec.samples), spec.epochs, mixed.accuracy,
                  mixed.accuracy - fp32.accuracy);
      if (precision == "fp16") {
        std::printf("  (%lld steps skipped by the scaler)",
                    static_cast<long long>(mixed.skipped_steps));
      }
      std::printf("\n");
      char evidence[64];
      std::snprintf(evidence, sizeof evidence, "%.4f vs %.4f", mixed.accuracy, fp32.accuracy);
      verdict.check(mixed.accuracy >= fp32.accuracy - kAccuracyMargin,
                    spec.name + " " + precision + ": accuracy within " +
                        std::to_string(static_cast<int>(kAccuracyMargin * 100)) + " point of fp32",
                    evidence);
    }
  }

  // The time of a step, fp32 against each 16-bit type: the median of kTimedRuns runs, with the
  // fastest and the slowest, so that the spread shows how far one figure can be trusted.
  std::printf("\nmodel  precision  ms per step: median (fastest-slowest)  speed-up over fp32\n");
  std::vector<std::string> timed = {"fp32"};
  timed.insert(timed.end(), precisions.begin(), precisions.end());
  bool busy = false;
  for (const ModelSpec& spec : specs) {
    double fp32_s = 0;
    for (const std::string& precision : timed) {
      const course::Timing t = time_step(spec, precision, train_set, device);
      if (precision == "fp32") fp32_s = t.median_s;
      std::printf("%-6s %-10s %-38s %.2fx%s\n", spec.name.c_str(), precision.c_str(),
                  course::describe_ms(t).c_str(), fp32_s / t.median_s,
                  precision == "fp16" ? "  (with the scaler's wait for the device each step)" : "");
      busy = busy || course::looks_busy(t);
    }
  }
  if (busy) std::cout << course::busy_note() << "\n";
  return verdict.finish("lesson 08 on " + device.str());
}
