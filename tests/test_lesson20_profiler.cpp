// Tests of lesson 20's profiler helpers (lessons/20_profiling/profiler.h): event times and the
// Chrome trace file.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>

#include "common/temporary_folder.h"  // defines: TemporaryFolder
#include "common/verdict.h"           // defines: CourseError
#include "profiler.h"

// A profile of a few operators, with the profiler as lesson 20 calls it.
static std::unique_ptr<torch::autograd::profiler::ProfilerResult> profile_a_matmul() {
  namespace impl = torch::profiler::impl;
  const impl::ProfilerConfig config(impl::ProfilerState::KINETO, /*report_input_shapes=*/true);
  const std::set<impl::ActivityType> activities = {impl::ActivityType::CPU};
  torch::autograd::profiler::prepareProfiler(config, activities);
  torch::autograd::profiler::enableProfiler(config, activities);
  torch::mm(torch::ones({8, 8}), torch::ones({8, 8})).relu();
  return torch::autograd::profiler::disableProfiler();
}

// Tests that the events' times are in microseconds on either LibTorch: every event starts within
// the last minute and lasts less than one.
TEST(Profiler, EventTimesAreMicroseconds) {
  const double now_us =
      std::chrono::duration<double, std::micro>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  const auto result = profile_a_matmul();
  ASSERT_FALSE(result->events().empty());
  for (const auto& event : result->events()) {
    EXPECT_NEAR(lesson20::event_start_us(event), now_us, 60e6) << event.name();
    EXPECT_GE(lesson20::event_duration_us(event), 0);
    EXPECT_LT(lesson20::event_duration_us(event), 60e6);
  }
}

// Tests that the trace is written whole (no part file left) with the operators as trace events,
// by Kineto or without it, and that an unwritable path is a CourseError naming the fix.
TEST(Profiler, SavesAChromeTrace) {
  const auto result = profile_a_matmul();
  course::TemporaryFolder folder("profiler");
  const std::string file = folder.file("trace.json");
  lesson20::save_chrome_trace(*result, file);
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find("\"traceEvents\""), std::string::npos);
  EXPECT_NE(text.str().find("\"aten::mm\""), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(file + ".part"));
  try {
    lesson20::save_chrome_trace(*result, folder.file("no-such-folder/trace.json"));
    ADD_FAILURE() << "no error for a folder that does not exist";
  } catch (const course::CourseError& error) {
    EXPECT_NE(error.hint().find("folder"), std::string::npos);
  }
}
