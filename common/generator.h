// generator.h defines: rng_state and set_rng_state, a device's default random generator read and
// put back (Python's torch.get_rng_state / torch.cuda.get_rng_state and their set_ forms).
#pragma once

#include <ATen/core/Tensor.h>  // defines: at::Tensor
#include <c10/core/Device.h>   // defines: c10::Device

namespace course {

/// The state of `device`'s default generator: the CPU's (shuffles, initialisation, CPU dropout)
/// or a GPU's (dropout and randperm on that GPU). A small CPU byte tensor.
at::Tensor rng_state(const c10::Device& device);
/// Puts a state rng_state() returned back into `device`'s default generator.
void set_rng_state(const c10::Device& device, const at::Tensor& state);

}  // namespace course
