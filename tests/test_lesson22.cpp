// Tests of lesson 22: packages that Python really compiled (the tutorial's program with --export,
// and a script of its own that knows nothing of the course), loaded with the lesson's Package and
// held against the eager ANN and Python's accuracy; each bad input a CourseError; on a LibTorch
// without AOTInductor, the lesson waived.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>

// The lesson is one file with its own main(); the tests include it for its functions.
#define GPU_LESSONS_NO_MAIN
#include "aot_inductor.cpp"
#include "common/temporary_folder.h"
#include "fashion_mnist_test.h"
#include "program_run.h"

#ifdef LESSON22_WITH_AOTI
namespace {

// The packages, made once for all the tests in the build's packages/ folder (CTest makes them
// first: the lesson's smoke run makes its own, tests/CMakeLists.txt runs the script): the lesson's
// own (the tutorial's program, --quick) and the two of tests/lesson22_packages.py, with the test
// accuracy that script printed for its weights. A test binary run by itself makes what is missing.
class Lesson22 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (lesson22::python().empty() || fashion_mnist(nullptr) == nullptr) return;
    const std::filesystem::path folder = LESSON22_PACKAGES_DIR;
    try {
      made_ = new lesson22::Made(lesson22::make_package(folder, torch::kCPU, true, false));
    } catch (const course::CourseError& e) {
      why_ = e.what();
      return;
    }
    elsewhere_ = (folder / "elsewhere").string();
    if (!std::filesystem::exists(elsewhere("accuracy.txt"))) {
      std::filesystem::create_directories(elsewhere_);
      course::ChildProcess script({lesson22::python(), LESSON22_PACKAGES_SCRIPT, elsewhere_}, {},
                                  false);
      script.read_rest();
      script.wait_for(std::chrono::minutes(10));
    }
    std::ifstream said(elsewhere("accuracy.txt"));  // "Test Accuracy: 0.xxxx", as Python printed it
    std::string line;
    std::smatch m;
    if (std::getline(said, line) &&
        std::regex_match(line, m, std::regex("^Test Accuracy: ([0-9.]+)$")))
      elsewhere_accuracy_ = std::stod(m[1]);
    script_ok_ = elsewhere_accuracy_ > 0 && std::filesystem::exists(elsewhere("batch64.pt2"));
    if (!script_ok_) why_ = "tests/lesson22_packages.py made no packages in " + elsewhere_;
  }
  static void TearDownTestSuite() { delete made_; }
  void SetUp() override {
    std::string why;
    if (fashion_mnist(&why) == nullptr) GTEST_SKIP() << why;
    if (lesson22::python().empty()) GTEST_SKIP() << "no Python with this LibTorch's torch";
    ASSERT_TRUE(script_ok_) << why_;
  }
  static const course::ImageSet& test_set() { return fashion_mnist(nullptr)->test; }
  static std::string elsewhere(const char* name) { return elsewhere_ + "/" + name; }

  static std::string elsewhere_;
  static lesson22::Made* made_;
  static double elsewhere_accuracy_;
  static bool script_ok_;
  static std::string why_;
};
std::string Lesson22::elsewhere_;
lesson22::Made* Lesson22::made_ = nullptr;
double Lesson22::elsewhere_accuracy_ = -1;
bool Lesson22::script_ok_ = false;
std::string Lesson22::why_;

// The package's logits on `device` for the whole test set, in the tutorial's batches.
torch::Tensor package_logits(lesson22::Package& package, const course::ImageSet& test) {
  torch::NoGradGuard no_grad;
  return lesson22::in_batches([&](const torch::Tensor& x) { return package.logits(x); },
                              test.images, lesson22::kBatchSize);
}

}  // namespace

