// Lesson 13 (going further) — crash-safe checkpoints: lesson 10's checkpoint (model, Adam, epoch)
// made to resume a run bit for bit, to survive a kill in the middle of a save, and to refuse a
// bad file before LibTorch reads it, each part measured against lesson 10's way:
//   1. an exact resume: the generators' states and where the run stands (other flags refused);
//   2. atomic writes: a temporary file, flushed and renamed over the last one (SIGKILL mid-save);
//   3. device mapping: the checkpoint loads on the CPU and on a GPU, Adam's state with it;
//   4. loading defensively: a stranger's file checked first; a refused file changes nothing;
//   and Ctrl-C finishes the step under way, keeping the last whole epoch's checkpoint (exit 130).
// Run:    build/bin/lesson13_crash_safe_checkpoints [--device ...] [--quick]   (every part)
//         build/bin/lesson13_crash_safe_checkpoints --checkpoint run.pt --epochs 5   (resumes
//             when run.pt exists, saves after every epoch: stop it with Ctrl-C, run it again)
// Checks: each part's claim, the test accuracy against the bar; with --checkpoint, that the last
//         checkpoint reads back equal. Exit 0 PASS, 1 FAIL, 2 bad flag, missing data or bad
//         checkpoint (with a HINT), 130 stopped by Ctrl-C.
#include <fcntl.h>        // defines: open, O_DIRECTORY
#include <sys/stat.h>     // defines: fchmod, umask
#include <torch/torch.h>  // defines: torch::serialize, torch::optim, torch::data
#include <unistd.h>       // defines: write, fsync, close, unlink

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "common/ann.h"               // defines: ANN, TrainLoader, train_epoch, test_accuracy
#include "common/child_process.h"     // defines: self_executable
#include "common/cli.h"               // defines: Cli, CpuThreads, start_lesson
#include "common/compare.h"           // defines: max_abs_diff
#include "common/dataset.h"           // defines: FashionMNIST
#include "common/device.h"            // defines: cuda_device_count, format_bytes
#include "common/generator.h"         // defines: rng_state, set_rng_state
#include "common/interrupt.h"         // defines: StopOnInterrupt, Interrupted, epoch_abandoned
#include "common/report.h"            // defines: format
#include "common/temporary_folder.h"  // defines: TemporaryFolder
#include "common/timing.h"            // defines: Stopwatch
#include "common/verdict.h"           // defines: Verdict, report_error
#include "crash_test.h"               // defines: KillReport, kill_repeatedly
#include "torch_files/state_dict.h"   // defines: CheckpointError, checked_copies, tensor_crc32

namespace lesson13 {

namespace fs = std::filesystem;
using course::CheckpointError;

// ---- knobs -----------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 12;
constexpr int kEpochs = 5;               // --checkpoint runs train to this many by default
constexpr std::int64_t kBatchSize = 64;  // lesson 10's (the tutorial's)
constexpr double kLearningRate = 1e-3;   // lesson 10's Adam
constexpr int kWorkers = 1;  // one loader thread: the bitwise check's one CPU thread keeps a core
constexpr std::int64_t kQuickSamples = 10000;  // --quick: the first 10,000 training images
constexpr double kAccuracyBar = 0.85;          // lesson 05's, after kEpochs on all images
constexpr double kQuickAccuracyBar = 0.70;     // for shorter runs
constexpr int kDemoEpochs = 3;  // part 1: a run of kDemoEpochs, stopped after kResumeAt, resumed
constexpr int kResumeAt = 2;
constexpr int kKills = 8;  // part 2: a child process saving in a loop is killed this many times
constexpr int kQuickKills = 3;
constexpr std::int64_t kSaveLoopBytes = 32ll << 20;  // large enough that most kills land mid-write
constexpr std::int64_t kFormatVersion = 1;  // what a checkpoint says it holds: others are refused
constexpr const char* kModelName = "ANN 784-128-64-10 + Adam";

// ---- lesson 10's model, loader and loop (the tutorial's ANN, shuffled batches): common/ann.h --
using course::ANN;
using course::TrainLoader;  // shuffle=True: an order drawn from the CPU generator every epoch

struct Training {  // a run's model and its Adam
  ANN model;
  torch::optim::Adam optimizer;
};

// Lesson 10's lines, after the seed: the model, moved to the device, then Adam over its parameters.
Training new_training(const torch::Device& device, std::uint64_t seed) {
  torch::manual_seed(seed);  // the model's first weights
  ANN model;
  model->to(device);  // before the optimizer is built over its parameters
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(kLearningRate));
  return Training{model, std::move(optimizer)};  // an optimizer is handed over, never copied
}

