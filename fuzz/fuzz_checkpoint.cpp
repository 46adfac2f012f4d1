// fuzz_checkpoint: libFuzzer target for the two readers of checkpoint files, each given the same
// input: lesson 14's load_checkpoint (a training run's checkpoint, into the tutorial's ANN and
// Adam) and course::read_python_state_dict (a file torch.save wrote; lesson 10 reads them). The
// course's own code runs up to the point where LibTorch's readers take over, and after them. Every
// input must load or give a course::CheckpointError; a crash, another exception or a hang is a
// bug. Run by scripts/fuzz, seeds in fuzz/corpus/fuzz_checkpoint/.
#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "checkpoint.h"  // defines: lesson 14's load_checkpoint, new_training
#include "fuzz_file.h"   // defines: fuzz::write_input

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static lesson14::Training run = lesson14::new_training(torch::kCPU, /*seed=*/1);
  const std::string& path = fuzz::write_input(data, size);
  try {
    lesson14::load_checkpoint(run, torch::kCPU, path);
  } catch (const course::CheckpointError&) {
  }
  try {
    for (const auto& entry : course::read_python_state_dict(path)) {
      // What the lessons do next with a state_dict's tensors: read every element.
      volatile double sum = entry.second.to(torch::kDouble).sum().item<double>();
      (void)sum;
    }
  } catch (const course::CheckpointError&) {
  }
  return 0;
}
