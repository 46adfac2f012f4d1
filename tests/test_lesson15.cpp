// Tests of lesson 15, untrusted checkpoints: bad checkpoints refused with the model untouched, one
// flipped bit found by the checksum, damage everywhere refused or harmless, tensors reaching past
// their storage and the fuzzer's files refused before LibTorch reads them; and the lesson's three
// parts, as its program runs them.
#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

// The lessons' main files have their own main(); the tests include them for their functions.
#define GPU_LESSONS_NO_MAIN
#include "exact_resume.cpp"
#include "resume_test.h"
#include "untrusted_checkpoints.cpp"

namespace {

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
  lesson14::save_checkpoint(trained, progress, kCpu, scratch.file("wider.pt"), wider);
  cases.emplace_back(scratch.file("wider.pt"), "'fc1.weight' is [256, 784]");
  course::StateDict doubled = course::state_dict(*trained.model);
  doubled[5].second = doubled[5].second.to(torch::kDouble);
  lesson14::save_checkpoint(trained, progress, kCpu, scratch.file("double.pt"), doubled);
  cases.emplace_back(scratch.file("double.pt"), "Double in the file");
  course::StateDict fewer = course::state_dict(*trained.model);
  fewer.erase(fewer.begin() + 2);
  lesson14::save_checkpoint(trained, progress, kCpu, scratch.file("fewer.pt"), fewer);
  cases.emplace_back(scratch.file("fewer.pt"), "has no 'fc2.weight'");
  course::StateDict more = course::state_dict(*trained.model);
  more.emplace_back("fc4.bias", torch::zeros({10}));
  lesson14::save_checkpoint(trained, progress, kCpu, scratch.file("more.pt"), more);
  cases.emplace_back(scratch.file("more.pt"), "has 'fc4.bias'");
  course::write_python_state_dict(course::state_dict(*trained.model),
                                  scratch.file("state_dict.pt"));
  cases.emplace_back(scratch.file("state_dict.pt"), "Python's torch.save format");
  torch::serialize::OutputArchive other;  // a LibTorch archive, but not a checkpoint
  other.write("weights", torch::zeros({3}));
  other.save_to(scratch.file("other.pt"));
  cases.emplace_back(scratch.file("other.pt"), "has no 'format'");

  for (const auto& [path, expected] : cases) {
    Training victim = lesson14::new_training(kCpu, lesson14::kSeed + 7);
    const std::vector<torch::Tensor> before = copy_of(victim);
    try {
      lesson14::load_checkpoint(victim, kCpu, path);
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
  torch::serialize::InputArchive archive = lesson14::open_archive(flipped, kCpu), model_state_dict;
  ASSERT_TRUE(archive.try_read("model_state_dict", model_state_dict));
  torch::Tensor read;
  for (const auto& [name, tensor] : course::archive_tensors(model_state_dict)) {
    if (name == "fc1.weight") read = tensor;
  }
  ASSERT_TRUE(read.defined());
  EXPECT_EQ(torch::ne(read, weight).sum().item<std::int64_t>(), 1);  // read, and changed
  Training victim = lesson14::new_training(kCpu, lesson14::kSeed + 1);
  try {
    lesson14::load_checkpoint(victim, kCpu, flipped);
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
    Training victim = lesson14::new_training(kCpu, lesson14::kSeed + 3);
    const std::vector<torch::Tensor> before = copy_of(victim);
    try {
      lesson14::load_checkpoint(victim, kCpu, damaged);
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
  Training victim = lesson14::new_training(kCpu, lesson14::kSeed + 1);
  const std::vector<torch::Tensor> before = copy_of(victim);
  for (const bool checkpoint : {true, false}) {
    try {
      if (checkpoint) {
        lesson14::load_checkpoint(victim, kCpu, scratch.file("stretched.pt"));
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
  Training victim = lesson14::new_training(kCpu, lesson14::kSeed + 1);
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
          lesson14::load_checkpoint(victim, kCpu, file);
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

// Tests the lesson's three parts as its program runs them, on the CPU: every check passes (a good
// file loads; the bad ones, the flipped bit and the fuzzer's files are refused).
TEST(Program, EveryPartPasses) {
  Scratch scratch;
  course::Verdict verdict;
  Training run = lesson15::one_step(kCpu, lesson15::kSeed);
  lesson15::refuse_bad_files(verdict, scratch.path(), run, kCpu, lesson15::kSeed);
  lesson15::flip_one_bit(verdict, scratch.path(), run, kCpu, lesson15::kSeed);
  lesson15::fuzzer_findings(verdict, scratch.path(), kCpu, lesson15::kSeed);
  EXPECT_EQ(verdict.checks(), 4);
  EXPECT_TRUE(verdict.passed());
}

// Tests that try_load says nothing of a good file and finds the run changed by it, and names a
// refused file without its folder, with its HINT, the run untouched.
TEST(Program, TryLoadReportsWhatHappened) {
  Scratch scratch;
  Training run = lesson15::one_step(kCpu, lesson15::kSeed);
  lesson14::save_checkpoint(run, Progress{}, kCpu, scratch.file("good.pt"));
  const lesson15::Attempt good = lesson15::try_load(scratch.file("good.pt"), kCpu, 3);
  EXPECT_EQ(good.refusal, "");
  EXPECT_FALSE(good.untouched);
  write_bytes(scratch.file("empty.pt"), "");
  const lesson15::Attempt empty = lesson15::try_load(scratch.file("empty.pt"), kCpu, 3);
  EXPECT_NE(empty.refusal.find("empty.pt"), std::string::npos) << empty.refusal;
  EXPECT_EQ(empty.refusal.find(scratch.path().string()), std::string::npos) << empty.refusal;
  EXPECT_TRUE(empty.untouched);
  EXPECT_FALSE(empty.hint.empty());
}

}  // namespace
