// device_shuffle.h defines: lesson 21's batches: the training set on the device, shuffled there
// once per epoch into EpochData, whose batches are slices made once (DeviceShuffler).
#pragma once

#include <torch/torch.h>  // defines: torch::randperm, torch::index_select_out

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/data.h"  // defines: ImageSet

namespace lesson21 {

//! [shuffle]
constexpr std::int64_t kPixels = 28 * 28;  // a Fashion-MNIST image, flattened

// One epoch's samples in their shuffled order, on the device: batch k is a slice of them, made
// once (a view, no copy), so a step reads its batch where the shuffle wrote it.
struct EpochData {
  torch::Tensor images, labels;  // [N, 784] float32 and [N] int64, in this epoch's order
  std::vector<torch::Tensor> batch_images, batch_labels;  // slices of 64 (the last may be fewer)
  torch::Tensor losses;                   // [steps] float32: each step writes its loss here,
  std::vector<torch::Tensor> loss_slots;  // into its own slot, and the epoch reads them once
  EpochData(std::int64_t samples, std::int64_t batch_size, const torch::Device& device)
      : images(torch::empty({samples, kPixels}, torch::TensorOptions().device(device))),
        labels(torch::empty({samples}, torch::dtype(torch::kLong).device(device))),
        losses(torch::zeros({(samples + batch_size - 1) / batch_size},
                            torch::TensorOptions().device(device))) {
    for (std::int64_t start = 0; start < samples; start += batch_size) {
      const std::int64_t size = std::min(batch_size, samples - start);
      batch_images.push_back(images.narrow(0, start, size));
      batch_labels.push_back(labels.narrow(0, start, size));
      loss_slots.push_back(losses[start / batch_size]);
    }
  }
  std::int64_t steps() const { return static_cast<std::int64_t>(batch_labels.size()); }
};

// The whole training set, copied to the device once. As LibTorch's RandomSampler, it draws an
// order as it is made and another as each epoch starts: from one seed, on the CPU, the same
// batches as lesson 05's DataLoader. On a GPU the order is drawn by the GPU's own generator.
class DeviceShuffler {
 public:
  DeviceShuffler(const course::ImageSet& train, const torch::Device& device)
      : images_(train.images.reshape({-1, kPixels}).to(device)), labels_(train.labels.to(device)) {
    new_order();
  }
  // Four operators per epoch, on the device: a new order, a view of its first `epoch` entries,
  // both gathers into `epoch`.
  void shuffle(EpochData& epoch) {
    new_order();
    const torch::Tensor order = order_.narrow(0, 0, epoch.images.size(0));
    torch::index_select_out(epoch.images, images_, 0, order);
    torch::index_select_out(epoch.labels, labels_, 0, order);
  }

 private:
  void new_order() {
    order_ = torch::randperm(labels_.size(0), torch::dtype(torch::kLong).device(images_.device()));
  }
  torch::Tensor images_, labels_, order_;
};
//! [shuffle]

}  // namespace lesson21
