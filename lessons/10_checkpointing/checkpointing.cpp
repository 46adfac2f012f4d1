// Lesson 10 — checkpointing: save a training run, resume it exactly, load it on any device, read
// and write Python's state_dict files, survive a crash mid-save; and activation checkpointing.
//
// You will learn:
//   - what a run must save to resume as if it had never stopped: the model, the optimizer's
//     state (Adam's moments and step count), the epoch and step, and the RNG states (CPU, and
//     the GPU's generator on CUDA), since they decide the next epoch's shuffle and dropout;
//   - atomic writes: a temporary file in the same folder, flushed to disk, renamed over the old
//     checkpoint. torch::save(value, path) truncates and writes in place, so a process killed
//     mid-save leaves a broken file where the last good checkpoint was;
//   - device mapping: every tensor is loaded onto the device asked for (Python's map_location),
//     and the optimizer's state follows the parameters, so a GPU run's checkpoint loads on a
//     laptop and the other way round;
//   - loading defensively: torch::load into a module silently takes whatever shapes the file
//     has, so the lesson reads each tensor itself, checks names and shapes, and only then copies;
//     a bad file is one clear error, never a crash, a partial load or a silent fresh start;
//   - Python interop: the seeds' torch.save(model.state_dict(), f) files, read through
//     LibTorch's own unpickler (after checking the zip's CRCs, which LibTorch does not), and files
//     that torch.load(f, weights_only=True) accepts;
//   - Ctrl-C finishes the step under way and leaves the last whole epoch's checkpoint (exit 130);
//   - activation checkpointing: LibTorch has no torch::utils::checkpoint, so the lesson writes one
//     as a custom autograd Function that keeps a segment's input instead of its activations and
//     runs the segment again in backward, with the RNG replayed so that dropout matches.
//
// Run:    build/bin/lesson10_checkpointing [--device ...] [--quick]   (every part, in a temporary
//             folder)
//         build/bin/lesson10_checkpointing --checkpoint run.pt --epochs 5   (resumes when run.pt
//             exists; saves after every epoch; stop it with Ctrl-C and run it again)
//         build/bin/lesson10_checkpointing --from-python model.pt [--to-python out.pt]
// Checks: without flags: a resumed run's parameters equal an uninterrupted run's bitwise; every
//         kill of a process saving atomically leaves a loadable checkpoint (saving in place is
//         shown breaking); a checkpoint loads onto the CPU
//         (and, with a GPU, onto it) equal to what was saved, optimizer state included; every bad
//         checkpoint is refused and leaves the model untouched; the state_dict written for Python
//         reads back equal; activation checkpointing gives the same loss and gradients (tolerance
//         by dtype) with a lower peak. With --checkpoint / --to-python: what was written reads
//         back equal. Every run prints "test accuracy: 0.xxxx" for the model it ends with and
//         checks it against lesson 05's bar when it trained a full run itself.
//         Exit 0 PASS, 1 FAIL, 2 bad flag, missing data or bad checkpoint, 130 stopped by Ctrl-C.
#include "checkpointing.h"

#include <ATen/core/ivalue.h>                    // defines: IValue::make_capsule
#include <caffe2/serialize/in_memory_adapter.h>  // defines: MemoryReadAdapter
#include <caffe2/serialize/inline_container.h>   // defines: PyTorchStreamReader/Writer (zip)
#include <caffe2/serialize/versions.h>           // defines: kMin/kMaxSupportedFileFormatVersion
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <torch/csrc/jit/serialization/export.h>     // defines: writeArchiveAndTensors
#include <torch/csrc/jit/serialization/pickler.h>    // defines: torch::jit::Pickler
#include <torch/csrc/jit/serialization/unpickler.h>  // defines: torch::jit::Unpickler
#include <unistd.h>
#include <zlib.h>  // defines: crc32_z (the checksum the zip format uses too)

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>

#include "common/cli.h"      // defines: Cli, CpuThreads, start_lesson
#include "common/data.h"     // defines: find_fashion_mnist, load_fashion_mnist
#include "common/device.h"   // defines: cuda_device_count, format_bytes, synchronize
#include "common/interrupt.h"  // defines: StopOnInterrupt, Interrupted (Ctrl-C)
#include "common/memory.h"   // defines: memory_stats, reset_peak_memory
#include "common/timing.h"   // defines: Stopwatch, time_median
#include "common/verdict.h"  // defines: Verdict, error_message

