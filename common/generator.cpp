// generator.cpp: see generator.h.
#include "common/generator.h"

#include <ATen/Context.h>  // defines: at::globalContext().defaultGenerator

#include <mutex>

namespace course {

// The generator's mutex keeps another thread from drawing while its state is read or replaced.
at::Tensor rng_state(const c10::Device& device) {
  at::Generator generator = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_rng_state(const c10::Device& device, const at::Tensor& state) {
  at::Generator generator = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state.to(c10::kCPU));
}

}  // namespace course
