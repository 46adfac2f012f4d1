// checkpoint.h defines: lesson 14's checkpoint, lesson 10's (the model, Adam, the epoch) with what
// an exact resume needs besides (the generators' states, where the run stands and on what data)
// and a checksum: saved atomically (lesson 13's write_atomically), loaded all or nothing.
// Lesson 15 shows what the loader's checks stop.
#pragma once

#include <torch/torch.h>  // defines: torch::optim::Adam, torch::serialize::InputArchive

#include <cstdint>
#include <string>

#include "common/ann.h"              // defines: ANN
#include "torch_files/state_dict.h"  // defines: StateDict

namespace lesson14 {

constexpr double kLearningRate = 1e-3;      // lesson 10's Adam
constexpr std::int64_t kFormatVersion = 1;  // what a checkpoint says it holds: others are refused
constexpr const char* kModelName = "ANN 784-128-64-10 + Adam";

/// A run's model and its Adam.
struct Training {
  course::ANN model;
  torch::optim::Adam optimizer;
};

/// Lesson 10's lines, after the seed: the model, moved to `device`, then Adam over its parameters.
Training new_training(const torch::Device& device, std::uint64_t seed);

/// Where a run stands, and on what data (a resume must train on the same).
struct Progress {
  std::int64_t epoch = 0, step = 0;          ///< completed epochs, optimizer steps taken
  std::int64_t samples = 0, batch_size = 0;  ///< training images per epoch, images per step
};

/// What loading found: the progress and more.
struct Loaded {
  Progress progress;
  std::string saved_on;   ///< the device the checkpoint was saved from ("cpu", "cuda:0")
  bool cuda_rng = false;  ///< it holds a CUDA generator state (restored only onto a CUDA device)
};

/// Saves `run`, `progress` and the generators' states of `device` to `path`, atomically.
/// `tensors`: the model's when empty (other models' state_dicts, to show them refused).
void save_checkpoint(Training& run, const Progress& progress, const torch::Device& device,
                     const std::string& path, course::StateDict tensors = {});

/// Opens a LibTorch archive, every tensor made on `device` (map_location), checked first.
torch::serialize::InputArchive open_archive(const std::string& path, const torch::Device& device);

/// Loads `path` into `run`, whose model lives on `device`: all or nothing. Throws
/// course::CheckpointError, with a HINT, for a file it refuses; `run` is then unchanged.
Loaded load_checkpoint(Training& run, const torch::Device& device, const std::string& path);

}  // namespace lesson14
