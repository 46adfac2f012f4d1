// Tests of lesson 10: exact resume, what a checkpoint restores, atomic saves under SIGKILL (a real
// child process), bad checkpoints refused with the model untouched, device mapping (storages
// recorded on cuda:0 loaded on the CPU; both ways on a real GPU),
// and state_dicts made and read by the real Python torch (skipped where none is installed).
#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <regex>

#include "checkpointing.h"
#include "common/cli.h"  // defines: course::CpuThreads
#include "common/memory.h"
#include "cuda_test.h"
#include "fashion_mnist_test.h"

namespace {

namespace fs = std::filesystem;
using lesson10::CheckpointError;
using lesson10::Progress;

// A fresh folder for one test, removed afterwards.
class Scratch {
 public:
  Scratch() {
    std::string name = (fs::temp_directory_path() / "lesson10-test-XXXXXX").string();
    path_ = ::mkdtemp(name.data());
  }
  ~Scratch() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

constexpr std::int64_t kSamples = 2000;  // a few hundred steps per epoch: seconds, not minutes
const torch::Device kCpu(torch::kCPU);

Progress fresh_progress(std::int64_t samples) {
  Progress progress;
  progress.samples = samples;
  progress.batch_size = lesson10::kBatchSize;
  return progress;
}

class CheckpointTest : public FashionMnistTest {
 protected:
  course::ImageSet small() const { return lesson11::take(train(), kSamples); }

