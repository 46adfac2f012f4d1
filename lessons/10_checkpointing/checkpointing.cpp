// Lesson 10 — checkpointing: the tutorial's recipe. Save a model and load it onto a device, save a
// training run (model, optimizer, epoch) and resume it, and exchange files with Python.
//
// You will learn:
//   - torch::save(model, path), Python's torch.save(model.state_dict(), path): every parameter and
//     buffer under its state_dict name ("fc1.weight", ..., "out.bias");
//   - torch::load(model, path, device), Python's model.load_state_dict(torch.load(path,
//     map_location=device, weights_only=True)): each tensor made on `device`, wherever it was
//     saved;
//   - a checkpoint that resumes training: the model, Adam's state and the epoch in one file,
//     loaded into a fresh ANN and Adam on the device;
//   - Python's own state_dict files, both ways (torch_files/state_dict.h reads and writes the
//   format).
// Going further: lesson 13 writes this checkpoint atomically, lesson 14 makes its resume exact, and
// lesson 15 loads files from strangers without harm.
//
// Run:    build/bin/lesson10_checkpointing [--device ...] [--quick]      (the recipe)
//         build/bin/lesson10_checkpointing --checkpoint run.pt --epochs 5   (resumes when run.pt
//             exists, saves after every epoch: stop it with Ctrl-C, run it again)
//         build/bin/lesson10_checkpointing --from-python model.pt [--to-python back.pt]
//             (model.pt: python3 python/tutorial_program.py --save model.pt)
// Checks: what torch::load reads back equals what torch::save wrote, on the device asked for, at
//         the same test accuracy; a resumed model and Adam equal the saved ones; a file written
//         for Python reads back equal; the test accuracy reaches the bar. Exit 0 PASS, 1 FAIL,
//         2 bad flag, missing data or a bad file (with a HINT), 130 stopped by Ctrl-C.
#include <torch/torch.h>  // defines: torch::save, torch::load, torch::serialize, torch::optim

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>

#include "common/cli.h"               // defines: Cli, start_lesson
#include "common/compare.h"           // defines: max_abs_diff
#include "common/dataset.h"           // defines: FashionMNIST (torchvision's datasets.FashionMNIST)
#include "common/interrupt.h"         // defines: StopOnInterrupt, stop_requested, epoch_abandoned
#include "common/temporary_folder.h"  // defines: TemporaryFolder
#include "common/verdict.h"           // defines: Verdict, report_error
#include "torch_files/state_dict.h"  // defines: CheckpointError, Python's files, the checks of a file

namespace lesson10 {
namespace fs = std::filesystem;

// ---- knobs -----------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 10;      // the model's first weights and the batches' order
constexpr int kEpochs = 5;               // the tutorial's: for epoch in range(5)
constexpr std::int64_t kBatchSize = 64;  // DataLoader(train_ds, batch_size=64, shuffle=True)
constexpr double kLearningRate = 1e-3;   // optim.Adam(model.parameters(), lr=0.001)
constexpr int kWorkers = 2;              // loader threads, as in lesson 05
constexpr double kAccuracyBar = 0.85;    // lesson 05's, after kEpochs on all 60,000 images
// --quick: kQuickEpochs on the first kQuickSamples training images; the bar is lower to match.
constexpr int kQuickEpochs = 2;
constexpr std::int64_t kQuickSamples = 10000;
constexpr double kQuickAccuracyBar = 0.70;

// ---- the tutorial's model: lesson 05's, declared again ---------------------------------------
//! [model]
// Each tutorial declares its own, and a state_dict is the names and shapes of one model's tensors:
// these (fc1, fc2, out) are the Python ANN's, so a file either side saves loads on the other.
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

// ---- data, training and evaluation: lesson 05's -------------------------------------------------
using Batches =
    torch::data::datasets::MapDataset<course::FashionMNIST, torch::data::transforms::Stack<>>;
using TrainLoader = torch::data::StatelessDataLoader<Batches, torch::data::samplers::RandomSampler>;
using TestLoader =
    torch::data::StatelessDataLoader<Batches, torch::data::samplers::SequentialSampler>;

std::unique_ptr<TrainLoader> make_train_loader(course::FashionMNIST train_ds) {
  return torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      std::move(train_ds).map(torch::data::transforms::Stack<>()),
      torch::data::DataLoaderOptions().batch_size(kBatchSize).workers(kWorkers));
}

std::unique_ptr<TestLoader> make_test_loader(course::FashionMNIST test_ds) {
  return torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      std::move(test_ds).map(torch::data::transforms::Stack<>()),
      torch::data::DataLoaderOptions().batch_size(kBatchSize));
}

