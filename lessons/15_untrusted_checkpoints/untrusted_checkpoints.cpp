// Lesson 15 (going further) — untrusted checkpoints: a file from someone else, or one that a disk
// or a copy damaged, loaded without harm. Lesson 14's load_checkpoint (lessons/14_exact_resume/
// checkpoint.cpp) checks a file twice before it changes anything: its bytes, before LibTorch reads
// them (open_archive: torch_files' check), then what they hold (names, shapes, dtypes, Adam's
// state, the generators' states, a checksum). This lesson shows what the checks stop:
//   1. bad checkpoints (missing, empty, cut short, random bytes, another model's, a state_dict made
//      for Python): each refused with one line and a HINT, the model and Adam left as they were;
//   2. one flipped bit: LibTorch reads the changed weight with no error; the checksum refuses it;
//   3. files that LibTorch's own readers mishandle (found by the fuzzer): refused before it reads.
// Run:    build/bin/lesson15_untrusted_checkpoints [--device ...] [--quick]
// Checks: a good checkpoint loads; every bad one is refused with a clear error, the run untouched;
//         the flipped bit is read by LibTorch and refused by the checksum; the fuzzer's files are
//         refused before LibTorch reads them. Exit 0 PASS, 1 FAIL, 2 bad flag.
#include <caffe2/serialize/inline_container.h>  // defines: PyTorchStreamWriter (a zip of records)
#include <torch/torch.h>                        // defines: torch::serialize::InputArchive

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint.h"               // defines: load_checkpoint (lessons/14_exact_resume/)
#include "common/cli.h"               // defines: Cli, start_lesson
#include "common/report.h"            // defines: format
#include "common/temporary_folder.h"  // defines: TemporaryFolder
#include "common/verdict.h"           // defines: Verdict, report_error
#include "torch_files/state_dict.h"   // defines: CheckpointError, write_damaged_copies

namespace lesson15 {

namespace fs = std::filesystem;
using course::CheckpointError;
using lesson14::Training;

constexpr std::uint64_t kSeed = 15;

// Writes `bytes` to `path`, whole, or throws: a file the lesson failed to write tests no loader.
void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.flush()) throw std::runtime_error("cannot write " + path);
}

// A run worth protecting: lesson 14's model and Adam after one step on random data, so that Adam
// has moments to save (what the file holds matters here, not how well the model learned).
Training one_step(const torch::Device& device, std::uint64_t seed) {
  Training run = lesson14::new_training(device, seed);
  const auto labels = torch::TensorOptions(device).dtype(torch::kLong);
  torch::nn::functional::cross_entropy(run.model->forward(torch::rand({64, 784}, device)),
                                       torch::randint(0, 10, {64}, labels))
      .backward();
  run.optimizer.step();
  return run;
}

//! [try-load]
/// What loading one file into a fresh run did.
struct Attempt {
  std::string refusal;     ///< the error's line, the file named without its folder ("": it loaded)
  std::string hint;        ///< the error's HINT
  bool untouched = false;  ///< the run is as it was made, Adam's state included
};

// Loads `path` into a fresh run, then compares that run with one made alike and never loaded into.
Attempt try_load(const std::string& path, const torch::Device& device, std::uint64_t seed) {
  Training victim = lesson14::new_training(device, seed);
  const Training fresh = lesson14::new_training(device, seed);  // as `victim` must stay
  Attempt attempt;
  try {
    lesson14::load_checkpoint(victim, device, path);
  } catch (const CheckpointError& e) {
    attempt.refusal = e.what();
    attempt.hint = e.hint();
    const std::string name = fs::path(path).filename().string();  // for shorter lines
    const std::size_t at = attempt.refusal.find(path);
    if (at != std::string::npos) attempt.refusal.replace(at, path.size(), name);
  }
  attempt.untouched =
      course::max_state_diff(*victim.model, victim.optimizer, *fresh.model, fresh.optimizer) == 0;
  return attempt;
}
//! [try-load]

