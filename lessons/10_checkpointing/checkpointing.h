// checkpointing.h: what lesson 10 teaches, callable from its tests and benchmarks.
// See checkpointing.cpp (parts 0-5).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/compare.h"  // defines: course::max_abs_diff, tolerance_for
#include "common/verdict.h"  // defines: course::CourseError
#include "fast_training_loop.h"   // defines: lesson11's Mlp, Trainer, make_trainer (the model trained)

namespace lesson10 {

// ---- knobs -----------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 10;
constexpr std::int64_t kBatchSize = lesson11::kBatchSize;
constexpr int kEpochs = lesson11::kEpochs;  // --checkpoint runs train to this many by default
// Part 1: a run of kDemoEpochs, interrupted after kResumeAt, resumed from its checkpoint.
constexpr int kDemoEpochs = 3;
constexpr int kResumeAt = 2;
// Part 2: a child process saving in a loop is killed this many times, at random moments.
constexpr int kKills = 8;
constexpr int kQuickKills = 3;
constexpr std::int64_t kSaveLoopBytes = 32ll << 20;  // large enough that most kills land mid-write
// What a checkpoint says it holds; a file that says otherwise is refused.
constexpr std::int64_t kFormatVersion = 1;
constexpr const char* kModelName = "lesson05.Mlp 784-128-64-10 + Adam";

/// A checkpoint (or state_dict file) that cannot be used: one line and a HINT, exit 2.
class CheckpointError : public course::CourseError {
 public:
  using CourseError::CourseError;
};

// ---- part 0: the recipe -----------------------------------------------------------------------
/// torch::save(model, path), then torch::load into a new model mapped onto the CPU (Python's
/// map_location="cpu") and moved to `device`: the new model.
lesson11::Mlp save_and_load_weights(lesson11::Mlp& model, const std::string& path,
                                    const torch::Device& device);

// ---- part 1: a training run's checkpoint ------------------------------------------------------
/// Where a run stands, and what it trained on (a resume must train on the same).
struct Progress {
  std::int64_t epoch = 0;       ///< completed epochs
  std::int64_t step = 0;        ///< optimizer steps taken
  std::int64_t samples = 0;     ///< training images per epoch
  std::int64_t batch_size = 0;  ///< images per step
};

/// A model's tensors by name (parameters, then buffers), as a state_dict lists them.
using Entries = std::vector<std::pair<std::string, torch::Tensor>>;
Entries model_entries(lesson11::Mlp& model);

/// The state of a device's default generator (CPU: the shuffles; a GPU: its random ops), and
/// putting one back.
torch::Tensor rng_state(const torch::Device& device);
void set_rng_state(const torch::Device& device, const torch::Tensor& state);

/// Runs `write` with a sink that writes to a temporary file in `path`'s folder; then flushes
/// that file to disk and renames it over `path`. A process killed at any moment leaves either
/// the old file or the new one at `path`, never a mix (a temporary file may be left beside it).
using Sink = std::function<std::size_t(const void*, std::size_t)>;
void write_atomically(const std::string& path, const std::function<void(const Sink&)>& write);

/// Saves the model (`entries`, by default the model's own), the optimizer's state, `progress`
/// and the RNG states (CPU, and `device`'s generator on CUDA) to `path`, atomically.
void save_checkpoint(lesson11::Trainer& trainer, const Progress& progress,
                     const torch::Device& device, const std::string& path);
void save_checkpoint(lesson11::Trainer& trainer, const Progress& progress,
                     const torch::Device& device, const std::string& path, const Entries& entries);

/// What loading found besides the progress.
struct Loaded {
  Progress progress;
  std::string saved_on;            ///< the device the checkpoint was saved from ("cpu", "cuda:0")
  bool cuda_rng = false;           ///< the checkpoint holds a CUDA generator state...
  bool cuda_rng_restored = false;  ///< ...and it was restored (only onto a CUDA device)
};

/// Loads `path` into `trainer`, whose model lives on `device` (every tensor is mapped there).
/// All or nothing: everything is read and checked before the trainer is touched. Throws
/// CheckpointError for a missing, truncated or corrupt file, another kind of file, another
/// model (missing or extra keys, other shapes) or an optimizer state that does not fit.
Loaded load_checkpoint(lesson11::Trainer& trainer, const torch::Device& device,
                       const std::string& path);

/// Trains `trainer` from `progress.epoch` to `epochs`, saving to `checkpoint` (unless empty)
/// after every epoch. Prints a line per epoch.
void train_to(lesson11::Trainer& trainer, Progress& progress, int epochs, lesson11::Loader& loader,
              const torch::Device& device, const std::string& checkpoint);

// ---- part 2: the crash test -------------------------------------------------------------------
/// Saves a kSaveLoopBytes checkpoint to `path` over and over (each filled with its iteration
/// number), printing "saved N" after each, until killed. `atomic` false writes in place, the way
/// torch::save(value, path) does.
[[noreturn]] void save_loop(const std::string& path, bool atomic);
/// Loads a save_loop() file and checks it is whole; returns its iteration number.
std::int64_t check_save_loop_file(const std::string& path);

/// `kills` times: starts `program --save-loop path`, lets it save twice, kills it with SIGKILL at
/// a random moment of its next save, and tries to load what is left at `path`.
struct KillReport {
  int kills = 0;
  int loadable = 0;         ///< times the file at `path` loaded whole afterwards
  int leftovers = 0;        ///< temporary files the killed saves left (removed)
  double save_seconds = 0;  ///< median time of one save in the child
  std::string failure;      ///< the first load error, if any
};
KillReport kill_while_saving(const std::string& program, const std::string& path, bool atomic,
                             int kills, std::uint64_t seed);

// ---- part 5: Python's state_dict files --------------------------------------------------------
/// Reads a state_dict that Python saved with torch.save(model.state_dict(), path), or a plain
/// dict of tensors, onto the CPU. Throws CheckpointError for anything else.
Entries read_python_state_dict(const std::string& path);
/// Writes the model's state_dict so that Python's torch.load(path, weights_only=True) returns a
/// dict that load_state_dict accepts (atomically).
void write_python_state_dict(lesson11::Mlp& model, const std::string& path);
/// Copies `entries` into `model` after checking that the names and shapes match exactly (all or
/// nothing; CheckpointError naming `source` otherwise).
void load_entries(lesson11::Mlp& model, const Entries& entries, const std::string& source);

}  // namespace lesson10