struct Progress {  // where a run stands, and on what data (a resume must train on the same)
  std::int64_t epoch = 0, step = 0;          ///< completed epochs, optimizer steps taken
  std::int64_t samples = 0, batch_size = 0;  ///< training images per epoch, images per step
};

struct Loaded {  // what loading found, the progress and more
  Progress progress;
  std::string saved_on;   ///< the device the checkpoint was saved from ("cpu", "cuda:0")
  bool cuda_rng = false;  ///< it holds a CUDA generator state (restored only onto a CUDA device)
};

struct Lesson {  // what every part of the program shares
  torch::Device device;
  course::FashionMNIST train, test;
  Progress fresh = {};  // a run at epoch 0 on this data, in these batches
  std::uint64_t seed = kSeed;
  fs::path work = {};  // the folder the parts' files go in
  course::Verdict verdict = {};
  std::string file(const std::string& name) const { return (work / name).string(); }
};

// ---- part 1: what a checkpoint holds to resume exactly ------------------------------------------
// Defined below: part 2's write_atomically(path, write) calls write(sink), a Sink being a function
// that takes bytes (a pointer and a count) and returns how many it took; part 4's load_checkpoint.
using Sink = std::function<std::size_t(const void*, std::size_t)>;
void write_atomically(const std::string& path, const std::function<void(const Sink&)>& write);
Loaded load_checkpoint(Training& run, const torch::Device& device, const std::string& path);

//! [save-checkpoint]
// Lesson 10's checkpoint (model_state_dict, optimizer_state_dict, epoch) and what it lacks: what
// the file is, where the run stands and on what, the generators' states, and a CRC-32 over all it
// restores (LibTorch's zip reader checks no CRC). `tensors`: the model's when empty (tests).
void save_checkpoint(Training& run, const Progress& progress, const torch::Device& device,
                     const std::string& path, course::StateDict tensors = {}) {
  if (tensors.empty()) tensors = course::state_dict(*run.model);
  torch::serialize::OutputArchive archive, model_state_dict, optimizer_state_dict;
  archive.write("format", c10::IValue(kFormatVersion));  // so that loading can refuse other files
  archive.write("model_name", c10::IValue(std::string(kModelName)));
  archive.write("saved_on", c10::IValue(device.str()));
  archive.write("epoch", c10::IValue(progress.epoch));
  archive.write("step", c10::IValue(progress.step));
  archive.write("samples", c10::IValue(progress.samples));
  archive.write("batch_size", c10::IValue(progress.batch_size));
  std::uint32_t crc = 0;
  for (const auto& [name, tensor] : tensors) {  // by state_dict names ("fc1.weight", ...)
    model_state_dict.write(name, tensor.detach());
    crc = course::tensor_crc32(crc, tensor);
  }
  archive.write("model_state_dict", model_state_dict);
  run.optimizer.save(optimizer_state_dict);  // Adam's moments and step counts
  archive.write("optimizer_state_dict", optimizer_state_dict);
  crc ^= course::adam_crc32(run.optimizer);
  // The generators: the next epoch's shuffle (CPU) and, on a GPU, its random numbers.
  const torch::Tensor cpu_rng = course::rng_state(torch::kCPU);
  // >>> lab: save the CPU generator's state, cpu_rng, under the key "rng_cpu"
  archive.write("rng_cpu", cpu_rng);
  // <<< lab
  crc = course::tensor_crc32(crc, cpu_rng);
  if (device.is_cuda()) archive.write("rng_cuda", course::rng_state(device));
  archive.write("checksum", c10::IValue(static_cast<std::int64_t>(crc)));
  // Not archive.save_to(path), lesson 10's: it truncates the last good checkpoint first.
  write_atomically(path, [&](const Sink& sink) { archive.save_to(sink); });
}
//! [save-checkpoint]

