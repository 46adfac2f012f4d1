// fast_training_loop.h: what lesson 11 teaches, callable from its tests and benchmarks.
// See fast_training_loop.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "common/compare.h"  // defines: course::tolerance_for
#include "common/data.h"  // defines: course::ImageSet

namespace lesson11 {

// ---- knobs -----------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 5;
constexpr int kEpochs = 5;
constexpr std::int64_t kBatchSize = 64;
constexpr double kLearningRate = 1e-3;     // Adam
constexpr double kAccuracyBar = 0.85;      // test accuracy after kEpochs on all 60,000 images
// --quick: one epoch on the first kQuickSamples training images; the bar is lower to match.
constexpr int kQuickEpochs = 1;
constexpr std::int64_t kQuickSamples = 10000;
constexpr double kQuickAccuracyBar = 0.70;
constexpr std::int64_t kEvalBatch = 1000;  // evaluation needs no graph: large batches are cheap
constexpr int kMaxWorkers = 16;           // --workers: threads gathering batches ahead
// The flat step adds and multiplies every element as LibTorch's Adam over the separate parameters
// does; a fused multiply-add where one kernel vectorizes and the other does not can round an
// element's last bit differently, and training carries such bits on. The epochs' losses are
// compared with ten times fp32's tolerance (common/compare.h), as a trajectory.
constexpr double kFlatTolerance = 10 * course::tolerance_for(torch::kFloat);

/// The classifier: 784 -> 128 -> ReLU -> 64 -> ReLU -> 10 (logits).
struct MlpImpl : torch::nn::Module {
  MlpImpl();
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(Mlp);

/// A batch, on the training device.
struct Batch {
  torch::Tensor images;  ///< float32 [B, 784]
  torch::Tensor labels;  ///< int64 [B]
};

/// Yields one shuffled epoch of batches on the device.
class Loader {
 public:
  virtual ~Loader() = default;
  /// Draws a new order of the samples (from the global, seeded generator).
  virtual void start_epoch() = 0;
  /// The next batch; false at the end of the epoch.
  virtual bool next(Batch& batch) = 0;
  /// The next batch written into `batch`'s own tensors, which keep their addresses (what a CUDA
  /// graph reads) when they have this batch's size; a shorter batch (the last one) comes in new
  /// tensors instead. False at the end of the epoch.
  virtual bool next_into(Batch& batch);
  virtual std::int64_t size() const = 0;
  virtual std::string name() const = 0;
};

/// "batches": the textbook path. Each batch is gathered on the host and copied to the device
/// (from pinned memory, non_blocking, on CUDA). With `workers` > 0, that many threads gather the
/// next batches ahead (Python's DataLoader(num_workers=..., pin_memory=True)): the same batches
/// in the same order.
std::unique_ptr<Loader> make_batches_loader(const course::ImageSet& data, std::int64_t batch_size,
                                            const torch::Device& device, int workers = 0);
/// "resident": the whole dataset is copied to the device once; batches are slices of it,
/// picked by a shuffled index tensor that lives on the device too.
std::unique_ptr<Loader> make_resident_loader(const course::ImageSet& data,
                                             std::int64_t batch_size, const torch::Device& device);
/// One of the two by name ("batches" or "resident"; `workers` for "batches").
std::unique_ptr<Loader> make_loader(const std::string& name, const course::ImageSet& data,
                                    std::int64_t batch_size, const torch::Device& device,
                                    int workers = 0);

// ---- the tutorial's loop ------------------------------------------------------------------------
/// What the Python tutorial builds: the model moved to the device, then Adam over its parameters.
struct TextbookTrainer {
  Mlp model;
  std::unique_ptr<torch::optim::Adam> optimizer;
};
/// A seeded model moved to `device`, then (in this order) Adam over model->parameters().
TextbookTrainer make_textbook_trainer(const torch::Device& device, std::uint64_t seed);

/// What one epoch did.
struct EpochStats {
  double mean_loss = 0;
  double seconds = 0;
  std::int64_t samples = 0;
  bool interrupted = false;  ///< stopped early: Ctrl-C under a course::StopOnInterrupt
  double samples_per_second() const { return seconds > 0 ? samples / seconds : 0; }
};

/// One epoch of the tutorial's loop: for each batch, zero_grad(), forward, loss, backward(),
/// step(). With `progress`, prints a progress line (for terminals). Stops early, after the step
/// under way, when course::stop_requested() (Ctrl-C).
EpochStats train_epoch_textbook(TextbookTrainer& trainer, Loader& loader,
                                const torch::Device& device, bool progress = false);

// ---- going faster, all parameters in one flat tensor --------------------------------------------
/// All of a model's parameters in one contiguous tensor, and their gradients in another: each
/// parameter (and its .grad()) becomes a view into them, so the optimizer updates one tensor with
/// a handful of kernels instead of a handful per parameter.
struct FlatParameters {
  torch::Tensor values;     ///< the optimizer's only parameter
  torch::Tensor gradients;  ///< values.grad(); backward accumulates into it in place
};
FlatParameters flatten_parameters(torch::nn::Module& model);

/// What the flat step needs: the model on its device, its flat parameters, and Adam over them.
/// (Lessons 09 and 10 train with it too.)
struct Trainer {
  Mlp model;
  FlatParameters flat;
  std::unique_ptr<torch::optim::Adam> optimizer;
};
/// A seeded model moved to `device`, then (in this order) flattened and given its optimizer.
Trainer make_trainer(const torch::Device& device, std::uint64_t seed);

/// One epoch of the flat step: the flat gradients zeroed in one kernel, Adam over the flat
/// parameters. CourseError when a parameter's gradient has left the flat gradient tensor (a
/// zero_grad() that sets gradients to none, on a model flattened after its optimizer was built).
EpochStats train_epoch(Trainer& trainer, Loader& loader, const torch::Device& device,
                       bool progress = false);


// ---- the whole step in a CUDA graph (CUDA only) -------------------------------------------------
// torch::optim::Adam's defaults, which DeviceAdam shares.
constexpr double kBeta1 = 0.9;
constexpr double kBeta2 = 0.999;
constexpr double kEpsilon = 1e-8;
constexpr int kGraphWarmupSteps = 3;  // eager steps on the capture stream before the capture
constexpr int kGraphCheckSteps = 200;  // graphed against eager: losses compared over this many steps
// The graph replays the very kernels the eager step launches, on the same data: their losses
// differ only if a kernel does (cuBLAS may pick another algorithm on the capture stream). One
// step would then differ by fp32 rounding (course::tolerance_for, 1e-5); over 200 steps, each
// feeding the next, such differences grow, hence ten times that. A host scalar frozen at
// capture would differ by far more within a few steps.
constexpr double kGraphTolerance = 10 * course::tolerance_for(torch::kFloat);

/// Adam over flat parameters whose step count and bias corrections are tensors on the device:
/// nothing its step reads from the host changes from one step to the next, so a CUDA graph can
/// capture it. (torch::optim::Adam counts steps on the host; a graph of it would replay the
/// first step's bias corrections forever, without any error.) Same arithmetic and defaults as
/// torch::optim::Adam with AdamOptions(lr).
class DeviceAdam {
 public:
  DeviceAdam(const FlatParameters& flat, double lr);
  /// One update of flat.values from flat.gradients: kernels only, no host sync, no host scalar
  /// that changes.
  void step();
  const torch::Tensor& exp_avg() const { return exp_avg_; }
  const torch::Tensor& exp_avg_sq() const { return exp_avg_sq_; }
  const torch::Tensor& steps() const { return steps_; }  ///< float64, on the device

