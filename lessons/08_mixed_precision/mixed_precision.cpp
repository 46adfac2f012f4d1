// Lesson 08 — mixed precision: the tutorial's AMP loop, what autocast does op by op, and what
// 16 bits buy.
//
// You will learn:
//   - tutorial 001's AMP loop ("Use torch.cuda.amp for Mixed Precision Training"): zero_grad, the
//     forward pass and the loss under autocast, then the gradient scaler's
//     scale(loss).backward(), step(optimizer) and update(), here in the tutorial's Fashion-MNIST
//     program (lesson 05's ANN, loaders and evaluation);
//   - autocast runs the ops that gain from it (linear, matmul) in a 16-bit type and keeps the ones
//     that need range (losses) in fp32; parameters, gradients and the optimizer stay fp32. The
//     CPU and CUDA policies differ: which op does what is printed, not assumed;
//   - fp16 (CUDA's) has a narrow range: the scaler multiplies the loss so that small gradients
//     survive, divides them back, skips steps that overflowed and adapts its factor. bf16 (the
//     CPU's) has fp32's range: there the scaler is built disabled, as GradScaler(enabled=False);
//   - a GPU's tensor cores run 16-bit matmuls faster; whether this small model gains is measured.
// LibTorch has neither torch.autocast nor GradScaler: autocast.h and grad_scaler.h (this folder)
// are thin C++ versions of Python's, and their headers name every LibTorch call they make.
//
// Run:    build/bin/lesson08_mixed_precision [--device auto|cpu|cuda|cuda:N] [--epochs N]
//                                            [--data-dir DIR] [--seed N] [--threads N] [--quick]
// Checks: under autocast linear/matmul give 16-bit results, cross-entropy and the weight gradient
//         fp32; 1e-8 is zero in fp16 unless scaled first; the scaler skips a step with an inf
//         gradient, halves its scale, and doubles it after growth_interval clean steps; the AMP
//         loop's test accuracy is within kAccuracyMargin of fp32's. Exit 0 PASS, 1 FAIL, 2 bad
//         flag or missing data.
#include <torch/torch.h>  // defines: torch::nn, torch::optim, torch::data, torch::max

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "autocast.h"        // defines: Autocast (`with torch.autocast(...)`), autocast_enabled
#include "common/cli.h"      // defines: Cli, start_lesson (--device, the device line)
#include "common/dataset.h"  // defines: FashionMNIST (torchvision's datasets.FashionMNIST)
#include "common/report.h"   // defines: format
#include "common/timing.h"   // defines: Stopwatch, time_median, per_piece, describe_ms
#include "common/verdict.h"  // defines: Verdict, report_error
#include "grad_scaler.h"     // defines: GradScaler (torch.amp.GradScaler)