//! [train-to]
// Trains `run` from `progress.epoch` to `epochs`, saving to `checkpoint` (unless empty) after
// every epoch. Ctrl-C: the step under way finishes, the epoch is abandoned, and the checkpoint
// keeps the last whole epoch. A save under way finishes first: the handler only sets a flag.
void train_to(Training& run, Progress& progress, int epochs, TrainLoader& loader,
              const torch::Device& device, const std::string& checkpoint) {
  course::StopOnInterrupt stop_on_ctrl_c;
  while (progress.epoch < epochs) {
    course::Stopwatch watch(device);
    std::pair<std::int64_t, double> epoch;  // the epoch's steps and mean loss
    try {
      epoch = course::train_epoch(run.model, run.optimizer, loader, device);
    } catch (const course::Interrupted& stop) {  // Ctrl-C: says what the checkpoint holds
      throw course::epoch_abandoned(stop, progress.epoch, checkpoint);
    }
    progress.epoch += 1;
    progress.step += epoch.first;
    std::printf("  epoch %lld/%d  loss %.4f  %5.2f s", static_cast<long long>(progress.epoch),
                epochs, epoch.second, watch.seconds());
    if (!checkpoint.empty()) {
      watch.restart();
      save_checkpoint(run, progress, device, checkpoint);  // after every epoch
      std::printf("  saved (%.0f ms)", watch.seconds() * 1e3);
    }
    std::printf("\n");
    std::fflush(stdout);  // a line per epoch, also through a pipe (| tee)
  }
}
//! [train-to]

// A fresh run and its loader, resumed from `checkpoint` when that file exists (`as_lesson10`: the
// generators left as lesson 10 leaves them). A run on other data or batches is refused.
Training resume_or_start(const Lesson& lesson, const std::string& checkpoint, Progress& progress,
                         std::unique_ptr<TrainLoader>& loader, bool as_lesson10 = false) {
  progress = lesson.fresh;
  Training run = new_training(lesson.device, lesson.seed);
  // The loader draws its first order now: before a restore puts the saved generator state back.
  loader = course::make_train_loader(lesson.train, progress.batch_size, kWorkers);
  if (checkpoint.empty()) return run;
  if (!fs::exists(checkpoint)) {
    std::cout << "  no checkpoint at " << checkpoint << " yet: starting from epoch 0\n";
    return run;
  }
  //! [resume]
  const torch::Tensor fresh_rng = course::rng_state(torch::kCPU);
  const Loaded loaded = load_checkpoint(run, lesson.device, checkpoint);
  const Progress& saved = loaded.progress;
  if (saved.samples != progress.samples || saved.batch_size != progress.batch_size) {
    throw CheckpointError(checkpoint + " is a run on " + std::to_string(saved.samples) +
                              " images in batches of " + std::to_string(saved.batch_size) +
                              ", this one " + std::to_string(progress.samples) + " in batches of " +
                              std::to_string(progress.batch_size),
                          "resume with the flags it was started with (--quick, --batch-size), or "
                          "use another --checkpoint path");
  }
  if (as_lesson10) course::set_rng_state(torch::kCPU, fresh_rng);
  progress = saved;
  std::cout << "  resumed from " << checkpoint << ": epoch " << progress.epoch << ", step "
            << progress.step << " (saved on " << loaded.saved_on << ")"
            << (as_lesson10 ? "; the generators as lesson 10 leaves them" : "") << "\n";
  if (loaded.cuda_rng && !lesson.device.is_cuda()) {
    std::cout << "  note: its CUDA generator state is not restored on " << lesson.device << "\n";
  }
  //! [resume]
  return run;
}

