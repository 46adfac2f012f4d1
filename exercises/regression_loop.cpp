// Exercise answer (lessons 05 and 06) — tutorial 003's GPU-aware regression loop, in C++.
//
// Tutorial 003, parts 3 and 4, translated line for line: a TensorDataset of 1,024 random samples
// (16 features, one random target each), a DataLoader (batch 64, shuffled), nn.Sequential moved
// to the device, MSELoss, Adam, 3 epochs, each batch moved in the loop; then the evaluation loop
// under torch.no_grad() that sums the absolute errors into the Mean Absolute Error.
//
// Run:    build/bin/exercise_regression_loop [--device auto|cpu|cuda|cuda:N] [--seed N]
//                                            [--threads N]
//         (--quick is accepted, as by every lesson: the run is already short)
// Checks: the model's parameters and its outputs are on the device; the last loss is finite; the
//         mean squared error over the whole dataset is lower after training than before (the
//         targets are noise, so the model can only fit the samples it trains on, but it can do
//         that); the evaluation saw every sample once and recorded no graph; and its MAE equals
//         the MAE of the whole dataset in one pass within kMaeTolerance.
//         Exit 0 PASS, 1 FAIL, 2 bad flag.
#include <torch/torch.h>  // defines: torch::nn, torch::optim, torch::data

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

#include "common/cli.h"      // defines: Cli, start_lesson (--device, the device line)
#include "common/compare.h"  // defines: tolerance_for
#include "common/verdict.h"  // defines: Verdict, report_error

namespace exercise_regression_loop {

// ---- knobs -----------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 3;          // the data, the first weights and the batches' order
constexpr std::int64_t kNumSamples = 1024;  // the tutorial's num_samples
constexpr std::int64_t kNumFeatures = 16;   // the tutorial's num_features
constexpr std::int64_t kBatchSize = 64;     // DataLoader(batch_size=64)
constexpr int kWorkers = 2;                 // DataLoader(num_workers=2)
constexpr double kLearningRate = 1e-3;      // optim.Adam(model.parameters(), lr=0.001)
constexpr int kNumEpochs = 3;               // the tutorial's num_epochs
// The batched MAE against the whole dataset's in one pass: the same fp32 sums in another order.
constexpr double kMaeTolerance = course::tolerance_for(torch::kFloat);

// ---- 2. Data -----------------------------------------------------------------------------------
//! [data]
// TensorDataset(X, y): sample i is row i of X and row i of y. (LibTorch's own TensorDataset
// holds one tensor only, so the exercise writes the two-tensor one.)
struct TensorDataset : torch::data::datasets::Dataset<TensorDataset> {
  TensorDataset(torch::Tensor X, torch::Tensor y) : X(std::move(X)), y(std::move(y)) {}
  torch::data::Example<> get(std::size_t index) override {
    return {X[static_cast<std::int64_t>(index)], y[static_cast<std::int64_t>(index)]};
  }
  torch::optional<std::size_t> size() const override { return static_cast<std::size_t>(X.size(0)); }
  torch::Tensor X, y;
};

// DataLoader(dataset, batch_size=64, shuffle=True, num_workers=2): Stack<> makes each batch's
// samples one tensor [64, 16] and one [64, 1], on the host. (pin_memory has no counterpart in
// LibTorch's DataLoaderOptions: lesson 11 writes a loader with pinned batches.)
auto make_loader(TensorDataset dataset) {
  return torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      std::move(dataset).map(torch::data::transforms::Stack<>()),
      torch::data::DataLoaderOptions().batch_size(kBatchSize).workers(kWorkers));
}
//! [data]

//! [reference]
// predictions - y for the whole dataset in one pass, with no graph: the reference the loops'
// figures are checked against (a measurement, not part of the tutorial's program).
torch::Tensor whole_dataset_errors(torch::nn::Sequential& model, const TensorDataset& dataset,
                                   const torch::Device& device) {
  torch::NoGradGuard no_grad;
  return model->forward(dataset.X.to(device)) - dataset.y.to(device);
}
// The mean of a tensor's elements, summed in double, on the host.
double mean_in_double(const torch::Tensor& t) { return t.to(torch::kDouble).mean().item<double>(); }
//! [reference]

// A small number as one reads it: "1.2e-07", where std::to_string would print "0.000000".
std::string scientific(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1e", x);
  return text;
}

}  // namespace exercise_regression_loop

