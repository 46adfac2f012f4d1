// Tests of lesson 13, crash-safe checkpoints: an exact resume (and lesson 10's, which is another
// run), what a checkpoint restores, atomic saves under SIGKILL (a real child process), bad
// checkpoints refused with the model untouched, damage everywhere refused or harmless, and device
// mapping (storages recorded on cuda:0 loaded on the CPU; both ways on a real GPU).
#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <regex>

// The lesson is one file with its own main(); the tests include it for its functions.
#define GPU_LESSONS_NO_MAIN
#include "checkpoint_cli.h"
#include "checkpoint_zip.h"
#include "crash_safe_checkpoints.cpp"
#include "cuda_test.h"
#include "fashion_mnist_test.h"
#include "program_run.h"
#include "scratch_files.h"

namespace {

namespace fs = std::filesystem;
using course::CheckpointError;
using lesson13::Progress;
using lesson13::Training;

constexpr std::int64_t kSamples = 2000;  // a few dozen steps per epoch: seconds, not minutes
const torch::Device kCpu(torch::kCPU);

Progress fresh_progress() {
  Progress progress;
  progress.samples = kSamples;
  progress.batch_size = lesson13::kBatchSize;
  return progress;
}

// A copy of every parameter, to tell afterwards whether a load changed the model.
std::vector<torch::Tensor> copy_of(Training& run) {
  std::vector<torch::Tensor> copies;
  for (const auto& p : run.model->parameters()) copies.push_back(p.detach().clone());
  return copies;
}

class CheckpointTest : public FashionMnistTest {
 protected:
  void SetUp() override {
    FashionMnistTest::SetUp();
    if (IsSkipped()) return;
    small = std::make_unique<course::FashionMNIST>(course::ImageSet{
        train().images.slice(0, 0, kSamples), train().labels.slice(0, 0, kSamples)});
  }
  // `epochs` epochs from the seed, resumed from `path` when it exists and saving to it (if any)
  // after each, as the lesson resumes: the model and Adam, then the loader, then the load.
  Training run(int epochs, const std::string& path = "") {
    Progress progress = fresh_progress();
    Training training = lesson13::new_training(kCpu, lesson13::kSeed);
    auto loader = course::make_train_loader(*small, lesson13::kBatchSize, lesson13::kWorkers);
    if (!path.empty() && fs::exists(path)) {
      progress = lesson13::load_checkpoint(training, kCpu, path).progress;
    }
    lesson13::train_to(training, progress, epochs, *loader, kCpu, path);
    return training;
  }
  std::unique_ptr<course::FashionMNIST> small;
  Scratch scratch;
};

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
  Training training = lesson13::new_training(kCpu, lesson13::kSeed);
  auto loader = course::make_train_loader(*small, lesson13::kBatchSize, lesson13::kWorkers);
  const torch::Tensor fresh = course::rng_state(kCpu);
  progress = lesson13::load_checkpoint(training, kCpu, scratch.file("as10.pt")).progress;
  course::set_rng_state(kCpu, fresh);
  lesson13::train_to(training, progress, 3, *loader, kCpu, "");
  EXPECT_GT(course::max_abs_diff(training.model->parameters(), straight), 0.0);
}