// ---- part 2: atomic writes ------------------------------------------------------------------
//! [write-atomically]
// Runs `write` with a sink into a temporary file beside `path`, flushes it to the disk and renames
// it over `path`: a process killed at any moment leaves the old file or the new one, never a mix.
void write_atomically(const std::string& path, const std::function<void(const Sink&)>& write) {
  const fs::path target = fs::absolute(path), folder = target.parent_path();
  // The temporary file, .NAME.tmp-XXXXXX, lives in the same folder: rename() is atomic only within
  // one file system. mkstemp (tempfile.mkstemp) writes a unique name over XXXXXX in the string's
  // own characters (.data()), creates and opens the file: its number (os.open's fd), or -1.
  std::string temporary = (folder / ".").string() + target.filename().string() + ".tmp-XXXXXX";
  const int fd = ::mkstemp(temporary.data());
  if (fd < 0) {
    throw CheckpointError("cannot write " + path + ": " + std::strerror(errno),
                          "check that the folder " + folder.string() + " exists and is writable");
  }
  // mkstemp's file is its owner's alone; give it a new file's mode: 0666 (read and write for all)
  // less the umask, which umask() reads only by replacing it (so it is put back at once).
  const mode_t mask = ::umask(0);
  ::umask(mask);
  ::fchmod(fd, 0666 & ~mask);
  int error = 0;  // the sink never throws (LibTorch's zip writer calls it); it records the error
  const Sink sink = [&](const void* data, std::size_t size) -> std::size_t {
    const char* bytes = static_cast<const char*>(data);
    for (std::size_t done = 0; done < size && error == 0;) {
      // os.write: it may write fewer bytes than asked (loop), or return -1 with the error in
      // errno; EINTR (a signal came) means "try again". ssize_t: a byte count that can be -1.
      const ssize_t n = ::write(fd, bytes + done, size - done);
      if (n < 0 && errno != EINTR) error = errno;
      if (n > 0) done += static_cast<std::size_t>(n);
    }
    return error == 0 ? size : 0;
  };
  std::string failure;
  try {
    write(sink);
  } catch (const std::exception& e) {
    failure = course::error_message(e);
  }
  // 1. os.fsync: the file's bytes on the disk, not only in the kernel's cache.
  if (error == 0 && failure.empty() && ::fsync(fd) != 0) error = errno;
  if (::close(fd) != 0 && error == 0) error = errno;
  // >>> lab: rename the flushed file over `target`; on failure, set error = errno
  if (error == 0 && failure.empty() && std::rename(temporary.c_str(), target.c_str()) != 0) {
    error = errno;  // 2. then the name points at them: readers see the old file or the new one
  }
  // <<< lab
  if (error != 0 || !failure.empty()) {
    ::unlink(temporary.c_str());  // os.remove
    throw CheckpointError(
        "saving " + path + " failed: " + (failure.empty() ? std::strerror(error) : failure),
        "free some disk space or save somewhere else; the previous file at " + path +
            " is untouched");
  }
  // 3. the folder, which records the rename, is flushed too: a power cut must not undo it
  // (O_DIRECTORY: open it only if it is one; `dir` is declared for this `if` alone).
  if (const int dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY); dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}
//! [write-atomically]

//! [save-loop]
// The child process: saves a kSaveLoopBytes archive filled with its iteration number to `path`,
// in place (lesson 10's) or atomically, printing "saved N" after each, until part 2 kills it.
void save_loop(const std::string& path, bool atomic) {
  torch::Tensor payload = torch::empty({kSaveLoopBytes / 4}, torch::kFloat);
  for (std::int64_t iteration = 1; true; ++iteration) {
    payload.fill_(static_cast<float>(iteration));
    torch::serialize::OutputArchive archive;
    archive.write("iteration", c10::IValue(iteration));
    archive.write("payload", payload);
    if (atomic) write_atomically(path, [&](const Sink& sink) { archive.save_to(sink); });
    if (!atomic) archive.save_to(path);  // lesson 10's: truncate, then write
    std::printf("saved %lld\n", static_cast<long long>(iteration));
    std::fflush(stdout);
  }
}
//! [save-loop]

// ---- part 4: loading, defensively (part 3, device mapping, is open_archive's `device`) ----------
using course::kDamagedHint;  // "restore a backup, or delete it to start over"

//! [open-archive]
// Opens a LibTorch archive, every tensor made on `device` (map_location). A stranger's file is
// checked first: LibTorch's readers trust its numbers (sizes, indices, strides), and a damaged one
// can crash them (torch_files/torch_file.h). LibTorch then reads the very bytes that were checked.
torch::serialize::InputArchive open_archive(const std::string& path, const torch::Device& device) {
  const course::TorchFile file = course::check_libtorch_archive(path, course::CrcCheck::kStructure);
  torch::serialize::InputArchive archive;
  try {
    // >>> lab: read the archive from file.bytes, every tensor created on `device` (map_location)
    archive.load_from(file.bytes.data(), file.bytes.size(), device);
    // <<< lab
  } catch (const std::exception& e) {
    throw CheckpointError(path + " is not a readable checkpoint (" + course::error_message(e) + ")",
                          kDamagedHint);
  }
  return archive;
}
//! [open-archive]

