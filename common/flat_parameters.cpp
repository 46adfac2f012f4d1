// flat_parameters.cpp: a module's parameters in one tensor (see flat_parameters.h).
#include "common/flat_parameters.h"

#include <torch/torch.h>  // defines: torch::empty, torch::zeros, torch::NoGradGuard

namespace course {

//! [flatten]
FlatParameters flatten_parameters(torch::nn::Module& model) {
  std::vector<torch::Tensor> params = model.parameters();
  std::int64_t total = 0;
  for (const auto& p : params) total += p.numel();
  FlatParameters flat;
  flat.values = torch::empty({total}, params.front().options().requires_grad(false));
  flat.gradients = torch::zeros({total}, flat.values.options());
  torch::NoGradGuard no_grad;
  std::int64_t offset = 0;
  for (auto& p : params) {
    const std::int64_t n = p.numel();
    torch::Tensor values = flat.values.slice(0, offset, offset + n).view(p.sizes());
    values.copy_(p);
    p.set_data(values);  // the parameter now lives inside flat.values
    // Backward adds into an existing .grad() in place: each gradient lands in flat.gradients.
    p.mutable_grad() = flat.gradients.slice(0, offset, offset + n).view(p.sizes());
    offset += n;
  }
  flat.values.mutable_grad() = flat.gradients;
  return flat;
}
//! [flatten]

}  // namespace course
