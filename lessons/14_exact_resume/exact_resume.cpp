// Lesson 14 (going further) — an exact resume: lesson 10's checkpoint (model, Adam, epoch) made to
// resume a run bit for bit, and to load on another device, each part measured against lesson
// 10's way. The checkpoint (checkpoint.cpp beside this file) also holds the generators' states and
// where the run stands; it is saved with lesson 13's atomic write and loaded all or nothing:
//   1. an exact resume: the same run as one never stopped, bitwise (lesson 10's resume: another);
//   2. device mapping: the checkpoint loads on the CPU and on a GPU, Adam's state with it;
//   and Ctrl-C finishes the step under way, keeping the last whole epoch's checkpoint (exit 130).
// Run:    build/bin/lesson14_exact_resume [--device ...] [--quick]   (both parts)
//         build/bin/lesson14_exact_resume --checkpoint run.pt --epochs 5   (resumes when run.pt
//             exists, saves after every epoch: stop it with Ctrl-C, run it again)
// Checks: each part's claim, the test accuracy against the bar; with --checkpoint, that the last
//         checkpoint reads back equal. Exit 0 PASS, 1 FAIL, 2 bad flag, missing data or bad
//         checkpoint (with a HINT), 130 stopped by Ctrl-C.
#include <torch/torch.h>  // defines: torch::optim, torch::data

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include "checkpoint.h"               // defines: Training, Progress, save_checkpoint
#include "common/ann.h"               // defines: ANN, TrainLoader, train_epoch, test_accuracy
#include "common/cli.h"               // defines: Cli, CpuThreads, start_lesson
#include "common/compare.h"           // defines: max_abs_diff
#include "common/dataset.h"           // defines: FashionMNIST
#include "common/device.h"            // defines: cuda_device_count
#include "common/generator.h"         // defines: rng_state, set_rng_state
#include "common/interrupt.h"         // defines: StopOnInterrupt, Interrupted, epoch_abandoned
#include "common/report.h"            // defines: format
#include "common/temporary_folder.h"  // defines: TemporaryFolder
#include "common/timing.h"            // defines: Stopwatch
#include "common/verdict.h"           // defines: Verdict, report_error
#include "torch_files/state_dict.h"   // defines: CheckpointError, check_writable, max_state_diff

namespace lesson14 {

namespace fs = std::filesystem;
using course::CheckpointError;

// ---- knobs -----------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 14;      // the model's first weights, and every shuffle after
constexpr int kEpochs = 5;               // --checkpoint runs train to this many by default
constexpr std::int64_t kBatchSize = 64;  // lesson 10's (the tutorial's)
constexpr int kWorkers = 1;  // one loader thread: the bitwise check's one CPU thread keeps a core
constexpr std::int64_t kQuickSamples = 10000;  // --quick: the first 10,000 training images
constexpr double kAccuracyBar = 0.85;          // lesson 05's, after kEpochs on all images
constexpr double kQuickAccuracyBar = 0.70;     // for shorter runs
constexpr int kDemoEpochs = 3;  // part 1: a run of kDemoEpochs, stopped after kResumeAt, resumed
constexpr int kResumeAt = 2;

// ---- lesson 10's loader and loop (the tutorial's, shuffled batches): common/ann.h -----------
using course::TrainLoader;  // shuffle=True: an order drawn from the CPU generator every epoch

struct Lesson {  // what every part of the program shares
  torch::Device device;
  course::FashionMNIST train, test;
  Progress fresh = {};  // a run at epoch 0 on this data, in these batches
  std::uint64_t seed = kSeed;
  fs::path work = {};  // the folder the parts' files go in
  course::Verdict verdict = {};
  std::string file(const std::string& name) const { return (work / name).string(); }
};

// ---- part 1: what a checkpoint holds (checkpoint.cpp), and training that saves it --------------
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

//! [resume]
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
  return run;
}
//! [resume]

// ---- the program: each part run and checked -----------------------------------------------------
//! [resume-exactly]
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
//! [resume-exactly]

// Part 2, device mapping: `path` loaded into a fresh run on `device` (map_location) holds `run`'s
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

// Without --checkpoint: every part in turn, in a temporary folder. Returns part 1's resumed run.
Training every_part(Lesson& lesson, int epochs) {
  const course::TemporaryFolder folder("lesson14-");  // removed, with its files, on return
  lesson.work = folder.path();
  Progress progress;
  Training run = resume_exactly(lesson, epochs, progress);
  std::cout << "\n== Part 2: device mapping ==\n";
  check_reload(lesson, lesson.file("run.pt"), run, torch::kCPU);
  if (course::cuda_device_count() > 0) check_reload(lesson, lesson.file("run.pt"), run, {"cuda:0"});
  if (course::cuda_device_count() == 0) std::cout << "(skipped: needs CUDA) loaded on a GPU\n";
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

}  // namespace lesson14

// ---- main --------------------------------------------------------------------------------------
#ifndef GPU_LESSONS_NO_MAIN  // tests/test_lesson14.cpp includes this file for its functions
int main(int argc, char** argv) try {
  using namespace lesson14;
  course::CommonOptions options;
  options.seed = kSeed;
  int epochs = 0;  // 0: kEpochs with --checkpoint, else kDemoEpochs
  int batch_size = static_cast<int>(kBatchSize);
  std::string checkpoint;
  course::Cli cli("lesson14_exact_resume",
                  "Lesson 14: a checkpoint that resumes a run exactly, on any device.", options);
  cli.add_data_dir();
  cli.add_path("--checkpoint", checkpoint,
               "train to --epochs, resuming from this file when it exists, saving every epoch");
  cli.add_option("--epochs", epochs, "epochs to train to (0: 5 with --checkpoint, else 3)", 0, 999);
  cli.add_option("--batch-size", batch_size, "samples per step", 1, 60000);
  if (auto code = cli.parse(argc, argv)) return *code;
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
  Training run =
      checkpoint.empty() ? every_part(lesson, epochs) : checkpoint_run(lesson, checkpoint, epochs);
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
  return lesson.verdict.finish("lesson 14 on " + device.str());
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
#endif