//! [load-checkpoint]
// Loads `path` into `run`, whose model lives on `device`. All or nothing: everything is read and
// checked before the model, Adam or a generator is touched; else a CheckpointError says why.
Loaded load_checkpoint(Training& run, const torch::Device& device, const std::string& path) {
  torch::serialize::InputArchive archive = open_archive(path, device);  // map_location=device
  const std::int64_t format = course::read_archive_int(archive, "format", path);
  const std::string model_name = course::read_archive_string(archive, "model_name");
  if (format != kFormatVersion || model_name != kModelName) {
    throw CheckpointError(path + " holds '" + model_name + "' (format " + std::to_string(format) +
                              "), not '" + kModelName + "' (format " +
                              std::to_string(kFormatVersion) + ")",
                          "use the program that saved it, or another --checkpoint path");
  }
  Loaded loaded;
  loaded.progress.epoch = course::read_archive_int(archive, "epoch", path);
  loaded.progress.step = course::read_archive_int(archive, "step", path);
  loaded.progress.samples = course::read_archive_int(archive, "samples", path);
  loaded.progress.batch_size = course::read_archive_int(archive, "batch_size", path);
  loaded.saved_on = course::read_archive_string(archive, "saved_on");
  // 1. The model: every name present, every shape and dtype equal, nothing extra (Module::load
  // would take whatever shapes the file has). Nothing is copied yet.
  torch::serialize::InputArchive model_state_dict, optimizer_state_dict;
  if (!archive.try_read("model_state_dict", model_state_dict)) {
    throw CheckpointError(path + " has no model_state_dict", kDamagedHint);
  }
  const auto copies = course::checked_copies(
      course::state_dict(*run.model), course::archive_tensors(model_state_dict),
      /*same_dtype=*/true, path,
      {": it is a checkpoint of another model",
       "load it into the model it was saved from, or use another --checkpoint path"});
  // 2. The optimizer: loaded into a spare Adam over the same parameters, then checked.
  torch::optim::Adam spare(run.model->parameters(), torch::optim::AdamOptions(kLearningRate));
  if (!archive.try_read("optimizer_state_dict", optimizer_state_dict)) {
    throw CheckpointError(path + " has no optimizer state", kDamagedHint);
  }
  course::load_adam_checked(spare, optimizer_state_dict, path);  // shapes, inside storage
  // 3. The generators' states, tried on the generators themselves (and put back).
  torch::Tensor cpu_rng, cuda_rng;
  loaded.cuda_rng = archive.try_read("rng_cuda", cuda_rng);
  const bool use_cuda_rng = loaded.cuda_rng && device.is_cuda();
  std::string refusal = archive.try_read("rng_cpu", cpu_rng)
                            ? course::generator_state_refusal(torch::kCPU, cpu_rng)
                            : "none is saved";
  if (refusal.empty() && use_cuda_rng) refusal = course::generator_state_refusal(device, cuda_rng);
  if (!refusal.empty()) {
    throw CheckpointError(path + " has no usable generator state (" + refusal + ")", kDamagedHint);
  }
  // 4. The checksum over what was read: a flipped bit anywhere in it is refused.
  std::uint32_t crc = 0;
  for (const auto& copy : copies) crc = course::tensor_crc32(crc, copy.second);
  crc = course::tensor_crc32(crc ^ course::adam_crc32(spare), cpu_rng);
  if (static_cast<std::int64_t>(crc) != course::read_archive_int(archive, "checksum", path) &&
      !course::kFuzzingBuild) {
    throw CheckpointError(
        path + " is corrupt: its contents do not match its checksum",
        "the file changed after it was written (disk or copy error): " + std::string(kDamagedHint));
  }
  // 5. Everything is read and checked: only now is the run changed.
  {
    torch::NoGradGuard no_grad;
    for (const auto& [destination, source] : copies) destination.copy_(source);
  }
  run.optimizer.load(optimizer_state_dict);  // what the spare Adam took, checked
  course::set_rng_state(torch::kCPU, cpu_rng);
  if (use_cuda_rng) course::set_rng_state(device, cuda_rng);
  return loaded;
}
//! [load-checkpoint]