// Tests that a checkpoint restores Adam's state, the progress and the CPU generator, into the
// model's own tensors (copied in, not swapped for the file's).
TEST_F(CheckpointTest, RestoresOptimizerProgressAndRng) {
  const std::string path = scratch.file("run.pt");
  Training trained = run(1, path);
  const torch::Tensor next_draw = torch::rand({8});  // what the generator gives after the save
  Training fresh = lesson13::new_training(kCpu, lesson13::kSeed + 1);
  void* const storage = fresh.model->fc1->weight.data_ptr();
  const lesson13::Loaded loaded = lesson13::load_checkpoint(fresh, kCpu, path);
  EXPECT_TRUE(torch::equal(torch::rand({8}), next_draw));
  EXPECT_EQ(loaded.progress.epoch, 1);
  EXPECT_EQ(loaded.progress.step, (kSamples + lesson13::kBatchSize - 1) / lesson13::kBatchSize);
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

// Tests that every SIGKILL of a child saving atomically in a loop leaves a whole file (and at
// most the temporary files of killed saves beside it).
TEST(CrashTest, AtomicSavesSurviveSigkill) {
  Scratch scratch;
  const std::string path = scratch.file("big.pt");
  const lesson13::KillReport report = lesson13::kill_repeatedly(
      {built_program(LESSON13_BINARY), "--save-loop", path, "--threads", "1"}, /*lines=*/2,
      /*kills=*/10,
      /*seed=*/1, [&] { lesson13::check_save_loop_file(path); });
  EXPECT_EQ(report.kills, 10);
  EXPECT_EQ(report.survived, 10) << report.failure;
  EXPECT_GT(report.piece_seconds, 0.0);
  for (const auto& file : fs::directory_iterator(scratch.path())) {
    const std::string name = file.path().filename().string();
    EXPECT_TRUE(name == "big.pt" || name.rfind(".big.pt.tmp-", 0) == 0) << name << " left behind";
  }
}

// Tests that the crash test's own check catches a torn file: a truncated one and one whose
// payload mixes two saves.
TEST(CrashTest, TornFilesAreCaught) {
  Scratch scratch;
  const std::string path = scratch.file("big.pt");
  torch::serialize::OutputArchive archive;
  archive.write("iteration", c10::IValue(std::int64_t{3}));
  torch::Tensor payload = torch::full({lesson13::kSaveLoopBytes / 4}, 3.0f);
  payload[100] = 2.0f;
  archive.write("payload", payload);
  archive.save_to(path);
  EXPECT_THROW(lesson13::check_save_loop_file(path), CheckpointError);
  payload[100] = 3.0f;
  archive.write("payload", payload);
  archive.save_to(path);
  EXPECT_EQ(lesson13::check_save_loop_file(path), 3);
  write_bytes(path, read_bytes(path).substr(0, 1 << 20));
  EXPECT_THROW(lesson13::check_save_loop_file(path), CheckpointError);
}

// Tests that a write that fails leaves the previous file as it was, and no temporary file.
TEST(AtomicWrite, FailureLeavesThePreviousFile) {
  Scratch scratch;
  const std::string path = scratch.file("ckpt.pt");
  write_bytes(path, "previous");
  EXPECT_THROW(lesson13::write_atomically(path,
                                          [](const lesson13::Sink& sink) {
                                            sink("partial", 7);
                                            throw std::runtime_error("disk full");
                                          }),
               CheckpointError);
  EXPECT_EQ(read_bytes(path), "previous");
  int files = 0;
  for (const auto& file : fs::directory_iterator(scratch.path())) files += file.exists() ? 1 : 0;
  EXPECT_EQ(files, 1);
  lesson13::write_atomically(path, [](const lesson13::Sink& sink) { sink("new", 3); });
  EXPECT_EQ(read_bytes(path), "new");
}

// Tests that a folder that does not exist is a clear error naming it.
TEST(AtomicWrite, MissingFolderIsAClearError) {
  try {
    lesson13::write_atomically("/nonexistent-folder/ckpt.pt", [](const lesson13::Sink&) {});
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-folder/ckpt.pt"), std::string::npos);
    EXPECT_NE(e.hint().find("writable"), std::string::npos);
  }
}

// Tests that each kind of bad checkpoint is refused with a CheckpointError naming the problem,
// and that the model and Adam it was to be loaded into are unchanged.
TEST_F(CheckpointTest, BadCheckpointsAreRefusedAndLeaveTheModelUntouched) {
  const std::string good = scratch.file("good.pt");
  Training trained = run(1, good);
  Progress progress = fresh_progress();
  const std::string bytes = read_bytes(good);
  std::vector<std::pair<std::string, std::string>> cases;  // path, expected substring
  cases.emplace_back(scratch.file("missing.pt"), "no file at");
  cases.emplace_back(scratch.path().string(), "is not a file");
  write_bytes(scratch.file("empty.pt"), "");
  cases.emplace_back(scratch.file("empty.pt"), "not a readable");
  for (const std::size_t keep : {std::size_t{100}, bytes.size() / 3, bytes.size() / 2,
                                 bytes.size() - 100, bytes.size() - 1}) {
    const std::string path = scratch.file("cut" + std::to_string(keep) + ".pt");
    write_bytes(path, bytes.substr(0, keep));
    cases.emplace_back(path, "not a readable");
  }
  std::mt19937 random(3);
  std::string noise(bytes.size(), '\0');
  for (char& c : noise) c = static_cast<char>(random());
  write_bytes(scratch.file("noise.pt"), noise);
  cases.emplace_back(scratch.file("noise.pt"), "not a readable");
  // One flipped bit in the model's, the optimizer's or the generator's bytes.
  for (const double where : {0.1, 0.25, 0.45, 0.6}) {
    std::string flipped = bytes;
    flipped[static_cast<std::size_t>(where * bytes.size())] ^= 0x10;
    const std::string path = scratch.file("flip" + std::to_string(where) + ".pt");
    write_bytes(path, flipped);
    cases.emplace_back(path, "");  // refused, whichever check notices first
  }
  course::StateDict wider = course::state_dict(*trained.model);
  wider[0].second = torch::zeros({256, 784});
  lesson13::save_checkpoint(trained, progress, kCpu, scratch.file("wider.pt"), wider);
  cases.emplace_back(scratch.file("wider.pt"), "'fc1.weight' is [256, 784]");
  course::StateDict doubled = course::state_dict(*trained.model);
  doubled[5].second = doubled[5].second.to(torch::kDouble);
  lesson13::save_checkpoint(trained, progress, kCpu, scratch.file("double.pt"), doubled);
  cases.emplace_back(scratch.file("double.pt"), "Double in the file");
  course::StateDict fewer = course::state_dict(*trained.model);
  fewer.erase(fewer.begin() + 2);
  lesson13::save_checkpoint(trained, progress, kCpu, scratch.file("fewer.pt"), fewer);
  cases.emplace_back(scratch.file("fewer.pt"), "has no 'fc2.weight'");
  course::StateDict more = course::state_dict(*trained.model);
  more.emplace_back("fc4.bias", torch::zeros({10}));
  lesson13::save_checkpoint(trained, progress, kCpu, scratch.file("more.pt"), more);
  cases.emplace_back(scratch.file("more.pt"), "has 'fc4.bias'");
  course::write_python_state_dict(course::state_dict(*trained.model),
                                  scratch.file("state_dict.pt"));
  cases.emplace_back(scratch.file("state_dict.pt"), "Python's torch.save format");
  torch::serialize::OutputArchive other;  // a LibTorch archive, but not a checkpoint
  other.write("weights", torch::zeros({3}));
  other.save_to(scratch.file("other.pt"));
  cases.emplace_back(scratch.file("other.pt"), "has no 'format'");

  for (const auto& [path, expected] : cases) {
    Training victim = lesson13::new_training(kCpu, lesson13::kSeed + 7);
    const std::vector<torch::Tensor> before = copy_of(victim);
    try {
      lesson13::load_checkpoint(victim, kCpu, path);
      ADD_FAILURE() << path << " loaded";
    } catch (const CheckpointError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(expected), std::string::npos) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << "one line: " << message;
      EXPECT_FALSE(e.hint().empty()) << message;
      EXPECT_NE(message.find(path), std::string::npos) << "names the file: " << message;
      if (path.find("state_dict") != std::string::npos) {
        EXPECT_NE(e.hint().find("--from-python"), std::string::npos) << e.hint();
      }
    }
    EXPECT_EQ(course::max_abs_diff(victim.model->parameters(), before), 0.0)
        << path << " changed the model";
    EXPECT_TRUE(victim.optimizer.state().empty()) << path << " changed Adam";
  }
}

