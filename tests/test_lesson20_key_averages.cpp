// Tests of lesson 20's op table (lessons/20_profiling/key_averages.h): the rows Python's
// prof.key_averages() would sum from a profile's events.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "key_averages.h"

namespace {

lesson20::Event host(const std::string& name, double start, double end, std::uint64_t thread = 1) {
  return {name, start, end, thread, false, {}};
}

}  // namespace

// Tests the op table's sums: a parent's self time leaves out the events directly inside it on its
// thread, not those on another thread; device events count as device time only.
TEST(KeyAverages, SelfTimeLeavesOutChildren) {
  const std::vector<lesson20::Event> events = {
      host("forward", 0, 100),
      host("aten::linear", 10, 60),
      host("aten::addmm", 20, 50),
      host("aten::relu", 70, 80),
      host("aten::addmm", 5, 95, 2),  // another thread: nobody's child
      {"volta_sgemm", 30, 45, 7, true, {}},
  };
  std::map<std::string, lesson20::OpRow> rows;
  for (const auto& row : lesson20::key_averages(events)) rows[row.name] = row;
  EXPECT_DOUBLE_EQ(rows["forward"].total_us, 100);
  EXPECT_DOUBLE_EQ(rows["forward"].self_us, 100 - 50 - 10);
  EXPECT_DOUBLE_EQ(rows["aten::linear"].self_us, 50 - 30);
  EXPECT_EQ(rows["aten::addmm"].calls, 2);
  EXPECT_DOUBLE_EQ(rows["aten::addmm"].self_us, 30 + 90);
  EXPECT_DOUBLE_EQ(rows["aten::relu"].self_us, 10);
  EXPECT_DOUBLE_EQ(rows["volta_sgemm"].device_us, 15);
  EXPECT_DOUBLE_EQ(rows["volta_sgemm"].total_us, 0);
}