// Tests that the package Python compiled computes what its weights compute in lesson 05's ANN,
// loaded from the state_dict saved beside it (lesson 10's route), and that its accuracy is the
// one Python printed and kept in the package's metadata.
TEST_F(Lesson22, PackageComputesTheEagerANNsLogitsAndPythonsAccuracy) {
  lesson22::Package package(made_->package, torch::kCPU);
  const auto logits = package_logits(package, test_set());
  auto eager = lesson22::eager_model(made_->state_dict, torch::kCPU);
  torch::NoGradGuard no_grad;
  const auto eager_logits = eager->forward(test_set().images.unsqueeze(1));
  const auto a = lesson22::compare(logits, eager_logits);
  EXPECT_LE(a.rel_diff, course::tolerance_for(torch::kFloat));
  EXPECT_EQ(a.unexplained, 0);
  ASSERT_FALSE(package.metadata("test_accuracy").empty());
  EXPECT_NEAR(lesson22::accuracy(logits, test_set().labels),
              std::stod(package.metadata("test_accuracy")), 0.5e-4 + 1e-4);
  EXPECT_EQ(package.metadata("AOTI_DEVICE_KEY"), "cpu");
  EXPECT_EQ(package.metadata("AOTI_MACHINE"), "x86_64");  // what it was compiled for
  EXPECT_FALSE(package.metadata("AOTI_CPU_ISA").empty());
  // What the zip holds: the generated C++ and the library compiled from it (the weights inside).
  caffe2::serialize::PyTorchStreamReader zip(made_->package);
  int sources = 0, libraries = 0;
  for (const auto& name : zip.getAllRecords()) {
    sources += name.size() > 12 && name.compare(name.size() - 12, 12, ".wrapper.cpp") == 0;
    libraries += name.size() > 11 && name.compare(name.size() - 11, 11, ".wrapper.so") == 0;
  }
  EXPECT_EQ(sources, 1);
  EXPECT_EQ(libraries, 1);
}

// Tests that the comparison can fail: other weights give other logits and unexplained predictions.
TEST_F(Lesson22, ComparisonCatchesOtherWeights) {
  lesson22::Package ours(made_->package, torch::kCPU),
      theirs(elsewhere("dynamic.pt2"), torch::kCPU);
  const auto a =
      lesson22::compare(package_logits(theirs, test_set()), package_logits(ours, test_set()));
  EXPECT_GT(a.rel_diff, 0.01);
  EXPECT_GT(a.unexplained, 100);
}

// Tests that a package made outside the course (its own script, other weights, no metadata) loads,
// takes a batch of 2 or more, refuses a batch of 1 (its lower bound, which the course's own
// package leaves out), and scores the test set as Python scored it.
TEST_F(Lesson22, PackageMadeElsewhereScoresWhatPythonScored) {
  lesson22::Package package(elsewhere("dynamic.pt2"), torch::kCPU);
  EXPECT_TRUE(package.metadata("test_accuracy").empty());
  for (const std::int64_t batch : {2, 7, 64, 1000})
    EXPECT_EQ(package.logits(test_set().images.slice(0, 0, batch)).size(0), batch);
  EXPECT_THROW(package.logits(test_set().images.slice(0, 0, 1)), course::CourseError);
  lesson22::Package ours(made_->package, torch::kCPU);
  EXPECT_EQ(ours.logits(test_set().images.slice(0, 0, 1)).size(0), 1);
  ASSERT_GT(elsewhere_accuracy_, 0);
  EXPECT_NEAR(lesson22::accuracy(package_logits(package, test_set()), test_set().labels),
              elsewhere_accuracy_, 0.5e-4 + 1e-4);
}

// Tests that a package exported for batches of 64 alone answers a batch of 64 and refuses a batch
// of 100 when AOTI_RUNTIME_CHECK_INPUTS is set (the lesson sets it); without it, the package's
// code runs on the 100 images and answers 64 rows, which the lesson's own check of the answer's
// shape catches.
TEST_F(Lesson22, PackageMadeForOneBatchSizeRefusesAnother) {
  const auto error_for = [&](lesson22::Package& package) -> std::string {
    try {
      package.logits(test_set().images.slice(0, 0, 100));
      return "";
    } catch (const course::CourseError& e) {
      return e.what();
    }
  };
  lesson22::Package checked(elsewhere("batch64.pt2"), torch::kCPU);
  EXPECT_EQ(checked.logits(test_set().images.slice(0, 0, 64)).size(0), 64);
  EXPECT_NE(error_for(checked).find("refused a [100, 1, 28, 28]"), std::string::npos);
  // A second load is a second copy of the package's code, which reads the variable anew.
  lesson22::Package unchecked(elsewhere("batch64.pt2"), torch::kCPU);
  unsetenv("AOTI_RUNTIME_CHECK_INPUTS");
  const std::string error = error_for(unchecked);
  setenv("AOTI_RUNTIME_CHECK_INPUTS", "1", 1);
  EXPECT_NE(error.find("answered a batch of 100 with [64, 10]"), std::string::npos) << error;
}