// ---- the program: each part run and checked -----------------------------------------------------
// Part 1: an uninterrupted run against one stopped, saved and resumed in a fresh model and Adam,
// the generators restored (this lesson) or not (lesson 10). Returns the resumed run.
Training resume_exactly(Lesson& lesson, int epochs, Progress& progress) {
  // Bitwise equality needs one CPU thread: MKL's threads may split a sum differently each run.
  // A guard, like Python's `with`: one thread (0: as they are) until the function returns.
  const bool cpu = lesson.device.is_cpu();
  const course::CpuThreads threads(cpu ? 1 : 0);
  std::cout << "\n== Part 1: save every epoch, stop, resume: the same run ==\nuninterrupted"
            << (cpu ? ", on one CPU thread (arithmetic that repeats bit for bit)" : "") << ":\n";
  std::unique_ptr<TrainLoader> loader;
  Training straight = resume_or_start(lesson, "", progress, loader);
  train_to(straight, progress, epochs, *loader, lesson.device, "");
  std::printf("stopped after %d epochs, then resumed in a fresh model and Adam:\n", kResumeAt);
  const std::string run_pt = lesson.file("run.pt"), stopped = lesson.file("stopped.pt");
  {
    Training first = resume_or_start(lesson, stopped, progress, loader);
    train_to(first, progress, kResumeAt, *loader, lesson.device, stopped);
  }  // the first "process" ends here: its model, optimizer and loader are gone
  fs::copy_file(stopped, run_pt, fs::copy_options::overwrite_existing);  // as lesson 10 resumes
  Training as10 = resume_or_start(lesson, run_pt, progress, loader, /*as_lesson10=*/true);
  train_to(as10, progress, epochs, *loader, lesson.device, run_pt);
  const double diff_as10 =
      course::max_abs_diff(straight.model->parameters(), as10.model->parameters());
  fs::copy_file(stopped, run_pt, fs::copy_options::overwrite_existing);  // as this lesson resumes
  Training resumed = resume_or_start(lesson, run_pt, progress, loader);
  train_to(resumed, progress, epochs, *loader, lesson.device, run_pt);
  const double diff =
      course::max_abs_diff(straight.model->parameters(), resumed.model->parameters());
  lesson.verdict.check(diff == 0,
                       "a resumed run's parameters equal the uninterrupted run's, bitwise",
                       course::format("max abs diff %.3g", diff));
  lesson.verdict.check(diff_as10 > 0,
                       "resumed as lesson 10 does (no generator states), it is another run",
                       course::format("max abs diff %.3g", diff_as10));
  return resumed;
}

// Loads a save_loop() file and checks it is whole; returns its iteration number.
std::int64_t check_save_loop_file(const std::string& path) {
  torch::serialize::InputArchive archive = open_archive(path, torch::kCPU);
  const std::int64_t iteration = course::read_archive_int(archive, "iteration", path);
  torch::Tensor payload;
  if (!archive.try_read("payload", payload) || payload.numel() != kSaveLoopBytes / 4 ||
      !payload.eq(static_cast<float>(iteration)).all().item<bool>()) {
    throw CheckpointError(path + " is torn: its payload is not all " + std::to_string(iteration),
                          "a save was interrupted in place");
  }
  return iteration;
}

// Part 2, `kills` times each way: starts this program with --save-loop, lets it save twice, kills
// it with SIGKILL (a crash: no clean-up) at a random moment of its next save, loads what is left.
void kill_while_saving(Lesson& lesson, int kills) {
  std::printf(
      "\n== Part 2: a process killed while saving ==\na child process saves a %s "
      "checkpoint in a loop; SIGKILL at a random moment of a save, %d times each way:\n"
      "%-36s %8s %10s %12s\n",
      course::format_bytes(kSaveLoopBytes).c_str(), kills, "how it saves", "kills", "loadable",
      "one save");
  const std::string big_pt = lesson.file("big.pt");
  for (const bool atomic : {false, true}) {
    fs::remove(big_pt);
    std::vector<std::string> args = {course::self_executable(), "--save-loop", big_pt, "--threads",
                                     "1"};
    if (!atomic) args.push_back("--in-place");
    const KillReport report = kill_repeatedly(args, /*lines=*/2, kills, lesson.seed,
                                              [&] { check_save_loop_file(big_pt); });
    std::printf("%-36s %8d %10d %9.0f ms\n",
                atomic ? "temporary file, fsync, rename" : "in place (save_to(path): lesson 10)",
                report.kills, report.survived, report.piece_seconds * 1e3);
    if (!report.failure.empty()) std::printf("  e.g. %s\n", report.failure.c_str());
    if (atomic) {
      lesson.verdict.check(report.survived == report.kills,
                           "every kill of an atomic save leaves a whole, loadable checkpoint",
                           std::to_string(report.survived) + "/" + std::to_string(report.kills));
    }
  }
}

