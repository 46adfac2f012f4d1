// checkpoint_cli.h defines: what lessons 10 and 14 both promise about --checkpoint on the command
// line, checked by running the lesson's program (run_program): a run resumed in a new process, a
// checkpoint of random bytes refused, a folder that does not exist refused.
#pragma once

#include <gtest/gtest.h>

#include <random>
#include <regex>
#include <string>
#include <vector>

#include "program_run.h"    // defines: ProgramRun, run_program
#include "scratch_files.h"  // defines: Scratch, write_bytes

// --epochs 1, then --epochs 2 in a new process resumes from epoch 1, then --epochs 2 again has
// nothing left to train; each passes.
inline void expect_resume_in_a_new_process(const std::string& binary) {
  Scratch dir;
  auto with = [&](const std::string& epochs) {
    return run_program({binary, "--quick", "--checkpoint", dir.file("run.pt"), "--epochs", epochs});
  };
  const ProgramRun first = with("1");
  EXPECT_EQ(first.exit_code, 0) << first.what();
  EXPECT_TRUE(first.printed("no checkpoint at")) << first.what();
  const ProgramRun resumed = with("2");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.what();
  EXPECT_TRUE(std::regex_search(resumed.output, std::regex("resumed from .*epoch 1")))
      << resumed.what();
  const ProgramRun done = with("2");
  EXPECT_EQ(done.exit_code, 0) << done.what();
  EXPECT_TRUE(done.printed("already at epoch 2")) << done.what();
}

// A checkpoint of random bytes stops the run with exit 2 and a HINT.
inline void expect_corrupt_checkpoint_refused(const std::string& binary) {
  Scratch dir;
  std::mt19937 random(12);
  std::string bytes(100000, '\0');
  for (char& byte : bytes) byte = static_cast<char>(random());
  write_bytes(dir.file("run.pt"), bytes);
  const ProgramRun run =
      run_program({binary, "--quick", "--checkpoint", dir.file("run.pt"), "--epochs", "1"});
  EXPECT_EQ(run.exit_code, 2) << run.what();
  EXPECT_TRUE(run.printed("HINT:")) << run.what();
}

// --checkpoint in a folder that does not exist stops with exit 2 and a HINT before any training.
inline void expect_unwritable_folder_refused(const std::string& binary) {
  Scratch dir;
  const ProgramRun run =
      run_program({binary, "--quick", "--checkpoint", dir.file("no/such/run.pt")});
  EXPECT_EQ(run.exit_code, 2) << run.what();
  EXPECT_TRUE(run.printed("HINT: create the folder")) << run.what();
}