// Tests why a checkpoint carries its own checksum: with one bit of fc1.weight's bytes flipped, the
// file passes the check of its structure and LibTorch's zip reader (which checks no CRC-32) reads
// the changed weight without an error; load_checkpoint refuses the file by its checksum.
TEST_F(CheckpointTest, OneFlippedBitIsFoundByTheChecksum) {
  const std::string good = scratch.file("good.pt"), flipped = scratch.file("flipped.pt");
  Training trained = run(1, good);
  const torch::Tensor weight = trained.model->fc1->weight.detach().contiguous();
  const std::string first(static_cast<const char*>(weight.data_ptr()), 64);  // its first floats
  std::string bytes = read_bytes(good);
  const std::size_t at = bytes.find(first);
  ASSERT_NE(at, std::string::npos);
  bytes[at + 1] ^= 0x10;  // one bit of the first weight's mantissa
  write_bytes(flipped, bytes);
  torch::serialize::InputArchive archive = lesson13::open_archive(flipped, kCpu), model_state_dict;
  ASSERT_TRUE(archive.try_read("model_state_dict", model_state_dict));
  torch::Tensor read;
  for (const auto& [name, tensor] : course::archive_tensors(model_state_dict)) {
    if (name == "fc1.weight") read = tensor;
  }
  ASSERT_TRUE(read.defined());
  EXPECT_EQ(torch::ne(read, weight).sum().item<std::int64_t>(), 1);  // read, and changed
  Training victim = lesson13::new_training(kCpu, lesson13::kSeed + 1);
  try {
    lesson13::load_checkpoint(victim, kCpu, flipped);
    ADD_FAILURE() << "the flipped file loaded";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("is corrupt: its contents do not match its checksum"),
              std::string::npos)
        << e.what();
  }
}

