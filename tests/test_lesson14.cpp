// Tests of lesson 14, an exact resume: a resumed run is the uninterrupted one bitwise (and lesson
// 10's resume is another run), what a checkpoint restores, device mapping (storages recorded on
// cuda:0 loaded on the CPU; both ways on a real GPU), and the program on the command line.
#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

// The lesson's main file has its own main(); the tests include it for its functions.
#define GPU_LESSONS_NO_MAIN
#include "checkpoint_cli.h"
#include "checkpoint_zip.h"
#include "cuda_test.h"
#include "exact_resume.cpp"
#include "program_run.h"
#include "resume_test.h"

namespace {

// Tests that N epochs straight equal k epochs + save + load into a fresh model and Adam + N-k
// epochs, bitwise, for every k, and for a run resumed twice; and that without the generators'
// states (lesson 10's resume) the run differs. On one thread, as the lesson does: MKL's threads
// make even two straight runs differ now and then (3 runs in 50 here).
TEST_F(CheckpointTest, ResumeIsBitwiseExact) {
  const course::CpuThreads reproducible(1);
  Training straight_run = run(3);
  const std::vector<torch::Tensor> straight = copy_of(straight_run);
  for (int k = 1; k <= 2; ++k) {
    const std::string path = scratch.file("run" + std::to_string(k) + ".pt");
    run(k, path);
    Training resumed = run(3, path);
    EXPECT_EQ(course::max_abs_diff(resumed.model->parameters(), straight), 0.0) << "at epoch " << k;
  }
  const std::string twice = scratch.file("twice.pt");
  run(1, twice);
  run(2, twice);
  Training resumed_twice = run(3, twice);
  EXPECT_EQ(course::max_abs_diff(resumed_twice.model->parameters(), straight), 0.0);
  // Lesson 10's resume: the same file, the generators left as a fresh process has them.
  run(2, scratch.file("as10.pt"));
  Progress progress = fresh_progress();
  Training training = lesson14::new_training(kCpu, lesson14::kSeed);
  auto loader = course::make_train_loader(*small, lesson14::kBatchSize, lesson14::kWorkers);
  const torch::Tensor fresh = course::rng_state(kCpu);
  progress = lesson14::load_checkpoint(training, kCpu, scratch.file("as10.pt")).progress;
  course::set_rng_state(kCpu, fresh);
  lesson14::train_to(training, progress, 3, *loader, kCpu, "");
  EXPECT_GT(course::max_abs_diff(training.model->parameters(), straight), 0.0);
}

// Tests that a checkpoint restores Adam's state, the progress and the CPU generator, into the
// model's own tensors (copied in, not swapped for the file's).
TEST_F(CheckpointTest, RestoresOptimizerProgressAndRng) {
  const std::string path = scratch.file("run.pt");
  Training trained = run(1, path);
  const torch::Tensor next_draw = torch::rand({8});  // what the generator gives after the save
  Training fresh = lesson14::new_training(kCpu, lesson14::kSeed + 1);
  void* const storage = fresh.model->fc1->weight.data_ptr();
  const lesson14::Loaded loaded = lesson14::load_checkpoint(fresh, kCpu, path);
  EXPECT_TRUE(torch::equal(torch::rand({8}), next_draw));
  EXPECT_EQ(loaded.progress.epoch, 1);
  EXPECT_EQ(loaded.progress.step, (kSamples + lesson14::kBatchSize - 1) / lesson14::kBatchSize);
  EXPECT_EQ(loaded.progress.samples, kSamples);
  EXPECT_EQ(loaded.saved_on, "cpu");
  EXPECT_FALSE(loaded.cuda_rng);
  EXPECT_EQ(course::max_abs_diff(fresh.model->parameters(), trained.model->parameters()), 0.0);
  EXPECT_EQ(course::max_adam_diff(fresh.optimizer, fresh.model->parameters(), trained.optimizer,
                                  trained.model->parameters()),
            0.0);
  EXPECT_EQ(course::adam_state(fresh.optimizer, fresh.model->out->bias)->step(),
            loaded.progress.step);
  EXPECT_EQ(fresh.model->fc1->weight.data_ptr(), storage);
}

// Tests map_location without a GPU: a checkpoint whose storages say cuda:0 loads onto the CPU,
// Adam's state with it. (On a GPU, CudaTest.CheckpointsMoveBetweenCpuAndCuda saves a real one.)
TEST_F(CheckpointTest, StoragesRecordedOnCudaLoadOnTheCpu) {
  Training trained = run(1, scratch.file("cpu.pt"));
  tag_storages_cuda(scratch.file("cpu.pt"), scratch.file("cuda.pt"));
  Training loaded = lesson14::new_training(kCpu, lesson14::kSeed + 1);
  const lesson14::Loaded info = lesson14::load_checkpoint(loaded, kCpu, scratch.file("cuda.pt"));
  EXPECT_EQ(info.saved_on, "cuda:0");  // the same pickled string
  EXPECT_EQ(course::max_abs_diff(loaded.model->parameters(), trained.model->parameters()), 0.0);
  EXPECT_TRUE(
      course::adam_state(loaded.optimizer, loaded.model->fc1->weight)->exp_avg().device().is_cpu());
}

// Tests that a CUDA checkpoint loads on the CPU and a CPU one on CUDA, Adam's state following the
// parameters, and that the CUDA generator is saved and restored.
TEST_F(CudaTest, CheckpointsMoveBetweenCpuAndCuda) {
  Scratch scratch;
  Training on_gpu = lesson14::new_training(device, lesson14::kSeed);
  const auto labels = torch::TensorOptions(device).dtype(torch::kLong);  // a device alone: floats
  torch::nn::functional::cross_entropy(on_gpu.model->forward(torch::rand({64, 784}, device)),
                                       torch::randint(0, 10, {64}, labels))
      .backward();
  on_gpu.optimizer.step();
  Progress progress = fresh_progress();
  lesson14::save_checkpoint(on_gpu, progress, device, scratch.file("gpu.pt"));
  const torch::Tensor next_gpu_draw = torch::rand({8}, device);

  Training on_cpu = lesson14::new_training(kCpu, lesson14::kSeed);
  const lesson14::Loaded loaded = lesson14::load_checkpoint(on_cpu, kCpu, scratch.file("gpu.pt"));
  EXPECT_EQ(loaded.saved_on, device.str());
  EXPECT_TRUE(loaded.cuda_rng);  // held, and not restored: the run is on the CPU
  EXPECT_EQ(course::max_abs_diff(on_cpu.model->parameters(), on_gpu.model->parameters()), 0.0);
  EXPECT_TRUE(
      course::adam_state(on_cpu.optimizer, on_cpu.model->fc1->weight)->exp_avg().device().is_cpu());

  lesson14::save_checkpoint(on_cpu, progress, kCpu, scratch.file("cpu.pt"));
  Training back = lesson14::new_training(device, lesson14::kSeed);
  lesson14::load_checkpoint(back, device, scratch.file("cpu.pt"));
  EXPECT_EQ(course::max_abs_diff(back.model->parameters(), on_cpu.model->parameters()), 0.0);
  EXPECT_EQ(course::adam_state(back.optimizer, back.model->fc1->weight)->exp_avg().device(),
            back.model->fc1->weight.device());

  Training again = lesson14::new_training(device, lesson14::kSeed);
  const lesson14::Loaded restored =
      lesson14::load_checkpoint(again, device, scratch.file("gpu.pt"));
  EXPECT_TRUE(restored.cuda_rng);
  EXPECT_TRUE(torch::equal(torch::rand({8}, device), next_gpu_draw));  // restored
}

// ---- on the command line: the lesson's program (LESSON14_BINARY), as a learner runs it -------
// Tests a run resumed across processes: --epochs 1, then --epochs 2 in a new process resumes from
// epoch 1, then --epochs 2 again has nothing left to train; each passes.
TEST(Cli, ResumeInANewProcess) { expect_resume_in_a_new_process(built_program(LESSON14_BINARY)); }

// Tests that a checkpoint of a --quick run, resumed without --quick, stops with exit 2 and a HINT
// naming the flags to resume with.
TEST(Cli, ResumeWithOtherSettings) {
  Scratch dir;
  const ProgramRun quick = run_program({built_program(LESSON14_BINARY), "--quick", "--checkpoint",
                                        dir.file("run.pt"), "--epochs", "1"});
  EXPECT_EQ(quick.exit_code, 0) << quick.what();
  EXPECT_TRUE(quick.printed("RESULT: PASS")) << quick.what();
  const ProgramRun other = run_program(
      {built_program(LESSON14_BINARY), "--checkpoint", dir.file("run.pt"), "--epochs", "2"});
  EXPECT_EQ(other.exit_code, 2) << other.what();
  EXPECT_TRUE(other.printed("HINT: resume with the flags")) << other.what();
}

// Tests that a checkpoint of random bytes stops the run with exit 2 and a HINT.
TEST(Cli, CorruptCheckpoint) { expect_corrupt_checkpoint_refused(built_program(LESSON14_BINARY)); }

// Tests that --checkpoint in a folder that does not exist stops with exit 2 before any training.
TEST(Cli, UnwritableFolder) { expect_unwritable_folder_refused(built_program(LESSON14_BINARY)); }

// Tests that --help lists the flags of a run that resumes (--checkpoint, --epochs, --batch-size).
TEST(Cli, Help) {
  const ProgramRun run = run_program({built_program(LESSON14_BINARY), "--help"});
  EXPECT_EQ(run.exit_code, 0) << run.what();
  EXPECT_TRUE(run.printed("--checkpoint") && run.printed("--epochs") && run.printed("--batch-size"))
      << run.what();
}

}  // namespace