//! [bad-files]
// Part 1: the good checkpoint loads; bad ones, each refused with one line and a HINT, the model
// and Adam left as they were.
void refuse_bad_files(course::Verdict& verdict, const fs::path& work, Training& run,
                      const torch::Device& device, std::uint64_t seed) {
  std::cout << "\n== Part 1: bad checkpoints ==\n";
  const std::string good = (work / "run.pt").string();
  lesson14::save_checkpoint(run, lesson14::Progress{}, device, good);
  Training back = lesson14::new_training(device, seed + 1);  // other first weights: a load shows
  lesson14::load_checkpoint(back, device, good);
  const double diff =
      course::max_state_diff(*back.model, back.optimizer, *run.model, run.optimizer);
  verdict.check(diff == 0, "a good checkpoint loads, equal, Adam's state with it",
                course::format("max abs diff %.3g", diff));
  // Missing, empty, cut in half, short of its last byte, random bytes (torch_files/state_dict.h):
  auto bad_files = course::write_damaged_copies(good, work.string(), /*seed=*/7);  // its noise
  // Checkpoints of another model: a wider first layer, a layer missing, a layer extra.
  for (const auto& [what, tensors] : course::misfit_state_dicts(course::state_dict(*run.model))) {
    bad_files.emplace_back(what, (work / (what.substr(0, what.find(' ')) + ".pt")).string());
    lesson14::save_checkpoint(run, lesson14::Progress{}, device, bad_files.back().second, tensors);
  }
  bad_files.emplace_back("a state_dict for Python", (work / "python.pt").string());
  course::write_python_state_dict(course::state_dict(*run.model), bad_files.back().second);
  bad_files.emplace_back("another kind of archive", (work / "other.pt").string());
  torch::serialize::OutputArchive other;  // a LibTorch archive, but not a checkpoint
  other.write("weights", torch::zeros({3}));
  other.save_to(bad_files.back().second);
  int refused = 0, untouched = 0;
  for (const auto& [what, path] : bad_files) {
    const Attempt attempt = try_load(path, device, seed);
    untouched += attempt.untouched;
    if (attempt.refusal.empty()) {
      std::printf("  %-24s LOADED (it should not)\n", what.c_str());
      continue;
    }
    std::printf("  %-24s error: %s\n", what.c_str(), attempt.refusal.c_str());
    if (refused++ == 0) std::printf("  %-24s HINT: %s\n", "", attempt.hint.c_str());
  }
  const int count = static_cast<int>(bad_files.size());
  verdict.check(refused == count && untouched == count,
                "every bad checkpoint is refused with a clear error, the model untouched",
                course::format("%d/%d refused, %d/%d untouched", refused, count, untouched, count));
}
//! [bad-files]

//! [flipped-bit]
// Part 2: one bit of fc1.weight's bytes flipped. The file's structure is whole, so LibTorch reads
// it, the changed weight with it, without an error; the checkpoint's own checksum refuses it.
void flip_one_bit(course::Verdict& verdict, const fs::path& work, Training& run,
                  const torch::Device& device, std::uint64_t seed) {
  std::cout << "\n== Part 2: one flipped bit ==\n";
  const torch::Tensor weight = run.model->fc1->weight.detach().to(torch::kCPU).contiguous();
  const std::string first(static_cast<const char*>(weight.data_ptr()), 64);  // its first floats
  std::string bytes = course::check_libtorch_archive((work / "run.pt").string()).bytes;  // whole
  const std::size_t at = bytes.find(first);  // where fc1.weight's bytes start in the file
  if (at == std::string::npos) throw std::runtime_error("fc1.weight's bytes are not in run.pt");
  bytes[at + 1] ^= 0x10;  // one bit of the first weight's mantissa
  const std::string flipped = (work / "flipped.pt").string();
  write_file(flipped, bytes);
  // What LibTorch reads from it: open_archive is lesson 14's (the structure checked, then read).
  torch::serialize::InputArchive archive = lesson14::open_archive(flipped, torch::kCPU);
  torch::serialize::InputArchive tensors;  // the model_state_dict inside it
  torch::Tensor read;
  if (archive.try_read("model_state_dict", tensors)) {
    for (const auto& [name, tensor] : course::archive_tensors(tensors)) {
      if (name == "fc1.weight") read = tensor;
    }
  }
  const std::int64_t changed =
      read.defined() ? torch::ne(read, weight).sum().item<std::int64_t>() : -1;
  std::printf("  LibTorch reads fc1.weight from it: %lld of its %lld numbers changed, no error\n",
              static_cast<long long>(changed), static_cast<long long>(weight.numel()));
  const Attempt attempt = try_load(flipped, device, seed);
  const std::string& refusal = attempt.refusal;
  std::printf("  lesson 14's load_checkpoint: %s\n", refusal.empty() ? "LOADED" : refusal.c_str());
  verdict.check(changed == 1 && refusal.find("checksum") != std::string::npos && attempt.untouched,
                "a flipped bit that LibTorch reads silently is refused by the checksum",
                course::format("%lld number changed; %s", static_cast<long long>(changed),
                               refusal.empty() ? "loaded" : "refused"));
}
//! [flipped-bit]

