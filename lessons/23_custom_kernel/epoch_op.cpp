// epoch_op.cpp: the operator gpu_lessons::train_epoch, a library of its own
// (libgpu_lessons_ops.so) that lesson 23 links and Python loads. It holds:
//   - the schema (TORCH_LIBRARY): the operator's name, arguments and result, which the dispatcher
//     and Python read; "(a!)" marks an argument the operator changes in place;
//   - the checks of every input (TORCH_CHECK), the same for both devices;
//   - the CPU implementation (TORCH_LIBRARY_IMPL(..., CPU, ...)): the reference, the step written
//     out in LibTorch's own operators, clear before fast;
//   - the CUDA implementation (TORCH_LIBRARY_IMPL(..., CUDA, ...)): one launch of the course's
//     kernel (epoch_kernel.cuh) on LibTorch's current stream, for the whole epoch.
// The dispatcher picks the implementation from the device of the tensors it is given.
#include "epoch_op.h"

#include <ATen/ATen.h>           // defines: at::addmm, at::mm_out, at::one_hot, ...
#include <ATen/MemoryOverlap.h>  // defines: at::get_overlap_status
#include <dlfcn.h>               // defines: dladdr (which file this code was loaded from)
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>  // defines: the fallbacks
#include <torch/library.h>  // defines: TORCH_LIBRARY, TORCH_LIBRARY_IMPL

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>
#include <vector>

#ifdef GPU_LESSONS_WITH_CUDA         // CMake defines it when this LibTorch has CUDA
#include <c10/cuda/CUDAException.h>  // defines: C10_CUDA_CHECK, C10_CUDA_KERNEL_LAUNCH_CHECK
#include <c10/cuda/CUDAGuard.h>      // defines: c10::cuda::CUDAGuard
#include <c10/cuda/CUDAStream.h>     // defines: c10::cuda::getCurrentCUDAStream
#endif

#include "epoch_kernel.h"  // defines: kParameters, the offsets kW1 ... kB3, EpochArgs, the launch

