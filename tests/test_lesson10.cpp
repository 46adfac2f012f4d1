// Tests of lesson 10, the tutorial's recipe: torch::save and torch::load onto a device (the weights
// and the test accuracy equal; storages recorded on cuda:0 loaded on the CPU; both ways on a real
// GPU), a checkpoint of model, Adam and epoch that resumes, bad files refused with a HINT, and the
// tutorial program's files from Python's real torch, both ways (skipped where none is installed).
#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>

// The lesson is one file with its own main(); the tests include it for its functions.
#define GPU_LESSONS_NO_MAIN
#include "checkpoint_cli.h"
#include "checkpoint_zip.h"
#include "checkpointing.cpp"
#include "cuda_test.h"
#include "fashion_mnist_test.h"
#include "program_run.h"
#include "scratch_files.h"

namespace {

namespace fs = std::filesystem;
using course::CheckpointError;
using lesson10::ANN;

constexpr std::int64_t kSamples = 2000;  // a few dozen steps per epoch: seconds, not minutes
const torch::Device kCpu(torch::kCPU);

std::unique_ptr<torch::optim::Adam> adam_for(ANN& model) {
  return std::make_unique<torch::optim::Adam>(model->parameters(),
                                              torch::optim::AdamOptions(lesson10::kLearningRate));
}

// A model on the CPU from the lesson's seed, trained one epoch on the first kSamples images with
// the lesson's loaders and loop.
class CheckpointTest : public FashionMnistTest {
 protected:
  void SetUp() override {
    FashionMnistTest::SetUp();
    if (IsSkipped()) return;
    torch::manual_seed(lesson10::kSeed);
    model = ANN();
    optimizer = adam_for(model);
    train_loader = lesson10::make_train_loader(course::FashionMNIST(course::ImageSet{
        train().images.slice(0, 0, kSamples), train().labels.slice(0, 0, kSamples)}));
    test_loader = lesson10::make_test_loader(course::FashionMNIST(test()));
  }
  // Trains `model` from `epoch` to `epochs`, saving the checkpoint at `path` after each.
  void train_to(std::int64_t& epoch, int epochs, const std::string& path) {
    lesson10::train_to(model, *optimizer, *train_loader, kCpu, epoch, epochs, path);
  }
  double accuracy(ANN& m) { return lesson10::evaluate(m, *test_loader, kCpu); }

