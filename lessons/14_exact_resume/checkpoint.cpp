// checkpoint.cpp: lesson 14's checkpoint, saved and loaded (checkpoint.h).
#include "checkpoint.h"

#include "common/generator.h"        // defines: rng_state, set_rng_state, generator_state_refusal
#include "common/verdict.h"          // defines: error_message
#include "torch_files/state_dict.h"  // defines: CheckpointError, checked_copies, tensor_crc32
#include "write_atomically.h"        // defines: write_atomically (lessons/13_atomic_writes/)

namespace lesson14 {

using course::CheckpointError;
using course::kDamagedHint;  // "restore a backup, or delete it to start over"

// Lesson 10's lines, after the seed: the model, moved to the device, then Adam over its parameters.
Training new_training(const torch::Device& device, std::uint64_t seed) {
  torch::manual_seed(seed);  // the model's first weights
  course::ANN model;
  model->to(device);  // before the optimizer is built over its parameters
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(kLearningRate));
  return Training{model, std::move(optimizer)};  // an optimizer is handed over, never copied
}

//! [save-checkpoint]
// Lesson 10's checkpoint (model_state_dict, optimizer_state_dict, epoch) and what it lacks: what
// the file is, where the run stands and on what, the generators' states, and a CRC-32 over all it
// restores (LibTorch's zip reader checks no CRC). `tensors`: the model's when empty (another
// model's state_dict, to show it refused: lesson 15).
void save_checkpoint(Training& run, const Progress& progress, const torch::Device& device,
                     const std::string& path, course::StateDict tensors) {
  if (tensors.empty()) tensors = course::state_dict(*run.model);
  torch::serialize::OutputArchive archive, model_state_dict, optimizer_state_dict;
  archive.write("format", c10::IValue(kFormatVersion));  // so that loading can refuse other files
  archive.write("model_name", c10::IValue(std::string(kModelName)));
  archive.write("saved_on", c10::IValue(device.str()));
  archive.write("epoch", c10::IValue(progress.epoch));
  archive.write("step", c10::IValue(progress.step));
  archive.write("samples", c10::IValue(progress.samples));
  archive.write("batch_size", c10::IValue(progress.batch_size));
  std::uint32_t crc = 0;
  for (const auto& [name, tensor] : tensors) {  // by state_dict names ("fc1.weight", ...)
    model_state_dict.write(name, tensor.detach());
    crc = course::tensor_crc32(crc, tensor);
  }
  archive.write("model_state_dict", model_state_dict);
  run.optimizer.save(optimizer_state_dict);  // Adam's moments and step counts
  archive.write("optimizer_state_dict", optimizer_state_dict);
  crc ^= course::adam_crc32(run.optimizer);
  // The generators: the next epoch's shuffle (CPU) and, on a GPU, its random numbers.
  const torch::Tensor cpu_rng = course::rng_state(torch::kCPU);
  // >>> lab: save the CPU generator's state, cpu_rng, under the key "rng_cpu"
  archive.write("rng_cpu", cpu_rng);
  // <<< lab
  crc = course::tensor_crc32(crc, cpu_rng);
  if (device.is_cuda()) archive.write("rng_cuda", course::rng_state(device));
  archive.write("checksum", c10::IValue(static_cast<std::int64_t>(crc)));
  // Not archive.save_to(path), lesson 10's: it empties the last good checkpoint first (lesson 13).
  lesson13::write_atomically(path, [&](const lesson13::Sink& sink) { archive.save_to(sink); });
}
//! [save-checkpoint]

//! [open-archive]
// Opens a LibTorch archive, every tensor made on `device` (map_location). A stranger's file is
// checked first: LibTorch's readers trust its numbers (sizes, indices, strides), and a damaged one
// can crash them (torch_files/torch_file.h). LibTorch then reads the very bytes that were checked.
torch::serialize::InputArchive open_archive(const std::string& path, const torch::Device& device) {
  const course::TorchFile file = course::check_libtorch_archive(path, course::CrcCheck::kStructure);
  torch::serialize::InputArchive archive;
  try {
    // >>> lab: read the archive from file.bytes, every tensor created on `device` (map_location)
    archive.load_from(file.bytes.data(), file.bytes.size(), device);
    // <<< lab
  } catch (const std::exception& e) {
    throw CheckpointError(path + " is not a readable checkpoint (" + course::error_message(e) + ")",
                          kDamagedHint);
  }
  return archive;
}
//! [open-archive]

