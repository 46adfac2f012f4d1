// Tests of what the course's programs promise on the command line, each program run as a learner
// runs it (tests/program_run.h): --help exits 0 and a bad flag or device exits 2 (every lesson and
// exercise), a lesson that reads Fashion-MNIST exits 2 with a HINT when the data is not there, one
// that stops on Ctrl-C does so at the end of a step (exit 130, lessons 10 and 14 keeping their
// last whole epoch), lessons 09, 17 and 18 as real c10d jobs of processes on this host, started the
// way torchrun starts ranks (its environment variables), so that CI needs no launcher, and the
// tutorial's Python program on torchvision's dataset and on its own. The programs come from the
// lesson registry (programs.inc, written by tests/CMakeLists.txt).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "common/child_process.h"  // defines: ChildProcess
#include "program_run.h"           // defines: ProgramRun, run_program, program_ended, joined
#include "scratch_files.h"         // defines: Scratch

namespace {

struct Program {
  const char* name;  // lessonNN_name or exercise_name
  const char* path;
  bool reads_data;       // gpu_lessons_add_lesson's READS_DATA
  bool stops_on_ctrl_c;  // and STOPS_ON_CTRL_C
};
const std::vector<Program> kPrograms = {
#include "programs.inc"
};
std::vector<Program> programs_where(bool (*keep)(const Program&)) {
  std::vector<Program> kept;
  for (const Program& p : kPrograms)
    if (keep(p)) kept.push_back(p);
  return kept;
}
std::string lesson_path(const std::string& prefix) {  // "lesson09" -> its program
  for (const Program& p : kPrograms)
    if (std::string(p.name).rfind(prefix + "_", 0) == 0) return p.path;
  return "";
}
std::string program_name(const ::testing::TestParamInfo<Program>& info) { return info.param.name; }

// ---- every program ------------------------------------------------------------------------------
class EveryProgram : public ::testing::TestWithParam<Program> {
 protected:
  ProgramRun run(std::vector<std::string> args) {
    args.insert(args.begin(), GetParam().path);
    return run_program(args);
  }
};

// --help exits 0, and reads in a terminal of 100 columns: every line fits, and every flag's help
// starts on the flag's own line (none pushed onto a line of its own by a long type or range).
TEST_P(EveryProgram, HelpExitsZeroAndFitsOneHundredColumns) {
  const ProgramRun r = run({"--help"});
  EXPECT_EQ(r.exit_code, 0) << r.what();
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    EXPECT_LE(line.size(), 100u) << line;
    if (line.rfind("  -", 0) == 0) {  // "  --flag TYPE=default" in 30 columns, then its help
      EXPECT_TRUE(line.size() > 30 && line[29] == ' ' && line[30] != ' ')
          << "help not beside: " << line;
    }
  }
}
TEST_P(EveryProgram, UnknownDeviceExitsTwo) {
  const ProgramRun r = run({"--device", "banana"});
  EXPECT_EQ(r.exit_code, 2) << r.what();
}
TEST_P(EveryProgram, GpuIndexPastTheCountExitsTwo) {
  const ProgramRun r = run({"--device", "cuda:99"});
  EXPECT_EQ(r.exit_code, 2) << r.what();
}
TEST_P(EveryProgram, UnknownFlagExitsTwo) {
  const ProgramRun r = run({"--no-such-flag"});
  EXPECT_EQ(r.exit_code, 2) << r.what();
}
INSTANTIATE_TEST_SUITE_P(Programs, EveryProgram, ::testing::ValuesIn(kPrograms), program_name);

// ---- a lesson that reads Fashion-MNIST, without it ----------------------------------------------
class ReadsData : public EveryProgram {};
TEST_P(ReadsData, MissingDataExitsTwoWithAHint) {
  Scratch dir;
  const ProgramRun r = run({"--quick", "--data-dir", dir.file("no-such-folder")});
  EXPECT_EQ(r.exit_code, 2) << r.what();
  EXPECT_TRUE(r.printed("HINT:")) << r.what();
}
INSTANTIATE_TEST_SUITE_P(Programs, ReadsData,
                         ::testing::ValuesIn(programs_where([](const Program& p) {
                           return p.reads_data;
                         })),
                         program_name);