// One epoch of the tutorial's loop; its mean loss. Ctrl-C ends it after the step under way.
double train_epoch(ANN& model, TrainLoader& train_loader, torch::optim::Adam& optimizer,
                   const torch::Device& device) {
  model->train();
  torch::nn::CrossEntropyLoss criterion;
  double total_loss = 0;
  std::int64_t batches = 0;
  for (auto& [features, labels] : train_loader) {
    features = features.to(device);
    labels = labels.to(device);
    torch::Tensor loss = criterion(model->forward(features), labels);
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
    total_loss += loss.item<double>();
    ++batches;
    if (course::stop_requested()) {  // Ctrl-C: stop after this step
      throw course::Interrupted("after step " + std::to_string(batches));
    }
  }
  return total_loss / static_cast<double>(batches);
}

// The fraction of the test set classified right (model.eval(), torch.no_grad(), torch.max).
double evaluate(ANN& model, TestLoader& test_loader, const torch::Device& device) {
  model->eval();
  torch::NoGradGuard no_grad;
  std::int64_t correct = 0, total = 0;
  for (auto& [features, labels] : test_loader) {
    auto [values, predicted] = torch::max(model->forward(features.to(device)), /*dim=*/1);
    total += labels.size(0);
    correct += (predicted == labels.to(device)).sum().item<std::int64_t>();
  }
  return static_cast<double>(correct) / static_cast<double>(total);
}

// ---- 1. save and load a model -------------------------------------------------------------------
//! [save-load]
// Python: torch.save(model.state_dict(), path)
void save_weights(ANN& model, const std::string& path) {
  // >>> lab: save the model's parameters and buffers, by name, to `path`
  torch::save(model, path);
  // <<< lab
}

// Python: model.load_state_dict(torch.load(path, map_location=device, weights_only=True))
void load_weights(ANN& model, const std::string& path, const torch::Device& device) {
  // torch::load trusts the file: LibTorch's reader takes the sizes a damaged file claims, and the
  // module takes whatever shapes the file holds. So the file is checked first (torch_files/).
  course::check_module_file(*model, path);
  // >>> lab: load `path` into `model`, every tensor made on `device` (Python's map_location)
  torch::load(model, path, device);
  // <<< lab
  model->to(device);  // the tutorial's class_model.to(device): the tensors are there already
}
//! [save-load]

// ---- 2. a checkpoint to resume from -------------------------------------------------------------
//! [checkpoint]
// Python: torch.save({"epoch": epoch, "model_state_dict": model.state_dict(),
//                     "optimizer_state_dict": optimizer.state_dict()}, path)
void save_checkpoint(ANN& model, torch::optim::Adam& optimizer, std::int64_t epoch,
                     const std::string& path) {
  torch::serialize::OutputArchive checkpoint, model_state_dict, optimizer_state_dict;
  model->save(model_state_dict);  // what torch::save(model, path) writes
  // >>> lab: write Adam's state (its moments and step counts) into optimizer_state_dict
  optimizer.save(optimizer_state_dict);
  // <<< lab
  checkpoint.write("epoch", c10::IValue(epoch));
  checkpoint.write("model_state_dict", model_state_dict);
  checkpoint.write("optimizer_state_dict", optimizer_state_dict);
  checkpoint.save_to(path);  // empties the last checkpoint first: lesson 13 says why it matters
}

// Python: checkpoint = torch.load(path, map_location=device)
//         model.load_state_dict(checkpoint["model_state_dict"])
//         optimizer.load_state_dict(checkpoint["optimizer_state_dict"])
// `model` is on `device` and `optimizer` was built over its parameters after the move; Adam's
// moments are made on `device` too, beside their parameters. Returns the saved epoch.
std::int64_t load_checkpoint(ANN& model, torch::optim::Adam& optimizer, const std::string& path,
                             const torch::Device& device) {
  course::check_libtorch_archive(path);  // a damaged file never reaches LibTorch's reader
  torch::serialize::InputArchive checkpoint, model_state_dict, optimizer_state_dict;
  checkpoint.load_from(path, device);
  c10::IValue epoch;
  if (!checkpoint.try_read("model_state_dict", model_state_dict) ||
      !checkpoint.try_read("optimizer_state_dict", optimizer_state_dict) ||
      !checkpoint.try_read("epoch", epoch) || !epoch.isInt()) {
    const std::string what = " is not a checkpoint of this lesson (no model, optimizer or epoch)";
    throw course::CheckpointError(path + what,
                                  "give a file --checkpoint wrote, or another path to start anew");
  }
  course::check_module_archive(*model, model_state_dict, path);  // names and shapes, first
  try {
    model->load(model_state_dict);
    // >>> lab: read Adam's state back from optimizer_state_dict
    optimizer.load(optimizer_state_dict);
    // <<< lab
  } catch (const c10::Error& e) {
    throw course::CheckpointError(path + ": " + course::error_message(e),
                                  "give a file that --checkpoint wrote for this program");
  }
  return epoch.toInt();
}
//! [checkpoint]