namespace lesson10 {

namespace fs = std::filesystem;

namespace {

// A fuzzing build (scripts/fuzz) lets inputs through a failed checksum, so that the fuzzer's
// mutations reach the readers behind it instead of stopping at the first CRC they break.
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
constexpr bool kFuzzing = true;
#else
constexpr bool kFuzzing = false;
#endif

std::string first_line(const std::exception& error) { return course::error_message(error); }

// ---- the RNG -----------------------------------------------------------------------------------
// Every random number in training comes from a device's default generator: the CPU's (shuffles,
// initialisation, CPU dropout) and one per GPU (dropout and randperm on that GPU). A generator's
// state is a small CPU byte tensor; the mutex keeps another thread from drawing meanwhile.
torch::Tensor rng_state(const torch::Device& device) {
  at::Generator generator = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_rng_state(const torch::Device& device, const torch::Tensor& state) {
  at::Generator generator = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state.to(torch::kCPU));
}

// Throws a CheckpointError unless the generator on `device` takes `state`: a contiguous byte
// tensor (the generator reads its bytes from the data pointer, whatever the strides) that
// LibTorch's own checks accept (size, format, a valid Mersenne Twister state). The generator is
// tried with it and put back, so that restoring it later, after the model has changed, cannot
// fail (found by fuzz_checkpoint: a float tensor there threw from set_state after the copies).
void check_rng_state(const torch::Device& device, const torch::Tensor& state,
                     const std::string& which, const std::string& path) {
  const std::string what = path + " has no usable " + which + " generator state";
  const std::string hint = "restore a backup, or delete it to start over";
  if (state.scalar_type() != torch::kByte || state.dim() != 1 || !state.is_contiguous()) {
    throw CheckpointError(what + " (not a contiguous byte vector)", hint);
  }
  const torch::Tensor now = rng_state(device);
  try {
    set_rng_state(device, state);
  } catch (const std::exception& e) {
    set_rng_state(device, now);
    throw CheckpointError(what + " (" + first_line(e) + ")", hint);
  }
  set_rng_state(device, now);
}

// A CRC-32 over everything a checkpoint restores. LibTorch's zip reader does not check the CRCs
// the zip stores, so a flipped bit in a tensor would load silently without this.
std::uint32_t add_to_checksum(std::uint32_t crc, const torch::Tensor& tensor) {
  if (!tensor.defined()) return crc;
  const torch::Tensor bytes = tensor.detach().to(torch::kCPU).contiguous();
  return static_cast<std::uint32_t>(
      crc32_z(crc, static_cast<const Bytef*>(bytes.data_ptr()), bytes.nbytes()));
}

std::uint32_t optimizer_checksum(const torch::optim::Optimizer& optimizer) {
  std::uint32_t combined = 0;  // XOR: the same whatever order the state map lists parameters in
  for (const auto& entry : optimizer.state()) {
    const auto& state = static_cast<const torch::optim::AdamParamState&>(*entry.second);
    std::uint32_t crc = add_to_checksum(0, state.exp_avg());
    crc = add_to_checksum(crc, state.exp_avg_sq());
    crc = add_to_checksum(crc, state.max_exp_avg_sq());
    const std::int64_t step = state.step();
    combined ^= static_cast<std::uint32_t>(
        crc32_z(crc, reinterpret_cast<const Bytef*>(&step), sizeof step));
  }
  return combined;
}

}  // namespace

// ---- saving, atomically -----------------------------------------------------------------------
Entries model_entries(lesson05::Mlp& model) {
  Entries entries;
  for (const auto& p : model->named_parameters()) entries.emplace_back(p.key(), p.value());
  for (const auto& b : model->named_buffers()) entries.emplace_back(b.key(), b.value());
  return entries;
}

//! [write-atomically]
void write_atomically(const std::string& path, const std::function<void(const Sink&)>& write) {
  const fs::path target = fs::absolute(path);
  const fs::path folder = target.parent_path();
  // The temporary file lives in the same folder: rename() is atomic only within one file system.
  std::string temporary = (folder / ("." + target.filename().string() + ".tmp-XXXXXX")).string();
  const int fd = ::mkstemp(temporary.data());
  if (fd < 0) {
    throw CheckpointError("cannot write " + path + ": " + std::strerror(errno),
                          "check that the folder " + folder.string() + " exists and is writable");
  }
  const mode_t mask = ::umask(0);  // mkstemp makes the file private; give it a new file's mode
  ::umask(mask);
  ::fchmod(fd, 0666 & ~mask);
  int error = 0;  // the sink never throws (LibTorch's zip writer calls it); it records the error
  const Sink sink = [&](const void* data, std::size_t size) -> std::size_t {
    const char* bytes = static_cast<const char*>(data);
    for (std::size_t done = 0; done < size && error == 0;) {
      const ssize_t n = ::write(fd, bytes + done, size - done);
      if (n < 0 && errno != EINTR) error = errno;
      if (n > 0) done += static_cast<std::size_t>(n);
    }
    return error == 0 ? size : 0;
  };
  std::string failure;
  try {
    write(sink);
  } catch (const std::exception& e) {
    failure = first_line(e);
  }
  if (error == 0 && failure.empty() && ::fsync(fd) != 0) error = errno;  // 1. bytes on the disk,
  if (::close(fd) != 0 && error == 0) error = errno;
  // >>> lab: rename the flushed file over `target`; on failure, set error = errno
  if (error == 0 && failure.empty() && std::rename(temporary.c_str(), target.c_str()) != 0) {
    error = errno;  // 2. then the name points at them: readers see the old file or the new one
  }
  // <<< lab
  if (error != 0 || !failure.empty()) {
    ::unlink(temporary.c_str());
    throw CheckpointError(
        "saving " + path + " failed: " + (failure.empty() ? std::strerror(error) : failure),
        "free some disk space or save somewhere else; the previous file at " + path +
            " is untouched");
  }
  // 3. the rename itself is recorded in the folder, which is flushed too (a power cut after the
  // rename must not bring the old file back).
  const int dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}
//! [write-atomically]

//! [save-checkpoint]
void save_checkpoint(lesson05::Trainer& trainer, const Progress& progress,
                     const torch::Device& device, const std::string& path, const Entries& entries) {
  torch::serialize::OutputArchive archive;
  // What the file is, so that loading can refuse anything else by name.
  archive.write("format", c10::IValue(kFormatVersion));
  archive.write("model_name", c10::IValue(std::string(kModelName)));
  archive.write("saved_on", c10::IValue(device.str()));
  // Where the run stands, and what it trains on (a resume must train on the same).
  archive.write("epoch", c10::IValue(progress.epoch));
  archive.write("step", c10::IValue(progress.step));
  archive.write("samples", c10::IValue(progress.samples));
  archive.write("batch_size", c10::IValue(progress.batch_size));
  // The model, by state_dict names ("fc1.weight", ...).
  std::uint32_t crc = 0;
  torch::serialize::OutputArchive model;
  for (const auto& [name, tensor] : entries) {
    model.write(name, tensor.detach());
    crc = add_to_checksum(crc, tensor);
  }
  archive.write("model", model);
  // Adam's per-parameter moments and step count, and its options.
  torch::serialize::OutputArchive optimizer;
  trainer.optimizer->save(optimizer);
  archive.write("optimizer", optimizer);
  crc ^= optimizer_checksum(*trainer.optimizer);
  // The generators: the next epoch's shuffle (CPU) and, on a GPU, its random numbers.
  const torch::Tensor cpu_rng = rng_state(torch::kCPU);
  // >>> lab: save the CPU generator's state, cpu_rng, under the key "rng_cpu"
  archive.write("rng_cpu", cpu_rng);
  // <<< lab
  crc = add_to_checksum(crc, cpu_rng);
  if (device.is_cuda()) archive.write("rng_cuda", rng_state(device));
  archive.write("checksum", c10::IValue(static_cast<std::int64_t>(crc)));
  // Not archive.save_to(path): that truncates the last good checkpoint before writing this one.
  write_atomically(path, [&](const Sink& sink) { archive.save_to(sink); });
}
//! [save-checkpoint]

void save_checkpoint(lesson05::Trainer& trainer, const Progress& progress,
                     const torch::Device& device, const std::string& path) {
  save_checkpoint(trainer, progress, device, path, model_entries(trainer.model));
}

// ---- loading, defensively -----------------------------------------------------------------------
namespace {

std::string shape(const torch::Tensor& t) {
  std::ostringstream out;
  out << t.sizes();
  return out.str();
}

// Throws unless every element `tensor`'s sizes and strides reach lies inside its storage. The
// sizes and strides come from the file's pickle and LibTorch's unpickler takes them as they are:
// a damaged file could otherwise make a tensor that reads (and a copy_ that writes) past the end
// of the bytes the file gave it.
void check_in_storage(const torch::Tensor& tensor, const std::string& what,
                      const std::string& path) {
  if (!tensor.defined()) return;
  const auto refuse = [&] {
    throw CheckpointError(path + ": " + what + " (" + shape(tensor) + ") reaches past the " +
                              std::to_string(tensor.storage().nbytes()) + " bytes stored for it",
                          "the file is damaged: restore a backup, or save it again");
  };
  for (const std::int64_t size : tensor.sizes()) {
    if (size < 0) refuse();  // the unpickler takes negative sizes too
  }
  if (tensor.numel() == 0) return;
  if (tensor.storage_offset() < 0) refuse();
  std::int64_t last = tensor.storage_offset();  // the furthest element, in elements
  for (std::int64_t d = 0; d < tensor.dim(); ++d) {
    std::int64_t reach = 0;
    if (tensor.stride(d) < 0 ||
        __builtin_mul_overflow(tensor.size(d) - 1, tensor.stride(d), &reach) ||
        __builtin_add_overflow(last, reach, &last)) {
      refuse();
    }
  }
  std::int64_t end = 0;
  if (__builtin_add_overflow(last, 1, &end) ||
      __builtin_mul_overflow(end, static_cast<std::int64_t>(tensor.element_size()), &end) ||
      end > static_cast<std::int64_t>(tensor.storage().nbytes())) {
    refuse();
  }
}

std::uint64_t little_endian(const std::string& bytes, std::size_t at, int size) {
  std::uint64_t value = 0;
  for (int i = size - 1; i >= 0; --i) value = (value << 8) | static_cast<unsigned char>(bytes[at + i]);
  return value;
}

// One entry of a zip's central directory.
struct ZipEntry {
  std::string name;
  std::uint32_t crc = 0;
  std::uint64_t compressed = 0, size = 0, local_header = 0, method = 0, flags = 0, attributes = 0;
};

// The zip's central directory, found the way LibTorch's zip reader (miniz) finds it: the last
// end-of-directory record, or the zip64 one that a zip64 locator just before it points at.
// Empty when there is none, or when an entry runs past the file. (LibTorch's reader does not
// check the CRC-32s recorded here, and a state_dict has no checksum of its own: check_crcs does.)
std::vector<ZipEntry> zip_directory(const std::string& zip) {
  std::vector<ZipEntry> entries;
  if (zip.size() < 22) return entries;
  const std::size_t end = zip.rfind(std::string("PK\x05\x06", 4), zip.size() - 22);
  if (end == std::string::npos) return entries;
  std::uint64_t count = little_endian(zip, end + 10, 2);
  std::uint64_t offset = little_endian(zip, end + 16, 4);
  if (end >= 20 + 56 && zip.compare(end - 20, 4, "PK\x06\x07") == 0) {  // a zip64 locator
    const std::uint64_t eocd64 = little_endian(zip, end - 20 + 8, 8);
    if (eocd64 > zip.size() - 56) return entries;  // no wrap-around
    if (zip.compare(eocd64, 4, "PK\x06\x06") == 0) {
      count = little_endian(zip, eocd64 + 32, 8);
      offset = little_endian(zip, eocd64 + 48, 8);
    }
  }
  for (std::uint64_t i = 0; i < count; ++i) {  // each entry is 46 bytes or more: count is bounded
    if (offset > zip.size() || zip.size() - offset < 46 ||
        zip.compare(offset, 4, "PK\x01\x02") != 0) {
      entries.clear();
      return entries;
    }
    const std::uint64_t name = little_endian(zip, offset + 28, 2);
    const std::uint64_t extra = little_endian(zip, offset + 30, 2);
    const std::uint64_t comment = little_endian(zip, offset + 32, 2);
    if (zip.size() - offset - 46 < name) {
      entries.clear();
      return entries;
    }
    ZipEntry entry;
    entry.name = zip.substr(offset + 46, name);
    entry.flags = little_endian(zip, offset + 8, 2);
    entry.method = little_endian(zip, offset + 10, 2);
    entry.crc = static_cast<std::uint32_t>(little_endian(zip, offset + 16, 4));
    entry.compressed = little_endian(zip, offset + 20, 4);
    entry.size = little_endian(zip, offset + 24, 4);
    entry.attributes = little_endian(zip, offset + 38, 4);
    entry.local_header = little_endian(zip, offset + 42, 4);
    entries.push_back(std::move(entry));
    offset += 46 + name + extra + comment;
  }
  return entries;
}

// A value the pickle check follows: what LibTorch's unpickler would hold, as far as the check
// needs it. Values live in one vector and refer to each other by index, as LibTorch's IValues
// refer to each other by pointer: a container read back from the memo is the same container.
struct PickleNode {
  enum Kind { kOther, kInt, kString, kTuple, kScalarType } kind = kOther;
  std::int64_t number = 0;              // an int, or a scalar type (torch.FloatStorage, ...)
  std::string text;                     // a string
  std::vector<std::uint32_t> children;  // what it holds: items, or a call's function and input
};

// Why LibTorch's unpickler must not see `pickle`, or "" when it may. The check runs the pickle's
// opcodes on a stack of PickleNodes the way LibTorch's torch::jit::Unpickler runs them on its
// own stack, and refuses what that unpickler does not check (measured and read in LibTorch 1.13;
// 2.x checks some of it):
//   - a memo index past the pickle's length: the unpickler grows its memo table to any index
//     (LONG_BINPUT 0x7174616d: 30 GB, found by fuzz_checkpoint);
//   - a string longer than the bytes left: it allocates the length before reading;
//   - an opcode with too few values on the stack, or no MARK, where 1.13 reads past its vectors;
//   - a storage reference (BINPERSID) whose element count times element size is more than the
//     record `record_size(key)` holds: the unpickler makes the storage that large, over the
//     record's smaller buffer, and every read of the tensor then runs past it;
//   - a container that holds itself (its reference counts never reach 0: a leak), and values
//     nested more than 1000 deep (freeing them recurses once per level, so a deep enough chain
//     overflows the stack; real files nest a few levels);
//   - an opcode the unpickler does not know (it would throw; the check cannot follow it).
std::string pickle_refusal(
    const std::string& pickle,
    const std::function<std::optional<std::uint64_t>(const std::string&)>& record_size) {
  std::vector<PickleNode> nodes(1);  // nodes[0]: any value the check needs nothing of
  std::vector<std::uint32_t> stack;
  std::vector<std::size_t> marks;
  std::unordered_map<std::uint64_t, std::uint32_t> memo;
  std::size_t at = 0;
  auto left = [&] { return pickle.size() - at; };
  auto take = [&](std::size_t n, std::uint64_t& value) {
    if (left() < n) return false;
    value = little_endian(pickle, at, static_cast<int>(n));
    at += n;
    return true;
  };
  auto line = [&](std::string& text) {  // GLOBAL's module and name
    const std::size_t end = pickle.find('\n', at);
    if (end == std::string::npos) return false;
    text = pickle.substr(at, end - at);
    at = end + 1;
    return true;
  };
  auto pop_to_mark = [&](std::size_t& start) {
    if (marks.empty()) return false;
    start = marks.back();
    marks.pop_back();
    return start <= stack.size();
  };
  // A new value holding the stack's values from `start` on, in their place.
  auto make = [&](PickleNode::Kind kind, std::size_t start) {
    PickleNode node;
    node.kind = kind;
    node.children.assign(stack.begin() + static_cast<std::ptrdiff_t>(start), stack.end());
    stack.resize(start);
    nodes.push_back(std::move(node));
    stack.push_back(static_cast<std::uint32_t>(nodes.size() - 1));
  };
  // The stack's values from `start` on go into the container at `into`.
  auto fill = [&](std::uint32_t into, std::size_t start) {
    auto& children = nodes[into].children;
    children.insert(children.end(), stack.begin() + static_cast<std::ptrdiff_t>(start),
                    stack.end());
    stack.resize(start);
  };
  std::uint64_t n = 0;
  if (!take(1, n) || n != 0x80 || !take(1, n) || n != 2) return "it is not a protocol 2 pickle";
  bool stopped = false;
  while (!stopped) {
    std::uint64_t opcode = 0;
    if (!take(1, opcode)) return "its pickle ends before its STOP";
    std::size_t start = 0;
    switch (opcode) {
      case '.':  // STOP
        stopped = true;
        break;
      case 'N':
      case 0x88:
      case 0x89:
      case 'G':  // None, True, False, BINFLOAT
        if (opcode == 'G' && !take(8, n)) return "its pickle is cut short";
        stack.push_back(0);
        break;
      case '}':
      case ']':
      case ')':  // EMPTY_DICT, EMPTY_LIST, EMPTY_TUPLE
        make(opcode == ')' ? PickleNode::kTuple : PickleNode::kOther, stack.size());
        break;
      case '(':  // MARK
        marks.push_back(stack.size());
        break;
      case 'q':
      case 'r':  // BINPUT, LONG_BINPUT
        if (!take(opcode == 'q' ? 1 : 4, n)) return "its pickle is cut short";
        if (stack.empty()) return "its pickle memoizes from an empty stack";
        if (n >= pickle.size()) return "its pickle has a memo index past its own length";
        memo[n] = stack.back();
        break;
      case 'h':
      case 'j': {  // BINGET, LONG_BINGET
        if (!take(opcode == 'h' ? 1 : 4, n)) return "its pickle is cut short";
        const auto found = memo.find(n);
        if (found == memo.end()) return "its pickle reads a memo entry it never wrote";
        stack.push_back(found->second);
        break;
      }
      case 'K':
      case 'M':
      case 'J':
      case 0x8a: {  // BININT1, BININT2, BININT, LONG1
        if (opcode == 0x8a && (!take(1, n) || n != 8)) return "its pickle has a long int";
        if (!take(opcode == 'K' ? 1 : opcode == 'M' ? 2 : opcode == 'J' ? 4 : 8, n)) {
          return "its pickle is cut short";
        }
        PickleNode node;
        node.kind = PickleNode::kInt;
        node.number = opcode == 'J' ? static_cast<std::int32_t>(n) : static_cast<std::int64_t>(n);
        nodes.push_back(std::move(node));
        stack.push_back(static_cast<std::uint32_t>(nodes.size() - 1));
        break;
      }
      case 'X':
      case 0x8d: {  // BINUNICODE, BINUNICODE8
        if (!take(opcode == 'X' ? 4 : 8, n)) return "its pickle is cut short";
        if (n > left()) return "its pickle has a string longer than the pickle";
        PickleNode node;
        node.kind = PickleNode::kString;
        node.text = pickle.substr(at, n);
        at += n;
        nodes.push_back(std::move(node));
        stack.push_back(static_cast<std::uint32_t>(nodes.size() - 1));
        break;
      }
      case 't':  // TUPLE
        if (!pop_to_mark(start)) return "its pickle builds a tuple without its MARK";
        make(PickleNode::kTuple, start);
        break;
      case 0x85:
      case 0x86:
      case 0x87:  // TUPLE1, TUPLE2, TUPLE3
        if (stack.size() < opcode - 0x84) return "its pickle builds a tuple from nothing";
        make(PickleNode::kTuple, stack.size() - (opcode - 0x84));
        break;
      case 'l':
      case 'd':  // LIST, DICT
        if (!pop_to_mark(start)) return "its pickle builds a container without its MARK";
        if (opcode == 'd' && (stack.size() - start) % 2 != 0) return "its pickle has a key alone";
        make(PickleNode::kOther, start);
        break;
      case 'e':
      case 'u':  // APPENDS, SETITEMS
        if (!pop_to_mark(start) || start == 0)
          return "its pickle fills a container without its MARK";
        if (opcode == 'u' && (stack.size() - start) % 2 != 0) return "its pickle has a key alone";
        fill(stack[start - 1], start);
        break;
      case 'a':
      case 's':  // APPEND, SETITEM
        if (stack.size() < (opcode == 'a' ? 2u : 3u)) return "its pickle fills nothing";
        start = stack.size() - (opcode == 'a' ? 1 : 2);
        fill(stack[start - 1], start);
        break;
      case 'c': {  // GLOBAL: torch.FloatStorage and the like stand for their scalar type
        std::string module, name;
        if (!line(module) || !line(name)) return "its pickle is cut short";
        PickleNode node;
        if (module == "torch") {
#define GPU_LESSONS_STORAGE(_, type)                                \
  if (name == #type "Storage") {                                    \
    node.kind = PickleNode::kScalarType;                            \
    node.number = static_cast<std::int64_t>(c10::ScalarType::type); \
  }
          AT_FORALL_SCALAR_TYPES_WITH_COMPLEX_AND_QINTS(GPU_LESSONS_STORAGE)
#undef GPU_LESSONS_STORAGE
        }
        nodes.push_back(std::move(node));
        stack.push_back(static_cast<std::uint32_t>(nodes.size() - 1));
        break;
      }
      case 0x81:  // NEWOBJ
        if (stack.empty()) return "its pickle makes an object from nothing";
        stack.pop_back();
        break;
      case 'b':
      case 'R':  // BUILD, REDUCE: the result may be (or hold) its input
        if (stack.size() < 2) return "its pickle calls nothing";
        make(PickleNode::kOther, stack.size() - 2);
        break;
      case 'Q': {  // BINPERSID: ('storage', scalar type, key, location, element count)
        if (stack.empty()) return "its pickle refers to a storage with nothing";
        const PickleNode& reference = nodes[stack.back()];
        stack.pop_back();
        const std::vector<std::uint32_t>& items = reference.children;
        if (reference.kind != PickleNode::kTuple || items.size() < 5 ||
            nodes[items[2]].kind != PickleNode::kString ||
            nodes[items[4]].kind != PickleNode::kInt ||
            (nodes[items[1]].kind != PickleNode::kScalarType &&
             nodes[items[1]].kind != PickleNode::kInt) ||
            nodes[items[1]].number < 0 ||
            nodes[items[1]].number >= static_cast<std::int64_t>(c10::ScalarType::NumOptions) ||
            nodes[items[1]].number == static_cast<std::int64_t>(c10::ScalarType::Undefined)) {
          return "its pickle has a storage reference the lesson cannot check";
        }
        const auto type = static_cast<c10::ScalarType>(nodes[items[1]].number);
        const std::string& key = nodes[items[2]].text;
        const std::int64_t count = nodes[items[4]].number;
        const std::optional<std::uint64_t> stored = record_size(key);
        std::int64_t bytes = 0;
        if (!stored || count < 0 ||
            __builtin_mul_overflow(count, static_cast<std::int64_t>(c10::elementSize(type)),
                                   &bytes) ||
            static_cast<std::uint64_t>(bytes) > *stored) {
          return "its storage '" + key.substr(0, 40) + "' is larger than the record holding it";
        }
        nodes.emplace_back();  // the tensor
        stack.push_back(static_cast<std::uint32_t>(nodes.size() - 1));
        break;
      }
      default:
        return "its pickle has an opcode LibTorch does not read (" + std::to_string(opcode) + ")";
    }
  }
  // Every value, walked without recursion: no value may hold itself, none may nest too deeply.
  constexpr std::uint32_t kMaxDepth = 1000;
  std::vector<std::uint8_t> state(nodes.size(), 0);  // 0 not seen, 1 on the path, 2 done
  std::vector<std::uint32_t> depth(nodes.size(), 1);
  std::vector<std::pair<std::uint32_t, std::size_t>> path;  // node, next child
  for (std::uint32_t root = 0; root < nodes.size(); ++root) {
    if (state[root] != 0) continue;
    state[root] = 1;
    path.emplace_back(root, 0);
    while (!path.empty()) {
      const std::uint32_t node = path.back().first;
      const std::size_t next = path.back().second++;
      if (next < nodes[node].children.size()) {
        const std::uint32_t child = nodes[node].children[next];
        if (state[child] == 1) return "its pickle has a container that holds itself";
        if (state[child] == 0) {
          state[child] = 1;
          path.emplace_back(child, 0);
        }
        continue;
      }
      for (const std::uint32_t child : nodes[node].children) {
        depth[node] = std::max(depth[node], depth[child] + 1);
      }
      if (depth[node] > kMaxDepth) return "its pickle nests values more than 1000 deep";
      state[node] = 2;
      path.pop_back();
    }
  }
  return "";
}

std::string lower_ascii(std::string text) {
  for (char& c : text) c = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  return text;
}

// The size of each record by its name as LibTorch's zip reader finds it, ignoring ASCII case (the
// smallest, where several names differ only in case).
std::unordered_map<std::string, std::uint64_t> record_sizes(
    const std::vector<ZipEntry>& directory) {
  std::unordered_map<std::string, std::uint64_t> sizes;
  for (const ZipEntry& entry : directory) {
    const auto [found, added] = sizes.emplace(lower_ascii(entry.name), entry.size);
    if (!added) found->second = std::min(found->second, entry.size);
  }
  return sizes;
}

// For pickle_refusal: the size of the record a storage key names, in `folder` (lower case).
std::function<std::optional<std::uint64_t>(const std::string&)> storage_sizes(
    std::unordered_map<std::string, std::uint64_t> sizes, const std::string& folder) {
  return
      [sizes = std::move(sizes), folder](const std::string& key) -> std::optional<std::uint64_t> {
        const auto found = sizes.find(folder + lower_ascii(key));
        if (found == sizes.end()) return std::nullopt;
        return found->second;
      };
}

// Why LibTorch's zip reader (caffe2::serialize::PyTorchStreamReader) would refuse `zip`, or ""
// when it opens it. Its constructor reads the directory, then the first entry's folder (every
// record's prefix), ".data/serialization_id" if there is one, and the format version from
// ".data/version" or "version". When any of that fails after the directory was read, it throws
// without freeing the directory (measured on LibTorch 1.13: every such file leaks it), so the
// lesson refuses those files itself, before LibTorch sees them: fuzz/regressions/fuzz_checkpoint.
std::string zip_refusal(const std::string& zip, const std::vector<ZipEntry>& directory) {
  if (zip.empty()) return "the file is empty";
  if (directory.empty()) return "no zip directory: the file is cut short, or not a zip archive";
  const std::string& first = directory.front().name;
  const std::size_t slash = first.find('/');
  if (slash == std::string::npos || first.find('\0') < slash) {
    return "its first entry is not in a folder";
  }
  // The reader finds a record by name ignoring ASCII case: every entry it might pick must read.
  const auto lower = lower_ascii;
  auto records_named = [&](const std::string& name) {
    std::vector<const ZipEntry*> found;
    const std::string wanted = lower(name);
    for (const ZipEntry& entry : directory) {
      if (lower(entry.name) == wanted) found.push_back(&entry);
    }
    return found;
  };
  auto records = [&](const std::string& record) {
    return records_named(first.substr(0, slash + 1) + record);
  };
  // A stored (uncompressed) record that lies inside the file, and whose bytes match the CRC-32
  // the directory records for them.
  auto stored = [&](const ZipEntry& entry, std::string& bytes, bool check_crc) {
    const std::uint64_t at = entry.local_header;
    if ((entry.flags & 0x61) != 0 || entry.method != 0 || (entry.attributes & 0x10) != 0 ||
        entry.size == 0 || entry.size != entry.compressed || entry.size == 0xffffffffu ||
        at == 0xffffffffu || at > zip.size() || zip.size() - at < 30 ||
        zip.compare(at, 4, "PK\x03\x04") != 0) {
      return false;
    }
    const std::uint64_t data =
        at + 30 + little_endian(zip, at + 26, 2) + little_endian(zip, at + 28, 2);
    if (data > zip.size() || zip.size() - data < entry.size) return false;
    bytes = zip.substr(data, entry.size);
    return !check_crc ||
           crc32_z(0, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()) == entry.crc;
  };
  std::string bytes;
  for (const ZipEntry* id : records(".data/serialization_id")) {
    if (!stored(*id, bytes, true)) return "its serialization id is damaged";
  }
  std::vector<const ZipEntry*> versions = records(".data/version");
  if (versions.empty()) versions = records("version");
  if (versions.empty()) return "it has no format version";
  for (const ZipEntry* version : versions) {
    if (!stored(*version, bytes, true)) return "its format version is damaged";
    constexpr std::uint64_t kMin = caffe2::serialize::kMinSupportedFileFormatVersion;
    constexpr std::uint64_t kMax = caffe2::serialize::kMaxSupportedFileFormatVersion;
    std::uint64_t number = 0;
    std::size_t digits = 0;
    while (digits < bytes.size() && digits < 8 && bytes[digits] >= '0' && bytes[digits] <= '9') {
      number = number * 10 + static_cast<std::uint64_t>(bytes[digits++] - '0');
    }
    if (digits == 0 || number < kMin || number > kMax) {
      return "its format version is not one LibTorch reads (" + std::to_string(kMin) + " to " +
             std::to_string(kMax) + ")";
    }
  }
  const std::unordered_map<std::string, std::uint64_t> sizes = record_sizes(directory);
  // What LibTorch reads after its constructor: every record, into a buffer of the size the
  // directory gives before a byte is read (so no entry may claim more than its bytes can hold),
  // and every pickle, through its unpickler (pickle_refusal).
  for (const ZipEntry& entry : directory) {
    if (entry.size == 0xffffffffu || entry.compressed == 0xffffffffu) {
      return "it has an entry of 4 GiB or more";  // zip64 sizes: LibTorch's own files have none
    }
    if (entry.method == 8 ? entry.size / 1032 > entry.compressed  // deflate's largest ratio
                          : entry.size > entry.compressed) {
      return "its entry " + entry.name.substr(0, 80) + " claims more bytes than it holds";
    }
    const bool pickle =
        entry.name.size() >= 3 && lower(entry.name.substr(entry.name.size() - 3)) == "pkl";
    if (!pickle) continue;
    if (!stored(entry, bytes, !kFuzzing)) {
      return "its pickle " + entry.name.substr(0, 80) + " is damaged";
    }
    // A storage key names a record beside the pickle: archive/data.pkl's "0" is archive/data/0.
    std::string folder = lower(entry.name);
    if (folder.size() >= 4 && folder.compare(folder.size() - 4, 4, ".pkl") == 0) {
      folder.resize(folder.size() - 4);
    }
    folder += '/';
    const std::string refusal = pickle_refusal(bytes, storage_sizes(sizes, folder));
    if (!refusal.empty()) return refusal;
  }
  return "";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// Opens any LibTorch archive, mapping every tensor onto `device` (Python's map_location).
torch::serialize::InputArchive open_archive(const std::string& path, const torch::Device& device) {
  if (!fs::exists(path)) {
    throw CheckpointError("no checkpoint at " + path,
                          "check the path (a run with --checkpoint PATH creates it)");
  }
  if (!fs::is_regular_file(path)) {
    throw CheckpointError(path + " is not a file", "give the path of a checkpoint file");
  }
  // The file is read once: what is checked is what LibTorch reads.
  const std::string bytes = read_file(path);
  const std::string refusal = zip_refusal(bytes, zip_directory(bytes));
  torch::serialize::InputArchive archive;
  try {
    if (!refusal.empty()) throw std::runtime_error(refusal);
    archive.load_from(bytes.data(), bytes.size(), device);
  } catch (const std::exception& e) {
    bool state_dict = false;  // torch.save's zip (data.pkl) rather than a module's (constants.pkl)?
    if (refusal.empty()) {
      try {
        caffe2::serialize::PyTorchStreamReader zip(
            std::make_shared<caffe2::serialize::MemoryReadAdapter>(bytes.data(), bytes.size()));
        state_dict = zip.hasRecord("data.pkl") && !zip.hasRecord("constants.pkl");
      } catch (const std::exception&) {
      }
    }
    if (state_dict) {
      throw CheckpointError(path +
                                " is a state_dict in torch.save's format, not a checkpoint of "
                                "a training run",
                            "start a run from its weights with --from-python " + path);
    }
    std::string reason = first_line(e);  // its first sentence (2.x appends a paragraph)
    reason = reason.substr(0, reason.find(". "));
    throw CheckpointError(path + " is not a readable checkpoint (" + reason + ")",
                          "the file is truncated or corrupt, or not a LibTorch archive: restore "
                          "a backup, or delete it to start over");
  }
  return archive;
}

std::int64_t read_int(torch::serialize::InputArchive& archive, const std::string& key,
                      const std::string& path) {
  c10::IValue value;
  if (!archive.try_read(key, value) || !value.isInt()) {
    throw CheckpointError(path + " has no '" + key + "': it is not a whole lesson 10 checkpoint",
                          "restore a backup, or delete it to start over");
  }
  return value.toInt();
}

std::string read_string(torch::serialize::InputArchive& archive, const std::string& key) {
  c10::IValue value;
  return archive.try_read(key, value) && value.isString() ? value.toStringRef() : std::string();
}

// Each tensor the model has, read from `archive` and checked, ready to copy: nothing is copied
// here. (archive.read(name, parameter) would swap the parameter's storage for the file's, of
// whatever shape the file has, and quietly detach it from lesson 05's flat parameter tensor.)
std::vector<std::pair<torch::Tensor, torch::Tensor>> checked_copies(
    const Entries& model, torch::serialize::InputArchive& archive, const std::string& path) {
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;
  for (const auto& [name, destination] : model) {
    torch::Tensor source;
    if (!archive.try_read(name, source)) {
      throw CheckpointError(path + " has no '" + name + "': it is a checkpoint of another model",
                            "load it into the model it was saved from, or start a new run with "
                            "another --checkpoint path");
    }
    if (!source.sizes().equals(destination.sizes()) ||
        source.scalar_type() != destination.scalar_type()) {
      throw CheckpointError(path + ": '" + name + "' is " + shape(source) + " " +
                                std::string(c10::toString(source.scalar_type())) +
                                " in the file but " + shape(destination) + " " +
                                c10::toString(destination.scalar_type()) + " in the model",
                            "it is a checkpoint of another model: load it into that model, or "
                            "start a new run with another --checkpoint path");
    }
    check_in_storage(source, "'" + name + "'", path);
    copies.emplace_back(destination, source);
  }
  for (const std::string& key : archive.keys()) {
    bool known = false;
    for (const auto& entry : model) known = known || entry.first == key;
    if (!known) {
      throw CheckpointError(path + " has '" + key +
                                "', which the model does not have: it is a "
                                "checkpoint of another model",
                            "load it into the model it was saved from, or start a new run with "
                            "another --checkpoint path");
    }
  }
  return copies;
}

}  // namespace

//! [load-checkpoint]
Loaded load_checkpoint(lesson05::Trainer& trainer, const torch::Device& device,
                       const std::string& path) {
  // map_location: every tensor in the file lands on `device`, wherever it was saved.
  torch::serialize::InputArchive archive = open_archive(path, device);
  const std::int64_t format = read_int(archive, "format", path);
  const std::string model_name = read_string(archive, "model_name");
  if (format != kFormatVersion || model_name != kModelName) {
    throw CheckpointError(path + " holds '" + model_name + "' (format " + std::to_string(format) +
                              "), not '" + kModelName + "' (format " +
                              std::to_string(kFormatVersion) + ")",
                          "use the program that saved it, or start a new run with another "
                          "--checkpoint path");
  }
  Loaded loaded;
  loaded.saved_on = read_string(archive, "saved_on");
  loaded.progress.epoch = read_int(archive, "epoch", path);
  loaded.progress.step = read_int(archive, "step", path);
  loaded.progress.samples = read_int(archive, "samples", path);
  loaded.progress.batch_size = read_int(archive, "batch_size", path);

  // 1. The model: every name present, every shape and dtype equal, nothing extra.
  torch::serialize::InputArchive model;
  if (!archive.try_read("model", model)) {
    throw CheckpointError(path + " has no model", "restore a backup, or delete it to start over");
  }
  const auto copies = checked_copies(model_entries(trainer.model), model, path);

  // 2. The optimizer: loaded into a new Adam over the same parameter, then checked.
  auto optimizer =
      std::make_unique<torch::optim::Adam>(std::vector<torch::Tensor>{trainer.flat.values},
                                           torch::optim::AdamOptions(lesson05::kLearningRate));
  torch::serialize::InputArchive saved_optimizer;
  c10::IValue version;
  if (!archive.try_read("optimizer", saved_optimizer) ||
      !saved_optimizer.try_read("pytorch_version", version)) {
    throw CheckpointError(path + " has no optimizer state",
                          "restore a backup, or delete it to start over");
  }
  try {
    optimizer->load(saved_optimizer);
  } catch (const std::exception& e) {
    throw CheckpointError(path + ": the optimizer state does not load (" + first_line(e) + ")",
                          "it is a checkpoint of another model or optimizer");
  }
  for (const auto& entry : optimizer->state()) {
    const auto& state = static_cast<const torch::optim::AdamParamState&>(*entry.second);
    check_in_storage(state.exp_avg(), "Adam's exp_avg", path);
    check_in_storage(state.exp_avg_sq(), "Adam's exp_avg_sq", path);
    check_in_storage(state.max_exp_avg_sq(), "Adam's max_exp_avg_sq", path);
    if (!state.exp_avg().sizes().equals(trainer.flat.values.sizes())) {
      throw CheckpointError(path + ": the optimizer state is " + shape(state.exp_avg()) +
                                ", the parameters " + shape(trainer.flat.values),
                            "it is a checkpoint of another model or optimizer");
    }
  }

  // 3. The generators' states, checked against the size this LibTorch uses.
  torch::Tensor cpu_rng, cuda_rng;
  if (!archive.try_read("rng_cpu", cpu_rng) || cpu_rng.numel() != rng_state(torch::kCPU).numel()) {
    throw CheckpointError(path + " has no usable CPU generator state",
                          "restore a backup, or delete it to start over");
  }
  loaded.cuda_rng = archive.try_read("rng_cuda", cuda_rng);
  check_in_storage(cpu_rng, "the CPU generator's state", path);
  check_in_storage(cuda_rng, "the CUDA generator's state", path);
  check_rng_state(torch::kCPU, cpu_rng, "CPU", path);
  if (loaded.cuda_rng && device.is_cuda()) check_rng_state(device, cuda_rng, "CUDA", path);

  // 4. The checksum over what was read: a flipped bit anywhere in it is refused.
  std::uint32_t crc = 0;
  for (const auto& copy : copies) crc = add_to_checksum(crc, copy.second);
  crc ^= optimizer_checksum(*optimizer);
  crc = add_to_checksum(crc, cpu_rng);
  if (static_cast<std::int64_t>(crc) != read_int(archive, "checksum", path) &&
      !kFuzzing) {
    throw CheckpointError(path + " is corrupt: its contents do not match its checksum",
                          "the file changed after it was written (disk or copy error): restore "
                          "a backup, or delete it to start over");
  }

  // 5. Everything is read and checked: only now is the trainer changed.
  {
    torch::NoGradGuard no_grad;
    for (const auto& [destination, source] : copies) destination.copy_(source);
  }
  trainer.optimizer = std::move(optimizer);
  set_rng_state(torch::kCPU, cpu_rng);
  if (loaded.cuda_rng && device.is_cuda()) {
    set_rng_state(device, cuda_rng);
    loaded.cuda_rng_restored = true;
  }
  return loaded;
}
//! [load-checkpoint]

torch::Tensor checkpoint_parameters(const std::string& path) {
  lesson05::Trainer trainer = lesson05::make_trainer(torch::kCPU, kSeed);
  load_checkpoint(trainer, torch::kCPU, path);
  return trainer.flat.values.detach().clone();
}

//! [train-to]
void train_to(lesson05::Trainer& trainer, Progress& progress, int epochs, lesson05::Loader& loader,
              const torch::Device& device, const std::string& checkpoint) {
  // Ctrl-C: the step under way finishes, the epoch is abandoned, and the checkpoint keeps the
  // last whole epoch. A save under way finishes first: the handler only sets a flag.
  course::StopOnInterrupt stop_on_ctrl_c;
  const auto stopped = [&](const std::string& what) {
    const std::string saved =
        checkpoint.empty() || progress.epoch == 0
            ? "nothing is saved"
            : checkpoint + " holds epoch " + std::to_string(progress.epoch) +
                  ": run the same command to resume from there";
    return course::Interrupted(what + "; " + saved);
  };
  while (progress.epoch < epochs) {
    const lesson05::EpochStats stats = lesson05::train_epoch(trainer, loader, device);
    if (stats.interrupted) {
      throw stopped("epoch " + std::to_string(progress.epoch + 1) + " abandoned after " +
                    std::to_string(stats.samples) + " of " + std::to_string(loader.size()) +
                    " samples");
    }
    progress.epoch += 1;
    progress.step += (stats.samples + progress.batch_size - 1) / progress.batch_size;
    std::printf("  epoch %lld/%d  loss %.4f  %5.2f s", static_cast<long long>(progress.epoch),
                epochs, stats.mean_loss, stats.seconds);
    if (!checkpoint.empty()) {
      course::Stopwatch watch(torch::kCPU);
      save_checkpoint(trainer, progress, device, checkpoint);  // after every epoch
      std::printf("  saved (%.0f ms)", watch.seconds() * 1e3);
    }
    std::printf("\n");
    std::fflush(stdout);  // a line per epoch, also through a pipe (| tee)
    if (course::stop_requested() && progress.epoch < epochs) {
      throw stopped("stopped after epoch " + std::to_string(progress.epoch));
    }
  }
}
//! [train-to]

// ---- Python's state_dict ----------------------------------------------------------------------
namespace {

// The key of the dummy entry the rewrite below adds (and the reader drops).
constexpr const char* kPlaceholderKey = "collections.OrderedDict";

std::string little_endian32(std::uint32_t n) {
  std::string bytes(4, '\0');
  for (int i = 0; i < 4; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return bytes;
}

//! [plain-dict-pickle]
// A state_dict is a collections.OrderedDict. LibTorch's unpickler expects that class only as a
// tensor's (empty) backward hooks and turns it into None, so torch::pickle_load fails on the
// seeds' files ("Expected GenericDict but got None"). torch.save writes pickle protocol 2 and
// always opens and closes a state_dict the same way; two edits of the opcodes make it a plain
// dict, which the unpickler reads. Anything else is left as it is (a plain dict needs nothing).
std::string plain_dict_pickle(std::string pickle) {
  // Opening: PROTO 2, GLOBAL collections.OrderedDict, BINPUT 0, EMPTY_TUPLE, REDUCE, BINPUT 1.
  static const std::string kOpening(
      "\x80\x02"
      "ccollections\nOrderedDict\nq\x00)Rq\x01",
      33);
  if (pickle.compare(0, kOpening.size(), kOpening) != 0) return pickle;
  // Becomes: an empty dict in memo 1, and the class still in memo 0 (each tensor's hooks refer
  // to it) as the value of a placeholder entry: EMPTY_DICT, BINPUT 1, MARK, BINUNICODE key,
  // GLOBAL, BINPUT 0, SETITEMS.
  const std::string key = kPlaceholderKey;
  pickle = std::string("\x80\x02}q\x01(X", 7) + little_endian32(key.size()) + key +
           std::string("ccollections\nOrderedDict\nq\x00u", 28) + pickle.substr(kOpening.size());
  // Closing: {'_metadata': OrderedDict(...)} BUILD STOP sets the attribute _metadata (each
  // module's version). Cut from that dict (EMPTY_DICT, BINPUT/LONG_BINPUT) and keep STOP.
  static const std::string kMetadata("X\x09\x00\x00\x00_metadata", 14);
  const std::size_t at = pickle.rfind(kMetadata);
  if (at != std::string::npos && pickle.size() >= 2 &&
      pickle.compare(pickle.size() - 2, 2, "b.") == 0) {
    std::size_t open = std::string::npos;
    if (at >= 3 && pickle[at - 3] == '}' && pickle[at - 2] == 'q') open = at - 3;
    if (at >= 6 && pickle[at - 6] == '}' && pickle[at - 5] == 'r') open = at - 6;
    if (open != std::string::npos) pickle = pickle.substr(0, open) + ".";
  }
  return pickle;
}
//! [plain-dict-pickle]

}  // namespace

namespace {

// Checks every record `zip` lists against the CRC the file records for it.
void check_crcs(caffe2::serialize::PyTorchStreamReader& zip, const std::vector<ZipEntry>& directory,
                const std::string& path) {
  for (const std::string& record : zip.getAllRecords()) {
    const auto found = std::find_if(directory.begin(), directory.end(), [&](const ZipEntry& entry) {
      return entry.name.size() > record.size() &&
             entry.name.compare(entry.name.size() - record.size() - 1, std::string::npos,
                                "/" + record) == 0;
    });
    auto [data, size] = zip.getRecord(record);
    const auto crc = static_cast<std::uint32_t>(
        crc32_z(0, static_cast<const Bytef*>(data.get()), size));
    if ((found == directory.end() || found->crc != crc) && !kFuzzing) {
      throw CheckpointError(path + " is corrupt: its entry " + record +
                                " does not match the CRC-32 the zip records for it",
                            "the file changed after Python saved it (disk or copy error): save "
                            "it again");
    }
  }
}

}  // namespace

//! [read-python]
Entries read_python_state_dict(const std::string& path) {
  const std::string hint =
      "save it in Python with torch.save(model.state_dict(), path) (the default zip format), or "
      "torch.save(dict(model.state_dict()), path)";
  if (!fs::is_regular_file(path)) throw CheckpointError("no file at " + path, hint);
  c10::IValue value;
  try {
    // torch.save's format: a zip with data.pkl (the pickle) and data/<key> (each storage's bytes).
    // The file is read once: what is checked is what LibTorch reads.
    const std::string file = read_file(path);
    const std::vector<ZipEntry> directory = zip_directory(file);
    const std::string refusal = zip_refusal(file, directory);
    if (!refusal.empty()) throw std::runtime_error(refusal);
    caffe2::serialize::PyTorchStreamReader zip(
        std::make_shared<caffe2::serialize::MemoryReadAdapter>(file.data(), file.size()));
    if (!zip.hasRecord("data.pkl")) throw std::runtime_error("no data.pkl in the zip");
    check_crcs(zip, directory, path);
    auto [bytes, size] = zip.getRecord("data.pkl");
    const std::string pickle =
        plain_dict_pickle(std::string(static_cast<const char*>(bytes.get()), size));
    // The rewritten pickle is checked again before LibTorch's unpickler runs it (zip_refusal).
    const std::string& first = directory.front().name;
    const std::string folder = lower_ascii(first.substr(0, first.find('/') + 1)) + "data/";
    const std::string unsafe =
        pickle_refusal(pickle, storage_sizes(record_sizes(directory), folder));
    if (!unsafe.empty()) throw std::runtime_error(unsafe);
    std::size_t offset = 0;
    auto read = [&](char* buffer, std::size_t n) {
      n = std::min(n, pickle.size() - offset);
      std::memcpy(buffer, pickle.data() + offset, n);
      offset += n;
      return n;
    };
    auto read_storage = [&](const std::string& key) {
      return std::get<0>(zip.getRecord("data/" + key));
    };
    // The CPU as the device: tensors saved from a GPU are mapped here (map_location="cpu").
    torch::jit::Unpickler unpickler(read, /*type_resolver=*/nullptr, /*obj_loader=*/nullptr,
                                    read_storage, c10::Device(torch::kCPU));
    value = unpickler.parse_ivalue();
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    throw CheckpointError(path + " is not a state_dict saved by torch.save (" + first_line(e) + ")",
                          hint);
  }
  if (!value.isGenericDict()) {
    throw CheckpointError(path + " holds a " + value.tagKind() + ", not a state_dict", hint);
  }
  Entries entries;
  for (const auto& item : value.toGenericDict()) {
    if (!item.key().isString())
      throw CheckpointError(path + " has a key that is not a string", hint);
    const std::string& name = item.key().toStringRef();
    if (name == kPlaceholderKey) continue;
    if (!item.value().isTensor()) {
      throw CheckpointError(
          path + ": '" + name + "' is a " + item.value().tagKind() + ", not a tensor", hint);
    }
    check_in_storage(item.value().toTensor(), "'" + name + "'", path);
    entries.emplace_back(name, item.value().toTensor());
  }
  return entries;
}
//! [read-python]

//! [write-python]
void write_python_state_dict(lesson05::Mlp& model, const std::string& path) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::TensorType::get());
  for (const auto& [name, tensor] : model_entries(model)) {
    dict.insert(name, tensor.detach().to(torch::kCPU).clone());  // compact, on the CPU
  }
  // torch::pickle_save(dict) tags the dict with its TorchScript type (a call to
  // torch.jit._pickle.restore_type_tag), which torch.load(weights_only=True) refuses. The same
  // pickler without the tag writes a plain dict of tensors.
  std::vector<char> pickle;
  torch::jit::Pickler pickler(
      [&](const char* data, std::size_t size) { pickle.insert(pickle.end(), data, data + size); },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(dict);
  pickler.stop();
  write_atomically(path, [&](const Sink& sink) {
    caffe2::serialize::PyTorchStreamWriter zip(sink);  // data.pkl + data/<key>, as torch.save
    torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(),
                                       zip);
    zip.writeEndOfFile();
  });
}
//! [write-python]

void load_entries(lesson05::Mlp& model, const Entries& entries, const std::string& source) {
  const Entries own = model_entries(model);
  for (const auto& [name, tensor] : entries) {
    bool known = false;
    for (const auto& entry : own) known = known || entry.first == name;
    if (!known) {
      throw CheckpointError(source + " has '" + name + "', which lesson 05's MLP does not have",
                            "save the state_dict of a module with Linear layers fc1 (784->128), "
                            "fc2 (128->64) and fc3 (64->10)");
    }
  }
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;
  for (const auto& [name, destination] : own) {
    const torch::Tensor* found = nullptr;
    for (const auto& entry : entries) found = entry.first == name ? &entry.second : found;
    if (found == nullptr || !found->sizes().equals(destination.sizes()) ||
        !found->is_floating_point()) {
      throw CheckpointError(
          source + ": '" + name + "' is " +
              (found == nullptr ? std::string("missing") : shape(*found)) + ", the model's is " +
              shape(destination),
          "save the state_dict of a module with Linear layers fc1 (784->128), fc2 (128->64) and "
          "fc3 (64->10)");
    }
    copies.emplace_back(destination, *found);
  }
  torch::NoGradGuard no_grad;
  for (const auto& [destination, source_tensor] : copies) destination.copy_(source_tensor);
}

// ---- the crash test -----------------------------------------------------------------------------
//! [save-loop]
void save_loop(const std::string& path, bool atomic) {
  torch::Tensor payload = torch::empty({kSaveLoopBytes / 4}, torch::kFloat);
  for (std::int64_t iteration = 1;; ++iteration) {
    payload.fill_(static_cast<float>(iteration));
    torch::serialize::OutputArchive archive;
    archive.write("iteration", c10::IValue(iteration));
    archive.write("payload", payload);
    if (atomic) {
      write_atomically(path, [&](const Sink& sink) { archive.save_to(sink); });
    } else {
      archive.save_to(path);  // what torch::save(value, path) does: truncate, then write
    }
    std::printf("saved %lld\n", static_cast<long long>(iteration));
    std::fflush(stdout);
  }
}
//! [save-loop]

std::int64_t check_save_loop_file(const std::string& path) {
  torch::serialize::InputArchive archive = open_archive(path, torch::kCPU);
  const std::int64_t iteration = read_int(archive, "iteration", path);
  torch::Tensor payload;
  if (!archive.try_read("payload", payload) || payload.numel() != kSaveLoopBytes / 4 ||
      !payload.eq(static_cast<float>(iteration)).all().item<bool>()) {
    throw CheckpointError(path + " is torn: its payload is not all " + std::to_string(iteration),
                          "a save was interrupted in place");
  }
  return iteration;
}

namespace {

// Reads one line from `fd` (the child's stdout); false at end of file.
bool read_line(int fd, std::string& line) {
  line.clear();
  char c = 0;
  while (true) {
    const ssize_t n = ::read(fd, &c, 1);
    if (n == 0) return false;
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (c == '\n') return true;
    line.push_back(c);
  }
}

}  // namespace

KillReport kill_while_saving(const std::string& program, const std::string& path, bool atomic,
                             int kills, std::uint64_t seed) {
  std::mt19937_64 random(seed);
  KillReport report;
  std::vector<double> save_seconds;
  for (int i = 0; i < kills; ++i) {
    int out[2];
    if (::pipe(out) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, out[0]);
    std::vector<std::string> args = {program, "--save-loop", path, "--threads", "1"};
    if (!atomic) args.push_back("--in-place");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    const int spawned = posix_spawn(&pid, program.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(out[1]);
    if (spawned != 0) {
      ::close(out[0]);
      throw std::runtime_error("cannot start " + program + ": " + std::strerror(spawned));
    }
    // Two whole saves (the file exists; one save's duration is known), then a kill at a random
    // moment of the third.
    std::string line;
    bool ok = read_line(out[0], line);
    const auto start = std::chrono::steady_clock::now();
    ok = ok && read_line(out[0], line);
    const double one_save =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (ok) {
      save_seconds.push_back(one_save);
      std::uniform_real_distribution<double> when(0.0, one_save);
      std::this_thread::sleep_for(std::chrono::duration<double>(when(random)));
    }
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ::close(out[0]);
    if (!ok) throw std::runtime_error(program + " --save-loop stopped before saving twice");
    report.kills += 1;
    try {
      check_save_loop_file(path);
      report.loadable += 1;
    } catch (const CheckpointError& e) {
      if (report.failure.empty()) report.failure = e.what();
    }
  }
  // A killed atomic save leaves its temporary file: harmless (never read), removed here.
  const fs::path target = fs::absolute(path);
  const std::string prefix = "." + target.filename().string() + ".tmp-";
  for (const auto& file : fs::directory_iterator(target.parent_path())) {
    if (file.path().filename().string().rfind(prefix, 0) == 0) {
      fs::remove(file.path());
      report.leftovers += 1;
    }
  }
  report.save_seconds = course::median(save_seconds);
  return report;
}

// ---- activation checkpointing -------------------------------------------------------------------
namespace {

// The segment a CheckpointFunction recomputes, kept in the autograd context (which holds
// IValues) as a capsule.
struct SegmentHolder : torch::CustomClassHolder {
  explicit SegmentHolder(torch::nn::Sequential s) : segment(std::move(s)) {}
  torch::nn::Sequential segment;
};

// The generators' states now; restore() puts them back.
struct RngStates {
  torch::Device device;
  torch::Tensor cpu, cuda;
  explicit RngStates(const torch::Device& d) : device(d), cpu(rng_state(torch::kCPU)) {
    if (d.is_cuda()) cuda = rng_state(d);
  }
  RngStates(const torch::Device& d, torch::Tensor c, torch::Tensor g)
      : device(d), cpu(std::move(c)), cuda(std::move(g)) {}
  void restore() const {
    set_rng_state(torch::kCPU, cpu);
    if (cuda.defined()) set_rng_state(device, cuda);
  }
};

//! [checkpoint-function]
struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  // Autograd runs forward with gradients off: the segment's activations are freed layer by layer.
  // Only the input is saved. The parameters come in as inputs too: that is what connects them to
  // this node, so they get gradients even when `input` requires none (the first segment's input
  // is the data). Had they been left out, backward would never run for such a segment and its
  // parameters would silently keep no gradient.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::nn::Sequential segment,
                               bool preserve_rng, const torch::Tensor& input,
                               torch::TensorList parameters) {
    (void)parameters;
    ctx->saved_data["segment"] =
        c10::IValue::make_capsule(c10::make_intrusive<SegmentHolder>(segment));
    ctx->saved_data["input_requires_grad"] = input.requires_grad();
    if (preserve_rng) {  // dropout in backward must draw the same numbers as here
      const RngStates now(input.device());
      ctx->saved_data["rng_cpu"] = now.cpu;
      if (now.cuda.defined()) ctx->saved_data["rng_cuda"] = now.cuda;
    }
    ctx->save_for_backward({input});
    return segment->forward(input);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto holder =
        c10::static_intrusive_pointer_cast<SegmentHolder>(ctx->saved_data["segment"].toCapsule());
    torch::nn::Sequential segment = holder->segment;
    const torch::Tensor input = ctx->get_saved_variables()[0];
    const std::vector<torch::Tensor> parameters = segment->parameters();
    // Run the segment again, this time recording a graph, from a detached copy of the input.
    torch::Tensor x =
        input.detach().requires_grad_(ctx->saved_data["input_requires_grad"].toBool());
    torch::Tensor output;
    {
      std::optional<RngStates> after;  // the RNG as backward found it, put back afterwards
      // >>> lab: restore the forward's RNG (ctx->saved_data), keeping the current one in `after`
      if (ctx->saved_data.count("rng_cpu") != 0) {
        after.emplace(x.device());
        const auto cuda = ctx->saved_data.count("rng_cuda") != 0
                              ? ctx->saved_data["rng_cuda"].toTensor()
                              : torch::Tensor();
        RngStates(x.device(), ctx->saved_data["rng_cpu"].toTensor(), cuda).restore();
      }
      // <<< lab
      torch::AutoGradMode enable_grad(true);
      output = segment->forward(x);
      if (after) after->restore();
    }
    // Differentiate the recomputed segment; the gradients go back through this node's inputs.
    std::vector<torch::Tensor> wrt;
    if (x.requires_grad()) wrt.push_back(x);
    for (const auto& p : parameters) {
      if (p.requires_grad()) wrt.push_back(p);
    }
    torch::autograd::variable_list grads;
    if (!wrt.empty() && grad_outputs[0].defined()) {
      grads = torch::autograd::grad({output}, wrt, {grad_outputs[0]}, /*retain_graph=*/false,
                                    /*create_graph=*/false, /*allow_unused=*/true);
    } else {
      grads.resize(wrt.size());
    }
    // One entry per forward argument: none for `segment` and `preserve_rng`, then the input's,
    // then each parameter's.
    torch::autograd::variable_list result = {torch::Tensor(), torch::Tensor()};
    std::size_t next = 0;
    result.push_back(x.requires_grad() ? grads[next++] : torch::Tensor());
    for (const auto& p : parameters)
      result.push_back(p.requires_grad() ? grads[next++] : torch::Tensor());
    return result;
  }
};
//! [checkpoint-function]

}  // namespace

