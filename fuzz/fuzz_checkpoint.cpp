// fuzz_checkpoint: libFuzzer target for lesson 10's two readers, each given the same input:
// load_checkpoint (a training run's checkpoint, into lesson 11's model and Adam) and
// read_python_state_dict (a file torch.save wrote). The lesson's own code runs up to the point
// where LibTorch's readers take over, and after them. Every input must load or give a
// lesson10::CheckpointError; a crash, another exception or a hang is a bug. Run by scripts/fuzz,
// seeds in fuzz/corpus/fuzz_checkpoint/.
#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "checkpointing.h"  // defines: lesson10::load_checkpoint, read_python_state_dict
#include "fuzz_file.h"      // defines: fuzz::write_input

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static lesson11::Trainer trainer = lesson11::make_trainer(torch::kCPU, lesson10::kSeed);
  const std::string& path = fuzz::write_input(data, size);
  try {
    lesson10::load_checkpoint(trainer, torch::kCPU, path);
  } catch (const lesson10::CheckpointError&) {
  }
  try {
    for (const auto& entry : lesson10::read_python_state_dict(path)) {
      // What the lesson does next with a state_dict's tensors: read every element.
      volatile double sum = entry.second.to(torch::kDouble).sum().item<double>();
      (void)sum;
    }
  } catch (const lesson10::CheckpointError&) {
  }
  return 0;
}