// Tests the loader against damage everywhere in a checkpoint: truncated at 97 offsets and with
// one byte changed at 211 positions spread over the file (the zip's headers, the pickles, the
// tensors), each load either refuses the file with a CheckpointError or loads exactly the saved
// run; none crashes, hangs or loads something else.
TEST_F(CheckpointTest, CorruptionSweep) {
  const std::string good = scratch.file("good.pt");
  Training trained = run(1, good);
  const std::string bytes = read_bytes(good);
  const std::string damaged = scratch.file("damaged.pt");
  int refused = 0, loaded = 0;
  auto try_load = [&](const std::string& what) {
    Training victim = lesson13::new_training(kCpu, lesson13::kSeed + 3);
    const std::vector<torch::Tensor> before = copy_of(victim);
    try {
      lesson13::load_checkpoint(victim, kCpu, damaged);
      loaded += 1;
      EXPECT_EQ(course::max_abs_diff(victim.model->parameters(), trained.model->parameters()), 0.0)
          << what;
    } catch (const CheckpointError&) {
      refused += 1;
      EXPECT_EQ(course::max_abs_diff(victim.model->parameters(), before), 0.0) << what;
    }
  };
  damage_everywhere(bytes, damaged, try_load);
  EXPECT_EQ(refused + loaded, kDamagedCopies);
  std::printf("corruption sweep: %d refused, %d loaded the saved run\n", refused, loaded);
}

// Copies the zip at `from` to `to` with out.bias's stride pickled as 2 instead of 1: its 10
// elements then span 19 floats, past the end of their storage (10 floats in a state_dict; in a
// checkpoint, the flat parameters, which out.bias ends). The zip's CRCs are written anew, as a
// damaged file could carry them.
void stretch_out_bias(const std::string& from, const std::string& to) {
  caffe2::serialize::PyTorchStreamReader in(from);
  caffe2::serialize::PyTorchStreamWriter out(to);
  // LibTorch's pickler writes a tuple as MARK, items, TUPLE: (10,) then (1,).
  const std::string size("(K\x0at", 4), stride("(K\x01t", 4);
  bool patched = false;
  for (const std::string& name : in.getAllRecords()) {
    if (name == "version" || name == ".data/version") continue;  // the writer adds its own
    auto [data, length] = in.getRecord(name);
    std::string bytes(static_cast<const char*>(data.get()), length);
    const std::size_t at = bytes.find(size);
    const std::size_t next = at == std::string::npos ? at : bytes.find(stride, at);
    if (name.size() >= 8 && name.compare(name.size() - 8, 8, "data.pkl") == 0 &&
        next != std::string::npos && next < at + 12) {
      bytes[next + 2] = 2;
      patched = true;
    }
    out.writeRecord(name, bytes.data(), bytes.size());
  }
  out.writeEndOfFile();
  ASSERT_TRUE(patched) << from;
}

// Tests that a tensor whose pickled sizes and strides reach past its storage is refused, in a
// checkpoint and in a state_dict, before anything reads it.
TEST_F(CheckpointTest, TensorsReachingPastTheirStorageAreRefused) {
  Training trained = run(1, scratch.file("good.pt"));
  course::write_python_state_dict(course::state_dict(*trained.model),
                                  scratch.file("good_state_dict.pt"));
  stretch_out_bias(scratch.file("good.pt"), scratch.file("stretched.pt"));
  stretch_out_bias(scratch.file("good_state_dict.pt"), scratch.file("stretched_state_dict.pt"));
  Training victim = lesson13::new_training(kCpu, lesson13::kSeed + 1);
  const std::vector<torch::Tensor> before = copy_of(victim);
  for (const bool checkpoint : {true, false}) {
    try {
      if (checkpoint) {
        lesson13::load_checkpoint(victim, kCpu, scratch.file("stretched.pt"));
      } else {
        course::read_python_state_dict(scratch.file("stretched_state_dict.pt"));
      }
      ADD_FAILURE() << (checkpoint ? "the checkpoint" : "the state_dict") << " was accepted";
    } catch (const CheckpointError& error) {
      EXPECT_NE(std::string(error.what()).find("'out.bias' ([10]) reaches past the"),
                std::string::npos)
          << error.what();
    }
  }
  EXPECT_EQ(course::max_abs_diff(victim.model->parameters(), before), 0.0);
}