// ---- Ctrl-C during training ---------------------------------------------------------------------
// SIGINT, sent once the first epoch is done (and saved): the run stops at the end of the step under
// way, says so, and exits 130; lessons 10 and 14's checkpoint keeps the last whole epoch, no other
// file is left, and a second run resumes from it.
class StopsOnCtrlC : public EveryProgram {};
TEST_P(StopsOnCtrlC, StopsAtTheEndOfAStep) {
  const std::string name = GetParam().name, lesson = name.substr(0, 8);
  const bool checkpoints = lesson == "lesson10" || lesson == "lesson14";
  Scratch dir;
  std::vector<std::string> argv{GetParam().path, "--device", "cpu", "--quick", "--epochs", "100"};
  std::string first = "epoch 1/100";  // common/report.h's run_epochs
  if (lesson == "lesson05" || lesson == "lesson10") first = "Epoch 1, ";  // the tutorial's words
  if (checkpoints) argv.insert(argv.end(), {"--checkpoint", dir.file("run.pt")});
  if (lesson == "lesson11") argv.insert(argv.end(), {"--run", "tutorial"});
  course::ChildProcess child(argv, {}, /*with_stderr=*/true);
  std::string output, line;
  bool started = false;
  while (!started && child.read_line(line)) {
    output += line + "\n";
    started = line.find(first) != std::string::npos;
  }
  ASSERT_TRUE(started) << "ended before its first epoch:\n" << output;
  child.signal(SIGINT);
  const ProgramRun stopped = program_ended(child, output + joined(child.read_rest()));
  EXPECT_EQ(stopped.exit_code, 130) << "after SIGINT: " << stopped.what();
  EXPECT_TRUE(std::regex_search(stopped.output, std::regex("(^|\n)stopped \\(Ctrl-C\\): ")))
      << stopped.what();
  if (!checkpoints) return;
  EXPECT_TRUE(stopped.printed("holds epoch")) << stopped.what();
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
    EXPECT_EQ(entry.path().filename(), "run.pt") << "left behind";
  const ProgramRun resumed = run_program({GetParam().path, "--device", "cpu", "--quick",
                                          "--checkpoint", dir.file("run.pt"), "--epochs", "1"});
  EXPECT_EQ(resumed.exit_code, 0) << resumed.what();
  EXPECT_TRUE(resumed.printed("already at epoch")) << resumed.what();
}
INSTANTIATE_TEST_SUITE_P(Programs, StopsOnCtrlC,
                         ::testing::ValuesIn(programs_where([](const Program& p) {
                           return p.stops_on_ctrl_c;
                         })),
                         program_name);

// ---- lessons 09, 17 and 18 as jobs of processes -------------------------------------------------
int free_port() {  // one the kernel picks; free when this returns
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof(address);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), size) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) == 0)
    port = ntohs(address.sin_port);
  close(fd);
  return port;
}

// The ranks of one job on this host, each a process with the variables torchrun sets: ranks
// 0 .. `started` - 1 of `world_size` (fewer: a rank that never arrives).
class Job {
 public:
  Job(const std::string& binary, int world_size, std::vector<std::string> args,
      std::vector<std::string> environment = {}, int started = -1)
      : port_(std::to_string(free_port())) {
    for (int r = 0; r < (started < 0 ? world_size : started); ++r) {
      std::vector<std::string> env = environment;
      env.insert(env.end(), {"MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port_,
                             "WORLD_SIZE=" + std::to_string(world_size),
                             "LOCAL_WORLD_SIZE=" + std::to_string(world_size),
                             "RANK=" + std::to_string(r), "LOCAL_RANK=" + std::to_string(r)});
      std::vector<std::string> argv{binary};
      argv.insert(argv.end(), args.begin(), args.end());
      ranks_.push_back(std::make_unique<course::ChildProcess>(argv, env, true));
    }
  }
  // Every rank to its end: how each ended and what it printed.
  std::vector<ProgramRun> finish() {
    std::vector<std::future<std::vector<std::string>>> outputs;
    for (auto& rank : ranks_)  // read at once: a rank that fills its pipe would wait for us
      outputs.push_back(std::async(std::launch::async, [&rank] { return rank->read_rest(); }));
    std::vector<ProgramRun> runs;
    for (size_t r = 0; r < ranks_.size(); ++r)
      runs.push_back(program_ended(*ranks_[r], seen_[r] + joined(outputs[r].get())));
    return runs;
  }
  // Reads rank `r`'s output until a line holds `text`; false if it ended first.
  bool wait_for_line(int r, const std::string& text) {
    std::string line;
    while (ranks_[r]->read_line(line)) {
      seen_[r] += line + "\n";
      if (line.find(text) != std::string::npos) return true;
    }
    return false;
  }
  const std::string& seen(int r) { return seen_[r]; }
  course::ChildProcess& rank(int r) { return *ranks_[r]; }

