// Tests of lesson 20: what its profiles of lesson 05's and lesson 12's loops hold, its op table,
// and its traces, with the lesson's own functions and constants.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>

// The lesson is one file with its own main(); the tests include it for its functions.
#define GPU_LESSONS_NO_MAIN
#include "common/temporary_folder.h"
#include "cuda_test.h"
#include "fashion_mnist_test.h"
#include "profiling.cpp"

namespace {

constexpr int kTestSteps = 4;  // steps of each loop under the profiler

// The first images of the training set: enough for the warm-up and the profiled steps.
course::FashionMNIST first_images(const course::ImageSet& train) {
  return course::FashionMNIST(
      course::take(train, (lesson20::kWarmupSteps + kTestSteps) * lesson20::kBatchSize));
}

// The two loops' profiles on the CPU, made once for the tests that read them (each profile runs
// the warm-up and the profiled steps of both loops).
const lesson20::Profiles& cpu_profiles(const course::ImageSet& train) {
  static const lesson20::Profiles profiles =
      lesson20::profile_loops(first_images(train), kTestSteps, torch::kCPU);
  return profiles;
}

}  // namespace

class ProfileTest : public FashionMnistTest {};

// Tests that a profile of N steps holds N ranges of each part, in both loops.
TEST_F(ProfileTest, NStepsHoldNRangesOfEachPart) {
  const auto& profiles = cpu_profiles(train());
  for (const auto* result : {profiles.tutorial.get(), profiles.fast.get()}) {
    const lesson20::LoopFacts facts = lesson20::facts_of(lesson20::events_of(*result));
    for (const std::string& part : lesson20::kParts) EXPECT_EQ(facts.ranges.at(part), kTestSteps);
  }
}

// Tests the counts the page states for the CPU: one .item() per step in lesson 05's loop and none
// in lesson 12's; lesson 05's loop calls .to(device) on each batch of images, which copies
// nothing on the CPU; Adam's last operator once per parameter tensor against once.
TEST_F(ProfileTest, CountsOnTheCpu) {
  const auto& profiles = cpu_profiles(train());
  const auto t = lesson20::facts_of(lesson20::events_of(*profiles.tutorial));
  const auto f = lesson20::facts_of(lesson20::events_of(*profiles.fast));
  EXPECT_EQ(t.item_reads, kTestSteps);
  EXPECT_EQ(f.item_reads, 0);
  EXPECT_EQ(t.image_moves, kTestSteps);
  EXPECT_EQ(f.image_moves, 0);
  EXPECT_EQ(t.image_copies, 0);
  EXPECT_EQ(t.host_to_device + f.host_to_device, 0);  // no device, no copies to it
  EXPECT_EQ(profiles.parameter_tensors, 6);
  EXPECT_EQ(t.adam_updates, 6 * kTestSteps);
  EXPECT_EQ(f.adam_updates, kTestSteps);
  EXPECT_GT(t.operators, f.operators);  // per-parameter Adam and the loader's work
  course::Verdict verdict;
  lesson20::check_profile(t, f, kTestSteps, profiles.parameter_tensors, torch::kCPU, verdict);
  EXPECT_EQ(verdict.finish("test"), 0);
}

// Tests that the check fails where the lab's starter leaves a part without its range.
TEST(CheckProfile, AMissingRangeFails) {
  lesson20::LoopFacts t, f;
  for (const std::string& part : lesson20::kParts) t.ranges[part] = f.ranges[part] = 2;
  t.ranges["backward"] = 0;
  t.item_reads = 2;
  t.image_moves = 2;
  t.adam_updates = 12;
  f.adam_updates = 2;
  course::Verdict verdict;
  lesson20::check_profile(t, f, 2, 6, torch::kCPU, verdict);
  EXPECT_EQ(verdict.finish("test"), 1);
}

// Tests the names of the two trace files that --trace FILE writes.
TEST(TraceFile, OnePerLoop) {
  EXPECT_EQ(lesson20::trace_file("out/trace.json", "lesson05"), "out/trace-lesson05.json");
  EXPECT_EQ(lesson20::trace_file("trace", "lesson12"), "trace-lesson12.json");
}

// Tests that the traces are written, and hold each step's ranges as trace events.
TEST_F(ProfileTest, TraceHoldsTheRanges) {
  const auto& profiles = cpu_profiles(train());
  course::TemporaryFolder folder("lesson20");
  const std::string file = (folder.path() / "trace.json").string();
  lesson20::save_chrome_trace(*profiles.tutorial, file);
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  const std::string json = text.str();
  EXPECT_NE(json.find("\"traceEvents\""), std::string::npos);
  std::size_t forwards = 0;
  for (auto at = json.find("\"forward\""); at != std::string::npos;
       at = json.find("\"forward\"", at + 1))
    ++forwards;
  EXPECT_EQ(forwards, static_cast<std::size_t>(kTestSteps));
}

class ProfileCudaTest : public CudaTest {};

// Tests the copies on a GPU: lesson 05's loop copies each batch to the device (features and
// labels: at least two copies a step), lesson 12's copies none; its ranges and reads as on the CPU.
TEST_F(ProfileCudaTest, LessonFivesLoopCopiesEachBatchLessonElevensNone) {
  std::string why;
  const FashionMnistSplits* data = fashion_mnist(&why);
  if (data == nullptr) GTEST_SKIP() << why;
  const auto profiles = lesson20::profile_loops(first_images(data->train), kTestSteps, device);
  const auto t = lesson20::facts_of(lesson20::events_of(*profiles.tutorial));
  const auto f = lesson20::facts_of(lesson20::events_of(*profiles.fast));
  EXPECT_GE(t.host_to_device, 2 * kTestSteps);
  EXPECT_EQ(f.host_to_device, 0);
  EXPECT_EQ(t.item_reads, kTestSteps);
  EXPECT_EQ(f.item_reads, 0);
  course::Verdict verdict;
  lesson20::check_profile(t, f, kTestSteps, profiles.parameter_tensors, device, verdict);
  EXPECT_EQ(verdict.finish("test"), 0);
}