// Tests each file that is not a package for this run: missing, a torch.save file, cut short,
// compiled for another device. Each a CourseError naming the file, never a crash.
TEST_F(Lesson22, FilesThatAreNotAPackageForThisRunAreClearErrors) {
  const auto refused = [](const std::string& path, const torch::Device& device, const char* says) {
    try {
      lesson22::Package package(path, device);
      ADD_FAILURE() << path << " loaded";
    } catch (const course::CourseError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
      EXPECT_FALSE(e.hint().empty());
    }
  };
  course::TemporaryFolder folder("lesson22-test-");
  refused(folder.file("absent.pt2"), torch::kCPU, "no package");
  refused(made_->state_dict, torch::kCPU, "is not an AOTInductor package");
  std::string bytes;
  {
    std::ifstream in(made_->package, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::ofstream(folder.file("cut.pt2"), std::ios::binary).write(bytes.data(), 4000);
  refused(folder.file("cut.pt2"), torch::kCPU, "is not an AOTInductor package");
  refused(made_->package, torch::Device(torch::kCUDA, 0),
          "was compiled for cpu, this run is on cuda");
  // A CUDA package on the CPU: the same package, its metadata saying "cuda" (a real one's code
  // cannot even be loaded without a CUDA driver: the check comes before the loader).
  {
    caffe2::serialize::PyTorchStreamReader in(made_->package);
    caffe2::serialize::PyTorchStreamWriter out(folder.file("cuda.pt2"));
    for (const auto& name : in.getAllRecords()) {
      const auto [bytes, size] = in.getRecord(name);
      std::string data(static_cast<const char*>(bytes.get()), size);
      if (name.find("wrapper_metadata.json") != std::string::npos)
        data.replace(data.find("\"cpu\""), 5, "\"cuda\"");
      out.writeRecord(name, data.data(), data.size());
    }
    out.writeEndOfFile();
  }
  EXPECT_EQ(lesson22::compiled_for(folder.file("cuda.pt2")), "cuda");
  refused(folder.file("cuda.pt2"), torch::kCPU, "was compiled for cuda, this run is on cpu");
}

// Tests that the lesson has loaded the libtorch.so of its own LibTorch, which a package's code
// needs by that name.
TEST(Lesson22Link, LibtorchOfThisLibTorchIsLoaded) {
  EXPECT_NO_THROW(lesson22::check_libtorch_loaded());
}

// Tests that a Python that cannot be started is a clear error with a HINT.
TEST(Lesson22Python, PythonThatCannotStartIsAClearError) {
  course::TemporaryFolder folder("lesson22-python-");
  setenv("GPU_LESSONS_PYTHON", "/nonexistent/python3", 1);
  EXPECT_THROW(lesson22::make_package(folder.path(), torch::kCPU, true, true), course::CourseError);
  unsetenv("GPU_LESSONS_PYTHON");
}

#else
// Tests that on a LibTorch without AOTInductor the lesson is waived (exit 77) and says what it
// needs.
TEST(Lesson22Waived, WaivedWithWhatItNeeds) {
  const auto run = run_program({built_program(LESSON22_BINARY), "--device", "cpu"});
  EXPECT_EQ(run.exit_code, course::kExitWaived);
  EXPECT_NE(run.output.find("needs 2.6 or newer"), std::string::npos) << run.output;
}
#endif
