// Tests of lesson 13, atomic writes: a write that fails leaves the previous file and nothing
// beside it; a folder that does not exist is a clear error; every SIGKILL of a child saving
// atomically in a loop leaves a whole file (a real child process); torn files are caught; and the
// program's part 1 and --help.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

// The lesson's main file has its own main(); the tests include it for its functions.
#define GPU_LESSONS_NO_MAIN
#include "atomic_writes.cpp"
#include "program_run.h"
#include "scratch_files.h"

namespace {

namespace fs = std::filesystem;
using course::CheckpointError;

// Tests that every SIGKILL of a child saving atomically in a loop leaves a whole file (and at
// most the temporary files of killed saves beside it).
TEST(CrashTest, AtomicSavesSurviveSigkill) {
  Scratch scratch;
  const std::string path = scratch.file("big.pt");
  const lesson13::KillReport report = lesson13::kill_repeatedly(
      {built_program(LESSON13_BINARY), "--save-loop", path, "--threads", "1"}, /*lines=*/2,
      /*kills=*/10,
      /*seed=*/1, [&] { lesson13::check_saved_file(path); });
  EXPECT_EQ(report.kills, 10);
  EXPECT_EQ(report.survived, 10) << report.failure;
  EXPECT_GT(report.piece_seconds, 0.0);
  for (const auto& file : fs::directory_iterator(scratch.path())) {
    const std::string name = file.path().filename().string();
    EXPECT_TRUE(name == "big.pt" || name.rfind(".big.pt.tmp-", 0) == 0) << name << " left behind";
  }
}

// Tests that the crash test's own check catches a torn file: a truncated one and one whose
// payload mixes two saves.
TEST(CrashTest, TornFilesAreCaught) {
  Scratch scratch;
  const std::string path = scratch.file("big.pt");
  torch::serialize::OutputArchive archive;
  archive.write("number", c10::IValue(std::int64_t{3}));
  torch::Tensor payload = torch::full({lesson13::kSaveBytes / 4}, 3.0f);
  payload[100] = 2.0f;
  archive.write("payload", payload);
  archive.save_to(path);
  EXPECT_THROW(lesson13::check_saved_file(path), CheckpointError);
  payload[100] = 3.0f;
  archive.write("payload", payload);
  archive.save_to(path);
  EXPECT_EQ(lesson13::check_saved_file(path), 3);
  write_bytes(path, read_bytes(path).substr(0, 1 << 20));
  EXPECT_THROW(lesson13::check_saved_file(path), CheckpointError);
}

// Tests that a write that fails leaves the previous file as it was, and no temporary file.
TEST(AtomicWrite, FailureLeavesThePreviousFile) {
  Scratch scratch;
  const std::string path = scratch.file("ckpt.pt");
  write_bytes(path, "previous");
  EXPECT_THROW(lesson13::write_atomically(path,
                                          [](const lesson13::Sink& sink) {
                                            sink("partial", 7);
                                            throw std::runtime_error("disk full");
                                          }),
               CheckpointError);
  EXPECT_EQ(read_bytes(path), "previous");
  int files = 0;
  for (const auto& file : fs::directory_iterator(scratch.path())) files += file.exists() ? 1 : 0;
  EXPECT_EQ(files, 1);
  lesson13::write_atomically(path, [](const lesson13::Sink& sink) { sink("new", 3); });
  EXPECT_EQ(read_bytes(path), "new");
}

// Tests that a folder that does not exist is a clear error naming it.
TEST(AtomicWrite, MissingFolderIsAClearError) {
  try {
    lesson13::write_atomically("/nonexistent-folder/ckpt.pt", [](const lesson13::Sink&) {});
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-folder/ckpt.pt"), std::string::npos);
    EXPECT_NE(e.hint().find("writable"), std::string::npos);
  }
}

// Tests part 1 as the program runs it: the failed atomic save leaves number 1 whole and no
// temporary file, and the folder is left empty.
TEST(Program, FailHalfWay) {
  Scratch scratch;
  course::Verdict verdict;
  lesson13::fail_half_way(verdict, scratch.path());
  EXPECT_EQ(verdict.checks(), 1);
  EXPECT_TRUE(verdict.passed());
  EXPECT_TRUE(fs::is_empty(scratch.path()));
}

// Tests that --help lists the learner's flags, not the crash test's own (--save-loop, --in-place).
TEST(Cli, Help) {
  const ProgramRun run = run_program({built_program(LESSON13_BINARY), "--help"});
  EXPECT_EQ(run.exit_code, 0) << run.what();
  EXPECT_TRUE(run.printed("--device")) << run.what();
  EXPECT_FALSE(run.printed("--save-loop") || run.printed("--in-place")) << run.what();
}

}  // namespace
