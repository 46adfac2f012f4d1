// Tests of lesson 24, two hosts: the hosts are made and removed (none left, even by a run that was
// killed), the cable's rate is set, and on them the job of the lesson's program learns what one
// process learns, and a cut cable ends both ranks within their timeout, the checkpoint resuming
// the job to the uncut job's parameters. Skipped, saying why, where namespaces cannot be made.
#include <gtest/gtest.h>
#include <sys/wait.h>

// The lesson is one file with its own main(); the tests include it for its functions.
#define GPU_LESSONS_NO_MAIN
#include "program_run.h"  // defines: built_program
#include "ranks_test.h"   // defines: FashionMnistGlooTest
#include "two_hosts.cpp"

namespace {

// The output of `argv` run to its end, and its status.
std::pair<std::vector<std::string>, int> run(std::vector<std::string> argv) {
  argv[0] = lesson24::find_program(argv[0]);
  course::ChildProcess child(argv, {}, true);
  auto lines = child.read_rest();
  const auto status = child.wait_for(std::chrono::seconds(60));
  return {lines, status ? *status : child.kill()};
}

bool netns_exists(const std::string& name) { return std::filesystem::exists("/run/netns/" + name); }

class Lesson24Hosts : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = lesson24::why_no_hosts();
    if (!why.empty()) GTEST_SKIP() << why;
  }
};

// Tests the two hosts: each a namespace of its own, each finding the other by name at its address,
// both removed (with their hosts files) when the object goes.
TEST_F(Lesson24Hosts, MadeFindEachOtherAndAreRemoved) {
  std::string names[2];
  {
    const lesson24::TwoHosts hosts;
    for (int h = 0; h < 2; ++h) {
      names[h] = hosts.netns(h);
      EXPECT_TRUE(netns_exists(names[h])) << names[h];
    }
    const auto [lines, status] = run(hosts.on(0, {"getent", "hosts", "host1"}));
    ASSERT_FALSE(lines.empty());
    EXPECT_EQ(lines[0].substr(0, lines[0].find(' ')), "10.24.0.2");
    const auto [name, named] = run(hosts.on(1, {"hostname"}));
    ASSERT_FALSE(name.empty());
    EXPECT_EQ(name[0], "host1");
  }
  for (const std::string& name : names) {
    EXPECT_FALSE(netns_exists(name)) << name << " left behind";
    EXPECT_FALSE(std::filesystem::exists("/etc/netns/" + name)) << name << "'s files left behind";
  }
}

// Tests the cable's limit: a token bucket at the rate asked for on each end, lifted by 0.
TEST_F(Lesson24Hosts, CableLimitedAndLifted) {
  lesson24::TwoHosts hosts;
  const auto shown = [&](int h) {
    std::string all;
    for (const auto& line : run({"tc", "-n", hosts.netns(h), "qdisc", "show"}).first) all += line;
    return all;
  };
  hosts.limit(0.1);
  for (int h = 0; h < 2; ++h) {
    EXPECT_NE(shown(h).find("tbf"), std::string::npos) << shown(h);
    EXPECT_NE(shown(h).find("rate 100Mbit"), std::string::npos) << shown(h);
  }
  hosts.limit(0);
  for (int h = 0; h < 2; ++h) EXPECT_EQ(shown(h).find("tbf"), std::string::npos) << shown(h);
}

// Tests that the hosts of a run that was killed (its process gone, its namespaces left) are
// removed by the next run, and those of a run still running are not.
TEST_F(Lesson24Hosts, KilledRunsHostsRemovedByTheNext) {
  const std::string stale = "gl24-99999999-0";  // past any process number Linux gives
  ASSERT_EQ(WEXITSTATUS(run({"ip", "netns", "add", stale}).second), 0);
  const lesson24::TwoHosts live;
  lesson24::remove_stale_hosts();  // (another test's run may have swept it first)
  EXPECT_FALSE(netns_exists(stale));
  EXPECT_TRUE(netns_exists(live.netns(0)));
}

// ---- the job on two hosts (the lesson's program as its ranks) -----------------------------------
class Lesson24Job : public FashionMnistGlooTest {
 protected:
  void SetUp() override {
    FashionMnistGlooTest::SetUp();
    const std::string why = lesson24::why_no_hosts();
    if (!why.empty()) GTEST_SKIP() << why;
    options.seed = lesson24::kSeed;
    flags.program = built_program(LESSON24_BINARY);
    flags.steps = 20;
  }
  course::CommonOptions options;
  lesson24::RankFlags flags;
  course::Verdict verdict;
};

// Tests part 1: both hosts' ranks end with one set of parameters, those of one process trained on
// the global batch (within the lesson's tolerance).
TEST_F(Lesson24Job, TwoHostsLearnWhatOneProcessLearns) {
  lesson24::TwoHosts hosts;
  const course::TemporaryFolder folder("lesson24-test-");
  const std::string sum =
      lesson24::part1(hosts, options, flags, train(), folder.path().string(), verdict);
  EXPECT_EQ(sum.size(), 16u);
  EXPECT_TRUE(verdict.passed());
  EXPECT_EQ(verdict.checks(), 2);
}

// Tests part 3: the cable cut mid-training ends both ranks with an error within --timeout (and
// their launchers non-zero), the checkpoint saved before the cut loads, and the job resumed from
// it on the mended cable ends with the uncut job's parameters, bit for bit.
TEST_F(Lesson24Job, CutCableEndsBothRanksAndTheJobResumes) {
  lesson24::TwoHosts hosts;
  const course::TemporaryFolder folder("lesson24-test-");
  flags.steps = lesson24::kSteps;
  const std::string uncut =
      lesson24::part1(hosts, options, flags, train(), folder.path().string(), verdict);
  lesson24::part3(hosts, options, flags, uncut, folder.path().string(), verdict);
  EXPECT_TRUE(verdict.passed());
  EXPECT_EQ(verdict.checks(), 2 + 4);
}

}  // namespace
