// state_dict.cpp: see state_dict.h.
#include "torch_files/state_dict.h"

#include <ATen/core/Dict.h>  // defines: c10::impl::GenericDict
#include <torch/types.h>     // defines: torch::NoGradGuard
#include <unistd.h>          // defines: access, W_OK
#include <zlib.h>            // defines: crc32_z

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <random>
#include <sstream>
#include <stdexcept>

#include "common/compare.h"  // defines: max_abs_diff

namespace course {

namespace fs = std::filesystem;

namespace {

const char* const kPythonHint =
    "save it in Python with torch.save(model.state_dict(), path) (the default zip format), or "
    "torch.save(dict(model.state_dict()), path)";

std::string shape(const at::Tensor& t) {
  std::ostringstream out;
  out << t.sizes();
  return out.str();
}

// Throws unless every element `tensor`'s sizes and strides reach lies inside its storage.
void check_in_storage(const at::Tensor& tensor, const std::string& what, const std::string& path) {
  const std::string refusal = storage_refusal(tensor);
  if (!refusal.empty()) {
    throw CheckpointError(path + ": " + what + " " + refusal,
                          "the file is damaged: restore a backup, or save it again");
  }
}

void flatten(torch::serialize::InputArchive& archive, const std::string& prefix, StateDict& out) {
  for (const std::string& key : archive.keys()) {
    at::Tensor tensor;
    torch::serialize::InputArchive child;
    if (archive.try_read(key, tensor)) {
      out.emplace_back(prefix + key, tensor);
    } else if (archive.try_read(key, child)) {
      flatten(child, prefix + key + ".", out);
    }
  }
}

}  // namespace

StateDict state_dict(const torch::nn::Module& module) {
  StateDict tensors;
  for (const auto& p : module.named_parameters()) tensors.emplace_back(p.key(), p.value());
  for (const auto& b : module.named_buffers()) tensors.emplace_back(b.key(), b.value());
  return tensors;
}

StateDict read_python_state_dict(const std::string& path) {
  if (!fs::is_regular_file(path)) throw CheckpointError("no file at " + path, kPythonHint);
  // torch.save's format: a zip with data.pkl (the pickle) and data/<key> (each storage's bytes).
  // Checked first, every record's CRC-32 too: a state_dict has no checksum of its own.
  const TorchFile file = check_torch_file(path, CrcCheck::kEveryRecord);
  if (!file.damaged_record.empty()) {
    throw CheckpointError(path + " is corrupt: " + file.refusal,
                          "the file changed after Python saved it (disk or copy error): save "
                          "it again");
  }
  c10::IValue value;
  try {
    if (!file.refusal.empty()) throw std::runtime_error(file.refusal);
    // LibTorch's unpickler reads the pickle (a state_dict's OrderedDict rewritten as a plain
    // dict, which it can read), every tensor made on the CPU: Python's map_location="cpu".
    value = read_torch_save(file);
  } catch (const std::exception& e) {
    throw CheckpointError(
        path + " is not a state_dict saved by torch.save (" + error_message(e) + ")", kPythonHint);
  }
  if (!value.isGenericDict()) {
    throw CheckpointError(path + " holds a " + value.tagKind() + ", not a state_dict", kPythonHint);
  }
  StateDict tensors;
  for (const auto& item : value.toGenericDict()) {
    if (!item.key().isString()) {
      throw CheckpointError(path + " has a key that is not a string", kPythonHint);
    }
    const std::string& name = item.key().toStringRef();
    if (name == kPlaceholderKey) continue;
    if (!item.value().isTensor()) {
      throw CheckpointError(
          path + ": '" + name + "' is a " + item.value().tagKind() + ", not a tensor", kPythonHint);
    }
    check_in_storage(item.value().toTensor(), "'" + name + "'", path);
    tensors.emplace_back(name, item.value().toTensor());
  }
  if (!file.crcs_recorded) {
    std::cout << "  note: " << path << " was saved without CRC-32s (Python's "
              << "torch.serialization.set_crc32_options(False)): its bytes could not be "
                 "checked\n";
  }
  return tensors;
}

void check_writable(const std::string& path, const std::string& flag) {
  const fs::path folder = fs::absolute(path.empty() ? "." : path).parent_path();
  if (!path.empty() && (!fs::is_directory(folder) || ::access(folder.c_str(), W_OK) != 0)) {
    throw CheckpointError(flag + " " + path + ": the folder " + folder.string() +
                              " does not exist or is not writable",
                          "create the folder first, or give " + flag + " another path");
  }
}

void write_python_state_dict(const StateDict& tensors,
                             const std::function<std::size_t(const void*, std::size_t)>& write) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::TensorType::get());
  for (const auto& [name, tensor] : tensors) {
    dict.insert(name, tensor.detach().to(c10::kCPU).clone());  // compact, on the CPU
  }
  // torch::pickle_save(dict) would tag the dict with its TorchScript type (a call to
  // torch.jit._pickle.restore_type_tag), which torch.load(weights_only=True) refuses:
  // write_torch_save writes a plain dict of tensors, as torch.save does.
  write_torch_save(dict, write);
}