torch::Tensor checkpoint(torch::nn::Sequential block, const torch::Tensor& input,
                         bool preserve_rng) {
  const std::vector<torch::Tensor> parameters = block->parameters();
  return CheckpointFunction::apply(block, preserve_rng, input, torch::TensorList(parameters));
}

DeepMlpImpl::DeepMlpImpl(int depth, std::int64_t width) {
  for (int first = 0; first < depth; first += kSegment) {
    torch::nn::Sequential segment;
    for (int layer = first; layer < std::min(depth, first + kSegment); ++layer) {
      segment->push_back(torch::nn::Linear(width, width));
      segment->push_back(torch::nn::ReLU());
      segment->push_back(torch::nn::Dropout(kDropout));
    }
    segments.push_back(register_module("segment" + std::to_string(segments.size()), segment));
  }
  head = register_module("head", torch::nn::Linear(width, 10));
}

//! [deep-forward]
torch::Tensor DeepMlpImpl::forward(const torch::Tensor& x, bool checkpointed, bool preserve_rng) {
  torch::Tensor h = x;
  for (auto& segment : segments) {
    h = checkpointed ? checkpoint(segment, h, preserve_rng) : segment->forward(h);
  }
  return head(h);
}
//! [deep-forward]

namespace {

std::int64_t width_of(DeepMlp& model) { return model->head->options.in_features(); }

void zero_gradients(torch::nn::Module& model) {
  for (auto& p : model.parameters()) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
}

}  // namespace