//! [fuzzer-findings]
// Part 3: two files the fuzzer found that LibTorch 1.13's readers mishandle, refused by the check
// before LibTorch reads a byte of them: a checkpoint whose version records are renamed away (the
// zip reader's constructor then throws without freeing what it read: a leak) and a pickle whose
// memo index is 1.9 billion (the unpickler grows its memo table to that many entries: 30 GB).
void fuzzer_findings(course::Verdict& verdict, const fs::path& work, const torch::Device& device,
                     std::uint64_t seed) {
  std::cout << "\n== Part 3: files the fuzzer found ==\n";
  std::string bytes = course::check_libtorch_archive((work / "run.pt").string()).bytes;
  for (const std::string name : {"/.data/version", "/version"}) {
    for (std::size_t at = bytes.find(name); at != std::string::npos; at = bytes.find(name, at)) {
      bytes[at + name.size() - 7] = 'x';  // .../version becomes .../xersion
    }
  }
  const std::string unversioned = (work / "unversioned.pt").string();
  const std::string memo = (work / "memo.pt").string();
  write_file(unversioned, bytes);
  {  // a zip of two records, written with LibTorch's own zip writer: a pickle, and 40 zero bytes
    caffe2::serialize::PyTorchStreamWriter out(memo);
    // The pickle: protocol 2 (\x80\x02), None (N), LONG_BINPUT (r) with the memo number 0x7174616d
    // in four bytes, lowest first (\x6d\x61\x74\x71), STOP (.).
    const std::string pickle("\x80\x02N\x72\x6d\x61\x74\x71.", 9), floats(40, '\0');
    out.writeRecord("data.pkl", pickle.data(), pickle.size());
    out.writeRecord("data/0", floats.data(), floats.size());
    out.writeEndOfFile();
  }
  int refused = 0;
  for (const auto& [what, path] : {std::pair{"versions renamed away", unversioned},
                                   std::pair{"a memo index of 1.9e9", memo}}) {
    const Attempt attempt = try_load(path, device, seed);
    const std::string& refusal = attempt.refusal;
    std::printf("  %-24s %s\n", what, refusal.empty() ? "LOADED (it should not)" : refusal.c_str());
    // The check's own words (LibTorch's errors, which open_archive catches, say "not a readable
    // checkpoint"): refused before LibTorch read the file.
    refused += refusal.find("is not a readable LibTorch archive (") != std::string::npos &&
               attempt.untouched;
  }
  verdict.check(refused == 2, "the fuzzer's files are refused before LibTorch reads them",
                course::format("%d/2 refused", refused));
}
//! [fuzzer-findings]

}  // namespace lesson15

// ---- main --------------------------------------------------------------------------------------
#ifndef GPU_LESSONS_NO_MAIN  // tests/test_lesson15.cpp includes this file for its functions
int main(int argc, char** argv) try {
  using namespace lesson15;
  course::CommonOptions options;
  options.seed = kSeed;
  course::Cli cli("lesson15_untrusted_checkpoints",
                  "Lesson 15: bad checkpoint files refused before they change anything.", options);
  if (auto code = cli.parse(argc, argv)) return *code;
  const torch::Device device = course::start_lesson(options);
  const course::TemporaryFolder folder("lesson15-");  // removed, with its files, at the end
  course::Verdict verdict;
  Training run = one_step(device, options.seed);
  refuse_bad_files(verdict, folder.path(), run, device, options.seed);
  flip_one_bit(verdict, folder.path(), run, device, options.seed);
  fuzzer_findings(verdict, folder.path(), device, options.seed);
  return verdict.finish("lesson 15 on " + device.str());
} catch (...) {
  return course::report_error();  // the error without LibTorch's backtrace, a HINT, exit 2 or 1
}
#endif
