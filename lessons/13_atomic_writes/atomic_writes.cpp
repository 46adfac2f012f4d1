// Lesson 13 (going further) — atomic writes: lesson 10 saves its checkpoint with save_to(path),
// which empties the last good checkpoint before it writes the new one. This lesson writes a
// temporary file, flushes it to the disk and renames it over the old one (write_atomically, in
// write_atomically.cpp beside this file), and puts both ways to the test:
//   1. a save that fails half-way (a full disk): in place, against atomically;
//   2. a process killed (SIGKILL) at a random moment of a save, again and again: in place, against
//      atomically (a child process: this program with --save-loop, killed by crash_test.h's test).
// Run:    build/bin/lesson13_atomic_writes [--device ...] [--quick]
// Checks: a failed atomic save leaves the previous file whole and nothing beside it; every kill of
//         an atomic save leaves a whole, loadable file. Exit 0 PASS, 1 FAIL, 2 bad flag.
#include <torch/torch.h>  // defines: torch::serialize::OutputArchive, InputArchive

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/child_process.h"     // defines: self_executable
#include "common/cli.h"               // defines: Cli, start_lesson
#include "common/device.h"            // defines: format_bytes
#include "common/temporary_folder.h"  // defines: TemporaryFolder
#include "common/verdict.h"           // defines: Verdict, report_error
#include "crash_test.h"               // defines: KillReport, kill_repeatedly
#include "torch_files/state_dict.h"   // defines: CheckpointError, check_libtorch_archive
#include "write_atomically.h"         // defines: Sink, write_atomically

namespace lesson13 {

namespace fs = std::filesystem;
using course::CheckpointError;

// ---- knobs -----------------------------------------------------------------------------------
constexpr std::uint64_t kSeed = 13;  // the moments of part 2's kills
constexpr int kKills = 8;            // part 2: a child saving in a loop is killed this often
constexpr int kQuickKills = 3;
constexpr std::int64_t kSaveBytes = 32ll << 20;  // large enough that most kills land mid-write

// ---- what every save here writes ----------------------------------------------------------------
//! [numbered-archive]
// A stand-in for a checkpoint whose tearing shows: its number and kSaveBytes of floats all equal
// to it. A file that mixes two saves, or stops short, fails check_saved_file.
torch::serialize::OutputArchive numbered_archive(torch::Tensor& payload, std::int64_t number) {
  payload.fill_(static_cast<float>(number));
  torch::serialize::OutputArchive archive;
  archive.write("number", c10::IValue(number));
  archive.write("payload", payload);
  return archive;
}

// Reads a numbered_archive() file back and checks it is whole; returns its number. The file is
// checked before LibTorch reads it, as every file the course loads (torch_files: lesson 15).
std::int64_t check_saved_file(const std::string& path) {
  const course::TorchFile file = course::check_libtorch_archive(path, course::CrcCheck::kStructure);
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(file.bytes.data(), file.bytes.size());
  } catch (const std::exception& e) {
    throw CheckpointError(path + " is not a readable archive (" + course::error_message(e) + ")",
                          course::kDamagedHint);
  }
  const std::int64_t number = course::read_archive_int(archive, "number", path);
  torch::Tensor payload;
  if (!archive.try_read("payload", payload) || payload.numel() != kSaveBytes / 4 ||
      !payload.eq(static_cast<float>(number)).all().item<bool>()) {
    throw CheckpointError(path + " is torn: its payload is not all " + std::to_string(number),
                          "a save was interrupted in place");
  }
  return number;
}
//! [numbered-archive]

// ---- part 1: a save that fails half-way ---------------------------------------------------------
// Whether `path` holds a whole file ("whole, number N"), or what check_saved_file says of it.
std::string state_of(const std::string& path, std::int64_t& number) {
  number = 0;
  try {
    number = check_saved_file(path);
    return "whole, number " + std::to_string(number);
  } catch (const std::exception& e) {
    return e.what();
  }
}