  // `epochs` epochs from the seed, saving to `path` (if any) after each; the trainer at the end.
  lesson11::Trainer run(int epochs, const std::string& path = "") {
    Progress progress = fresh_progress(kSamples);
    lesson11::Trainer trainer = lesson11::make_trainer(kCpu, lesson10::kSeed);
    if (!path.empty() && fs::exists(path)) {
      progress = lesson10::load_checkpoint(trainer, kCpu, path).progress;
    }
    auto loader = lesson11::make_loader("batches", small(), lesson10::kBatchSize, kCpu);
    lesson10::train_to(trainer, progress, epochs, *loader, kCpu, path);
    return trainer;
  }
  Scratch scratch;
};

// Tests that N epochs straight equal k epochs + save + load into a fresh model and optimizer +
// N-k epochs, bitwise, for every k, and for a run resumed twice. On one thread, as the lesson
// does: MKL's threads make even two straight runs differ now and then (3 runs in 50 here).
TEST_F(CheckpointTest, ResumeIsBitwiseExact) {
  const course::CpuThreads reproducible(1);
  const torch::Tensor straight = run(3).flat.values.detach().clone();
  for (int k = 1; k <= 2; ++k) {
    const std::string path = scratch.file("run" + std::to_string(k) + ".pt");
    run(k, path);
    const torch::Tensor resumed = run(3, path).flat.values;
    EXPECT_EQ((resumed - straight).abs().max().item<double>(), 0.0) << "resumed at epoch " << k;
  }
  const std::string twice = scratch.file("twice.pt");
  run(1, twice);
  run(2, twice);
  EXPECT_TRUE(torch::equal(run(3, twice).flat.values, straight));
}

// Tests that a checkpoint restores Adam's state, the progress and the CPU generator.
TEST_F(CheckpointTest, RestoresOptimizerProgressAndRng) {
  const std::string path = scratch.file("run.pt");
  lesson11::Trainer trainer = run(1, path);
  const torch::Tensor next_draw = torch::rand({8});  // what the generator gives after the save
  lesson11::Trainer fresh = lesson11::make_trainer(kCpu, lesson10::kSeed + 1);
  const lesson10::Loaded loaded = lesson10::load_checkpoint(fresh, kCpu, path);
  EXPECT_TRUE(torch::equal(torch::rand({8}), next_draw));
  EXPECT_EQ(loaded.progress.epoch, 1);
  EXPECT_EQ(loaded.progress.step, (kSamples + lesson10::kBatchSize - 1) / lesson10::kBatchSize);
  EXPECT_EQ(loaded.progress.samples, kSamples);
  EXPECT_EQ(loaded.saved_on, "cpu");
  EXPECT_FALSE(loaded.cuda_rng);
  EXPECT_TRUE(torch::equal(fresh.flat.values, trainer.flat.values));
  ASSERT_EQ(fresh.optimizer->state().size(), 1u);
  const auto& a =
      static_cast<const torch::optim::AdamParamState&>(*trainer.optimizer->state().begin()->second);
  const auto& b =
      static_cast<const torch::optim::AdamParamState&>(*fresh.optimizer->state().begin()->second);
  EXPECT_EQ(a.step(), b.step());
  EXPECT_TRUE(torch::equal(a.exp_avg(), b.exp_avg()));
  EXPECT_TRUE(torch::equal(a.exp_avg_sq(), b.exp_avg_sq()));
  // The loaded model's parameters still live in the flat tensor the optimizer updates.
  EXPECT_EQ(fresh.model->fc1->weight.data_ptr(), fresh.flat.values.data_ptr());
}

// Tests that every SIGKILL of a child saving atomically in a loop leaves a whole file.
TEST(CrashTest, AtomicSavesSurviveSigkill) {
  Scratch scratch;
  const lesson10::KillReport report = lesson10::kill_while_saving(
      LESSON10_BINARY, scratch.file("big.pt"), /*atomic=*/true, /*kills=*/10, /*seed=*/1);
  EXPECT_EQ(report.kills, 10);
  EXPECT_EQ(report.loadable, 10) << report.failure;
  EXPECT_GT(report.save_seconds, 0.0);
  for (const auto& file : fs::directory_iterator(scratch.path())) {
    EXPECT_EQ(file.path().filename(), "big.pt") << "left behind";
  }
}

// Tests that the crash test's own check catches a torn file: a truncated one and one whose
// payload mixes two saves.
TEST(CrashTest, TornFilesAreCaught) {
  Scratch scratch;
  const std::string path = scratch.file("big.pt");
  torch::serialize::OutputArchive archive;
  archive.write("iteration", c10::IValue(std::int64_t{3}));
  torch::Tensor payload = torch::full({lesson10::kSaveLoopBytes / 4}, 3.0f);
  payload[100] = 2.0f;
  archive.write("payload", payload);
  archive.save_to(path);
  EXPECT_THROW(lesson10::check_save_loop_file(path), CheckpointError);
  payload[100] = 3.0f;
  archive.write("payload", payload);
  archive.save_to(path);
  EXPECT_EQ(lesson10::check_save_loop_file(path), 3);
  write_bytes(path, read_bytes(path).substr(0, 1 << 20));
  EXPECT_THROW(lesson10::check_save_loop_file(path), CheckpointError);
}

// Tests that a write that fails leaves the previous file as it was, and no temporary file.
TEST(AtomicWrite, FailureLeavesThePreviousFile) {
  Scratch scratch;
  const std::string path = scratch.file("ckpt.pt");
  write_bytes(path, "previous");
  EXPECT_THROW(lesson10::write_atomically(path,
                                          [](const lesson10::Sink& sink) {
                                            sink("partial", 7);
                                            throw std::runtime_error("disk full");
                                          }),
               CheckpointError);
  EXPECT_EQ(read_bytes(path), "previous");
  int files = 0;
  for (const auto& file : fs::directory_iterator(scratch.path())) files += file.exists() ? 1 : 0;
  EXPECT_EQ(files, 1);
  lesson10::write_atomically(path, [](const lesson10::Sink& sink) { sink("new", 3); });
  EXPECT_EQ(read_bytes(path), "new");
}

// Tests that a folder that does not exist is a clear error naming it.
TEST(AtomicWrite, MissingFolderIsAClearError) {
  try {
    lesson10::write_atomically("/nonexistent-folder/ckpt.pt", [](const lesson10::Sink&) {});
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-folder/ckpt.pt"), std::string::npos);
    EXPECT_NE(e.hint().find("writable"), std::string::npos);
  }
}

// Tests that each kind of bad checkpoint is refused with a CheckpointError naming the problem,
// and that the model it was to be loaded into is unchanged.
TEST_F(CheckpointTest, BadCheckpointsAreRefusedAndLeaveTheModelUntouched) {
  const std::string good = scratch.file("good.pt");
  lesson11::Trainer trainer = run(1, good);
  Progress progress = fresh_progress(kSamples);
  const std::string bytes = read_bytes(good);
  std::vector<std::pair<std::string, std::string>> cases;  // path, expected substring
  cases.emplace_back(scratch.file("missing.pt"), "no checkpoint at");
  cases.emplace_back(scratch.path().string(), "is not a file");
  write_bytes(scratch.file("empty.pt"), "");
  cases.emplace_back(scratch.file("empty.pt"), "not a readable checkpoint");
  for (const std::size_t keep : {std::size_t{100}, bytes.size() / 3, bytes.size() / 2,
                                 bytes.size() - 100, bytes.size() - 1}) {
    const std::string path = scratch.file("cut" + std::to_string(keep) + ".pt");
    write_bytes(path, bytes.substr(0, keep));
    cases.emplace_back(path, "not a readable checkpoint");
  }
  std::mt19937 random(3);
  std::string noise(bytes.size(), '\0');
  for (char& c : noise) c = static_cast<char>(random());
  write_bytes(scratch.file("noise.pt"), noise);
  cases.emplace_back(scratch.file("noise.pt"), "not a readable checkpoint");
  // One flipped bit in the model's, the optimizer's or the generator's bytes.
  for (const double where : {0.1, 0.25, 0.45, 0.6}) {
    std::string flipped = bytes;
    flipped[static_cast<std::size_t>(where * bytes.size())] ^= 0x10;
    const std::string path = scratch.file("flip" + std::to_string(where) + ".pt");
    write_bytes(path, flipped);
    cases.emplace_back(path, "");  // refused, whichever check notices first
  }
  lesson10::Entries wider = lesson10::model_entries(trainer.model);
  wider[0].second = torch::zeros({256, 784});
  lesson10::save_checkpoint(trainer, progress, kCpu, scratch.file("wider.pt"), wider);
  cases.emplace_back(scratch.file("wider.pt"), "'fc1.weight' is [256, 784]");
  lesson10::Entries doubled = lesson10::model_entries(trainer.model);
  doubled[5].second = doubled[5].second.to(torch::kDouble);
  lesson10::save_checkpoint(trainer, progress, kCpu, scratch.file("double.pt"), doubled);
  cases.emplace_back(scratch.file("double.pt"), "Double in the file");
  lesson10::Entries fewer = lesson10::model_entries(trainer.model);
  fewer.erase(fewer.begin() + 2);
  lesson10::save_checkpoint(trainer, progress, kCpu, scratch.file("fewer.pt"), fewer);
  cases.emplace_back(scratch.file("fewer.pt"), "has no 'fc2.weight'");
  lesson10::Entries more = lesson10::model_entries(trainer.model);
  more.emplace_back("fc4.bias", torch::zeros({10}));
  lesson10::save_checkpoint(trainer, progress, kCpu, scratch.file("more.pt"), more);
  cases.emplace_back(scratch.file("more.pt"), "has 'fc4.bias'");
  lesson10::write_python_state_dict(trainer.model, scratch.file("state_dict.pt"));
  cases.emplace_back(scratch.file("state_dict.pt"), "a state_dict in torch.save's format");
  torch::serialize::OutputArchive other;  // a LibTorch archive, but not a checkpoint
  other.write("weights", torch::zeros({3}));
  other.save_to(scratch.file("other.pt"));
  cases.emplace_back(scratch.file("other.pt"), "has no 'format'");

  for (const auto& [path, expected] : cases) {
    lesson11::Trainer victim = lesson11::make_trainer(kCpu, lesson10::kSeed + 7);
    const torch::Tensor before = victim.flat.values.detach().clone();
    try {
      lesson10::load_checkpoint(victim, kCpu, path);
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
    EXPECT_TRUE(torch::equal(victim.flat.values, before)) << path << " changed the model";
    EXPECT_EQ(victim.model->fc1->weight.data_ptr(), victim.flat.values.data_ptr());
  }
}

// Writes `bytes` to `path` damaged in 308 ways, calling `check(what)` after each: truncated at 97
// offsets from 0 to the whole file less a 97th, then with one byte changed at 211 positions spread
// evenly over it (the zip's headers, the pickles, the tensors).
constexpr int kDamagedCopies = 97 + 211;
void damage_everywhere(const std::string& bytes, const std::string& path,
                       const std::function<void(const std::string&)>& check) {
  for (int i = 0; i <= 96; ++i) {
    const std::size_t keep = bytes.size() * static_cast<std::size_t>(i) / 97;
    write_bytes(path, bytes.substr(0, keep));
    check("truncated to " + std::to_string(keep));
  }
  for (int i = 0; i < 211; ++i) {
    std::string copy = bytes;
    const std::size_t at = (copy.size() - 1) * static_cast<std::size_t>(i) / 210;
    copy[at] = static_cast<char>(copy[at] ^ 0x5a);
    write_bytes(path, copy);
    check("byte " + std::to_string(at) + " changed");
  }
}

// Tests the loader against damage everywhere in a checkpoint: truncated at 97 offsets and with
// one byte changed at 211 positions spread over the file (the zip's headers, the pickles, the
// tensors), each load either refuses the file with a CheckpointError or loads exactly the saved
// run; none crashes, hangs or loads something else.
TEST_F(CheckpointTest, CorruptionSweep) {
  const std::string good = scratch.file("good.pt");
  lesson11::Trainer trainer = run(1, good);
  const std::string bytes = read_bytes(good);
  const std::string damaged = scratch.file("damaged.pt");
  int refused = 0, loaded = 0;
  auto try_load = [&](const std::string& what) {
    lesson11::Trainer victim = lesson11::make_trainer(kCpu, lesson10::kSeed + 3);
    const torch::Tensor before = victim.flat.values.detach().clone();
    try {
      lesson10::load_checkpoint(victim, kCpu, damaged);
      loaded += 1;
      EXPECT_TRUE(torch::equal(victim.flat.values, trainer.flat.values)) << what;
    } catch (const CheckpointError&) {
      refused += 1;
      EXPECT_TRUE(torch::equal(victim.flat.values, before)) << what;
    }
  };
  damage_everywhere(bytes, damaged, try_load);
  EXPECT_EQ(refused + loaded, kDamagedCopies);
  std::printf("corruption sweep: %d refused, %d loaded the saved run\n", refused, loaded);
}

// Tests the reader of Python's state_dicts the same way: a file written for Python, truncated at
// 97 offsets and with one byte changed at 211 positions, is refused or read back exactly.
TEST_F(CheckpointTest, PythonStateDictCorruptionSweep) {
  lesson11::Trainer trainer = run(1);
  const std::string good = scratch.file("state_dict.pt");
  lesson10::write_python_state_dict(trainer.model, good);
  const std::string bytes = read_bytes(good);
  const std::string damaged = scratch.file("damaged.pt");
  int refused = 0, loaded = 0;
  auto try_read = [&](const std::string& what) {
    lesson11::Mlp model;
    try {
      lesson10::load_entries(model, lesson10::read_python_state_dict(damaged), damaged);
      loaded += 1;
      EXPECT_TRUE(torch::equal(lesson11::flatten_parameters(*model).values, trainer.flat.values))
          << what;
    } catch (const CheckpointError&) {
      refused += 1;
    }
  };
  damage_everywhere(bytes, damaged, try_read);
  EXPECT_EQ(refused + loaded, kDamagedCopies);
  std::printf("state_dict corruption sweep: %d refused, %d read back exactly\n", refused, loaded);
}

// Copies the zip at `from` to `to` with every storage's recorded device changed from "cpu" to
// "cuda:0", as a GPU run records it (the string is pickled once and referred to after that).
void tag_storages_cuda(const std::string& from, const std::string& to) {
  caffe2::serialize::PyTorchStreamReader in(from);
  caffe2::serialize::PyTorchStreamWriter out(to);
  const std::string cpu(
      "X\x03\x00\x00\x00"
      "cpu",
      8),
      cuda(
          "X\x06\x00\x00\x00"
          "cuda:0",
          11);
  for (const std::string& name : in.getAllRecords()) {
    if (name == "version" || name == ".data/version") continue;  // the writer adds its own
    auto [data, size] = in.getRecord(name);
    std::string bytes(static_cast<const char*>(data.get()), size);
    if (name == "data.pkl") {
      const std::size_t at = bytes.find(cpu);
      ASSERT_NE(at, std::string::npos);
      bytes.replace(at, cpu.size(), cuda);
    }
    out.writeRecord(name, bytes.data(), bytes.size());
  }
  out.writeEndOfFile();
}

// Copies the zip at `from` to `to` with fc3.bias's stride pickled as 2 instead of 1: its 10
// elements then span 19 floats, past the end of their storage (10 floats in a state_dict; in a
// checkpoint, the flat parameters, which fc3.bias ends). The zip's CRCs are written anew, as a
// damaged file could carry them.
void stretch_fc3_bias(const std::string& from, const std::string& to) {
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
  lesson11::Trainer trainer = run(1, scratch.file("good.pt"));
  lesson10::write_python_state_dict(trainer.model, scratch.file("good_state_dict.pt"));
  stretch_fc3_bias(scratch.file("good.pt"), scratch.file("stretched.pt"));
  stretch_fc3_bias(scratch.file("good_state_dict.pt"), scratch.file("stretched_state_dict.pt"));
  lesson11::Trainer victim = lesson11::make_trainer(kCpu, lesson10::kSeed + 1);
  const torch::Tensor before = victim.flat.values.clone();
  for (const std::string& file : {scratch.file("stretched.pt"), scratch.file("stretched_state_dict.pt")}) {
    try {
      if (file == scratch.file("stretched.pt")) {
        lesson10::load_checkpoint(victim, kCpu, file);
      } else {
        lesson10::read_python_state_dict(file);
      }
      ADD_FAILURE() << file << " was accepted";
    } catch (const CheckpointError& error) {
      EXPECT_NE(std::string(error.what()).find("'fc3.bias' ([10]) reaches past the"),
                std::string::npos)
          << error.what();
    }
  }
  EXPECT_TRUE(torch::equal(victim.flat.values, before));
}

// A string literal's bytes, NULs included.
template <std::size_t N>
std::string bytes_of(const char (&literal)[N]) {
  return std::string(literal, N - 1);
}

// Tests that what the check of a torch file refuses (common/torch_file.h, whose own tests cover
// every case) reaches the learner as the lesson's error from both loaders, the model untouched:
// a checkpoint with its version record renamed away (LibTorch's reader would leak on it) and a
// zip whose pickle LibTorch's unpickler would grow a 30 GB memo for (found by fuzz_checkpoint).
TEST_F(CheckpointTest, FilesTheCheckRefusesNeverReachLibTorch) {
  lesson11::Trainer trainer = run(1, scratch.file("good.pt"));
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
  lesson11::Trainer victim = lesson11::make_trainer(kCpu, lesson10::kSeed + 1);
  const torch::Tensor before = victim.flat.values.clone();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {scratch.file("unversioned.pt"), "it has no format version"},
      {scratch.file("memo.pt"), "memo index past its own length"}};
  for (const auto& [file, expected] : cases) {
    for (const bool state_dict : {true, false}) {
      try {
        if (state_dict) lesson10::read_python_state_dict(file);
        else lesson10::load_checkpoint(victim, kCpu, file);
        ADD_FAILURE() << file << " was accepted";
      } catch (const CheckpointError& error) {
        EXPECT_NE(std::string(error.what()).find(expected), std::string::npos) << error.what();
        EXPECT_NE(std::string(error.what()).find(state_dict ? "is not a state_dict saved by torch.save ("
                                                            : "is not a readable checkpoint ("),
                  std::string::npos)
            << error.what();
      }
    }
  }
  EXPECT_TRUE(torch::equal(victim.flat.values, before));
}

// Tests map_location without a GPU: a checkpoint whose storages say cuda:0 loads onto the CPU,
// the optimizer's state with it. (On a GPU, CudaTest.CheckpointsMoveBetweenCpuAndCuda saves a
// real one.)
TEST_F(CheckpointTest, StoragesRecordedOnCudaLoadOnTheCpu) {
  lesson11::Trainer trainer = run(1, scratch.file("cpu.pt"));
  tag_storages_cuda(scratch.file("cpu.pt"), scratch.file("cuda.pt"));
  lesson11::Trainer loaded = lesson11::make_trainer(kCpu, lesson10::kSeed + 1);
  const lesson10::Loaded info = lesson10::load_checkpoint(loaded, kCpu, scratch.file("cuda.pt"));
  EXPECT_EQ(info.saved_on, "cuda:0");  // the same pickled string
  EXPECT_TRUE(torch::equal(loaded.flat.values, trainer.flat.values));
  const auto& state =
      static_cast<const torch::optim::AdamParamState&>(*loaded.optimizer->state().begin()->second);
  EXPECT_TRUE(state.exp_avg().device().is_cpu());
}

// Tests that a CUDA checkpoint loads on the CPU and a CPU one on CUDA, the optimizer's state
// following the parameters, and that the CUDA generator is saved and restored.
TEST_F(CudaTest, CheckpointsMoveBetweenCpuAndCuda) {
  Scratch scratch;
  lesson11::Trainer on_gpu = lesson11::make_trainer(device, lesson10::kSeed);
  lesson11::Batch batch{torch::rand({64, 784}, device), torch::randint(0, 10, {64}, device)};
  torch::nn::functional::cross_entropy(on_gpu.model->forward(batch.images), batch.labels)
      .backward();
  on_gpu.optimizer->step();
  Progress progress = fresh_progress(64);
  lesson10::save_checkpoint(on_gpu, progress, device, scratch.file("gpu.pt"));
  const torch::Tensor next_gpu_draw = torch::rand({8}, device);

  lesson11::Trainer on_cpu = lesson11::make_trainer(kCpu, lesson10::kSeed);
  const lesson10::Loaded loaded = lesson10::load_checkpoint(on_cpu, kCpu, scratch.file("gpu.pt"));
  EXPECT_EQ(loaded.saved_on, device.str());
  EXPECT_TRUE(loaded.cuda_rng);
  EXPECT_FALSE(loaded.cuda_rng_restored);
  EXPECT_TRUE(torch::equal(on_cpu.flat.values, on_gpu.flat.values.cpu()));
  const auto& state =
      static_cast<const torch::optim::AdamParamState&>(*on_cpu.optimizer->state().begin()->second);
  EXPECT_TRUE(state.exp_avg().device().is_cpu());

  lesson10::save_checkpoint(on_cpu, progress, kCpu, scratch.file("cpu.pt"));
  lesson11::Trainer back = lesson11::make_trainer(device, lesson10::kSeed);
  lesson10::load_checkpoint(back, device, scratch.file("cpu.pt"));
  EXPECT_TRUE(torch::equal(back.flat.values.cpu(), on_cpu.flat.values));
  const auto& gpu_state =
      static_cast<const torch::optim::AdamParamState&>(*back.optimizer->state().begin()->second);
  EXPECT_EQ(gpu_state.exp_avg().device(), back.flat.values.device());

  lesson11::Trainer again = lesson11::make_trainer(device, lesson10::kSeed);
  const lesson10::Loaded restored =
      lesson10::load_checkpoint(again, device, scratch.file("gpu.pt"));
  EXPECT_TRUE(restored.cuda_rng_restored);
  EXPECT_TRUE(torch::equal(torch::rand({8}, device), next_gpu_draw));
}

// ---- Python ------------------------------------------------------------------------------------
// Files made and read by the real Python torch whose version matches this LibTorch.
class PythonTest : public FashionMnistTest {
 protected:
  void SetUp() override {
    FashionMnistTest::SetUp();
    if (IsSkipped()) return;
    if (std::string(LESSON10_PYTHON).empty()) GTEST_SKIP() << "no Python with torch found";
  }
  // Runs Python with `args`; its exit code and output.
  static int python(const std::string& args, std::string& output) {
    const std::string command = std::string(LESSON10_PYTHON) + " " + args + " 2>&1";
    FILE* pipe = ::popen(command.c_str(), "r");
    output.clear();
    char buffer[4096];
    while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) output += buffer;
    return WEXITSTATUS(::pclose(pipe));
  }
  static double accuracy_in(const std::string& output) {
    std::smatch match;
    if (!std::regex_search(output, match, std::regex("test accuracy: ([0-9.]+)"))) return -1;
    return std::stod(match[1]);
  }
  static std::string roundtrip() { return std::string(LESSON10_ROUNDTRIP); }
  Scratch scratch;
};

// Tests that a state_dict Python saved as the tutorials do (torch.save(model.state_dict())) loads,
// and gives Python's accuracy.
TEST_F(PythonTest, ReadsTorchSaveOfAStateDict) {
  const std::string path = scratch.file("python.pt");
  std::string output;
  ASSERT_EQ(python(roundtrip() + " save " + path + " --epochs 1", output), 0) << output;
  const double python_accuracy = accuracy_in(output);
  ASSERT_GT(python_accuracy, 0.7) << output;
  lesson11::Mlp model;
  const lesson10::Entries entries = lesson10::read_python_state_dict(path);
  ASSERT_EQ(entries.size(), 6u);
  EXPECT_EQ(entries[0].first, "fc1.weight");
  lesson10::load_entries(model, entries, path);
  EXPECT_NEAR(lesson11::evaluate(model, test(), kCpu), python_accuracy, 1e-4);
}

// Tests why the pickle is rewritten: LibTorch's own torch::pickle_load fails on the tutorials'
// state_dict file (an OrderedDict), and reads the same tensors saved as a plain dict.
TEST_F(PythonTest, PickleLoadFailsOnAStateDictButReadsADict) {
  const std::string dir = scratch.path().string();
  std::string output;
  write_bytes(dir + "/make.py",
              "import sys, torch; m = torch.nn.Linear(3, 2)\n"
              "torch.save(m.state_dict(), sys.argv[1] + '/sd.pt')\n"
              "torch.save(dict(m.state_dict()), sys.argv[1] + '/dict.pt')\n");
  ASSERT_EQ(python(dir + "/make.py " + dir, output), 0) << output;
  const std::string state_dict = read_bytes(dir + "/sd.pt");
  const std::string plain = read_bytes(dir + "/dict.pt");
  try {
    const c10::IValue value =
        torch::pickle_load(std::vector<char>(state_dict.begin(), state_dict.end()));
    EXPECT_FALSE(value.isGenericDict()) << "torch::pickle_load now reads a state_dict";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("Expected GenericDict but got None"), std::string::npos)
        << e.what();
  }
  const c10::IValue value = torch::pickle_load(std::vector<char>(plain.begin(), plain.end()));
  ASSERT_TRUE(value.isGenericDict());
  EXPECT_EQ(value.toGenericDict().size(), 2u);
  const lesson10::Entries entries = lesson10::read_python_state_dict(dir + "/sd.pt");
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_TRUE(torch::equal(entries[0].second, value.toGenericDict().at("weight").toTensor()));
}