  ANN model{nullptr};
  std::unique_ptr<torch::optim::Adam> optimizer;
  std::unique_ptr<lesson10::TrainLoader> train_loader;
  std::unique_ptr<lesson10::TestLoader> test_loader;
  Scratch scratch;
};

// Tests torch::save and torch::load: a fresh model gets the trained weights exactly, on the
// device asked for, and the same test accuracy.
TEST_F(CheckpointTest, SaveAndLoadGiveTheSameWeightsAndAccuracy) {
  std::int64_t epoch = 0;
  train_to(epoch, 1, scratch.file("run.pt"));
  lesson10::save_weights(model, scratch.file("model.pt"));
  ANN loaded;
  lesson10::load_weights(loaded, scratch.file("model.pt"), kCpu);
  EXPECT_EQ(course::max_abs_diff(loaded->parameters(), model->parameters()), 0.0);
  EXPECT_TRUE(loaded->out->bias.device().is_cpu());
  EXPECT_EQ(accuracy(loaded), accuracy(model));
  EXPECT_GT(accuracy(loaded), 0.5);
}

// Tests map_location without a GPU: a file whose storages say cuda:0 (as a GPU run's do) loads
// onto the CPU with the device given to torch::load. (On a GPU,
// CudaTest.WeightsMoveBetweenCpuAndCuda saves a real one.)
TEST_F(CheckpointTest, StoragesRecordedOnCudaLoadOnTheCpu) {
  lesson10::save_weights(model, scratch.file("cpu.pt"));
  tag_storages_cuda(scratch.file("cpu.pt"), scratch.file("cuda.pt"));
  ANN loaded;
  lesson10::load_weights(loaded, scratch.file("cuda.pt"), kCpu);
  EXPECT_EQ(course::max_abs_diff(loaded->parameters(), model->parameters()), 0.0);
  ANN resumed;
  auto resumed_optimizer = adam_for(resumed);
  std::int64_t epoch = 0;
  train_to(epoch, 1, scratch.file("run.pt"));
  tag_storages_cuda(scratch.file("run.pt"), scratch.file("run-cuda.pt"));
  EXPECT_EQ(
      lesson10::load_checkpoint(resumed, *resumed_optimizer, scratch.file("run-cuda.pt"), kCpu), 1);
  EXPECT_EQ(course::max_state_diff(*resumed, *resumed_optimizer, *model, *optimizer), 0.0);
  EXPECT_TRUE(
      course::adam_state(*resumed_optimizer, resumed->fc1->weight)->exp_avg().device().is_cpu());
}

// Tests the checkpoint: a fresh ANN and Adam get the model, Adam's moments and step counts and the
// epoch back, and training goes on from the next epoch, saving it.
TEST_F(CheckpointTest, CheckpointResumesModelAdamAndEpoch) {
  std::int64_t epoch = 0;
  train_to(epoch, 1, scratch.file("run.pt"));
  ANN resumed;
  auto resumed_optimizer = adam_for(resumed);
  std::int64_t saved =
      lesson10::load_checkpoint(resumed, *resumed_optimizer, scratch.file("run.pt"), kCpu);
  EXPECT_EQ(saved, 1);
  EXPECT_EQ(course::max_state_diff(*resumed, *resumed_optimizer, *model, *optimizer), 0.0);
  const auto* state = course::adam_state(*resumed_optimizer, resumed->fc2->weight);
  ASSERT_NE(state, nullptr);
  EXPECT_EQ(state->step(), (kSamples + lesson10::kBatchSize - 1) / lesson10::kBatchSize);
  lesson10::train_to(resumed, *resumed_optimizer, *train_loader, kCpu, saved, 2,
                     scratch.file("run.pt"));
  EXPECT_EQ(saved, 2);
  ANN again;
  auto again_optimizer = adam_for(again);
  EXPECT_EQ(lesson10::load_checkpoint(again, *again_optimizer, scratch.file("run.pt"), kCpu), 2);
  EXPECT_EQ(course::max_state_diff(*again, *again_optimizer, *resumed, *resumed_optimizer), 0.0);
}

// A module of the tutorial's names with a wider first layer: another model's file.
struct WideImpl : torch::nn::Module {
  WideImpl()
      : fc1(register_module("fc1", torch::nn::Linear(28 * 28, 256))),
        fc2(register_module("fc2", torch::nn::Linear(256, 64))),
        out(register_module("out", torch::nn::Linear(64, 10))) {}
  torch::nn::Linear fc1, fc2, out;
};
TORCH_MODULE(Wide);

// Tests that bad files are refused with one line naming the file and a HINT, before LibTorch's
// reader or torch::load takes them: missing, empty, cut short, random bytes, another model's, a
// checkpoint where weights are wanted and the other way round, and Python's format.
TEST_F(CheckpointTest, BadFilesAreRefusedWithAHint) {
  std::int64_t epoch = 0;
  train_to(epoch, 1, scratch.file("run.pt"));
  lesson10::save_weights(model, scratch.file("model.pt"));
  const std::string bytes = read_bytes(scratch.file("model.pt"));
  write_bytes(scratch.file("empty.pt"), "");
  write_bytes(scratch.file("cut.pt"), bytes.substr(0, bytes.size() / 2));
  std::mt19937 random(3);
  std::string noise(bytes.size(), '\0');
  for (char& c : noise) c = static_cast<char>(random());
  write_bytes(scratch.file("noise.pt"), noise);
  std::string flipped = bytes;  // a bit of a tensor: the record's CRC-32 no longer matches
  flipped[bytes.size() / 2] ^= 0x10;
  write_bytes(scratch.file("flipped.pt"), flipped);
  Wide wide;
  torch::save(wide, scratch.file("wide.pt"));
  lesson10::save_python_weights(model, scratch.file("python.pt"));
  const std::vector<std::pair<std::string, std::string>> weights = {
      {"missing.pt", "no file at"},
      {"empty.pt", "not a readable LibTorch archive"},
      {"cut.pt", "not a readable LibTorch archive"},
      {"noise.pt", "not a readable LibTorch archive"},
      {"flipped.pt", "not a readable LibTorch archive"},
      {"wide.pt", "'fc1.weight' is [256, 784]"},
      {"run.pt", "has no 'fc1.weight'"},
      {"python.pt", "Python's torch.save format"}};
  for (const auto& [name, expected] : weights) {
    ANN victim;
    const torch::Tensor before = victim->fc1->weight.detach().clone();
    try {
      lesson10::load_weights(victim, scratch.file(name), kCpu);
      ADD_FAILURE() << name << " loaded";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(scratch.file(name)), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
      EXPECT_FALSE(e.hint().empty()) << name;
    }
    EXPECT_TRUE(torch::equal(victim->fc1->weight, before)) << name << " changed the model";
  }
  const std::vector<std::pair<std::string, std::string>> checkpoints = {
      {"noise.pt", "not a readable LibTorch archive"},
      {"model.pt", "not a checkpoint of this lesson"},
      {"python.pt", "--from-python"}};
  for (const auto& [name, expected] : checkpoints) {
    ANN victim;
    auto victim_optimizer = adam_for(victim);
    try {
      lesson10::load_checkpoint(victim, *victim_optimizer, scratch.file(name), kCpu);
      ADD_FAILURE() << name << " loaded";
    } catch (const CheckpointError& e) {
      EXPECT_NE((std::string(e.what()) + e.hint()).find(expected), std::string::npos) << e.what();
    }
  }
}

// Tests that a CUDA file loads on the CPU and a CPU file on CUDA, with torch::load and with the
// checkpoint, Adam's state following the parameters.
TEST_F(CudaTest, WeightsMoveBetweenCpuAndCuda) {
  Scratch scratch;
  ANN on_gpu;
  on_gpu->to(device);
  auto optimizer = adam_for(on_gpu);
  const auto labels = torch::TensorOptions(device).dtype(torch::kLong);  // a device alone: floats
  torch::nn::functional::cross_entropy(on_gpu->forward(torch::rand({64, 1, 28, 28}, device)),
                                       torch::randint(0, 10, {64}, labels))
      .backward();
  optimizer->step();
  lesson10::save_weights(on_gpu, scratch.file("gpu.pt"));
  lesson10::save_checkpoint(on_gpu, *optimizer, 1, scratch.file("gpu-run.pt"));
  ANN on_cpu;
  lesson10::load_weights(on_cpu, scratch.file("gpu.pt"), kCpu);
  EXPECT_TRUE(on_cpu->fc1->weight.device().is_cpu());
  EXPECT_EQ(course::max_abs_diff(on_cpu->parameters(), on_gpu->parameters()), 0.0);
  ANN resumed;  // on the CPU
  auto resumed_optimizer = adam_for(resumed);
  EXPECT_EQ(
      lesson10::load_checkpoint(resumed, *resumed_optimizer, scratch.file("gpu-run.pt"), kCpu), 1);
  EXPECT_EQ(course::max_state_diff(*resumed, *resumed_optimizer, *on_gpu, *optimizer), 0.0);
  EXPECT_TRUE(
      course::adam_state(*resumed_optimizer, resumed->fc1->weight)->exp_avg().device().is_cpu());
  lesson10::save_weights(on_cpu, scratch.file("cpu.pt"));
  ANN back;
  lesson10::load_weights(back, scratch.file("cpu.pt"), device);
  EXPECT_EQ(back->fc1->weight.device(), device);
  EXPECT_EQ(course::max_abs_diff(back->parameters(), on_cpu->parameters()), 0.0);
}

// ---- Python ------------------------------------------------------------------------------------
// Files made and read by the real Python torch whose version matches this LibTorch, through the
// tutorial's own program (python/tutorial_program.py).
class PythonTest : public CheckpointTest {
 protected:
  void SetUp() override {
    if (test_python(LESSON10_PYTHON).empty()) GTEST_SKIP() << "no Python with torch found";
    CheckpointTest::SetUp();
  }
  // Runs Python with `args`; its exit code and output.
  static int python(const std::string& args, std::string& output) {
    const std::string command = test_python(LESSON10_PYTHON) + " " + args + " 2>&1";
    FILE* pipe = ::popen(command.c_str(), "r");
    output.clear();
    char buffer[4096];
    while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) output += buffer;
    return WEXITSTATUS(::pclose(pipe));
  }
  static double accuracy_in(const std::string& output) {
    std::smatch match;
    if (!std::regex_search(output, match, std::regex("Test Accuracy: ([0-9.]+)"))) return -1;
    return std::stod(match[1]);
  }
  static std::string program() {
    return source_file(LESSON10_TUTORIAL_PROGRAM, "python/tutorial_program.py");
  }
};