namespace epoch_op {
namespace {

using namespace epoch_kernel;

//! [schema]
// The schema, as Python would write it: Tensor(a!) is changed in place (each such argument gets a
// letter of its own), Tensor? may be None, int is int64_t in C++, float is double. It returns
// each step's loss; parameters, gradients and Adam's state are the flat tensors of the ANN's
// 109,386 parameters, in model.parameters()'s order; clock, when given, gets the times of the
// step's three phases (int64 nanoseconds: the start, then the end of each phase of each step).
constexpr const char* kSchema =
    "train_epoch(Tensor(a!) parameters, Tensor(b!) gradients, Tensor(c!) exp_avg, "
    "Tensor(d!) exp_avg_sq, Tensor(e!) step, Tensor images, Tensor labels, Tensor order, "
    "int batch_size, float lr, Tensor(f!)? clock=None) -> Tensor";
//! [schema]

//! [checks]
// Every input, before anything is read: shapes, dtypes, one device, contiguous memory (the
// kernel reads raw pointers). A wrong one is a c10::Error naming it (Python: a RuntimeError).
void check_inputs(const at::Tensor& parameters, const at::Tensor& gradients,
                  const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq, const at::Tensor& step,
                  const at::Tensor& images, const at::Tensor& labels, const at::Tensor& order,
                  std::int64_t batch_size, double lr, const c10::optional<at::Tensor>& clock) {
  const c10::Device device = images.device();
  const auto same_device = [&](const at::Tensor& t, const char* name) {
    TORCH_CHECK(t.device() == device, "train_epoch: ", name, " is on ", t.device(),
                " and images on ", device, ": every tensor must be on one device");
  };
  const auto flat = [&](const at::Tensor& t, const char* name) {
    TORCH_CHECK(t.dim() == 1 && t.size(0) == kParameters && t.scalar_type() == at::kFloat,
                "train_epoch: ", name, " must be float32 [", kParameters,
                "] (the ANN's parameters in one tensor), not ", t.scalar_type(), " ", t.sizes());
    TORCH_CHECK(t.is_contiguous(), "train_epoch: ", name, " must be contiguous");
    same_device(t, name);
  };
  flat(parameters, "parameters"), flat(gradients, "gradients");
  flat(exp_avg, "exp_avg"), flat(exp_avg_sq, "exp_avg_sq");
  TORCH_CHECK(step.numel() == 1 && step.scalar_type() == at::kFloat,
              "train_epoch: step must be one float32 (Adam's step count), not ", step.scalar_type(),
              " ", step.sizes());
  same_device(step, "step");
  TORCH_CHECK(images.dim() == 2 && images.size(1) == kIn && images.scalar_type() == at::kFloat,
              "train_epoch: images must be float32 [N, ", kIn, "] (each 28x28 image a row), not ",
              images.scalar_type(), " ", images.sizes());
  TORCH_CHECK(
      labels.dim() == 1 && labels.size(0) == images.size(0) && labels.scalar_type() == at::kLong,
      "train_epoch: labels must be int64 [", images.size(0), "] (one per image), not ",
      labels.scalar_type(), " ", labels.sizes());
  TORCH_CHECK(order.dim() == 1 && order.size(0) > 0 && order.scalar_type() == at::kLong,
              "train_epoch: order must be int64 [samples] (the epoch's rows of images, at least "
              "one), not ",
              order.scalar_type(), " ", order.sizes());
  for (const auto& [t, name] :
       {std::pair{images, "images"}, {labels, "labels"}, {order, "order"}}) {
    TORCH_CHECK(t.is_contiguous(), "train_epoch: ", name, " must be contiguous");
    same_device(t, name);
  }
  TORCH_CHECK(batch_size >= 1 && batch_size <= kMaxRows, "train_epoch: batch_size must be 1..",
              kMaxRows, ", not ", batch_size);
  TORCH_CHECK(std::isfinite(lr) && lr > 0, "train_epoch: lr must be a positive number, not ", lr);
  const std::int64_t steps = (order.size(0) + batch_size - 1) / batch_size;
  if (clock) {
    TORCH_CHECK(clock->dim() == 1 && clock->size(0) == kGridSyncsPerStep * steps + 1 &&
                    clock->scalar_type() == at::kLong && clock->is_contiguous(),
                "train_epoch: clock must be contiguous int64 [", kGridSyncsPerStep * steps + 1,
                "] (a start and ", kGridSyncsPerStep, " phases a step), not ", clock->scalar_type(),
                " ", clock->sizes());
    same_device(*clock, "clock");
  }
  // What the operator writes must be its own memory: the same tensor passed twice would be read
  // and written as two.
  std::vector<std::pair<at::Tensor, const char*>> written = {{parameters, "parameters"},
                                                             {gradients, "gradients"},
                                                             {exp_avg, "exp_avg"},
                                                             {exp_avg_sq, "exp_avg_sq"},
                                                             {step, "step"}};
  if (clock) written.emplace_back(*clock, "clock");
  std::vector<std::pair<at::Tensor, const char*>> all = written;
  all.insert(all.end(), {{images, "images"}, {labels, "labels"}, {order, "order"}});
  for (std::size_t i = 0; i < written.size(); ++i) {
    for (std::size_t j = i + 1; j < all.size(); ++j) {
      const at::MemOverlapStatus overlap = at::get_overlap_status(written[i].first, all[j].first);
      TORCH_CHECK(overlap != at::MemOverlapStatus::Full && overlap != at::MemOverlapStatus::Partial,
                  "train_epoch: ", written[i].second, " and ", all[j].second,
                  " share memory: each tensor the operator writes needs its own");
    }
  }
}

// The values that index memory, checked on the CPU. (On CUDA the kernel checks each index as it
// reads it: reading them here would make the host wait for the GPU.)
void check_indices(const at::Tensor& images, const at::Tensor& labels, const at::Tensor& order) {
  const auto [lowest, highest] = at::aminmax(order);
  TORCH_CHECK(lowest.item<std::int64_t>() >= 0 && highest.item<std::int64_t>() < images.size(0),
              "train_epoch: order holds ", lowest.item<std::int64_t>(), "..",
              highest.item<std::int64_t>(), ", and images has rows 0..", images.size(0) - 1);
  const auto [lowest_label, highest_label] = at::aminmax(labels);
  TORCH_CHECK(
      lowest_label.item<std::int64_t>() >= 0 && highest_label.item<std::int64_t>() < kClasses,
      "train_epoch: labels must be classes 0..", kClasses - 1, ", and they hold ",
      lowest_label.item<std::int64_t>(), "..", highest_label.item<std::int64_t>());
}
//! [checks]

// The host's clock in nanoseconds, for the phases' times on the CPU.
std::int64_t host_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

//! [cpu]
// The ANN's six parameters as views of a flat tensor, each in nn.Linear's shape.
struct Layers {
  at::Tensor w1, b1, w2, b2, w3, b3;
};
Layers views_of(const at::Tensor& flat) {
  return {flat.narrow(0, kW1, kHidden1 * kIn).view({kHidden1, kIn}),
          flat.narrow(0, kB1, kHidden1),
          flat.narrow(0, kW2, kHidden2 * kHidden1).view({kHidden2, kHidden1}),
          flat.narrow(0, kB2, kHidden2),
          flat.narrow(0, kW3, kClasses * kHidden2).view({kClasses, kHidden2}),
          flat.narrow(0, kB3, kClasses)};
}

// The reference: each step of the epoch in LibTorch's operators, the math the kernel does, in the
// kernel's three phases.
at::Tensor train_epoch_cpu(at::Tensor& parameters, at::Tensor& gradients, at::Tensor& exp_avg,
                           at::Tensor& exp_avg_sq, at::Tensor& step, const at::Tensor& images,
                           const at::Tensor& labels, const at::Tensor& order,
                           std::int64_t batch_size, double lr,
                           const c10::optional<at::Tensor>& clock) {
  check_inputs(parameters, gradients, exp_avg, exp_avg_sq, step, images, labels, order, batch_size,
               lr, clock);
  check_indices(images, labels, order);
  // Below autograd: the operator changes its inputs in place and records no graph.
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  const Layers p = views_of(parameters);
  Layers g = views_of(gradients);  // the gradients' views, written into (out=)
  const std::int64_t samples = order.size(0), steps = (samples + batch_size - 1) / batch_size;
  at::Tensor losses = at::empty({steps}, parameters.options());
  std::vector<std::int64_t> times = {host_ns()};  // for the clock, when it is asked for
  double t = step.item<double>();                 // Adam's step count
  for (std::int64_t k = 0; k < steps; ++k) {
    const std::int64_t rows = std::min(batch_size, samples - k * batch_size);
    const at::Tensor batch = order.narrow(0, k * batch_size, rows);
    const at::Tensor x = images.index_select(0, batch), y = labels.index_select(0, batch);
    // Phase 1, the first layer: y = x W^T + b, then the ReLU.
    const at::Tensor h1 = at::relu(at::addmm(p.b1, x, p.w1.t()));
    times.push_back(host_ns());
    // Phase 2: the other two layers, the loss (cross_entropy: the mean over the batch) and the
    // gradients flowing back. At the logits the loss's gradient is (softmax - one_hot(y)) / rows;
    // at each layer's input it is d W, passed by the ReLU where the layer's output was > 0.
    const at::Tensor h2 = at::relu(at::addmm(p.b2, h1, p.w2.t()));
    const at::Tensor log_probs = at::log_softmax(at::addmm(p.b3, h2, p.w3.t()), /*dim=*/1);
    losses[k] = at::nll_loss(log_probs, y);
    const at::Tensor d_out = (log_probs.exp() - at::one_hot(y, kClasses).to(at::kFloat)) / rows;
    const at::Tensor d_h2 = at::mm(d_out, p.w3) * (h2 > 0);
    const at::Tensor d_h1 = at::mm(d_h2, p.w2) * (h1 > 0);
    times.push_back(host_ns());
    // Phase 3, the parameters: for each layer dW = d^T a (a: its input), db = d summed over the
    // rows; then Adam (torch::optim::Adam's step, its default betas and epsilon).
    at::mm_out(g.w3, d_out.t(), h2);
    at::sum_out(g.b3, d_out, /*dim=*/0);
    at::mm_out(g.w2, d_h2.t(), h1);
    at::sum_out(g.b2, d_h2, /*dim=*/0);
    at::mm_out(g.w1, d_h1.t(), x);
    at::sum_out(g.b1, d_h1, /*dim=*/0);
    t += 1;
    const double bias_correction1 = 1 - std::pow(kBeta1, t);
    const double bias_correction2 = 1 - std::pow(kBeta2, t);
    exp_avg.mul_(kBeta1).add_(gradients, 1 - kBeta1);
    exp_avg_sq.mul_(kBeta2).addcmul_(gradients, gradients, 1 - kBeta2);
    const at::Tensor denominator = (exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(kEpsilon);
    parameters.addcdiv_(exp_avg, denominator, -lr / bias_correction1);
    times.push_back(host_ns());
  }
  step.fill_(t);
  if (clock) clock->copy_(at::tensor(times, at::kLong));
  return losses;
}
//! [cpu]

#ifdef GPU_LESSONS_WITH_CUDA
//! [cuda]
// The whole epoch in one launch of the kernel, queued on LibTorch's current stream of the tensors'
// GPU: the call returns at once, and the work after it on that stream waits for it, as after any
// operator of LibTorch's.
at::Tensor train_epoch_cuda(at::Tensor& parameters, at::Tensor& gradients, at::Tensor& exp_avg,
                            at::Tensor& exp_avg_sq, at::Tensor& step, const at::Tensor& images,
                            const at::Tensor& labels, const at::Tensor& order,
                            std::int64_t batch_size, double lr,
                            const c10::optional<at::Tensor>& clock) {
  check_inputs(parameters, gradients, exp_avg, exp_avg_sq, step, images, labels, order, batch_size,
               lr, clock);
  const c10::cuda::CUDAGuard on_device(images.device());  // the launch goes to the tensors' GPU
  const std::int64_t samples = order.size(0), steps = (samples + batch_size - 1) / batch_size;
  at::Tensor losses = at::empty({steps}, parameters.options());
  at::Tensor scratch = at::empty({kScratchFloats}, parameters.options());  // what phases share
  const EpochArgs args{parameters.data_ptr<float>(),
                       gradients.data_ptr<float>(),
                       exp_avg.data_ptr<float>(),
                       exp_avg_sq.data_ptr<float>(),
                       step.data_ptr<float>(),
                       images.data_ptr<float>(),
                       labels.data_ptr<std::int64_t>(),
                       order.data_ptr<std::int64_t>(),
                       images.size(0),
                       samples,
                       batch_size,
                       static_cast<float>(lr),
                       losses.data_ptr<float>(),
                       scratch.data_ptr<float>(),
                       clock ? clock->data_ptr<std::int64_t>() : nullptr};
  C10_CUDA_CHECK(launch_train_epoch(args, c10::cuda::getCurrentCUDAStream()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return losses;
}
//! [cuda]
#endif

}  // namespace

std::string library_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&library_path), &info) == 0 || !info.dli_fname)
    return "";
  return info.dli_fname;
}

}  // namespace epoch_op