namespace lesson08 {

// ---- knobs -----------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 8;  // the first weights and the batch order, the same per precision
// The 16-bit type: fp16 on CUDA (the tutorial's; tensor cores; it needs the scaler), bf16 on the
// CPU (the one LibTorch 1.13's CPU autocast knows; fp32's range, so no scaler).
constexpr torch::ScalarType kCudaDtype = torch::kHalf;
constexpr torch::ScalarType kCpuDtype = torch::kBFloat16;
constexpr int kEpochs = 2;               // per precision, on all 60,000 training images
constexpr std::int64_t kBatchSize = 64;  // lesson 05's DataLoader(batch_size=64)
constexpr int kWorkers = 2;              // and its num_workers=2
constexpr double kLearningRate = 1e-3;   // optim.Adam(model.parameters(), lr=0.001)
//! [margin]
constexpr double kAccuracyMargin = 0.01;  // the AMP loop's test accuracy within 1 point of fp32's
//! [margin]
constexpr std::int64_t kQuickSamples = 10000;  // --quick: one epoch on the first 10,000 images
// Timing: one step on one batch already on the device, at the training batch and at a large one.
constexpr std::int64_t kLargeBatch = 4096;  // where the matmuls dominate a step
constexpr int kTimedRuns = 5;               // the median of this many runs, each of
constexpr double kTimedRunSeconds = 0.2;    // as many steps as fill about this long,
constexpr int kMaxTimedSteps = 50;          // and at most this many

// ---- 1. The tutorial's AMP loop --------------------------------------------------------------
//! [amp-loop]
// One epoch of `for data, target in dataloader:` with autocast and the scaler. Model and Loader
// are template parameters: any module with a forward(x) and any range of batches will do, as in
// Python (main passes lesson 05's ANN and LibTorch's loader). With use_amp false the same lines
// train in fp32: autocast switched off, and a scaler built disabled (Python's enabled=use_amp).
// Returns the epoch's mean loss as a tensor on the device: reading it waits for the GPU, so the
// caller reads it once per epoch, not once per step.
template <typename Model, typename Loader>
torch::Tensor train_epoch(Model& model, Loader& train_loader,
                          torch::nn::CrossEntropyLoss& criterion,
                          torch::optim::Optimizer& optimizer, GradScaler& scaler,
                          const torch::Device& device, torch::ScalarType dtype, bool use_amp) {
  model->train();
  torch::Tensor total_loss = torch::zeros({}, torch::TensorOptions().device(device));
  std::int64_t batches = 0;
  for (auto& [features, labels] : train_loader) {
    features = features.to(device);
    labels = labels.to(device);

    //! [autocast-block]
    optimizer.zero_grad();
    torch::Tensor loss;  // declared before the block: Python's `with` has no scope, C++'s has
    {
      // >>> lab: with autocast(): autocast.h's guard, in `dtype`, on when use_amp
      Autocast autocast(device.type(), dtype, /*enabled=*/use_amp);  // with autocast():
      // <<< lab
      torch::Tensor outputs = model->forward(features);
      loss = criterion(outputs, labels);
    }  // autocast ends: backward runs each op in the dtype its forward pass used
    //! [autocast-block]

    // >>> lab: backpropagate the scaled loss, step the optimizer through the scaler, update it
    scaler.scale(loss).backward();
    scaler.step(optimizer);  // unscales the gradients; skips the step if one is inf or NaN
    scaler.update();         // halves the scale after a skip, doubles it after 2000 clean ones
    // <<< lab

    total_loss += loss.detach();
    ++batches;
  }
  return total_loss / static_cast<double>(batches);
}
//! [amp-loop]

// ---- 2. The tutorial's model, data and evaluation (lesson 05) ---------------------------------
//! [model]
struct ANNImpl : torch::nn::Module {
  ANNImpl()
      : fc1(register_module("fc1", torch::nn::Linear(28 * 28, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 64))),
        out(register_module("out", torch::nn::Linear(64, 10))),
        relu(register_module("relu", torch::nn::ReLU())) {}

  torch::Tensor forward(torch::Tensor x) {
    x = x.view({x.size(0), -1});  // [B, 1, 28, 28] -> [B, 784]
    x = relu(fc1(x));
    x = relu(fc2(x));
    return out(x);
  }