 private:
  std::string port_;
  std::vector<std::unique_ptr<course::ChildProcess>> ranks_;
  std::map<int, std::string> seen_;  // what wait_for_line read of each rank
};

std::string checksum(const ProgramRun& run) {
  std::smatch m;
  return std::regex_search(run.output, m, std::regex("(^|\n)parameter checksum ([0-9a-f]+)"))
             ? m[2].str()
             : "";
}
double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
const std::vector<std::string> kCpuFlags{"--timeout", "20", "--device", "cpu"};
constexpr double kTimeout = 20;  // those flags' --timeout
std::vector<std::string> with(std::vector<std::string> flags,
                              const std::vector<std::string>& more) {
  flags.insert(flags.end(), more.begin(), more.end());
  return flags;
}

constexpr const char* kFailuresLesson = "lesson17";  // distributed failures: lesson 09's job
constexpr const char* kSilentLesson = "lesson18";    // silent failures: lesson 17's job, checked

class Jobs : public ::testing::TestWithParam<std::string> {  // lesson09, 17 or 18
 protected:
  void SetUp() override {
    binary_ = lesson_path(GetParam());
    ASSERT_FALSE(binary_.empty()) << GetParam() << " is not in the registry";
  }
  std::string number() const { return GetParam().substr(6, 2); }
  // Lesson 09's own job, whose rendezvous is LibTorch's (lessons 17 and 18: lesson 17's).
  bool lesson09() const { return GetParam() == "lesson09"; }
  // The silent-failures lesson, whose ranks check their summed gradient.
  bool silent_lesson() const { return GetParam() == kSilentLesson; }
  // The jobs on the CPU talk through Gloo.
  static bool without_gloo() {
#ifdef GPU_LESSONS_WITH_GLOO
    return false;
#else
    return true;
#endif
  }
  // On GPUs they talk through NCCL: skipped without it, or without `gpus` GPUs.
  static bool without_nccl() {
#ifdef GPU_LESSONS_WITH_NCCL
    return false;
#else
    return true;
#endif
  }
  std::string binary_;
};
#define SKIP_WITHOUT_GLOO() \
  if (without_gloo()) GTEST_SKIP() << "this build has no Gloo (install libgloo-dev)"
#define SKIP_WITHOUT_GPUS(gpus)                                 \
  if (without_nccl()) GTEST_SKIP() << "this build has no NCCL"; \
  if (torch::cuda::device_count() < (gpus)) GTEST_SKIP() << "needs " #gpus " GPU(s)"

// Two ranks, --quick: both pass and hold the same parameters.
TEST_P(Jobs, TwoRanksPassWithTheSameParameters) {
  SKIP_WITHOUT_GLOO();
  std::vector<ProgramRun> runs = Job(binary_, 2, with(kCpuFlags, {"--quick"})).finish();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(runs[r].exit_code, 0) << runs[r].what();
    EXPECT_TRUE(
        runs[r].printed("RESULT: PASS lesson " + number() + " rank " + std::to_string(r) + " of 2"))
        << runs[r].what();
  }
  EXPECT_FALSE(checksum(runs[0]).empty()) << runs[0].what();
  EXPECT_EQ(checksum(runs[0]), checksum(runs[1]));
}

// Two ranks pass with the BLAS's kernels for other CPUs forced, each of which rounds a matrix
// product differently (OpenBLAS: Debian's flavour; MKL: the 2.11 wheel's).
TEST_P(Jobs, TwoRanksPassWithOtherCpusKernels) {
  SKIP_WITHOUT_GLOO();
  for (const std::vector<std::string>& kernels :
       {std::vector<std::string>{"OPENBLAS_CORETYPE=Sandybridge", "MKL_ENABLE_INSTRUCTIONS=AVX2"},
        std::vector<std::string>{"OPENBLAS_CORETYPE=Prescott", "MKL_ENABLE_INSTRUCTIONS=SSE4_2"}}) {
    SCOPED_TRACE(kernels[0]);
    std::vector<ProgramRun> runs = Job(binary_, 2, with(kCpuFlags, {"--quick"}), kernels).finish();
    EXPECT_EQ(runs[0].exit_code, 0) << runs[0].what();
    EXPECT_EQ(runs[1].exit_code, 0) << runs[1].what();
    EXPECT_FALSE(checksum(runs[0]).empty()) << runs[0].what();
    EXPECT_EQ(checksum(runs[0]), checksum(runs[1]));
    if (silent_lesson()) {  // its summed-gradient check holds with each
      EXPECT_TRUE(runs[0].printed("summed gradient vs one process's")) << runs[0].what();
    }
  }
}