void write_python_state_dict(const StateDict& tensors, const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (out) {
    write_python_state_dict(tensors, [&](const void* data, std::size_t size) -> std::size_t {
      out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
      return out ? size : 0;
    });
  }
  if (!out) {
    throw CheckpointError("cannot write " + path,
                          "check that its folder exists and is writable, and that the disk has "
                          "room");
  }
}

std::vector<std::pair<at::Tensor, at::Tensor>> checked_copies(
    const StateDict& model, const std::vector<std::string>& file_names,
    const std::function<std::optional<at::Tensor>(const std::string&)>& file_has, bool same_dtype,
    const std::string& source, const Mismatch& mismatch) {
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;
  for (const auto& [name, destination] : model) {
    const std::optional<at::Tensor> found = file_has(name);
    if (!found) {
      throw CheckpointError(source + " has no '" + name + "'" + mismatch.another_model,
                            mismatch.hint);
    }
    const at::Tensor& source_tensor = *found;
    if (!source_tensor.sizes().equals(destination.sizes()) || !source_tensor.is_floating_point() ||
        (same_dtype && source_tensor.scalar_type() != destination.scalar_type())) {
      throw CheckpointError(source + ": '" + name + "' is " + shape(source_tensor) + " " +
                                std::string(c10::toString(source_tensor.scalar_type())) +
                                " in the file but " + shape(destination) + " " +
                                c10::toString(destination.scalar_type()) + " in the model",
                            mismatch.hint);
    }
    check_in_storage(source_tensor, "'" + name + "'", source);
    copies.emplace_back(destination, source_tensor);
  }
  for (const std::string& key : file_names) {
    bool known = false;
    for (const auto& entry : model) known = known || entry.first == key;
    if (!known) {
      throw CheckpointError(
          source + " has '" + key + "', which the model does not have" + mismatch.another_model,
          mismatch.hint);
    }
  }
  return copies;
}

std::vector<std::pair<at::Tensor, at::Tensor>> checked_copies(const StateDict& model,
                                                              const StateDict& file,
                                                              bool same_dtype,
                                                              const std::string& source,
                                                              const Mismatch& mismatch) {
  std::vector<std::string> names;
  for (const auto& entry : file) names.push_back(entry.first);
  return checked_copies(
      model, names,
      [&](const std::string& name) -> std::optional<at::Tensor> {
        for (const auto& [key, tensor] : file) {
          if (key == name) return tensor;
        }
        return std::nullopt;
      },
      same_dtype, source, mismatch);
}

void load_state_dict(torch::nn::Module& module, const StateDict& tensors, const std::string& source,
                     const std::string& hint) {
  const auto copies =
      checked_copies(state_dict(module), tensors, /*same_dtype=*/false, source, {"", hint});
  torch::NoGradGuard no_grad;
  for (const auto& [destination, source_tensor] : copies) destination.copy_(source_tensor);
}

TorchFile check_libtorch_archive(const std::string& path, CrcCheck crc) {
  if (!fs::exists(path)) {
    throw CheckpointError("no file at " + path,
                          "check the path (the program that saves it "
                          "creates it)");
  }
  if (!fs::is_regular_file(path)) {
    throw CheckpointError(path + " is not a file", "give the path of a file torch::save wrote");
  }
  TorchFile file = check_torch_file(path, crc);
  if (file.refusal.empty() && file.has_record("data.pkl") && !file.has_record("constants.pkl")) {
    throw CheckpointError(path +
                              " is a state_dict in Python's torch.save format, not a LibTorch "
                              "archive",
                          "read it as Python's file (course::read_python_state_dict; lesson 10: "
                          "--from-python " +
                              path + ")");
  }
  if (!file.refusal.empty()) {
    std::string reason = file.refusal;  // its first sentence
    reason = reason.substr(0, reason.find(". "));
    throw CheckpointError(path + " is not a readable LibTorch archive (" + reason + ")",
                          file.damaged_record.empty()
                              ? "the file is truncated or corrupt, or not a file torch::save "
                                "wrote: restore a backup, or save it again"
                              : "the file changed after it was written (disk or copy error): "
                                "restore a backup, or save it again");
  }
  return file;
}