//! [register]
// The operator's schema, once, under the course's namespace: C++ finds it as
// "gpu_lessons::train_epoch", Python as torch.ops.gpu_lessons.train_epoch.
TORCH_LIBRARY(gpu_lessons, m) { m.def(epoch_op::kSchema); }

// Its implementation for tensors on the CPU ...
TORCH_LIBRARY_IMPL(gpu_lessons, CPU, m) { m.impl("train_epoch", &epoch_op::train_epoch_cpu); }

// ... and for tensors on a CUDA GPU, where this LibTorch has CUDA.
#ifdef GPU_LESSONS_WITH_CUDA
TORCH_LIBRARY_IMPL(gpu_lessons, CUDA, m) { m.impl("train_epoch", &epoch_op::train_epoch_cuda); }
#endif

// No backward: autograd's own fallbacks refuse a tensor that requires grad where the operator
// writes in place, mark the operator's result as having no gradient, and count the changes to
// each tensor it writes (the version counters that tell a saved tensor it changed).
TORCH_LIBRARY_IMPL(gpu_lessons, Autograd, m) {
  m.impl("train_epoch", torch::autograd::autogradNotImplementedFallback());
}
TORCH_LIBRARY_IMPL(gpu_lessons, ADInplaceOrView, m) {
  m.impl("train_epoch", torch::autograd::autogradNotImplementedInplaceOrViewFallback());
}
//! [register]