// Rank 1 killed (SIGKILL) mid-training: rank 0 ends non-zero, saying so, within the timeout.
TEST_P(Jobs, RankKilledEndsTheOtherWithinTheTimeout) {
  SKIP_WITHOUT_GLOO();
  Job job(binary_, 2, with(kCpuFlags, {"--epochs", "50"}));
  ASSERT_TRUE(job.wait_for_line(1, "epoch 1/50")) << "rank 1 ended first:\n" << job.seen(1);
  job.rank(1).kill();
  const auto start = std::chrono::steady_clock::now();
  const ProgramRun rank0 = job.finish()[0];
  EXPECT_LT(seconds_since(start), kTimeout + 1) << rank0.what();  // within the timeout's second
  EXPECT_NE(rank0.exit_code, 0) << rank0.what();
  EXPECT_TRUE(rank0.printed("lost the job")) << rank0.what();
  EXPECT_TRUE(rank0.printed("RESULT: FAIL")) << rank0.what();
}

// Rank 0 alone in a job of two: exit 2 with the rendezvous' message and a HINT, after one
// --timeout of 5 s (not before it, not a second after it: start-up, the data, is in the 15 s).
TEST_P(Jobs, RankThatNeverArrivesIsWaitedForOnce) {
  SKIP_WITHOUT_GLOO();
  const auto start = std::chrono::steady_clock::now();
  const ProgramRun rank0 =
      Job(binary_, 2, {"--quick", "--timeout", "5", "--device", "cpu"}, {}, /*started=*/1)
          .finish()[0];
  const double took = seconds_since(start);
  EXPECT_EQ(rank0.exit_code, 2) << rank0.what();
  const char* says =
      lesson09() ? "could not join the job" : "gave up waiting for the other ranks.*1 of 2 arrived";
  EXPECT_TRUE(std::regex_search(rank0.output, std::regex(says))) << rank0.what();
  EXPECT_TRUE(rank0.printed("HINT:")) << rank0.what();
  EXPECT_GE(took, 5.0) << rank0.what();
  EXPECT_LE(took, 15.0) << rank0.what();
}

// On GPUs, where a job picks NCCL (skipped without enough of them): a job of one forms its group,
// passes and shuts the group down (no warning that it was not destroyed).
TEST_P(Jobs, NcclJobOfOneRank) {
  SKIP_WITHOUT_GPUS(1);
  const ProgramRun rank0 =
      Job(binary_, 1, {"--quick", "--timeout", "60", "--device", "cuda"}).finish()[0];
  EXPECT_EQ(rank0.exit_code, 0) << rank0.what();
  EXPECT_TRUE(std::regex_search(rank0.output, std::regex("nccl group of 1 (formed|connected)")))
      << rank0.what();
  EXPECT_TRUE(rank0.printed("RESULT: PASS lesson " + number() + " rank 0 of 1 on cuda:0"))
      << rank0.what();
  EXPECT_FALSE(std::regex_search(
      rank0.output, std::regex("destroy_process_group|not been destroyed", std::regex::icase)))
      << rank0.what();
}

std::string lesson_name(const ::testing::TestParamInfo<std::string>& info) { return info.param; }
INSTANTIATE_TEST_SUITE_P(Lessons, Jobs,
                         ::testing::Values("lesson09", kFailuresLesson, kSilentLesson),
                         lesson_name);