// Tests that Python's torch.load(weights_only=True) + load_state_dict accept what C++ writes,
// and that Python then measures the accuracy C++ measured.
TEST_F(PythonTest, PythonLoadsWhatCppWrites) {
  Progress progress = fresh_progress(kSamples);
  lesson11::Trainer trainer = lesson11::make_trainer(kCpu, lesson10::kSeed);
  auto loader = lesson11::make_loader("batches", lesson11::take(train(), kSamples),
                                      lesson10::kBatchSize, kCpu);
  lesson10::train_to(trainer, progress, 1, *loader, kCpu, "");
  const std::string path = scratch.file("for_python.pt");
  lesson10::write_python_state_dict(trainer.model, path);
  std::string output;
  ASSERT_EQ(python(roundtrip() + " load " + path, output), 0) << output;
  EXPECT_NEAR(accuracy_in(output), lesson11::evaluate(trainer.model, test(), kCpu), 1e-4) << output;
}

// Tests the other forms Python may write: a plain dict loads; a list, a legacy (non-zip) file,
// a state_dict of another model and a CUDA-less map of a tensor are clear errors.
TEST_F(PythonTest, OtherPythonFiles) {
  const std::string dir = scratch.path().string();
  std::string output;
  const std::string script =
      "import sys, torch; d = sys.argv[1]; torch.manual_seed(0)\n"
      "class M(torch.nn.Module):\n"
      "  def __init__(s, h=128):\n"
      "    super().__init__(); s.fc1 = torch.nn.Linear(784, h); s.fc2 = torch.nn.Linear(h, 64);"
      " s.fc3 = torch.nn.Linear(64, 10)\n"
      "sd = M().state_dict()\n"
      "torch.save(dict(sd), d + '/plain.pt')\n"
      "torch.save(list(sd.values()), d + '/list.pt')\n"
      "torch.save(sd, d + '/legacy.pt', _use_new_zipfile_serialization=False)\n"
      "torch.save(M(256).state_dict(), d + '/wide.pt')\n"
      "torch.save({'fc1.weight': 3, 'fc1.bias': 4}, d + '/number.pt')\n";
  write_bytes(dir + "/make.py", script);
  ASSERT_EQ(python(dir + "/make.py " + dir, output), 0) << output;
  lesson11::Mlp model;
  lesson10::load_entries(model, lesson10::read_python_state_dict(dir + "/plain.pt"), "plain.pt");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"list.pt", "not a state_dict"},
      {"legacy.pt", "not a state_dict saved by torch.save"},
      {"number.pt", "not a tensor"}};
  for (const auto& [name, expected] : bad) {
    try {
      lesson10::read_python_state_dict(dir + "/" + name);
      ADD_FAILURE() << name << " was read";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
      EXPECT_NE(e.hint().find("torch.save(model.state_dict()"), std::string::npos);
    }
  }
  const torch::Tensor before = lesson11::flatten_parameters(*model).values.clone();
  try {
    lesson10::load_entries(model, lesson10::read_python_state_dict(dir + "/wide.pt"), "wide.pt");
    ADD_FAILURE() << "wide.pt was loaded";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("'fc1.weight' is [256, 784]"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(torch::equal(lesson11::flatten_parameters(*model).values, before));
}

}  // namespace