StateDict archive_tensors(torch::serialize::InputArchive& archive) {
  StateDict tensors;
  flatten(archive, "", tensors);
  return tensors;
}

void check_module_archive(const torch::nn::Module& module, torch::serialize::InputArchive& archive,
                          const std::string& source) {
  checked_copies(state_dict(module), archive_tensors(archive), /*same_dtype=*/true, source,
                 {": it is a file of another model", "load it into the model it was saved from"});
}

void check_module_file(const torch::nn::Module& module, const std::string& path) {
  const TorchFile file = check_libtorch_archive(path);
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(file.bytes.data(), file.bytes.size(), c10::Device(c10::kCPU));
  } catch (const std::exception& e) {
    throw CheckpointError(path + " is not a readable LibTorch archive (" + error_message(e) + ")",
                          "restore a backup, or save it again");
  }
  check_module_archive(module, archive, path);
}

namespace {
// The optimizer's key for a parameter, as LibTorch 1.13 (a string) and 2.x (a pointer) make it.
[[maybe_unused]] bool is_key_of(const std::string& key, const at::Tensor& p) {
  std::ostringstream pointer;  // what 1.13's c10::guts::to_string writes
  pointer << p.unsafeGetTensorImpl();
  return key == pointer.str();
}
[[maybe_unused]] bool is_key_of(const void* key, const at::Tensor& p) {
  return key == p.unsafeGetTensorImpl();
}
}  // namespace

const torch::optim::AdamParamState* adam_state(const torch::optim::Adam& optimizer,
                                               const at::Tensor& parameter) {
  for (const auto& [key, state] : optimizer.state()) {
    if (is_key_of(key, parameter)) {
      return static_cast<const torch::optim::AdamParamState*>(state.get());
    }
  }
  return nullptr;
}

std::uint32_t tensor_crc32(std::uint32_t crc, const at::Tensor& tensor) {
  if (!tensor.defined()) return crc;
  const at::Tensor bytes = tensor.detach().to(c10::kCPU).contiguous();
  return static_cast<std::uint32_t>(
      crc32_z(crc, static_cast<const Bytef*>(bytes.data_ptr()), bytes.nbytes()));
}

std::uint32_t adam_crc32(const torch::optim::Adam& optimizer) {
  std::uint32_t combined = 0;  // XOR: the same whatever order the state map lists parameters in
  for (const auto& entry : optimizer.state()) {
    const auto& state = static_cast<const torch::optim::AdamParamState&>(*entry.second);
    std::uint32_t crc = tensor_crc32(0, state.exp_avg());
    crc = tensor_crc32(crc, state.exp_avg_sq());
    crc = tensor_crc32(crc, state.max_exp_avg_sq());
    const std::int64_t step = state.step();
    combined ^= static_cast<std::uint32_t>(
        crc32_z(crc, reinterpret_cast<const Bytef*>(&step), sizeof step));
  }
  return combined;
}

void check_adam_state(const torch::optim::Adam& optimizer,
                      const std::vector<at::Tensor>& parameters, const std::string& source) {
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const torch::optim::AdamParamState* state = adam_state(optimizer, parameters[i]);
    if (state == nullptr) continue;  // no step taken yet
    const std::string which = "Adam's state of parameter " + std::to_string(i);
    for (const at::Tensor& moment : {state->exp_avg(), state->exp_avg_sq()}) {
      check_in_storage(moment, which, source);
      if (!moment.sizes().equals(parameters[i].sizes())) {
        throw CheckpointError(source + ": " + which + " is " + shape(moment) + ", the parameter " +
                                  shape(parameters[i]),
                              "it is a checkpoint of another model or optimizer");
      }
    }
    check_in_storage(state->max_exp_avg_sq(), which, source);
  }
}