  torch::nn::Linear fc1, fc2, out;
  torch::nn::ReLU relu;
};
TORCH_MODULE(ANN);
//! [model]

// DataLoader(test_ds, batch_size=64): Stack<> makes batches of the samples, in order.
using TestLoader = torch::data::StatelessDataLoader<
    torch::data::datasets::MapDataset<course::FashionMNIST, torch::data::transforms::Stack<>>,
    torch::data::samplers::SequentialSampler>;

//! [evaluate]
// The fraction of the test set classified right, under autocast too when use_amp.
double evaluate(ANN& model, TestLoader& test_loader, const torch::Device& device,
                torch::ScalarType dtype, bool use_amp) {
  model->eval();
  torch::NoGradGuard no_grad;
  Autocast autocast(device.type(), dtype, /*enabled=*/use_amp);
  std::int64_t correct = 0;  // correct = 0
  std::int64_t total = 0;    // total = 0
  for (auto& [features, labels] : test_loader) {
    features = features.to(device);
    labels = labels.to(device);
    torch::Tensor outputs = model->forward(features);
    auto [values, predicted] = torch::max(outputs, /*dim=*/1);
    total += labels.size(0);
    correct += (predicted == labels).sum().item<std::int64_t>();
  }
  return static_cast<double>(correct) / static_cast<double>(total);
}
//! [evaluate]

//! [program]
// The tutorial's program with the AMP loop: loaders, the model moved before Adam is built over
// its parameters, the loss, the scaler, the epochs, the evaluation. The seed makes the first
// weights and the batch order the same in fp32 and in mixed precision. Returns the test accuracy.
double run_program(const course::FashionMNIST& train_ds, const course::FashionMNIST& test_ds,
                   int epochs, const torch::Device& device, torch::ScalarType dtype, bool use_amp,
                   std::uint64_t seed) {
  torch::manual_seed(seed);
  auto train_loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      course::FashionMNIST(train_ds).map(torch::data::transforms::Stack<>()),
      torch::data::DataLoaderOptions().batch_size(kBatchSize).workers(kWorkers));
  auto test_loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      course::FashionMNIST(test_ds).map(torch::data::transforms::Stack<>()),
      torch::data::DataLoaderOptions().batch_size(kBatchSize));

  ANN model;
  model->to(device);  // the parameters stay fp32: autocast casts copies of them for each op
  torch::nn::CrossEntropyLoss criterion;
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(kLearningRate));
  // scaler = torch.amp.GradScaler(device.type, enabled=use_amp and dtype == torch.float16)
  GradScaler scaler(device, /*enabled=*/use_amp && dtype == torch::kHalf);

  for (int epoch = 0; epoch < epochs; ++epoch) {
    const torch::Tensor loss =
        train_epoch(model, *train_loader, criterion, optimizer, scaler, device, dtype, use_amp);
    std::printf("  Epoch %d, Loss: %.4f\n", epoch + 1, loss.item<double>());
  }
  if (scaler.is_enabled()) {
    std::printf("  GradScaler's scale at the end: %.0f\n", scaler.get_scale());
  }
  return evaluate(model, *test_loader, device, dtype, use_amp);
}
//! [program]

// ---- 3. What autocast does, op by op ---------------------------------------------------------
struct OpDtype {
  std::string op;
  torch::ScalarType dtype;
};