 private:
  torch::Tensor values_, gradients_;
  torch::Tensor exp_avg_, exp_avg_sq_, denom_;  // the two moments, and scratch for the update
  torch::Tensor steps_, bias1_, bias2_;         // 0-dim float64 tensors on the device
  double lr_;
};

/// One training step of the flat model: zero the gradients, forward, loss, backward, DeviceAdam.
/// Returns the loss, on the device.
torch::Tensor device_adam_step(Mlp& model, const FlatParameters& flat, DeviceAdam& adam,
                               const torch::Tensor& images, const torch::Tensor& labels);

/// device_adam_step captured once in a CUDA graph and replayed for every batch of `batch_size`:
/// one launch replaces the step's dozens of kernel launches. The graph reads its input from
/// `batch` and writes the loss to `loss`, tensors whose addresses never change: fill `batch` in
/// place (Loader::next_into) before each step(). CUDA only: a CourseError elsewhere.
class GraphedStep {
 public:
  GraphedStep(Mlp& model, const FlatParameters& flat, DeviceAdam& adam, std::int64_t batch_size,
              const torch::Device& device);
  ~GraphedStep();
  GraphedStep(const GraphedStep&) = delete;
  GraphedStep& operator=(const GraphedStep&) = delete;
  /// One step on `batch`: eager for the first kGraphWarmupSteps calls (on the capture stream),
  /// then captured and replayed, then replayed.
  void step();
  bool captured() const;
  Batch batch;         ///< static input: [batch_size, 784] images, [batch_size] labels
  torch::Tensor loss;  ///< the last step's loss, written by the step (0-dim, on the device)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// One epoch with the whole step in a CUDA graph: the loader fills the graph's static batch in
/// place and the graph is replayed; the shorter last batch takes the same step eagerly.
EpochStats train_epoch_graphed(Mlp& model, const FlatParameters& flat, DeviceAdam& adam,
                               GraphedStep& graph, Loader& loader, const torch::Device& device);

/// The graphed step against the same step run eagerly, from the same seed on the same batches
/// (the first `steps` full batches of `data`, in order): the largest relative difference between
/// their losses. CUDA only.
double graphed_vs_eager(const course::ImageSet& data, std::int64_t batch_size,
                        const torch::Device& device, std::uint64_t seed, int steps);

/// Fraction of `data` classified correctly, evaluated on `device` without a graph.
double evaluate(Mlp& model, const course::ImageSet& data, const torch::Device& device);

/// The first `n` samples of `data` (all of it when n >= its size).
course::ImageSet take(const course::ImageSet& data, std::int64_t n);

// ---- a whole run ---------------------------------------------------------------------------------
/// The runs the lesson compares, each a step and a loader: "textbook" (the tutorial's loop, each
/// batch copied to the device), "resident" (the tutorial's loop, the dataset resident on the
/// device), "flat" (all parameters in one tensor, resident) and "graphed" (the flat step in a
/// CUDA graph, resident; CUDA only).
const std::vector<std::string>& run_names();
/// A whole run: a seeded model, `epochs` epochs of `run` (`workers` threads gathering batches for
/// the textbook run), then test accuracy.
struct RunResult {
  std::vector<EpochStats> epochs;
  double accuracy = 0;
};
RunResult train_and_evaluate(const course::ImageSet& train, const course::ImageSet& test,
                             const std::string& run, int epochs, std::int64_t batch_size,
                             const torch::Device& device, std::uint64_t seed,
                             bool progress = false, int workers = 0);


}  // namespace lesson11