// Part 3, device mapping: `path` loaded into a fresh run on `device` (map_location) holds `run`'s
// model and Adam, Adam's state on `device` beside its parameters.
void check_reload(Lesson& lesson, const std::string& path, Training& run,
                  const torch::Device& device) {
  Training back = new_training(device, lesson.seed);
  const Loaded loaded = load_checkpoint(back, device, path);
  const double diff =
      course::max_state_diff(*back.model, back.optimizer, *run.model, run.optimizer);
  const auto* adam = course::adam_state(back.optimizer, back.model->fc1->weight);
  lesson.verdict.check(diff == 0 && adam != nullptr && adam->exp_avg().device() == device,
                       "the " + loaded.saved_on + " checkpoint loads on " + device.str() +
                           ", equal, Adam's state with it",
                       course::format("max abs diff %.3g", diff));
}

// Part 4: bad files, each refused with one line and a HINT, the model and Adam left as they were.
void refuse_bad_files(Lesson& lesson, Training& run, const Progress& progress) {
  std::cout << "\n== Part 4: bad checkpoints ==\n";
  // Missing, empty, cut in half, short of its last byte, random bytes (torch_files/state_dict.h):
  auto bad_files = course::write_damaged_copies(lesson.file("run.pt"), lesson.work, 7);
  // Checkpoints of another model: a wider first layer, a layer missing, a layer extra.
  for (const auto& [what, tensors] : course::misfit_state_dicts(course::state_dict(*run.model))) {
    bad_files.emplace_back(what, lesson.file(what.substr(0, what.find(' ')) + ".pt"));
    save_checkpoint(run, progress, lesson.device, bad_files.back().second, tensors);
  }
  bad_files.emplace_back("a state_dict for Python", lesson.file("python.pt"));
  course::write_python_state_dict(course::state_dict(*run.model), bad_files.back().second);
  int refused = 0, untouched = 0;
  for (const auto& [what, path] : bad_files) {
    Training victim = new_training(lesson.device, lesson.seed);
    const Training fresh = new_training(lesson.device, lesson.seed);  // as `victim` must stay
    try {
      load_checkpoint(victim, lesson.device, path);
      std::printf("  %-24s LOADED (it should not)\n", what.c_str());
    } catch (const CheckpointError& e) {
      std::string message = e.what();  // shorter lines: the file's name without its folder
      message.replace(message.find(path), path.size(), fs::path(path).filename().string());
      std::printf("  %-24s error: %s\n", what.c_str(), message.c_str());
      if (refused++ == 0) std::printf("  %-24s HINT: %s\n", "", e.hint().c_str());
    }
    untouched += course::max_state_diff(*victim.model, victim.optimizer, *fresh.model,
                                        fresh.optimizer) == 0;  // Adam's state included
  }
  const int count = static_cast<int>(bad_files.size());
  lesson.verdict.check(
      refused == count && untouched == count,
      "every bad checkpoint is refused with a clear error, the model untouched",
      course::format("%d/%d refused, %d/%d untouched", refused, count, untouched, count));
}

// Without --checkpoint: every part in turn, in a temporary folder. Returns part 1's resumed run.
Training every_part(Lesson& lesson, int epochs, int kills) {
  const course::TemporaryFolder folder("lesson13-");  // removed, with its files, on return
  lesson.work = folder.path();
  Progress progress;
  Training run = resume_exactly(lesson, epochs, progress);
  kill_while_saving(lesson, kills);
  std::cout << "\n== Part 3: device mapping ==\n";
  check_reload(lesson, lesson.file("run.pt"), run, torch::kCPU);
  if (course::cuda_device_count() > 0) check_reload(lesson, lesson.file("run.pt"), run, {"cuda:0"});
  if (course::cuda_device_count() == 0) std::cout << "(skipped: needs CUDA) loaded on a GPU\n";
  refuse_bad_files(lesson, run, progress);
  return run;
}

