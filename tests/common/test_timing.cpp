// Tests of common/timing.h: timing: medians, operator counts, what a timing says, per-piece
// timings.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>

#include "common/device.h"
#include "common/timing.h"
// Tests that the median lies between the fastest and slowest run and counts the runs.
TEST(Timing, MedianIsBetweenMinAndMax) {
  int calls = 0;
  const auto t = course::time_median(
      [&] {
        ++calls;
        torch::mm(torch::ones({64, 64}), torch::ones({64, 64}));
      },
      c10::Device(c10::kCPU), /*warmup=*/2, /*runs=*/5);
  EXPECT_EQ(calls, 7);
  EXPECT_EQ(t.runs, 5);
  EXPECT_LE(t.min_s, t.median_s);
  EXPECT_LE(t.median_s, t.max_s);
  EXPECT_GT(t.min_s, 0.0);
}

// Tests the count of operators: each torch::add dispatches (at least) one operator, twice the
// work counts twice, and nothing is counted once the call is over.
TEST(Timing, CountOperatorsCountsEachDispatch) {
  const torch::Tensor a = torch::ones({8}), b = torch::ones({8});
  const std::int64_t one = course::count_operators([&] { (void)torch::add(a, b); });
  EXPECT_GE(one, 1);
  EXPECT_EQ(course::count_operators([&] {
              (void)torch::add(a, b);
              (void)torch::add(a, b);
            }),
            2 * one);
  EXPECT_EQ(course::count_operators([] {}), 0);
}

// Tests that the matmul rate is a rate: positive and finite, in FLOP/s (a CPU does more than a
// million a second).
TEST(Timing, MatmulRateIsFlopsPerSecond) {
  const double rate = course::matmul_rate(c10::Device(c10::kCPU));
  EXPECT_TRUE(std::isfinite(rate));
  EXPECT_GT(rate, 1e6);
}

// Tests the spread's wording and the busy-machine rule (slowest over 1.5 times the fastest).
TEST(Timing, DescribeAndBusy) {
  course::Timing t;
  t.runs = 4;
  t.median_s = 0.412;
  t.min_s = 0.391;
  t.max_s = 0.52;
  EXPECT_EQ(course::describe(t, "s"), "0.412 s (0.391-0.520, 4 runs)");
  EXPECT_EQ(course::describe_ms(t), "412.000 ms (391.000-520.000, 4 runs)");
  EXPECT_FALSE(course::looks_busy(t));
  t.max_s = 0.6;
  EXPECT_TRUE(course::looks_busy(t));
  t.runs = 1;  // one run has no spread to judge
  EXPECT_FALSE(course::looks_busy(t));
  EXPECT_EQ(course::describe(t, "s"), "0.412 s (one run, no spread)");
}

// Tests the note a lesson prints under its timings: the busy note when one of them spreads too
// far; else a single run's note when one of them is one run; else nothing.
TEST(Timing, NoteUnderTimings) {
  const course::Timing steady{0.4, 0.39, 0.41, 5}, spread{0.4, 0.3, 0.6, 5},
      single{0.4, 0.4, 0.4, 1};
  EXPECT_EQ(course::timing_note({steady, steady}), "");
  EXPECT_EQ(course::timing_note({}), "");
  EXPECT_EQ(course::timing_note({steady, spread}), course::busy_note() + "\n");
  EXPECT_EQ(course::timing_note({spread, single}), course::busy_note() + "\n");
  const std::string one = course::timing_note({steady, single});
  EXPECT_EQ(one.rfind("note: one run, so no spread", 0), 0u) << one;
  EXPECT_EQ(one.back(), '\n');
}

// Tests the median for odd, even and empty inputs.
TEST(Timing, Median) {
  EXPECT_EQ(course::median({3.0, 1.0, 2.0}), 2.0);
  EXPECT_EQ(course::median({4.0, 1.0, 3.0, 2.0}), 2.5);
  EXPECT_EQ(course::median({}), 0.0);
}

// Tests the summary of timings already taken: median, fastest, slowest, count; zeros for none.
TEST(Timing, Summarize) {
  const course::Timing t = course::summarize({0.3, 0.1, 0.2, 0.5});
  EXPECT_EQ(t.runs, 4);
  EXPECT_EQ(t.min_s, 0.1);
  EXPECT_EQ(t.max_s, 0.5);
  EXPECT_DOUBLE_EQ(t.median_s, 0.25);
  const course::Timing none = course::summarize({});
  EXPECT_EQ(none.runs, 0);
  EXPECT_EQ(none.median_s, 0.0);
  EXPECT_FALSE(course::looks_busy(none));
  const course::Timing one = course::per_piece(t, 4);  // four steps timed together: one of them
  EXPECT_EQ(one.runs, 4);
  EXPECT_DOUBLE_EQ(one.min_s, 0.025);
  EXPECT_DOUBLE_EQ(one.max_s, 0.125);
  EXPECT_DOUBLE_EQ(one.median_s, 0.0625);
}