StepCost measure_step(DeepMlp& model, std::int64_t batch, bool checkpointed,
                      const torch::Device& device) {
  model->to(device);
  model->train();
  const auto options = torch::TensorOptions().device(device);
  const torch::Tensor x = torch::randn({batch, width_of(model)}, options);
  const torch::Tensor y = torch::randint(0, 10, {batch}, options.dtype(torch::kLong));
  auto step = [&] {
    zero_gradients(*model);
    torch::nn::functional::cross_entropy(model->forward(x, checkpointed), y).backward();
  };
  step();  // warm-up: the gradients exist from here on, so the peak below is the step's own
  course::synchronize(device);
  course::reset_peak_memory(device);
  const std::int64_t before = course::memory_stats(device).allocated;
  step();
  course::synchronize(device);
  StepCost cost;
  cost.peak_bytes = course::memory_stats(device).peak_allocated - before;
  cost.seconds = course::time_median(step, device, /*warmup=*/0, kTimedSteps).median_s;
  return cost;
}

StepResult step_gradients(DeepMlp& model, const torch::Tensor& x, const torch::Tensor& y,
                          bool checkpointed, std::uint64_t seed, bool preserve_rng) {
  model->train();
  zero_gradients(*model);
  torch::manual_seed(seed);  // the same dropout masks for both ways
  StepResult result;
  result.loss =
      torch::nn::functional::cross_entropy(model->forward(x, checkpointed, preserve_rng), y);
  result.loss.backward();
  result.loss = result.loss.detach();
  for (const auto& p : model->parameters()) {
    result.gradients.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  }
  return result;
}

}  // namespace lesson10