//! [op-dtypes]
// The dtype of each op's result under autocast in `dtype` on `device`, and of a weight gradient.
std::vector<OpDtype> op_dtypes(const torch::Device& device, torch::ScalarType dtype) {
  torch::manual_seed(kSeed);
  torch::nn::Linear layer(8, 4);
  layer->to(device);
  const auto on = torch::TensorOptions().device(device);
  const torch::Tensor x = torch::randn({16, 8}, on);
  const torch::Tensor y = torch::randint(4, {16}, on.dtype(torch::kLong));
  std::vector<OpDtype> rows;
  torch::Tensor loss;
  {
    Autocast autocast(device.type(), dtype);  // with torch.autocast(device.type, dtype):
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
  loss.backward();  // outside autocast
  rows.push_back({"weight gradient", layer->weight.grad().scalar_type()});
  return rows;
}
//! [op-dtypes]

// Prints the table for each 16-bit type the device's autocast takes, and checks the claims.
void check_policy(const torch::Device& device, course::Verdict& verdict) {
  std::cout << "Under autocast on " << device << ", op by op:\n";
  std::vector<torch::ScalarType> dtypes = {kCpuDtype};
  if (device.is_cuda()) dtypes = {torch::kHalf, torch::kBFloat16};
  for (const torch::ScalarType dtype : dtypes) {
    bool low_matmul = true;  // linear and matmul in the 16-bit type
    bool fp32_loss = false;  // cross-entropy in fp32
    bool fp32_grad = false;  // the weight gradient in fp32
    std::cout << "  " << dtype << ":";
    for (const OpDtype& row : op_dtypes(device, dtype)) {
      std::cout << " " << row.op << "=" << row.dtype << ";";
      if (row.op == "linear" || row.op == "matmul") low_matmul &= row.dtype == dtype;
      if (row.op == "cross_entropy") fp32_loss = row.dtype == torch::kFloat;
      if (row.op == "weight gradient") fp32_grad = row.dtype == torch::kFloat;
    }
    std::cout << "\n";
    verdict.check(low_matmul && fp32_loss && fp32_grad,
                  std::string(c10::toString(dtype)) +
                      ": linear/matmul in 16 bits, cross-entropy and the gradient in fp32");
  }
}

// ---- 4. The scaler and an overflow -----------------------------------------------------------
//! [fp16-range]
// Why fp16 needs the scaler: small gradients in fp16 as they are, and scaled first (then unscaled).
void check_fp16_range(course::Verdict& verdict) {
  const double scale = GradScalerOptions().init_scale;
  const torch::Tensor grads = torch::tensor({1e-4f, 1e-6f, 1e-8f});
  const torch::Tensor plain = grads.to(torch::kHalf).to(torch::kFloat);
  const torch::Tensor scaled = (grads * scale).to(torch::kHalf).to(torch::kFloat) / scale;
  std::printf("\nfp16: smallest normal %.3g, smallest above zero %.3g\n",
              static_cast<float>(std::numeric_limits<c10::Half>::min()),
              static_cast<float>(std::numeric_limits<c10::Half>::denorm_min()));
  for (int i = 0; i < 3; ++i) {
    std::printf("  %.0e in fp16: %.4e; scaled by %.0f first: %.4e\n", grads[i].item<float>(),
                plain[i].item<float>(), scale, scaled[i].item<float>());
  }
  verdict.check(plain[2].item<float>() == 0 && scaled[2].item<float>() > 0,
                "a 1e-8 gradient is zero in fp16, and survives when scaled first");
}
//! [fp16-range]

// An inf gradient (what fp16 gives when a scaled gradient overflows) is skipped and halves the
// scale; growth_interval clean steps double it. On any device: the scaler's arithmetic is fp32.
void check_scaler(const torch::Device& device, course::Verdict& verdict) {
  torch::manual_seed(kSeed);
  torch::nn::Linear layer(4, 2);
  layer->to(device);
  torch::optim::SGD sgd(layer->parameters(), torch::optim::SGDOptions(0.1));
  GradScalerOptions options;
  options.growth_interval = 3;  // grow after 3 clean steps, to see it happen
  GradScaler scaler(device, options);
  const torch::Tensor x = torch::ones({2, 4}, torch::TensorOptions().device(device));
  const auto step = [&](bool overflow) {
    sgd.zero_grad();
    scaler.scale(layer(x).sum()).backward();
    if (overflow) layer->weight.grad()[0][0] = std::numeric_limits<float>::infinity();
    const bool stepped = scaler.step(sgd);
    scaler.update();
    return stepped;
  };

  const torch::Tensor before = layer->weight.detach().clone();
  const double first = scaler.get_scale();
  const bool stepped = step(/*overflow=*/true);
  const double backed_off = scaler.get_scale();
  std::printf("\nGradScaler: inf gradient -> step %s, scale %.0f -> %.0f\n",
              stepped ? "taken" : "skipped", first, backed_off);
  verdict.check(!stepped && torch::equal(before, layer->weight.detach()),
                "the scaler skips a step whose gradients hold an inf");
  verdict.check(backed_off == first * options.backoff_factor, "and halves its scale");
  for (int i = 0; i < options.growth_interval; ++i) step(/*overflow=*/false);
  std::printf("GradScaler: %lld clean steps -> scale %.0f -> %.0f\n",
              static_cast<long long>(options.growth_interval), backed_off, scaler.get_scale());
  verdict.check(scaler.get_scale() == backed_off * options.growth_factor,
                "after growth_interval clean steps the scale doubles");
}

// ---- 5. What 16 bits buy, measured -----------------------------------------------------------
//! [time-step]
// The time of one step of the AMP loop on a batch of `batch` already on the device: steps of a
// list of the same batch, timed by train_epoch itself. Median, fastest and slowest of kTimedRuns.
course::Timing time_step(std::int64_t batch, const torch::Device& device, torch::ScalarType dtype,
                         bool use_amp) {
  torch::manual_seed(kSeed);
  ANN model;
  model->to(device);
  torch::nn::CrossEntropyLoss criterion;
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(kLearningRate));
  GradScaler scaler(device, /*enabled=*/use_amp && dtype == torch::kHalf);  // as run_program's
  const auto on = torch::TensorOptions().device(device);
  const torch::data::Example<> one{torch::rand({batch, 1, 28, 28}, on),
                                   torch::randint(10, {batch}, on.dtype(torch::kLong))};
  std::vector<torch::data::Example<>> batches(2, one);  // warm-up: Adam's state, the kernels
  train_epoch(model, batches, criterion, optimizer, scaler, device, dtype, use_amp);
  course::Stopwatch watch(device);
  train_epoch(model, batches, criterion, optimizer, scaler, device, dtype, use_amp);
  const double step_s = watch.seconds() / 2;
  const int steps = std::clamp(static_cast<int>(kTimedRunSeconds / step_s), 1, kMaxTimedSteps);
  batches.assign(steps, one);  // a timed run: `steps` steps
  const course::Timing t = course::time_median(
      [&] { train_epoch(model, batches, criterion, optimizer, scaler, device, dtype, use_amp); },
      device, /*warmup=*/0, kTimedRuns);
  return course::per_piece(t, static_cast<double>(batches.size()));  // per step
}
//! [time-step]