// One test image in the 10,000: what two builds of the same arithmetic may disagree on (a tie
// broken the other way), and the difference printing with four digits allows.
constexpr double kOneImage = 1e-4;

// Tests that the file the tutorial's program saves (torch.save(model.state_dict())) loads, and
// gives the accuracy Python printed.
TEST_F(PythonTest, LoadsTheTutorialProgramsFileAtPythonsAccuracy) {
  const std::string path = scratch.file("model.pt");
  std::string output;
  ASSERT_EQ(
      python(program() + " --epochs 1 --limit " + std::to_string(kSamples) + " --save " + path,
             output),
      0)
      << output;
  const double python_accuracy = accuracy_in(output);
  ASSERT_GT(python_accuracy, 0.3) << output;
  const course::StateDict tensors = course::read_python_state_dict(path);
  ASSERT_EQ(tensors.size(), 6u);
  EXPECT_EQ(tensors[0].first, "fc1.weight");
  EXPECT_EQ(tensors[5].first, "out.bias");
  ANN loaded;
  lesson10::load_python_weights(loaded, path);
  EXPECT_NEAR(accuracy(loaded), python_accuracy, kOneImage) << output;
}

// Tests that Python's torch.load(weights_only=True) + load_state_dict accept what C++ writes, and
// that Python then measures the accuracy C++ measured.
TEST_F(PythonTest, PythonLoadsWhatCppWritesAtCppsAccuracy) {
  std::int64_t epoch = 0;
  train_to(epoch, 1, scratch.file("run.pt"));
  const std::string path = scratch.file("for_python.pt");
  lesson10::save_python_weights(model, path);
  std::string output;
  ASSERT_EQ(python(program() + " --load " + path, output), 0) << output;
  EXPECT_NEAR(accuracy_in(output), accuracy(model), kOneImage) << output;
}

