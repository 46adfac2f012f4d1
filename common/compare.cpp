// compare.cpp: the comparisons of compare.h and the reasoning behind each tolerance.
#include "common/compare.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>

namespace course {

namespace {
at::Tensor as_double(const at::Tensor& t) { return t.detach().to(at::kCPU, at::kDouble); }
}  // namespace

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined() || !a.sizes().equals(b.sizes())) {
    return std::numeric_limits<double>::infinity();
  }
  if (a.numel() == 0) return 0;
  return (as_double(a) - as_double(b)).abs().max().item<double>();
}

double max_abs_diff(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, max_abs_diff(a[i], b[i]));
  return worst;
}

double max_rel_diff(const at::Tensor& a, const at::Tensor& b) {
  const double diff = max_abs_diff(a, b);
  if (diff == 0) return 0;
  const double scale = b.numel() == 0 ? 0 : as_double(b).abs().max().item<double>();
  return scale > 0 ? diff / scale : std::numeric_limits<double>::infinity();
}

double max_rel_diff(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, max_rel_diff(a[i], b[i]));
  return worst;
}

std::vector<at::Tensor> gradients(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  grads.reserve(params.size());
  for (const auto& p : params) grads.push_back(p.grad());
  return grads;
}

double relative_diff(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined() || !a.sizes().equals(b.sizes())) {
    return std::numeric_limits<double>::infinity();
  }
  const at::Tensor a64 = as_double(a), b64 = as_double(b);
  const double diff = (a64 - b64).norm().item<double>();
  if (diff == 0) return 0;
  const double scale = b64.norm().item<double>();
  return scale > 0 ? diff / scale : std::numeric_limits<double>::infinity();
}

std::uint64_t checksum(const at::Tensor& tensor) {
  const at::Tensor bytes = tensor.detach().to(at::kCPU).contiguous();
  const auto* p = static_cast<const unsigned char*>(bytes.data_ptr());
  const std::size_t size = bytes.numel() * bytes.element_size();
  std::uint64_t hash = 1469598103934665603ULL;  // FNV-1a, 64 bits
  for (std::size_t i = 0; i < size; ++i) hash = (hash ^ p[i]) * 1099511628211ULL;
  return hash;
}

}  // namespace course
