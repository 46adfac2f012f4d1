// flat_parameters.h defines: a module's parameters moved into one flat tensor, and their
// gradients into another (lesson 12's "flat" step; lesson 20 profiles it).
#pragma once

#include <torch/nn/module.h>  // defines: torch::nn::Module

namespace course {

/// values: the optimizer's only parameter; gradients: values.grad(), into which backward
/// accumulates in place.
struct FlatParameters {
  torch::Tensor values, gradients;
};

/// Moves every parameter of `model` into one tensor (each parameter becomes a view of it, its
/// values kept) and points each parameter's .grad() at a view of one gradient tensor. Call it
/// after the model has moved to its device, and build the optimizer over `values` afterwards.
FlatParameters flatten_parameters(torch::nn::Module& model);

}  // namespace course