// Tests why the pickle is rewritten: LibTorch's own torch::pickle_load fails on a state_dict file
// (an OrderedDict), and reads the same tensors saved as a plain dict.
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
  const course::StateDict tensors = course::read_python_state_dict(dir + "/sd.pt");
  ASSERT_EQ(tensors.size(), 2u);
  EXPECT_TRUE(torch::equal(tensors[0].second, value.toGenericDict().at("weight").toTensor()));
}

// Tests the other forms Python may write: a plain dict loads; a list, a legacy (non-zip) file, a
// dict holding a number and a state_dict of another model are clear errors, the model untouched.
TEST_F(PythonTest, OtherPythonFiles) {
  const std::string dir = scratch.path().string();
  std::string output;
  const std::string script =
      "import sys, torch; d = sys.argv[1]; torch.manual_seed(0)\n"
      "class M(torch.nn.Module):\n"
      "  def __init__(s, h=128):\n"
      "    super().__init__(); s.fc1 = torch.nn.Linear(784, h); s.fc2 = torch.nn.Linear(h, 64);"
      " s.out = torch.nn.Linear(64, 10); s.relu = torch.nn.ReLU()\n"
      "sd = M().state_dict()\n"
      "torch.save(dict(sd), d + '/plain.pt')\n"
      "torch.save(list(sd.values()), d + '/list.pt')\n"
      "torch.save(sd, d + '/legacy.pt', _use_new_zipfile_serialization=False)\n"
      "torch.save(M(256).state_dict(), d + '/wide.pt')\n"
      "torch.save({'fc1.weight': 3, 'fc1.bias': 4}, d + '/number.pt')\n";
  write_bytes(dir + "/make.py", script);
  ASSERT_EQ(python(dir + "/make.py " + dir, output), 0) << output;
  ANN loaded;
  lesson10::load_python_weights(loaded, dir + "/plain.pt");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"list.pt", "not a state_dict"},
      {"legacy.pt", "not a state_dict saved by torch.save"},
      {"number.pt", "not a tensor"}};
  for (const auto& [name, expected] : bad) {
    try {
      course::read_python_state_dict(dir + "/" + name);
      ADD_FAILURE() << name << " was read";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
      EXPECT_NE(e.hint().find("torch.save(model.state_dict()"), std::string::npos);
    }
  }
  const torch::Tensor before = loaded->fc1->weight.detach().clone();
  try {
    lesson10::load_python_weights(loaded, dir + "/wide.pt");
    ADD_FAILURE() << "wide.pt was loaded";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("'fc1.weight' is [256, 784]"), std::string::npos)
        << e.what();
    EXPECT_NE(e.hint().find("fc1, fc2, out"), std::string::npos) << e.hint();
  }
  EXPECT_TRUE(torch::equal(loaded->fc1->weight, before));
}

