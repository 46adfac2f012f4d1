// Tests of common/report.h: printf into a string, the progress line (silent off a terminal), an
// epoch's line or its Ctrl-C stop, the epochs' timing after the first, and the table of timed
// runs with each run's speed against the one before it.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/interrupt.h"
#include "common/report.h"

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

// Tests that format() writes what printf would, however long.
TEST(Report, Format) {
  EXPECT_EQ(course::format("%d runs, %.2f s", 3, 1.5), "3 runs, 1.50 s");
  EXPECT_EQ(course::format("%s", std::string(1000, 'x').c_str()).size(), 1000u);
  EXPECT_EQ(course::format("%s", ""), "");
}

// Tests that a progress line prints every `every` updates when enabled, clears itself at the end,
// and prints nothing when disabled (as off a terminal).
TEST(Report, ProgressLine) {
  testing::internal::CaptureStdout();
  {
    course::ProgressLine line(/*total=*/600, /*enabled=*/true, /*every=*/2);
    for (int done = 100; done <= 600; done += 100) line.update(done);
  }
  const std::string shown = testing::internal::GetCapturedStdout();
  EXPECT_TRUE(contains(shown, "\r     200/600 samples")) << shown;
  EXPECT_TRUE(contains(shown, "\r     600/600 samples")) << shown;
  EXPECT_FALSE(contains(shown, "100/600")) << shown;
  EXPECT_EQ(shown.back(), '\r') << "cleared at the end";
  testing::internal::CaptureStdout();
  {
    course::ProgressLine line(600, /*enabled=*/false);
    for (int done = 0; done < 1000; ++done) line.update(done);
  }
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");
}

// Tests an epoch's line, and that an interrupted epoch is an Interrupted that says how far it got.
TEST(Report, EpochLineOrStop) {
  course::EpochStats stats{/*mean_loss=*/0.5, /*seconds=*/2.0, /*samples=*/1000, false};
  testing::internal::CaptureStdout();
  course::report_epoch("flat", 1, 5, stats, 1000, "nothing saved");
  EXPECT_EQ(testing::internal::GetCapturedStdout(),
            "  flat     epoch 2/5  loss 0.5000   2.000 s        500 samples/s\n");
  stats.samples = 300;
  stats.interrupted = true;
  try {
    course::report_epoch("flat", 1, 5, stats, 1000, "nothing saved");
    ADD_FAILURE() << "no Interrupted";
  } catch (const course::Interrupted& e) {
    EXPECT_STREQ(e.what(), "flat run, epoch 2 of 5, after 300 of 1000 samples; nothing saved");
  }
}

// Tests that the epochs' timing leaves the first epoch out, unless it is the only one.
TEST(Report, EpochTimingLeavesTheFirstOut) {
  std::vector<course::EpochStats> epochs(3);
  epochs[0].seconds = 9;
  epochs[1].seconds = 1;
  epochs[2].seconds = 3;
  const course::Timing t = course::epoch_timing(epochs);
  EXPECT_EQ(t.runs, 2);
  EXPECT_DOUBLE_EQ(t.median_s, 2.0);
  EXPECT_DOUBLE_EQ(t.max_s, 3.0);
  epochs.resize(1);
  EXPECT_EQ(course::epoch_timing(epochs).runs, 1);
  EXPECT_DOUBLE_EQ(course::epoch_timing(epochs).median_s, 9.0);
}

// Tests the table of timed runs: a row per run, each run's speed against the one before it, and
// the busy note when a run's timings spread too far.
TEST(Report, TimedRuns) {
  course::Timing slow{/*median_s=*/2.0, 2.0, 2.0, 4}, fast{0.5, 0.5, 0.5, 4};
  testing::internal::CaptureStdout();
  const std::string text = course::print_timed_runs(
      {{"textbook", slow, 1000, 0.8712}, {"resident", fast, 1000, 0.8712}}, "s/epoch",
      "samples/s", "test accuracy", "cpu");
  EXPECT_EQ(testing::internal::GetCapturedStdout(), text);
  EXPECT_TRUE(contains(text, "s/epoch: median (fastest-slowest)")) << text;
  EXPECT_TRUE(contains(text, "\ntextbook   2.000 s (2.000-2.000, 4 runs)")) << text;
  EXPECT_TRUE(contains(text, "2000       0.8712\n")) << text;  // 1000 items / 0.5 s
  EXPECT_TRUE(contains(text, "resident is 4.00x the speed of textbook on cpu\n")) << text;
  EXPECT_FALSE(contains(text, course::busy_note())) << text;
  const course::Timing spread{1.0, 0.5, 2.0, 4};
  testing::internal::CaptureStdout();
  EXPECT_TRUE(contains(course::print_timed_runs({{"one", spread, 1, 0}}, "s", "items/s", "x", ""),
                       course::busy_note()));
  testing::internal::GetCapturedStdout();
}