//! [load-checkpoint]
// Loads `path` into `run`, whose model lives on `device`. All or nothing: everything is read and
// checked before the model, Adam or a generator is touched; else a CheckpointError says why.
Loaded load_checkpoint(Training& run, const torch::Device& device, const std::string& path) {
  torch::serialize::InputArchive archive = open_archive(path, device);  // map_location=device
  const std::int64_t format = course::read_archive_int(archive, "format", path);
  const std::string model_name = course::read_archive_string(archive, "model_name");
  if (format != kFormatVersion || model_name != kModelName) {
    throw CheckpointError(path + " holds '" + model_name + "' (format " + std::to_string(format) +
                              "), not '" + kModelName + "' (format " +
                              std::to_string(kFormatVersion) + ")",
                          "use the program that saved it, or another --checkpoint path");
  }
  Loaded loaded;
  loaded.progress.epoch = course::read_archive_int(archive, "epoch", path);
  loaded.progress.step = course::read_archive_int(archive, "step", path);
  loaded.progress.samples = course::read_archive_int(archive, "samples", path);
  loaded.progress.batch_size = course::read_archive_int(archive, "batch_size", path);
  loaded.saved_on = course::read_archive_string(archive, "saved_on");
  // 1. The model: every name present, every shape and dtype equal, nothing extra (Module::load
  // would take whatever shapes the file has). Nothing is copied yet.
  torch::serialize::InputArchive model_state_dict, optimizer_state_dict;
  if (!archive.try_read("model_state_dict", model_state_dict)) {
    throw CheckpointError(path + " has no model_state_dict", kDamagedHint);
  }
  const auto copies = course::checked_copies(
      course::state_dict(*run.model), course::archive_tensors(model_state_dict),
      /*same_dtype=*/true, path,
      {": it is a checkpoint of another model",
       "load it into the model it was saved from, or use another --checkpoint path"});
  // 2. The optimizer: loaded into a spare Adam over the same parameters, then checked.
  torch::optim::Adam spare(run.model->parameters(), torch::optim::AdamOptions(kLearningRate));
  if (!archive.try_read("optimizer_state_dict", optimizer_state_dict)) {
    throw CheckpointError(path + " has no optimizer state", kDamagedHint);
  }
  course::load_adam_checked(spare, optimizer_state_dict, path);  // shapes, inside storage
  // 3. The generators' states, tried on the generators themselves (and put back).
  torch::Tensor cpu_rng, cuda_rng;
  loaded.cuda_rng = archive.try_read("rng_cuda", cuda_rng);
  const bool use_cuda_rng = loaded.cuda_rng && device.is_cuda();
  std::string refusal = archive.try_read("rng_cpu", cpu_rng)
                            ? course::generator_state_refusal(torch::kCPU, cpu_rng)
                            : "none is saved";
  if (refusal.empty() && use_cuda_rng) refusal = course::generator_state_refusal(device, cuda_rng);
  if (!refusal.empty()) {
    throw CheckpointError(path + " has no usable generator state (" + refusal + ")", kDamagedHint);
  }
  // 4. The checksum over what was read: a flipped bit anywhere in it is refused.
  std::uint32_t crc = 0;
  for (const auto& copy : copies) crc = course::tensor_crc32(crc, copy.second);
  crc = course::tensor_crc32(crc ^ course::adam_crc32(spare), cpu_rng);
  if (static_cast<std::int64_t>(crc) != course::read_archive_int(archive, "checksum", path) &&
      !course::kFuzzingBuild) {
    throw CheckpointError(
        path + " is corrupt: its contents do not match its checksum",
        "the file changed after it was written (disk or copy error): " + std::string(kDamagedHint));
  }
  // 5. Everything is read and checked: only now is the run changed.
  {
    torch::NoGradGuard no_grad;
    for (const auto& [destination, source] : copies) destination.copy_(source);
  }
  run.optimizer.load(optimizer_state_dict);  // what the spare Adam took, checked
  course::set_rng_state(torch::kCPU, cpu_rng);
  if (use_cuda_rng) course::set_rng_state(device, cuda_rng);
  return loaded;
}
//! [load-checkpoint]

}  // namespace lesson14