// A string literal's bytes, NULs included.
template <std::size_t N>
std::string bytes_of(const char (&literal)[N]) {
  return std::string(literal, N - 1);
}

// Tests that what the check of a torch file refuses (torch_files/torch_file.h, whose own tests
// cover every case) reaches the learner as a CheckpointError from both loaders, the model
// untouched: a checkpoint with its version record renamed away (LibTorch's reader would leak on it)
// and a zip whose pickle LibTorch's unpickler would grow a 30 GB memo for (found by
// fuzz_checkpoint).
TEST_F(CheckpointTest, FilesTheCheckRefusesNeverReachLibTorch) {
  Training trained = run(1, scratch.file("good.pt"));
  std::string bytes = read_bytes(scratch.file("good.pt"));
  for (const std::string name : {"/.data/version", "/version"}) {
    for (std::size_t at = bytes.find(name); at != std::string::npos; at = bytes.find(name, at)) {
      bytes[at + name.size() - 7] = 'x';  // .../version becomes .../xersion
    }
  }
  write_bytes(scratch.file("unversioned.pt"), bytes);
  {
    caffe2::serialize::PyTorchStreamWriter out(scratch.file("memo.pt"));
    const std::string pickle = bytes_of("\x80\x02N\x72\x6d\x61\x74\x71."), floats(40, '\0');
    out.writeRecord("data.pkl", pickle.data(), pickle.size());
    out.writeRecord("data/0", floats.data(), floats.size());
    out.writeEndOfFile();
  }
  Training victim = lesson13::new_training(kCpu, lesson13::kSeed + 1);
  const std::vector<torch::Tensor> before = copy_of(victim);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {scratch.file("unversioned.pt"), "it has no format version"},
      {scratch.file("memo.pt"), "memo index past its own length"}};
  for (const auto& [file, expected] : cases) {
    for (const bool state_dict : {true, false}) {
      try {
        if (state_dict) {
          course::read_python_state_dict(file);
        } else {
          lesson13::load_checkpoint(victim, kCpu, file);
        }
        ADD_FAILURE() << file << " was accepted";
      } catch (const CheckpointError& error) {
        EXPECT_NE(std::string(error.what()).find(expected), std::string::npos) << error.what();
        EXPECT_NE(std::string(error.what())
                      .find(state_dict ? "is not a state_dict saved by torch.save ("
                                       : "is not a readable LibTorch archive ("),
                  std::string::npos)
            << error.what();
      }
    }
  }
  EXPECT_EQ(course::max_abs_diff(victim.model->parameters(), before), 0.0);
}

// Tests map_location without a GPU: a checkpoint whose storages say cuda:0 loads onto the CPU,
// Adam's state with it. (On a GPU, CudaTest.CheckpointsMoveBetweenCpuAndCuda saves a real one.)
TEST_F(CheckpointTest, StoragesRecordedOnCudaLoadOnTheCpu) {
  Training trained = run(1, scratch.file("cpu.pt"));
  tag_storages_cuda(scratch.file("cpu.pt"), scratch.file("cuda.pt"));
  Training loaded = lesson13::new_training(kCpu, lesson13::kSeed + 1);
  const lesson13::Loaded info = lesson13::load_checkpoint(loaded, kCpu, scratch.file("cuda.pt"));
  EXPECT_EQ(info.saved_on, "cuda:0");  // the same pickled string
  EXPECT_EQ(course::max_abs_diff(loaded.model->parameters(), trained.model->parameters()), 0.0);
  EXPECT_TRUE(
      course::adam_state(loaded.optimizer, loaded.model->fc1->weight)->exp_avg().device().is_cpu());
}

