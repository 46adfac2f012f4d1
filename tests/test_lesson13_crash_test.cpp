// Tests of lesson 13's crash test (crash_test.h): a child killed again and again, and the check
// after each kill.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "crash_test.h"

// Tests the crash test's loop: each kill is followed by the check, its failures counted and the
// first one kept, and the piece of work between two lines measured.
TEST(CrashTest, KillRepeatedlyChecksAfterEachKill) {
  int checks = 0;
  const lesson13::KillReport report = lesson13::kill_repeatedly(
      {"/bin/sh", "-c", "while :; do echo piece; sleep 0.02; done"}, /*lines=*/2, /*kills=*/4,
      /*seed=*/1, [&] {
        if (++checks % 2 == 0) throw std::runtime_error("torn " + std::to_string(checks));
      });
  EXPECT_EQ(report.kills, 4);
  EXPECT_EQ(checks, 4);
  EXPECT_EQ(report.survived, 2);
  EXPECT_EQ(report.failure, "torn 2");
  EXPECT_GT(report.piece_seconds, 0.0);
}