//! [fail-half-way]
// Saves number 1, then number 2 to a disk that fills up half-way through (the "disk" takes half
// of the bytes, then fails as a full one does), each way; the file left behind is checked.
void fail_half_way(course::Verdict& verdict, const fs::path& work) {
  std::cout << "\n== Part 1: a save that fails half-way (the disk full) ==\n";
  torch::Tensor payload = torch::empty({kSaveBytes / 4}, torch::kFloat);
  std::ostringstream next;  // the second save's bytes, as save_to would write them
  numbered_archive(payload, 2).save_to(next);
  const std::string bytes = next.str();
  const std::string half = bytes.substr(0, bytes.size() / 2);
  for (const bool atomic : {false, true}) {
    const std::string path = (work / (atomic ? "atomic.pt" : "in_place.pt")).string();
    numbered_archive(payload, 1).save_to(path);  // the last good checkpoint
    if (atomic) {
      try {
        write_atomically(path, [&](const Sink& sink) {
          sink(half.data(), half.size());
          throw std::runtime_error("No space left on device");  // what a full disk says
        });
      } catch (const CheckpointError& e) {
        std::printf("  atomically: %s\n", e.what());
      }
    } else {  // save_to(path): open the file for writing, which empties it, then write
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out.write(half.data(), static_cast<std::streamsize>(half.size()));
      std::printf("  in place: the disk filled up after %s of %s\n",
                  course::format_bytes(half.size()).c_str(),
                  course::format_bytes(bytes.size()).c_str());
    }
    std::int64_t number = 0;
    const std::string left = state_of(path, number);
    std::printf("  %-10s left: %s\n", atomic ? "atomically" : "in place", left.c_str());
    int files = 0;
    for (const auto& entry : fs::directory_iterator(work)) files += entry.is_regular_file();
    fs::remove(path);
    if (atomic) {
      verdict.check(number == 1 && files == 1,
                    "a failed atomic save leaves the previous file whole, and nothing beside it",
                    left + ", " + std::to_string(files) + " file(s) in the folder");
    }
  }
}
//! [fail-half-way]

// ---- part 2: a process killed while saving ------------------------------------------------------
//! [save-loop]
// The child process: saves a numbered archive to `path`, in place (lesson 10's save_to(path)) or
// atomically, printing "saved N" after each, until part 2 kills it.
void save_loop(const std::string& path, bool atomic) {
  torch::Tensor payload = torch::empty({kSaveBytes / 4}, torch::kFloat);
  for (std::int64_t number = 1; true; ++number) {
    torch::serialize::OutputArchive archive = numbered_archive(payload, number);
    if (atomic) write_atomically(path, [&](const Sink& sink) { archive.save_to(sink); });
    if (!atomic) archive.save_to(path);  // lesson 10's: empty the file, then write
    std::printf("saved %lld\n", static_cast<long long>(number));
    std::fflush(stdout);
  }
}
//! [save-loop]

//! [kill-while-saving]
// `kills` times each way: starts this program with --save-loop, lets it save twice, kills it with
// SIGKILL (a crash: no clean-up) at a random moment of its next save, and checks what is left.
void kill_while_saving(course::Verdict& verdict, const fs::path& work, int kills,
                       std::uint64_t seed) {
  std::printf(
      "\n== Part 2: a process killed while saving ==\na child process saves a %s "
      "file in a loop; SIGKILL at a random moment of a save, %d times each way:\n"
      "%-36s %8s %10s %12s\n",
      course::format_bytes(kSaveBytes).c_str(), kills, "how it saves", "kills", "loadable",
      "one save");
  const std::string path = (work / "big.pt").string();
  for (const bool atomic : {false, true}) {
    fs::remove(path);
    std::vector<std::string> child = {course::self_executable(), "--save-loop", path, "--threads",
                                      "1"};
    if (!atomic) child.push_back("--in-place");
    const KillReport report =
        kill_repeatedly(child, /*lines=*/2, kills, seed, [&] { check_saved_file(path); });
    std::printf("%-36s %8d %10d %9.0f ms\n",
                atomic ? "temporary file, fsync, rename" : "in place (save_to(path): lesson 10)",
                report.kills, report.survived, report.piece_seconds * 1e3);
    if (!report.failure.empty()) std::printf("  e.g. %s\n", report.failure.c_str());
    if (atomic) {
      verdict.check(report.survived == report.kills,
                    "every kill of an atomic save leaves a whole, loadable file",
                    std::to_string(report.survived) + "/" + std::to_string(report.kills));
    }
  }
}
//! [kill-while-saving]

}  // namespace lesson13

// ---- main --------------------------------------------------------------------------------------
#ifndef GPU_LESSONS_NO_MAIN  // tests/test_lesson13.cpp includes this file for its functions
int main(int argc, char** argv) try {
  using namespace lesson13;
  course::CommonOptions options;
  options.seed = kSeed;
  std::string save_loop_path;
  bool in_place = false;
  course::Cli cli("lesson13_atomic_writes",
                  "Lesson 13: a save that survives a full disk and a kill.", options);
  cli.add_hidden_path("--save-loop", save_loop_path);  // part 2's child process
  cli.add_hidden_flag("--in-place", in_place);
  if (auto code = cli.parse(argc, argv)) return *code;
  if (!save_loop_path.empty()) save_loop(save_loop_path, /*atomic=*/!in_place);  // until killed
  const torch::Device device = course::start_lesson(options);
  std::cout << "(what is saved here lives on the CPU: a file is written alike from every device)\n";
  const course::TemporaryFolder folder("lesson13-");  // removed, with its files, at the end
  course::Verdict verdict;
  fail_half_way(verdict, folder.path());
  kill_while_saving(verdict, folder.path(), options.quick ? kQuickKills : kKills, options.seed);
  return verdict.finish("lesson 13 on " + device.str());
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
#endif