// Tests that a CUDA checkpoint loads on the CPU and a CPU one on CUDA, Adam's state following the
// parameters, and that the CUDA generator is saved and restored.
TEST_F(CudaTest, CheckpointsMoveBetweenCpuAndCuda) {
  Scratch scratch;
  Training on_gpu = lesson13::new_training(device, lesson13::kSeed);
  const auto labels = torch::TensorOptions(device).dtype(torch::kLong);  // a device alone: floats
  torch::nn::functional::cross_entropy(on_gpu.model->forward(torch::rand({64, 784}, device)),
                                       torch::randint(0, 10, {64}, labels))
      .backward();
  on_gpu.optimizer.step();
  Progress progress = fresh_progress();
  lesson13::save_checkpoint(on_gpu, progress, device, scratch.file("gpu.pt"));
  const torch::Tensor next_gpu_draw = torch::rand({8}, device);

  Training on_cpu = lesson13::new_training(kCpu, lesson13::kSeed);
  const lesson13::Loaded loaded = lesson13::load_checkpoint(on_cpu, kCpu, scratch.file("gpu.pt"));
  EXPECT_EQ(loaded.saved_on, device.str());
  EXPECT_TRUE(loaded.cuda_rng);  // held, and not restored: the run is on the CPU
  EXPECT_EQ(course::max_abs_diff(on_cpu.model->parameters(), on_gpu.model->parameters()), 0.0);
  EXPECT_TRUE(
      course::adam_state(on_cpu.optimizer, on_cpu.model->fc1->weight)->exp_avg().device().is_cpu());

  lesson13::save_checkpoint(on_cpu, progress, kCpu, scratch.file("cpu.pt"));
  Training back = lesson13::new_training(device, lesson13::kSeed);
  lesson13::load_checkpoint(back, device, scratch.file("cpu.pt"));
  EXPECT_EQ(course::max_abs_diff(back.model->parameters(), on_cpu.model->parameters()), 0.0);
  EXPECT_EQ(course::adam_state(back.optimizer, back.model->fc1->weight)->exp_avg().device(),
            back.model->fc1->weight.device());

  Training again = lesson13::new_training(device, lesson13::kSeed);
  const lesson13::Loaded restored =
      lesson13::load_checkpoint(again, device, scratch.file("gpu.pt"));
  EXPECT_TRUE(restored.cuda_rng);
  EXPECT_TRUE(torch::equal(torch::rand({8}, device), next_gpu_draw));  // restored
}

// ---- on the command line: the lesson's program (LESSON13_BINARY), as a learner runs it -------
// Tests a run resumed across processes: --epochs 1, then --epochs 2 in a new process resumes from
// epoch 1, then --epochs 2 again has nothing left to train; each passes.
TEST(Cli, ResumeInANewProcess) { expect_resume_in_a_new_process(built_program(LESSON13_BINARY)); }

// Tests that a checkpoint of a --quick run, resumed without --quick, stops with exit 2 and a HINT
// naming the flags to resume with.
TEST(Cli, ResumeWithOtherSettings) {
  Scratch dir;
  const ProgramRun quick = run_program({built_program(LESSON13_BINARY), "--quick", "--checkpoint",
                                        dir.file("run.pt"), "--epochs", "1"});
  EXPECT_EQ(quick.exit_code, 0) << quick.what();
  EXPECT_TRUE(quick.printed("RESULT: PASS")) << quick.what();
  const ProgramRun other = run_program(
      {built_program(LESSON13_BINARY), "--checkpoint", dir.file("run.pt"), "--epochs", "2"});
  EXPECT_EQ(other.exit_code, 2) << other.what();
  EXPECT_TRUE(other.printed("HINT: resume with the flags")) << other.what();
}

// Tests that a checkpoint of random bytes stops the run with exit 2 and a HINT.
TEST(Cli, CorruptCheckpoint) { expect_corrupt_checkpoint_refused(built_program(LESSON13_BINARY)); }

// Tests that --checkpoint in a folder that does not exist stops with exit 2 before any training.
TEST(Cli, UnwritableFolder) { expect_unwritable_folder_refused(built_program(LESSON13_BINARY)); }

// Tests that --help lists the learner's flags, not the crash test's own (--save-loop, --in-place).
TEST(Cli, Help) {
  const ProgramRun run = run_program({built_program(LESSON13_BINARY), "--help"});
  EXPECT_EQ(run.exit_code, 0) << run.what();
  EXPECT_TRUE(run.printed("--checkpoint")) << run.what();
  EXPECT_FALSE(run.printed("--save-loop") || run.printed("--in-place")) << run.what();
}

}  // namespace