// Trains from `epoch` to `epochs`, saving the checkpoint after every epoch.
void train_to(ANN& model, torch::optim::Adam& optimizer, TrainLoader& train_loader,
              const torch::Device& device, std::int64_t& epoch, int epochs,
              const std::string& checkpoint) {
  course::StopOnInterrupt ctrl_c;  // Ctrl-C: the step under way ends, the file keeps its epoch
  while (epoch < epochs) {
    double loss = 0;
    try {
      loss = train_epoch(model, train_loader, optimizer, device);
    } catch (const course::Interrupted& stop) {  // says what the checkpoint holds
      throw course::epoch_abandoned(stop, epoch, checkpoint);
    }
    save_checkpoint(model, optimizer, ++epoch, checkpoint);
    std::printf("Epoch %lld, Loss: %.4f  (saved to %s)\n", static_cast<long long>(epoch), loss,
                fs::path(checkpoint).filename().c_str());
    std::fflush(stdout);
  }
}

// ---- 3. Python's state_dict files ---------------------------------------------------------------
//! [python]
// The file Python's torch.save(model.state_dict(), path) wrote: torch.load(path, map_location=
// "cpu", weights_only=True), then the strict load_state_dict (names and shapes checked, copy_).
void load_python_weights(ANN& model, const std::string& path) {
  course::load_state_dict(*model, course::read_python_state_dict(path), path,
                          "save the state_dict of the tutorial's ANN (fc1, fc2, out)");
}

// A file Python reads with model.load_state_dict(torch.load(path, weights_only=True)).
void save_python_weights(ANN& model, const std::string& path) {
  course::write_python_state_dict(course::state_dict(*model), path);
}
//! [python]

// ---- the program's runs -------------------------------------------------------------------------
struct Run {  // what every run of the program shares
  torch::Device device;
  TrainLoader& train_loader;
  TestLoader& test_loader;
  int epochs;  // to train to
  course::Verdict verdict;
};

std::string evidence(const char* format, double a, double b = 0) {  // printf, into a string
  char text[120];
  std::snprintf(text, sizeof text, format, a, b);
  return text;
}

// The recipe, in a temporary folder: the tutorial's program saved after every epoch and stopped
// half way; its weights saved and loaded onto the device; the run resumed in `resumed`.
void recipe(Run& run, ANN& resumed, torch::optim::Adam& resumed_optimizer) {
  const course::TemporaryFolder work("lesson10-");  // gone when the recipe returns or throws
  const std::string checkpoint = work.file("checkpoint.pt"), weights = work.file("model.pt");
  std::cout << "\n== 1. The tutorial's program, saving a checkpoint after every epoch ==\n";
  ANN model;              // a run started here, and stopped half way
  model->to(run.device);  // before the optimizer is built over its parameters
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(kLearningRate));
  std::int64_t epoch = 0;
  const int stop = std::max(1, run.epochs / 2);
  train_to(model, optimizer, run.train_loader, run.device, epoch, stop, checkpoint);
  const double accuracy = evaluate(model, run.test_loader, run.device);
  std::cout << "\n== 2. torch::save the weights; torch::load them onto " << run.device << " ==\n";
  save_weights(model, weights);
  ANN loaded;  // a fresh model, on the CPU until torch::load puts its tensors on the device
  load_weights(loaded, weights, run.device);
  const double diff = course::max_abs_diff(loaded->parameters(), model->parameters());
  const double loaded_accuracy = evaluate(loaded, run.test_loader, run.device);
  std::printf("model.pt: %lld bytes; Test Accuracy: %.4f saved, %.4f loaded\n",
              static_cast<long long>(fs::file_size(weights)), accuracy, loaded_accuracy);
  run.verdict.check(diff == 0 && loaded->fc1->weight.device() == run.device,
                    "torch::load reads the weights back equal, onto " + run.device.str(),
                    evidence("max abs diff %g", diff));
  run.verdict.check(loaded_accuracy == accuracy,
                    "the loaded model's test accuracy is the saved one's",
                    evidence("%.4f vs %.4f", loaded_accuracy, accuracy));

  std::cout << "\n== 3. Resume: the checkpoint loaded into a fresh ANN and Adam ==\n";
  std::int64_t saved = load_checkpoint(resumed, resumed_optimizer, checkpoint, run.device);
  const double resumed_diff =
      course::max_state_diff(*resumed, resumed_optimizer, *model, optimizer);
  run.verdict.check(resumed_diff == 0 && saved == stop,
                    "the checkpoint gives back the model, Adam's state and the epoch",
                    evidence("max abs diff %g, epoch %.0f", resumed_diff, double(saved)));
  train_to(resumed, resumed_optimizer, run.train_loader, run.device, saved, run.epochs, checkpoint);
}