std::int64_t read_archive_int(torch::serialize::InputArchive& archive, const std::string& key,
                              const std::string& path, const std::string& what) {
  c10::IValue value;
  if (!archive.try_read(key, value) || !value.isInt()) {
    throw CheckpointError(path + " has no '" + key + "': " + what, kDamagedHint);
  }
  return value.toInt();
}

std::string read_archive_string(torch::serialize::InputArchive& archive, const std::string& key) {
  c10::IValue value;  // any value a file holds (an int, a string, a tensor...)
  if (archive.try_read(key, value) && value.isString()) return value.toStringRef();
  return "";
}

void load_adam_checked(torch::optim::Adam& optimizer, torch::serialize::InputArchive& state,
                       const std::string& path) {
  c10::IValue version;  // Adam::save writes it first: without it, this is no optimizer state
  if (!state.try_read("pytorch_version", version)) {
    throw CheckpointError(path + " has no optimizer state", kDamagedHint);
  }
  try {
    optimizer.load(state);
  } catch (const std::exception& e) {
    throw CheckpointError(path + ": the optimizer state does not load (" + error_message(e) + ")",
                          "it is a checkpoint of another model or optimizer");
  }
  std::vector<at::Tensor> parameters;
  for (const auto& group : optimizer.param_groups()) {
    parameters.insert(parameters.end(), group.params().begin(), group.params().end());
  }
  check_adam_state(optimizer, parameters, path);
}

double max_adam_diff(const torch::optim::Adam& a, const std::vector<at::Tensor>& a_parameters,
                     const torch::optim::Adam& b, const std::vector<at::Tensor>& b_parameters) {
  const double infinity = std::numeric_limits<double>::infinity();
  if (a_parameters.size() != b_parameters.size()) return infinity;
  double diff = 0;
  for (std::size_t i = 0; i < a_parameters.size(); ++i) {
    const torch::optim::AdamParamState* x = adam_state(a, a_parameters[i]);
    const torch::optim::AdamParamState* y = adam_state(b, b_parameters[i]);
    if (x == nullptr || y == nullptr) {
      if (x != y) return infinity;
      continue;
    }
    if (x->step() != y->step()) return infinity;
    diff = std::max({diff, max_abs_diff(x->exp_avg(), y->exp_avg()),
                     max_abs_diff(x->exp_avg_sq(), y->exp_avg_sq())});
  }
  return diff;
}

double max_state_diff(const torch::nn::Module& a, const torch::optim::Adam& a_adam,
                      const torch::nn::Module& b, const torch::optim::Adam& b_adam) {
  return std::max(max_abs_diff(a.parameters(), b.parameters()),
                  max_adam_diff(a_adam, a.parameters(), b_adam, b.parameters()));
}

std::vector<std::pair<std::string, StateDict>> misfit_state_dicts(const StateDict& tensors) {
  StateDict wider = tensors, fewer = tensors, more = tensors;
  if (!tensors.empty()) {
    std::vector<std::int64_t> shape = tensors.front().second.sizes().vec();
    if (!shape.empty()) shape[0] *= 2;
    wider.front().second = at::zeros(shape, tensors.front().second.options());
    fewer.pop_back();
  }
  more.emplace_back("extra.weight", at::zeros({1}));
  return {{"wrong shape", wider}, {"missing key", fewer}, {"extra key", more}};
}

std::vector<std::pair<std::string, std::string>> write_damaged_copies(const std::string& path,
                                                                      const std::string& folder,
                                                                      std::uint32_t seed) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  std::string noise(bytes.size(), '\0');
  std::mt19937 random(seed);
  for (char& c : noise) c = static_cast<char>(random());
  const std::string name = fs::path(path).filename().string();
  const std::string missing = (fs::path(folder) / ("missing-" + name)).string();
  fs::remove(missing);
  std::vector<std::pair<std::string, std::string>> copies = {{"missing file", missing}};
  const auto write = [&](const std::string& what, const std::string& prefix,
                         const std::string& content) {
    const std::string file = (fs::path(folder) / (prefix + name)).string();
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out << content;
    if (!out.flush()) throw std::runtime_error("cannot write " + file);
    copies.emplace_back(what, file);
  };
  write("empty file", "empty-", "");
  write("truncated (half)", "half-", bytes.substr(0, bytes.size() / 2));
  write("truncated (last byte)", "short-", bytes.substr(0, bytes.empty() ? 0 : bytes.size() - 1));
  write("random bytes", "random-", noise);
  return copies;
}

}  // namespace course