void print_timings(const torch::Device& device, torch::ScalarType dtype) {
  std::printf("\nbatch  precision  ms per step: median (fastest-slowest)  speed-up over fp32\n");
  std::vector<course::Timing> timings;
  for (const std::int64_t batch : {kBatchSize, kLargeBatch}) {
    const course::Timing fp32 = time_step(batch, device, dtype, /*use_amp=*/false);
    const course::Timing mixed = time_step(batch, device, dtype, /*use_amp=*/true);
    std::printf("%-6lld %-10s %-38s\n", static_cast<long long>(batch), "fp32",
                course::describe_ms(fp32).c_str());
    std::printf("%-6lld %-10s %-38s %.2fx\n", static_cast<long long>(batch), c10::toString(dtype),
                course::describe_ms(mixed).c_str(), fp32.median_s / mixed.median_s);
    timings.insert(timings.end(), {fp32, mixed});
  }
  std::cout << course::timing_note(timings);  // a busy machine, or single runs: says so
}

}  // namespace lesson08

// ---- main: the checks, the program in fp32 and with the AMP loop, the timing -----------------
#ifndef GPU_LESSONS_NO_MAIN  // tests/test_lesson08.cpp includes this file for its functions
int main(int argc, char** argv) try {
  using namespace lesson08;
  course::CommonOptions options;
  options.seed = kSeed;
  int epochs = 0;  // 0: kEpochs, or 1 with --quick
  course::Cli cli("lesson08_mixed_precision",
                  "Lesson 08: the tutorial's AMP loop (autocast, GradScaler) and fp32.", options);
  cli.add_data_dir();
  cli.add_option("--epochs", epochs, "epochs per precision (0 = 2, or 1 with --quick)", 0, 1000);
  if (auto code = cli.parse(argc, argv)) return *code;
  // The tutorials' device line:
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  device = course::start_lesson(options, device);  // --device may override it; printed first
  const torch::ScalarType dtype = device.is_cuda() ? kCudaDtype : kCpuDtype;
  course::Verdict verdict;

  check_policy(device, verdict);
  check_fp16_range(verdict);
  check_scaler(device, verdict);

  // The tutorial's program twice, from the same seed: in fp32, then with the AMP loop.
  const course::FashionMNIST train_ds(options.data_dir, /*train=*/true,
                                      options.quick ? kQuickSamples : -1);
  const course::FashionMNIST test_ds(options.data_dir, /*train=*/false);
  if (epochs == 0) epochs = options.quick ? 1 : kEpochs;
  std::printf("\nFashion-MNIST: %lld training images, batch %lld, %d epoch(s)\n",
              static_cast<long long>(*train_ds.size()), static_cast<long long>(kBatchSize), epochs);
  std::printf("fp32:\n");
  const double fp32 =
      run_program(train_ds, test_ds, epochs, device, dtype, /*use_amp=*/false, options.seed);
  std::printf("  Test Accuracy: %.4f\n", fp32);
  std::printf("autocast %s:\n", c10::toString(dtype));
  const double mixed =
      run_program(train_ds, test_ds, epochs, device, dtype, /*use_amp=*/true, options.seed);
  std::printf("  Test Accuracy: %.4f (%+.4f)\n", mixed, mixed - fp32);
  verdict.check(mixed >= fp32 - kAccuracyMargin,
                "the AMP loop's test accuracy is within the margin of fp32's",
                course::format("%.4f vs %.4f, margin %.2f", mixed, fp32, kAccuracyMargin));

  print_timings(device, dtype);
  return verdict.finish("lesson 08 on " + device.str());
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
#endif
