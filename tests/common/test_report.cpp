// Tests of common/report.h: printf into a string, the progress line (silent off a terminal), an
// epoch's line or its Ctrl-C stop, a run of epochs and its Ctrl-C stop, how far apart two runs'
// losses are, the epochs' timing after the first, and the table of timed runs with each run's
// speed against the one before it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

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

// Tests a run of epochs: each epoch made and printed in turn; an epoch that says it was
// interrupted ends the run as report_epoch does, and an epoch that throws Interrupted itself is
// rethrown with the run's name and epoch.
TEST(Report, RunEpochsOrStop) {
  int made = 0;
  testing::internal::CaptureStdout();
  const auto epochs = course::run_epochs(
      "pinned", 3, 100,
      [&] {
        ++made;
        return course::EpochStats{/*mean_loss=*/1.0 / made, /*seconds=*/1.0, /*samples=*/100,
                                  false};
      },
      "nothing saved");
  const std::string shown = testing::internal::GetCapturedStdout();
  ASSERT_EQ(epochs.size(), 3u);
  EXPECT_DOUBLE_EQ(epochs[2].mean_loss, 1.0 / 3);
  EXPECT_TRUE(contains(shown, "  pinned   epoch 3/3  loss 0.3333")) << shown;
  try {
    testing::internal::CaptureStdout();
    course::run_epochs(
        "flat", 4, 100,
        [&] {
          return course::EpochStats{1.0, 1.0, /*samples=*/40, /*interrupted=*/true};
        },
        "nothing saved");
    ADD_FAILURE() << "no Interrupted";
  } catch (const course::Interrupted& e) {
    EXPECT_STREQ(e.what(), "flat run, epoch 1 of 4, after 40 of 100 samples; nothing saved");
  }
  made = 0;
  try {
    course::run_epochs(
        "tutorial", 5, 100,
        [&]() -> course::EpochStats {
          if (++made == 2) throw course::Interrupted("after step 7");
          return {1.0, 1.0, 100, false};
        },
        "nothing saved");
    ADD_FAILURE() << "no Interrupted";
  } catch (const course::Interrupted& e) {
    EXPECT_STREQ(e.what(), "tutorial run, epoch 2 of 5, after step 7; nothing saved");
  }
  testing::internal::GetCapturedStdout();
}

// Tests how far apart two runs' losses are: the largest relative difference, epoch by epoch.
TEST(Report, MaxLossDifference) {
  std::vector<course::EpochStats> a(3), b(3);
  for (int e = 0; e < 3; ++e) a[e].mean_loss = b[e].mean_loss = 1.0 / (e + 1);
  EXPECT_EQ(course::max_loss_difference(a, b), 0.0);
  a[1].mean_loss = 0.5 * 1.01;  // 1% off in the second epoch
  a[2].mean_loss = 1.0 / 3 * 0.999;
  EXPECT_NEAR(course::max_loss_difference(a, b), 0.01, 1e-12);
  EXPECT_EQ(course::max_loss_difference({}, b), 0.0);
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
  const std::string text =
      course::print_timed_runs({{"textbook", slow, 1000, 0.8712}, {"resident", fast, 1000, 0.8712}},
                               "s/epoch", "samples/s", "test accuracy", "cpu");
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

// Tests that a table whose time is per millisecond ("ms/step") shows its timings in milliseconds,
// and its rate still per second.
TEST(Report, TimedRunsInMilliseconds) {
  const course::Timing step{/*median_s=*/0.0005, 0.0004, 0.0006, 5};
  testing::internal::CaptureStdout();
  const std::string text =
      course::print_timed_runs({{"step", step, 64, 0.5}}, "ms/step", "samples/s", "loss", "cpu");
  testing::internal::GetCapturedStdout();
  EXPECT_TRUE(contains(text, "\nstep       0.500 ms (0.400-0.600, 5 runs)")) << text;
  EXPECT_TRUE(contains(text, "128000       0.5000\n")) << text;  // 64 samples / 0.5 ms
}