// --checkpoint PATH: resumes from PATH when it exists, trains to --epochs, saving after each.
void checkpoint_run(Run& run, ANN& model, torch::optim::Adam& optimizer, const std::string& path) {
  std::int64_t epoch = 0;
  if (!fs::exists(path)) {
    std::cout << "no checkpoint at " << path << " yet: starting from epoch 0\n";
  } else {
    epoch = load_checkpoint(model, optimizer, path, run.device);
    std::cout << "resumed from " << path << ": epoch " << epoch << "\n";
  }
  if (epoch >= run.epochs) std::cout << "already at epoch " << epoch << ": nothing to train\n";
  train_to(model, optimizer, run.train_loader, run.device, epoch, run.epochs, path);
}

// --to-python PATH: the model written for Python's torch.load(path, weights_only=True), read back.
void to_python(Run& run, ANN& model, const std::string& path) {
  save_python_weights(model, path);
  ANN back;
  load_python_weights(back, path);
  const double diff = course::max_abs_diff(back->parameters(), model->parameters());
  run.verdict.check(diff == 0, "the file written for Python reads back equal",
                    evidence("max abs diff %g", diff));
}

}  // namespace lesson10

// ---- main ---------------------------------------------------------------------------------------
#ifndef GPU_LESSONS_NO_MAIN  // tests/test_lesson10.cpp includes this file for its functions
int main(int argc, char** argv) try {
  using namespace lesson10;
  course::CommonOptions options;
  options.seed = kSeed;
  int epochs = 0;  // 0: kEpochs, or kQuickEpochs with --quick
  std::string checkpoint, from_python, to_python_path;
  course::Cli cli("lesson10_checkpointing",
                  "Lesson 10: save a model, load it onto a device, resume a training run, and "
                  "Python's state_dict files.",
                  options);
  cli.add_data_dir();
  cli.add_option("--epochs", epochs, "epochs to train to (0 = 5, or 2 with --quick)", 0, 1000);
  cli.add_path(
      "--checkpoint", checkpoint,
      "train to --epochs, resuming from this file when it exists, saving after each epoch");
  cli.add_path("--from-python", from_python,
               "no training: the model Python saved with torch.save(model.state_dict(), PATH)");
  cli.add_path("--to-python", to_python_path,
               "write the model at the end for Python's torch.load(PATH, weights_only=True)");
  if (auto code = cli.parse(argc, argv)) return *code;
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);  // tutorials'
  device = course::start_lesson(options, device);      // --device may override it; printed first
  course::check_writable(checkpoint, "--checkpoint");  // before the training, not after it
  course::check_writable(to_python_path, "--to-python");

  torch::manual_seed(options.seed);
  course::FashionMNIST train_ds(options.data_dir, /*train=*/true,
                                options.quick ? kQuickSamples : -1);
  std::printf("Fashion-MNIST: %lld training images; the tutorial's ANN, Adam, batch %lld\n",
              static_cast<long long>(*train_ds.size()), static_cast<long long>(kBatchSize));
  auto train_loader = make_train_loader(std::move(train_ds));
  auto test_loader = make_test_loader(course::FashionMNIST(options.data_dir, /*train=*/false));
  if (epochs == 0) epochs = options.quick ? kQuickEpochs : kEpochs;
  Run run{device, *train_loader, *test_loader, epochs, {}};

  ANN model;
  model->to(device);  // before the optimizer is built over its parameters
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(kLearningRate));
  if (!from_python.empty()) {
    load_python_weights(model, from_python);
    std::cout << "loaded Python's state_dict " << from_python << "\n";
  } else if (!checkpoint.empty()) {
    checkpoint_run(run, model, optimizer, checkpoint);
  } else {
    recipe(run, model, optimizer);
  }
  if (!to_python_path.empty()) to_python(run, model, to_python_path);
  const double accuracy = evaluate(model, *test_loader, device);
  std::printf("Test Accuracy: %.4f\n", accuracy);
  if (from_python.empty() && epochs >= (options.quick ? kQuickEpochs : kEpochs)) {
    const double bar = options.quick ? kQuickAccuracyBar : kAccuracyBar;
    run.verdict.check(accuracy >= bar, "the test accuracy reaches the bar",
                      evidence("%.4f vs bar %.2f", accuracy, bar));
  } else if (run.verdict.checks() == 0) {
    run.verdict.check(accuracy > 0.1, "the model classifies better than chance",
                      evidence("%.4f vs 0.10", accuracy));
  }
  return run.verdict.finish("lesson 10 on " + device.str());
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
#endif