// ---- main
// ----------------------------------------------------------------------------------------
namespace {

using lesson10::CheckpointError;
using lesson10::Progress;

std::string evidence(const char* format, double a, double b = 0) {
  char text[160];
  std::snprintf(text, sizeof text, format, a, b);
  return text;
}

// A file the run will write at the end must be writable now, not after an hour of training.
void check_writable(const std::string& path, const std::string& flag) {
  const std::filesystem::path folder = std::filesystem::absolute(path).parent_path();
  if (!std::filesystem::is_directory(folder) || ::access(folder.c_str(), W_OK) != 0) {
    throw CheckpointError(flag + " " + path + ": the folder " + folder.string() +
                              " does not exist or is not writable",
                          "create the folder first, or give " + flag + " another path");
  }
}

// A fresh trainer, resumed from `checkpoint` when that file exists. A checkpoint of a run on
// other data or batches is refused: resuming it would silently become another run.
lesson05::Trainer resume_or_start(const std::string& checkpoint, const torch::Device& device,
                                  std::uint64_t seed, Progress& progress) {
  lesson05::Trainer trainer = lesson05::make_trainer(device, seed);
  if (checkpoint.empty()) return trainer;
  if (!std::filesystem::exists(checkpoint)) {
    std::cout << "  no checkpoint at " << checkpoint << " yet: starting from epoch 0\n";
    return trainer;
  }
  //! [resume]
  const lesson10::Loaded loaded = lesson10::load_checkpoint(trainer, device, checkpoint);
  if (loaded.progress.samples != progress.samples ||
      loaded.progress.batch_size != progress.batch_size) {
    throw CheckpointError(
        checkpoint + " is a run on " + std::to_string(loaded.progress.samples) +
            " images in batches of " + std::to_string(loaded.progress.batch_size) + ", this one " +
            std::to_string(progress.samples) + " in batches of " +
            std::to_string(progress.batch_size),
        "resume with the flags it was started with (--quick, --batch-size), or use another "
        "--checkpoint path");
  }
  progress = loaded.progress;
  std::cout << "  resumed from " << checkpoint << ": epoch " << progress.epoch << ", step "
            << progress.step << " (saved on " << loaded.saved_on << ")\n";
  if (loaded.cuda_rng && !loaded.cuda_rng_restored) {
    std::cout << "  note: its CUDA generator state is not restored on " << device.str() << "\n";
  }
  //! [resume]
  return trainer;
}

// Part 4's bad files, each next to what loading it must say.
struct BadFile {
  std::string what;
  std::string path;
};

std::vector<BadFile> make_bad_files(const std::filesystem::path& folder, const std::string& good,
                                    lesson05::Trainer& trainer, const Progress& progress,
                                    const torch::Device& device, const std::string& for_python) {
  std::vector<BadFile> files;
  auto path = [&](const std::string& name) { return (folder / name).string(); };
  files.push_back({"missing file", path("no-such-file.pt")});
  std::ifstream in(good, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  auto write = [&](const std::string& name, const std::string& content) {
    std::ofstream(path(name), std::ios::binary) << content;
    return path(name);
  };
  files.push_back({"empty file", write("empty.pt", "")});
  files.push_back({"truncated (half)", write("truncated.pt", bytes.substr(0, bytes.size() / 2))});
  files.push_back(
      {"truncated (last byte)", write("truncated1.pt", bytes.substr(0, bytes.size() - 1))});
  std::mt19937 random(7);
  std::string noise(4096, '\0');
  for (char& c : noise) c = static_cast<char>(random());
  files.push_back({"random bytes", write("random.pt", noise)});
  // Checkpoints of another model: a wider first layer, a layer missing, a layer extra.
  lesson10::Entries wider = lesson10::model_entries(trainer.model);
  wider[0].second = torch::zeros({256, 784});
  wider[1].second = torch::zeros({256});
  lesson10::save_checkpoint(trainer, progress, device, path("wider.pt"), wider);
  files.push_back({"wrong shape", path("wider.pt")});
  lesson10::Entries fewer = lesson10::model_entries(trainer.model);
  fewer.pop_back();
  lesson10::save_checkpoint(trainer, progress, device, path("fewer.pt"), fewer);
  files.push_back({"missing key", path("fewer.pt")});
  lesson10::Entries more = lesson10::model_entries(trainer.model);
  more.emplace_back("fc4.weight", torch::zeros({10, 10}));
  lesson10::save_checkpoint(trainer, progress, device, path("more.pt"), more);
  files.push_back({"extra key", path("more.pt")});
  files.push_back({"a state_dict for Python", for_python});
  return files;
}

}  // namespace

int lesson_main(int argc, char** argv) {
  using namespace lesson10;
  course::CommonOptions options;
  options.seed = kSeed;
  int epochs = -1;  // -1: kEpochs with --checkpoint, 0 with --from-python alone
  int batch_size = static_cast<int>(kBatchSize);
  std::string checkpoint, from_python, to_python, save_loop_path;
  bool in_place = false;
  course::Cli cli("lesson10_checkpointing",
                  "Lesson 10: checkpointing (save, resume exactly, load anywhere, Python files, "
                  "crash-safe writes) and activation checkpointing.",
                  options);
  cli.add_data_dir();
  cli.add_path(
      "--checkpoint", checkpoint,
      "train to --epochs, resuming from this file when it exists, saving after each epoch");
  cli.add_option("--epochs", epochs, "epochs to train to (-1: 5 with --checkpoint, else 0)", -1,
                 1000);
  cli.add_option("--batch-size", batch_size, "samples per step", 1, 60000);
  cli.add_path("--from-python", from_python,
               "start from a state_dict saved by Python's torch.save(model.state_dict(), PATH)");
  cli.add_path("--to-python", to_python,
               "write the final model for Python's torch.load(PATH, weights_only=True)");
  cli.add_path("--save-loop", save_loop_path,
               "(crash test) save a large checkpoint to PATH over and over until killed");
  cli.add_flag("--in-place", in_place, "(crash test) --save-loop writes in place, not atomically");
  if (auto code = cli.parse(argc, argv)) return *code;
  if (!save_loop_path.empty()) save_loop(save_loop_path, /*atomic=*/!in_place);
  const torch::Device device = course::start_lesson(options);

  const auto folder = course::find_fashion_mnist(options.data_dir);
  course::ImageSet train = course::load_fashion_mnist(folder, /*train=*/true);
  const course::ImageSet test = course::load_fashion_mnist(folder, /*train=*/false);
  if (options.quick) train = lesson05::take(train, lesson05::kQuickSamples);
  Progress fresh;
  fresh.samples = train.labels.size(0);
  fresh.batch_size = batch_size;
  std::cout << "Fashion-MNIST: " << fresh.samples
            << " training images; lesson 05's MLP, Adam, batch " << batch_size << "\n";
  course::Verdict verdict;

  const bool driven = !checkpoint.empty() || !from_python.empty() || !to_python.empty();
  if (driven) {
    // ---- one run, driven by the flags ----------------------------------------------------------
    if (epochs < 0) epochs = (checkpoint.empty() && !from_python.empty()) ? 0 : kEpochs;
    if (!checkpoint.empty()) check_writable(checkpoint, "--checkpoint");
    if (!to_python.empty()) check_writable(to_python, "--to-python");
    Progress progress = fresh;
    lesson05::Trainer trainer = resume_or_start(checkpoint, device, options.seed, progress);
    const bool resumed = progress.epoch > 0;
    if (!resumed && !from_python.empty()) {
      lesson10::load_entries(trainer.model, read_python_state_dict(from_python), from_python);
      std::cout << "  started from Python's state_dict " << from_python << "\n";
    } else if (!from_python.empty()) {
      std::cout << "  note: --from-python " << from_python << " is not read: the run resumes\n";
    }
    const std::int64_t first_epoch = progress.epoch;
    auto loader = lesson05::make_loader("batches", train, batch_size, device);
    train_to(trainer, progress, epochs, *loader, device, checkpoint);
    if (resumed && first_epoch >= epochs) {
      std::cout << "  already at epoch " << progress.epoch << ": nothing to train\n";
    }
    const torch::Tensor final_parameters = trainer.flat.values.detach().to(torch::kCPU);
    if (!checkpoint.empty() && progress.epoch > first_epoch) {
      const double diff =
          (checkpoint_parameters(checkpoint) - final_parameters).abs().max().item<double>();
      verdict.check(diff == 0, "the last checkpoint reads back equal to the model",
                    evidence("max abs diff %.3g", diff));
    }
    if (!to_python.empty()) {
      write_python_state_dict(trainer.model, to_python);
      lesson05::Mlp copy;
      load_entries(copy, read_python_state_dict(to_python), to_python);
      const double diff = (lesson05::flatten_parameters(*copy).values - final_parameters)
                              .abs()
                              .max()
                              .item<double>();
      std::cout << "  wrote " << to_python << " (for torch.load(path, weights_only=True))\n";
      verdict.check(diff == 0, "the state_dict written for Python reads back equal",
                    evidence("max abs diff %.3g", diff));
    }
    const double accuracy = lesson05::evaluate(trainer.model, test, device);
    std::printf("test accuracy: %.4f\n", accuracy);
    // Lesson 05's bar holds for a whole run this program trained itself.
    if (from_python.empty() && !options.quick && progress.epoch >= kEpochs &&
        batch_size <= kBatchSize) {
      verdict.check(accuracy >= lesson05::kAccuracyBar, "test accuracy reaches lesson 05's bar",
                    evidence("%.4f vs bar %.2f", accuracy, lesson05::kAccuracyBar));
    }
    if (verdict.checks() == 0) {
      verdict.check(std::isfinite(accuracy), "the model evaluates", evidence("%.4f", accuracy));
    }
    return verdict.finish("lesson 10 on " + device.str());
  }

  // ---- every part, in a temporary folder
  // ---------------------------------------------------------
  const std::filesystem::path work =
      std::filesystem::temp_directory_path() / ("lesson10-" + std::to_string(::getpid()));
  std::filesystem::create_directories(work);
  struct Cleanup {
    std::filesystem::path path;
    ~Cleanup() { std::filesystem::remove_all(path); }
  } cleanup{work};
  const std::string run_pt = (work / "run.pt").string();
  const int demo_epochs = epochs > 0 ? std::max(epochs, kResumeAt + 1) : kDemoEpochs;

  std::cout << "\n== Part 1: save every epoch, stop, resume: the same run ==\n";
  // Bitwise equality needs reproducible arithmetic. On the CPU that means one thread: PyTorch's
  // own LibTorch multiplies matrices with MKL, whose threads may split a sum differently from
  // one run to the next, so even two uninterrupted runs can differ in the last bits.
  std::optional<course::CpuThreads> reproducible;
  if (device.is_cpu()) {
    reproducible.emplace(1);
    std::cout << "(on one CPU thread, so that the arithmetic repeats bit for bit)\n";
  }
  std::cout << "uninterrupted, " << demo_epochs << " epochs:\n";
  Progress straight_progress = fresh;
  lesson05::Trainer straight = lesson05::make_trainer(device, options.seed);
  auto straight_loader = lesson05::make_loader("batches", train, batch_size, device);
  train_to(straight, straight_progress, demo_epochs, *straight_loader, device, "");
  std::cout << "stopped after " << kResumeAt << " epochs, then resumed in a fresh trainer:\n";
  {
    Progress progress = fresh;
    lesson05::Trainer first = resume_or_start(run_pt, device, options.seed, progress);
    auto loader = lesson05::make_loader("batches", train, batch_size, device);
    train_to(first, progress, kResumeAt, *loader, device, run_pt);
  }  // the first "process" ends here: its model, optimizer and loader are gone
  Progress progress = fresh;
  lesson05::Trainer resumed = resume_or_start(run_pt, device, options.seed, progress);
  auto loader = lesson05::make_loader("batches", train, batch_size, device);
  train_to(resumed, progress, demo_epochs, *loader, device, run_pt);
  const double resume_diff =
      (straight.flat.values - resumed.flat.values).abs().max().item<double>();
  std::printf("max abs difference, resumed vs uninterrupted: %.3g\n", resume_diff);
  verdict.check(resume_diff == 0,
                "a resumed run's parameters equal the uninterrupted run's, bitwise",
                evidence("max abs diff %.3g", resume_diff));
  reproducible.reset();

  std::cout << "\n== Part 2: a process killed while saving ==\n";
  const int kills = options.quick ? kQuickKills : kKills;
  std::printf(
      "a child process saves a %s checkpoint in a loop; SIGKILL at a random moment of a "
      "save, %d times each way:\n",
      course::format_bytes(kSaveLoopBytes).c_str(), kills);
  std::printf("%-36s %8s %10s %12s\n", "how it saves", "kills", "loadable", "one save");
  const std::string program = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string big_pt = (work / "big.pt").string();
  for (const bool atomic : {false, true}) {
    std::filesystem::remove(big_pt);
    const KillReport report = kill_while_saving(program, big_pt, atomic, kills, options.seed);
    std::printf("%-36s %8d %10d %9.0f ms\n",
                atomic ? "temporary file, fsync, rename" : "in place (archive.save_to(path))",
                report.kills, report.loadable, report.save_seconds * 1e3);
    if (!report.failure.empty()) std::printf("  e.g. %s\n", report.failure.c_str());
    if (atomic) {
      if (report.leftovers > 0) {
        std::printf("  (%d temporary files of killed saves were left beside it, and removed)\n",
                    report.leftovers);
      }
      verdict.check(report.loadable == report.kills,
                    "every kill of an atomic save leaves a whole, loadable checkpoint",
                    std::to_string(report.loadable) + "/" + std::to_string(report.kills));
    }
  }

  std::cout << "\n== Part 3: device mapping ==\n";
  const torch::Tensor saved = resumed.flat.values.detach().to(torch::kCPU);
  {
    //! [map-to-cpu]
    lesson05::Trainer on_cpu = lesson05::make_trainer(torch::kCPU, options.seed);
    const Loaded loaded = load_checkpoint(on_cpu, torch::kCPU, run_pt);  // map_location="cpu"
    //! [map-to-cpu]
    const auto& state = static_cast<const torch::optim::AdamParamState&>(
        *on_cpu.optimizer->state().begin()->second);
    const bool equal = torch::equal(on_cpu.flat.values, saved);
    std::cout << "saved on " << loaded.saved_on << ", loaded on cpu: parameters "
              << (equal ? "equal" : "DIFFER") << ", Adam's state on "
              << state.exp_avg().device().str() << " (step " << state.step() << ")\n";
    verdict.check(
        equal && state.exp_avg().device().is_cpu(),
        "the " + loaded.saved_on + " checkpoint loads on the CPU, optimizer state with it");
  }
  if (course::cuda_device_count() > 0) {
    // The other way: a checkpoint written from the CPU, loaded onto the GPU (or from the GPU,
    // when this run trained there, loaded back onto it).
    const torch::Device gpu = device.is_cuda() ? device : torch::Device(torch::kCUDA, 0);
    lesson05::Trainer on_cpu = lesson05::make_trainer(torch::kCPU, options.seed);
    load_checkpoint(on_cpu, torch::kCPU, run_pt);
    const std::string cpu_pt = (work / "from-cpu.pt").string();
    save_checkpoint(on_cpu, progress, torch::kCPU, cpu_pt);
    lesson05::Trainer on_gpu = lesson05::make_trainer(gpu, options.seed);
    load_checkpoint(on_gpu, gpu, cpu_pt);
    const auto& state = static_cast<const torch::optim::AdamParamState&>(
        *on_gpu.optimizer->state().begin()->second);
    const bool equal = torch::equal(on_gpu.flat.values.to(torch::kCPU), saved);
    std::cout << "saved on cpu, loaded on " << gpu.str() << ": parameters "
              << (equal ? "equal" : "DIFFER") << ", Adam's state on "
              << state.exp_avg().device().str() << "\n";
    verdict.check(equal && state.exp_avg().device() == on_gpu.flat.values.device(),
                  "a CPU checkpoint loads onto the GPU, optimizer state with it");
  } else {
    std::cout << "(skipped: needs CUDA) saving on a GPU and loading onto the CPU, and the other "
                 "way round: run this lesson with --device cuda on a machine with a GPU\n";
  }

  std::cout << "\n== Part 4: bad checkpoints ==\n";
  const std::string for_python = (work / "for_python.pt").string();
  write_python_state_dict(resumed.model, for_python);
  int refused = 0, untouched = 0;
  std::string example_hint;
  const auto bad_files = make_bad_files(work, run_pt, resumed, progress, device, for_python);
  for (const BadFile& bad : bad_files) {
    lesson05::Trainer victim = lesson05::make_trainer(device, options.seed);
    const torch::Tensor before = victim.flat.values.detach().clone();
    try {
      load_checkpoint(victim, device, bad.path);
      std::printf("  %-24s LOADED (it should not)\n", bad.what.c_str());
    } catch (const CheckpointError& e) {
      refused += 1;
      std::string message = e.what();  // shorter lines: file names without the folder
      const std::string prefix = work.string() + "/";
      for (auto at = message.find(prefix); at != std::string::npos; at = message.find(prefix)) {
        message.erase(at, prefix.size());
      }
      std::printf("  %-24s error: %s\n", bad.what.c_str(), message.c_str());
      if (example_hint.empty()) example_hint = e.hint();
    }
    untouched += torch::equal(victim.flat.values, before) ? 1 : 0;
  }
  std::cout << "  (each also prints a HINT, e.g. \"" << example_hint << "\")\n";
  const int bad_count = static_cast<int>(bad_files.size());
  verdict.check(refused == bad_count && untouched == bad_count,
                "every bad checkpoint is refused with a clear error, the model left untouched",
                std::to_string(refused) + "/" + std::to_string(bad_count) + " refused, " +
                    std::to_string(untouched) + "/" + std::to_string(bad_count) + " untouched");

  std::cout << "\n== Part 5: state_dicts for and from Python ==\n";
  {
    lesson05::Mlp copy;
    load_entries(copy, read_python_state_dict(for_python), for_python);
    const torch::Tensor back = lesson05::flatten_parameters(*copy).values;
    const bool equal = torch::equal(back, saved);
    std::cout
        << "wrote " << std::filesystem::path(for_python).filename().string() << " ("
        << course::format_bytes(static_cast<double>(std::filesystem::file_size(for_python)))
        << "); Python reads it with torch.load(path, weights_only=True)\n"
        << "read back through the reader of Python's files: " << (equal ? "equal" : "DIFFERENT")
        << "\n"
        << "(with Python's torch: lessons/10_checkpointing/roundtrip.py; see the lesson page)\n";
    verdict.check(equal, "the state_dict written for Python reads back equal");
  }

  std::cout << "\n== Part 6: activation checkpointing ==\n";
  {
    const std::int64_t width = options.quick ? kDeepWidth / 2 : kDeepWidth;
    const int check_depth = 2 * kSegment;
    torch::manual_seed(options.seed);
    DeepMlp model(check_depth, width);
    model->to(device);
    const auto opts = torch::TensorOptions().device(device);
    const torch::Tensor x = torch::randn({64, width}, opts);  // data: requires no grad
    const torch::Tensor y = torch::randint(0, 10, {64}, opts.dtype(torch::kLong));
    const StepResult plain = step_gradients(model, x, y, false, options.seed);
    const StepResult kept = step_gradients(model, x, y, true, options.seed);
    const StepResult no_replay = step_gradients(model, x, y, true, options.seed, false);
    const double loss_diff = course::max_rel_diff(plain.loss, kept.loss);
    const double grad_diff = course::max_rel_diff(plain.gradients, kept.gradients);
    const double no_replay_diff = course::max_rel_diff(plain.gradients, no_replay.gradients);
    std::printf(
        "depth %d, width %lld, dropout %.1f, segments of %d layers: loss relative diff %.3g, "
        "gradients max relative diff %.3g (tolerance %.0e)\n",
        check_depth, static_cast<long long>(width), kDropout, kSegment, loss_diff, grad_diff,
        course::tolerance_for(torch::kFloat));
    std::printf(
        "without replaying the RNG in backward, dropout draws other masks: gradients "
        "differ by %.3g\n",
        no_replay_diff);
    verdict.check(
        loss_diff <= course::tolerance_for(torch::kFloat) && grad_diff <= course::tolerance_for(torch::kFloat),
        "activation checkpointing gives the same loss and gradients, the first "
        "segment's too (its input requires no grad)",
        evidence("max relative diff %.3g", std::max(loss_diff, grad_diff)));

    const std::vector<int> depths = options.quick ? std::vector<int>{8} : std::vector<int>{8, 16};
    const std::vector<std::int64_t> batches =
        options.quick ? std::vector<std::int64_t>{256} : std::vector<std::int64_t>{256, 1024};
    std::printf("\n%6s %6s %14s %14s %7s %11s %11s %8s\n", "depth", "batch", "peak, plain",
                "peak, ckpt", "ratio", "step, plain", "step, ckpt", "extra");
    bool lower = true;
    for (const int depth : depths) {
      torch::manual_seed(options.seed);
      DeepMlp deep(depth, width);
      for (const std::int64_t batch : batches) {
        const StepCost without = measure_step(deep, batch, false, device);
        const StepCost with = measure_step(deep, batch, true, device);
        lower = lower && with.peak_bytes < without.peak_bytes;
        std::printf("%6d %6lld %14s %14s %6.2fx %8.1f ms %8.1f ms %+7.0f%%\n", depth,
                    static_cast<long long>(batch),
                    course::format_bytes(static_cast<double>(without.peak_bytes)).c_str(),
                    course::format_bytes(static_cast<double>(with.peak_bytes)).c_str(),
                    static_cast<double>(with.peak_bytes) / static_cast<double>(without.peak_bytes),
                    without.seconds * 1e3, with.seconds * 1e3,
                    (with.seconds / without.seconds - 1) * 100);
      }
    }
    std::cout << "(peak: bytes allocated during one step above those live before it; step: "
                 "forward + backward, median of "
              << kTimedSteps << ")\n";
    verdict.check(lower, "activation checkpointing lowers every step's peak memory");
  }

  std::cout << "\n";
  const double accuracy = lesson05::evaluate(resumed.model, test, device);
  std::printf("test accuracy: %.4f\n", accuracy);
  const bool full = !options.quick && demo_epochs >= kEpochs && batch_size <= kBatchSize;
  const double bar = full ? lesson05::kAccuracyBar : lesson05::kQuickAccuracyBar;
  verdict.check(accuracy >= bar, "the resumed model's test accuracy reaches the bar",
                evidence("%.4f vs bar %.2f", accuracy, bar));
  return verdict.finish("lesson 10 on " + device.str());
}
