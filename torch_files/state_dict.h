// state_dict.h defines: a model's state_dict in C++ (its tensors by name), read from and written
// to the files Python's torch.save(model.state_dict(), path) writes and torch.load(path,
// weights_only=True) reads; a strict load_state_dict (every name and shape checked, all or
// nothing); the checks of a LibTorch archive (torch::save, OutputArchive) before LibTorch reads
// it and before torch::load or Module::load takes its shapes; Adam's state per parameter; and
// CRC-32s of tensors and of Adam's state (a checkpoint's own checksum); damaged files and other
// models' state_dicts, to show a loader refusing them.
// The file format's own checks are torch_files/torch_file.h's.
#pragma once

#include <torch/nn/module.h>                // defines: torch::nn::Module
#include <torch/optim/adam.h>               // defines: torch::optim::Adam, AdamParamState
#include <torch/serialize/input-archive.h>  // defines: torch::serialize::InputArchive

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/verdict.h"          // defines: CourseError
#include "torch_files/torch_file.h"  // defines: TorchFile, CrcCheck

namespace course {

/// A checkpoint or state_dict file that cannot be used (missing, damaged, another model's, another
/// kind of file): one line naming the file and what is wrong, a HINT, exit 2.
class CheckpointError : public CourseError {
 public:
  using CourseError::CourseError;
};

/// The HINT for a checkpoint that is damaged, cut short or not whole.
constexpr const char* kDamagedHint = "restore a backup, or delete it to start over";

/// Throws CheckpointError naming `flag` when `path` (a file to be written; empty: none) lies in a
/// folder that does not exist or that this process may not write into: found before the
/// training, not after it.
void check_writable(const std::string& path, const std::string& flag);

/// Tensors by state_dict name ("fc1.weight", ...), in order: Python's model.state_dict().
using StateDict = std::vector<std::pair<std::string, at::Tensor>>;

/// `module`'s parameters, then its buffers, by their state_dict names: the tensors themselves
/// (not copies), wherever they live.
StateDict state_dict(const torch::nn::Module& module);

/// Reads a file Python saved with torch.save(model.state_dict(), path) (the default zip format),
/// or a plain dict of tensors, onto the CPU: Python's torch.load(path, map_location="cpu",
/// weights_only=True). The file is checked first (check_torch_file, every record's CRC-32: a
/// state_dict has no checksum of its own), then read by LibTorch's own unpickler. Throws
/// CheckpointError for a missing, damaged or other kind of file.
StateDict read_python_state_dict(const std::string& path);

/// Writes `tensors` (copied to the CPU) in torch.save's format through `write`, so that Python's
/// torch.load(path, weights_only=True) returns a dict that load_state_dict accepts.
void write_python_state_dict(const StateDict& tensors,
                             const std::function<std::size_t(const void*, std::size_t)>& write);
/// The same, to `path` (in place, as torch.save does). CheckpointError when it cannot be written.
void write_python_state_dict(const StateDict& tensors, const std::string& path);

/// Python's strict model.load_state_dict(sd): every one of `module`'s names is in `tensors` with
/// the module's shape and a floating dtype, and `tensors` has no name the module lacks; only then
/// is each copied (copy_, into the module's own tensors, on their device and in their dtype).
/// Otherwise nothing is copied, and CheckpointError names `source`, the tensor and what differs,
/// with `hint`.
void load_state_dict(torch::nn::Module& module, const StateDict& tensors, const std::string& source,
                     const std::string& hint);

/// What a mismatch means, for checked_copies' error.
struct Mismatch {
  std::string
      another_model;  ///< appended to "has no 'x'": what the file is, e.g. ": a file of ..."
  std::string hint;
};
/// The check behind load_state_dict, for a file read another way: each of `model`'s names is
/// found by `file_has`, with the model's shape and a floating dtype (the same dtype when
/// `same_dtype`), inside its storage; `file_names` holds no name the model lacks. Returns the
/// pairs (model's tensor, file's tensor) to copy; copies nothing. CheckpointError otherwise.
std::vector<std::pair<at::Tensor, at::Tensor>> checked_copies(
    const StateDict& model, const std::vector<std::string>& file_names,
    const std::function<std::optional<at::Tensor>(const std::string&)>& file_has, bool same_dtype,
    const std::string& source, const Mismatch& mismatch);

/// The same for a file's tensors already read by name (`file`, e.g. archive_tensors()).
std::vector<std::pair<at::Tensor, at::Tensor>> checked_copies(const StateDict& model,
                                                              const StateDict& file,
                                                              bool same_dtype,
                                                              const std::string& source,
                                                              const Mismatch& mismatch);

/// Checks `path` before LibTorch's reader (torch::load, InputArchive::load_from) opens it: a
/// regular file, in LibTorch's archive format, accepted by check_torch_file with the CRC-32s
/// `crc` asks for (kEveryRecord: a flipped bit in a tensor is found too). Returns the file read
/// and checked; CheckpointError (with a HINT) when LibTorch must not read it.
TorchFile check_libtorch_archive(const std::string& path, CrcCheck crc = CrcCheck::kEveryRecord);

/// The tensors of an archive written by torch::save(module) or module->save(archive), by
/// state_dict name: its nested archives ("fc1" holding "weight") flattened to "fc1.weight".
StateDict archive_tensors(torch::serialize::InputArchive& archive);

/// Checks that `archive`, read from `source`, holds `module`'s state as torch::save(module) wrote
/// it: every name, the module's shapes, nothing extra (torch::load and Module::load take whatever
/// shapes a file has, and ignore what is extra). Throws CheckpointError; changes nothing.
void check_module_archive(const torch::nn::Module& module, torch::serialize::InputArchive& archive,
                          const std::string& source);

/// check_libtorch_archive, then check_module_archive on what it holds: run it before
/// torch::load(model, path, device).
void check_module_file(const torch::nn::Module& module, const std::string& path);

/// Adam's state for `parameter` (its two moments and its step count), or nullptr before the
/// parameter's first step. (LibTorch keys the state by the parameter's TensorImpl, a string in
/// 1.13, a pointer in 2.x.)
const torch::optim::AdamParamState* adam_state(const torch::optim::Adam& optimizer,
                                               const at::Tensor& parameter);
/// A CRC-32 of `tensor`'s bytes (read on the CPU, in order), continuing `crc`; undefined: `crc`.
std::uint32_t tensor_crc32(std::uint32_t crc, const at::Tensor& tensor);
/// A CRC-32 of Adam's state (each parameter's moments and step count), the same whatever order
/// LibTorch's state map lists the parameters in.
std::uint32_t adam_crc32(const torch::optim::Adam& optimizer);

/// Checks Adam's state as `optimizer.load` left it, read from `source`: each of `parameters`'
/// moments has the parameter's shape and lies inside its storage. CheckpointError otherwise (Adam's
/// own load checks neither, and the next step would read past them or fail far from the cause).
void check_adam_state(const torch::optim::Adam& optimizer,
                      const std::vector<at::Tensor>& parameters, const std::string& source);
/// The integer `archive` holds under `key`; CheckpointError "`path` has no '`key`': `what`" when
/// it holds none (a file of another kind, or damaged), with a HINT to restore or start over.
std::int64_t read_archive_int(torch::serialize::InputArchive& archive, const std::string& key,
                              const std::string& path,
                              const std::string& what = "it is not a whole checkpoint");
/// The string `archive` holds under `key`; "" when it holds none, or holds another kind of value.
std::string read_archive_string(torch::serialize::InputArchive& archive, const std::string& key);

/// Loads `state` (what Adam::save wrote, read from `path`) into `optimizer`, then check_adam_state
/// over all its parameters. CheckpointError when `state` is no optimizer state, when Adam's load
/// refuses it, or when it does not fit the parameters; `optimizer` may then hold part of it, so
/// load into a spare Adam first when the real one must stay as it was.
void load_adam_checked(torch::optim::Adam& optimizer, torch::serialize::InputArchive& state,
                       const std::string& path);
/// The largest difference between two Adams' states, parameter by parameter (`a_parameters` and
/// `b_parameters` in the same order): the moments' max_abs_diff; infinity when a step count
/// differs or one has a state the other lacks.
double max_adam_diff(const torch::optim::Adam& a, const std::vector<at::Tensor>& a_parameters,
                     const torch::optim::Adam& b, const std::vector<at::Tensor>& b_parameters);
/// The largest difference between two models' parameters and their Adams' states (0: equal):
/// max_abs_diff over the parameters, max_adam_diff over the states.
double max_state_diff(const torch::nn::Module& a, const torch::optim::Adam& a_adam,
                      const torch::nn::Module& b, const torch::optim::Adam& b_adam);

/// Three state_dicts that a model whose state_dict is `tensors` must refuse (another model's):
/// {"wrong shape": the first tensor's first dimension doubled}, {"missing key": the last tensor
/// left out}, {"extra key": a tensor "extra.weight" added}.
std::vector<std::pair<std::string, StateDict>> misfit_state_dicts(const StateDict& tensors);

/// Copies of the file at `path` damaged as files break in practice, written into `folder`:
/// {what, file} for a missing file (none is written there), an empty one, one cut in half, one
/// short of its last byte, and random bytes of its size drawn from `seed`. std::runtime_error
/// when `path` cannot be read or a copy cannot be written.
std::vector<std::pair<std::string, std::string>> write_damaged_copies(const std::string& path,
                                                                      const std::string& folder,
                                                                      std::uint32_t seed);

}  // namespace course