// ---- main: the tutorial's parts 3 and 4, step by step -------------------------------------------
int main(int argc, char** argv) try {
  using namespace exercise_regression_loop;
  course::CommonOptions options;
  options.seed = kSeed;
  course::Cli cli("exercise_regression_loop",
                  "Tutorial 003's GPU-aware regression loop and its no_grad evaluation.", options);
  if (auto code = cli.parse(argc, argv)) return *code;

  // 1. Setup: torch.device("cuda" if torch.cuda.is_available() else "cpu"), or --device.
  const torch::Device device = course::start_lesson(options);
  torch::manual_seed(options.seed);

  //! [setup]
  // 2. Dummy data: X = torch.randn(num_samples, num_features); y = torch.randn(num_samples, 1)
  const torch::Tensor X = torch::randn({kNumSamples, kNumFeatures});
  const torch::Tensor y = torch::randn({kNumSamples, 1});
  const TensorDataset dataset(X, y);  // kept for the checks; the loader takes a copy
  auto data_loader = make_loader(dataset);

  // 3. The model, moved once, right after it is made (all its weights and biases, in place).
  torch::nn::Sequential model(torch::nn::Linear(kNumFeatures, 64), torch::nn::ReLU(),
                              torch::nn::Linear(64, 1));
  model->to(device);

  // 4. Loss and optimizer, the optimizer built over the moved parameters.
  torch::nn::MSELoss loss_function;
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(kLearningRate));
  //! [setup]
  // The mean squared error over all samples, in double, before training (checked below).
  const double mse_before = mean_in_double(whole_dataset_errors(model, dataset, device).square());

  //! [train]
  // 5. The training loop: every batch's features and targets moved to the model's device.
  torch::Tensor loss;
  for (int epoch = 0; epoch < kNumEpochs; ++epoch) {
    model->train();
    for (auto& [batch_X, batch_y] : *data_loader) {
      batch_X = batch_X.to(device);
      batch_y = batch_y.to(device);

      torch::Tensor predictions = model->forward(batch_X);  // 1. forward pass
      loss = loss_function(predictions, batch_y);           // 2. loss

      optimizer.zero_grad();  // 3. backward pass and optimization
      loss.backward();
      optimizer.step();
    }
    // The last batch's loss, as the tutorial prints it; .item() waits for the GPU.
    std::printf("Epoch [%d/%d], Loss: %.4f\n", epoch + 1, kNumEpochs, loss.item<double>());
  }
  //! [train]
  const double mse_after = mean_in_double(whole_dataset_errors(model, dataset, device).square());

  //! [evaluate]
  // Part 4: the evaluation loop, with no graph (`with torch.no_grad():`).
  model->eval();
  double total_error = 0;
  std::int64_t num_samples = 0;
  bool recorded_a_graph = false;  // for the check below: a prediction that requires grad
  {
    torch::NoGradGuard no_grad;  // until the end of this scope
    for (auto& [batch_X, batch_y] : *data_loader) {
      batch_X = batch_X.to(device);
      batch_y = batch_y.to(device);

      torch::Tensor predictions = model->forward(batch_X);
      recorded_a_graph |= predictions.requires_grad();

      total_error += torch::abs(predictions - batch_y).sum().item<double>();
      num_samples += batch_X.size(0);
    }
  }
  const double mae = total_error / static_cast<double>(num_samples);
  std::printf("Evaluation complete. Mean Absolute Error on the dataset: %.4f\n", mae);
  //! [evaluate]

  //! [check]
  // The same MAE, from the whole dataset in one pass: equal up to the order of the fp32 sums.
  const double reference = mean_in_double(torch::abs(whole_dataset_errors(model, dataset, device)));
  const double mae_diff = std::abs(mae - reference) / reference;
  //! [check]

  course::Verdict verdict;
  bool on_device = true;
  for (const auto& p : model->parameters()) on_device &= p.device() == device;
  const bool outputs_on_device = whole_dataset_errors(model, dataset, device).device() == device;
  verdict.check(on_device && outputs_on_device,
                "the model's parameters and its outputs are on " + device.str());
  verdict.check(std::isfinite(loss.item<double>()), "the last loss is finite",
                std::to_string(loss.item<double>()));
  verdict.check(mse_after < mse_before, "training lowered the mean squared error over the dataset",
                std::to_string(mse_before) + " -> " + std::to_string(mse_after));
  verdict.check(num_samples == kNumSamples && !recorded_a_graph,
                "the evaluation saw every sample once and recorded no graph",
                std::to_string(num_samples) + " samples");
  verdict.check(
      mae_diff <= kMaeTolerance, "the MAE equals the whole dataset's in one pass",
      "relative diff " + scientific(mae_diff) + ", tolerance " + scientific(kMaeTolerance));
  return verdict.finish("tutorial 003's regression loop on " + device.str());
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