// Lesson 17's jobs on GPUs. Two NCCL ranks, a GPU each, rank 1 killed: rank 0 exits 1 with its
// own error within the timeout (not NCCL's watchdog's SIGABRT, 134).
class Lesson17Jobs : public Jobs {};
TEST_P(Lesson17Jobs, NcclRankKilledEndsTheOtherWithItsOwnError) {
  SKIP_WITHOUT_GPUS(2);
  Job job(binary_, 2, {"--epochs", "50", "--timeout", "20", "--device", "cuda"});
  ASSERT_TRUE(job.wait_for_line(1, "epoch 1/50")) << "rank 1 ended first:\n" << job.seen(1);
  job.rank(1).kill();
  const auto start = std::chrono::steady_clock::now();
  const ProgramRun rank0 = job.finish()[0];
  EXPECT_LE(seconds_since(start), kTimeout + 15) << rank0.what();
  EXPECT_EQ(rank0.exit_code, 1) << rank0.what();
  EXPECT_TRUE(rank0.printed("lost the job")) << rank0.what();
}
// One rank more than there are GPUs: --device cuda exits 2 on every rank, saying why; --device
// auto trains every rank on the CPU (Gloo) and passes.
TEST_P(Lesson17Jobs, NcclTooFewGpus) {
  SKIP_WITHOUT_GPUS(1);
  const int gpus = static_cast<int>(torch::cuda::device_count());
  std::vector<ProgramRun> cuda =
      Job(binary_, gpus + 1, {"--quick", "--timeout", "20", "--device", "cuda"}).finish();
  for (const ProgramRun& rank : cuda) EXPECT_EQ(rank.exit_code, 2) << rank.what();
  EXPECT_TRUE(cuda[0].printed("NCCL needs a GPU for every rank")) << cuda[0].what();
  std::vector<ProgramRun> automatic =
      Job(binary_, gpus + 1, {"--quick", "--timeout", "120", "--device", "auto"}).finish();
  for (const ProgramRun& rank : automatic) EXPECT_EQ(rank.exit_code, 0) << rank.what();
  EXPECT_TRUE(automatic[0].printed("every rank trains on the CPU")) << automatic[0].what();
  EXPECT_TRUE(automatic[0].printed("gloo group of " + std::to_string(gpus + 1) + " connected"))
      << automatic[0].what();
}
// Two ranks given the same GPU (CUDA_VISIBLE_DEVICES=0 for both): both exit 2, saying why.
TEST_P(Lesson17Jobs, NcclTwoRanksOnOneGpu) {
  SKIP_WITHOUT_GPUS(1);
  std::vector<ProgramRun> runs = Job(binary_, 2, {"--quick", "--timeout", "20", "--device", "auto"},
                                     {"CUDA_VISIBLE_DEVICES=0"})
                                     .finish();
  for (const ProgramRun& rank : runs) {
    EXPECT_EQ(rank.exit_code, 2) << rank.what();
    EXPECT_TRUE(rank.printed("share one GPU")) << rank.what();
  }
}
INSTANTIATE_TEST_SUITE_P(Lessons, Lesson17Jobs, ::testing::Values("lesson17"), lesson_name);

// ---- the tutorial's Python program --------------------------------------------------------------
// On torchvision's FashionMNIST (--torchvision, what the yardstick times) and on its own IDX
// Dataset it trains the same model on the same batches: one epoch on 2,000 images from one seed
// prints the same loss and accuracy. Skipped without a Python with this build's torch, or when that
// Python has no torchvision.
TEST(TutorialProgram, TorchvisionsDatasetAndItsOwnTrainTheSame) {
  const std::string python = GPU_LESSONS_PYTHON, program = TUTORIAL_PROGRAM;
  if (python.empty()) GTEST_SKIP() << "no Python with this build's torch";
  if (run_program({python, "-c", "import torchvision"}).exit_code != 0)
    GTEST_SKIP() << python << " has no torchvision";
  auto train = [&](std::vector<std::string> more) {
    std::vector<std::string> argv{python, program, "--epochs", "1", "--limit", "2000"};
    argv.insert(argv.end(), more.begin(), more.end());
    return run_program(argv, {"CUDA_VISIBLE_DEVICES="}, /*with_stderr=*/false);
  };
  const ProgramRun torchvision = train({"--torchvision"}), own = train({});
  ASSERT_EQ(torchvision.exit_code, 0) << torchvision.output;
  ASSERT_EQ(own.exit_code, 0) << own.output;
  EXPECT_TRUE(
      std::regex_search(torchvision.output, std::regex("(^|\n)Test Accuracy: 0\\.[0-9]+\n")))
      << torchvision.output;
  EXPECT_EQ(torchvision.output, own.output) << "the two datasets trained differently";
}

}  // namespace