// ---- on the command line: the lesson's program (LESSON10_BINARY), as a learner runs it -------
// Tests a run resumed across processes: --epochs 1, then --epochs 2 in a new process resumes from
// epoch 1, then --epochs 2 again has nothing left to train; each passes.
TEST(Cli, ResumeInANewProcess) { expect_resume_in_a_new_process(built_program(LESSON10_BINARY)); }

// Tests that a checkpoint of random bytes stops the run with exit 2 and a HINT.
TEST(Cli, CorruptCheckpoint) { expect_corrupt_checkpoint_refused(built_program(LESSON10_BINARY)); }

// Tests that --from-python of a file that does not exist stops with exit 2 and a HINT.
TEST(Cli, MissingPythonFile) {
  Scratch dir;
  const ProgramRun run = run_program(
      {built_program(LESSON10_BINARY), "--quick", "--from-python", dir.file("none.pt")});
  EXPECT_EQ(run.exit_code, 2) << run.what();
  EXPECT_TRUE(run.printed("HINT: save it in Python")) << run.what();
}

// Tests that --checkpoint in a folder that does not exist stops with exit 2 before any training.
TEST(Cli, UnwritableFolder) { expect_unwritable_folder_refused(built_program(LESSON10_BINARY)); }

// Tests that --help lists the lesson's flags.
TEST(Cli, Help) {
  const ProgramRun run = run_program({built_program(LESSON10_BINARY), "--help"});
  EXPECT_EQ(run.exit_code, 0) << run.what();
  for (const char* flag : {"--from-python", "--to-python", "--checkpoint"}) {
    EXPECT_TRUE(run.printed(flag)) << flag << " is not in " << run.what();
  }
}

}  // namespace