// --checkpoint PATH: a run resumed from PATH if it exists, saved there every epoch, read back.
Training checkpoint_run(Lesson& lesson, const std::string& checkpoint, int epochs) {
  course::check_writable(checkpoint, "--checkpoint");  // before the training, not after it
  lesson.work = fs::absolute(checkpoint).parent_path();
  Progress progress;
  std::unique_ptr<TrainLoader> loader;
  Training run = resume_or_start(lesson, checkpoint, progress, loader);
  const std::int64_t first = progress.epoch;
  if (first >= epochs) std::cout << "  already at epoch " << first << ": nothing to train\n";
  train_to(run, progress, epochs, *loader, lesson.device, checkpoint);
  if (progress.epoch > first) check_reload(lesson, checkpoint, run, torch::kCPU);
  return run;
}

}  // namespace lesson13

// ---- main --------------------------------------------------------------------------------------
#ifndef GPU_LESSONS_NO_MAIN  // tests/test_lesson13.cpp includes this file for its functions
int main(int argc, char** argv) try {
  using namespace lesson13;
  course::CommonOptions options;
  options.seed = kSeed;
  int epochs = 0;  // 0: kEpochs with --checkpoint, else kDemoEpochs
  int batch_size = static_cast<int>(kBatchSize);
  std::string checkpoint, save_loop_path;
  bool in_place = false;
  course::Cli cli("lesson13_crash_safe_checkpoints",
                  "Lesson 13: checkpoints that resume, survive a kill, refuse bad files.", options);
  cli.add_data_dir();
  cli.add_path("--checkpoint", checkpoint,
               "train to --epochs, resuming from this file when it exists, saving every epoch");
  cli.add_option("--epochs", epochs, "epochs to train to (0: 5 with --checkpoint, else 3)", 0, 999);
  cli.add_option("--batch-size", batch_size, "samples per step", 1, 60000);
  cli.add_hidden_path("--save-loop", save_loop_path);  // part 2's child process
  cli.add_hidden_flag("--in-place", in_place);
  if (auto code = cli.parse(argc, argv)) return *code;
  if (!save_loop_path.empty()) save_loop(save_loop_path, /*atomic=*/!in_place);  // until killed
  const torch::Device device = course::start_lesson(options);
  Lesson lesson{device,
                course::FashionMNIST(options.data_dir, true, options.quick ? kQuickSamples : -1),
                course::FashionMNIST(options.data_dir, false)};  // the other members as declared
  lesson.seed = options.seed;
  lesson.fresh.samples = static_cast<std::int64_t>(*lesson.train.size());
  lesson.fresh.batch_size = batch_size;
  std::cout << "Fashion-MNIST: " << lesson.fresh.samples
            << " training images; the tutorial's ANN, Adam, batch " << batch_size << "\n";
  if (epochs == 0) epochs = checkpoint.empty() ? kDemoEpochs : kEpochs;
  if (checkpoint.empty()) epochs = std::max(epochs, kResumeAt + 1);  // part 1 stops at kResumeAt
  Training run = checkpoint.empty()
                     ? every_part(lesson, epochs, options.quick ? kQuickKills : kKills)
                     : checkpoint_run(lesson, checkpoint, epochs);
  const double accuracy = course::test_accuracy(run.model, lesson.test.images(), device);
  std::printf("test accuracy: %.4f\n", accuracy);
  const bool full = !options.quick && epochs >= kEpochs && batch_size <= kBatchSize;
  if (checkpoint.empty() || full) {  // the bar, for a whole run this program trained
    const double bar = full ? kAccuracyBar : kQuickAccuracyBar;
    lesson.verdict.check(accuracy >= bar, "the test accuracy reaches the bar",
                         course::format("%.4f vs bar %.2f", accuracy, bar));
  } else if (lesson.verdict.checks() == 0) {
    lesson.verdict.check(accuracy > 0.1, "the model classifies better than chance",
                         course::format("%.4f vs 0.10", accuracy));
  }
  return lesson.verdict.finish("lesson 13 on " + device.str());
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
#endif
