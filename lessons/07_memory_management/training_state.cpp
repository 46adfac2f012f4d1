// training_state.cpp: the bytes of training_state.h, tensor by tensor.
#include "training_state.h"

namespace lesson07 {

std::int64_t training_state_bytes(const torch::nn::Module& model, const torch::optim::Adam& adam) {
  std::int64_t bytes = 0;
  for (const auto& p : model.parameters()) {
    bytes += p.nbytes();
    if (p.grad().defined()) bytes += p.grad().nbytes();
  }
  for (const auto& entry : adam.state()) {  // Adam's state, one entry per parameter
    const auto& state = static_cast<const torch::optim::AdamParamState&>(*entry.second);
    bytes += state.exp_avg().nbytes() + state.exp_avg_sq().nbytes();
    if (state.max_exp_avg_sq().defined()) bytes += state.max_exp_avg_sq().nbytes();
  }
  return bytes;
}

}  // namespace lesson07
