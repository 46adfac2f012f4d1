// dataset.h defines: FashionMNIST, a torch::data dataset over Fashion-MNIST's IDX files: what
// torchvision's datasets.FashionMNIST(transform=transforms.ToTensor()) gives Python, one sample at
// a time (an image [1, 28, 28] of floats in [0, 1], and its label), for LibTorch's own data
// loader (torch::data::make_data_loader).
#pragma once

#include <torch/data/datasets/base.h>  // defines: torch::data::datasets::Dataset
#include <torch/data/example.h>        // defines: torch::data::Example

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/data.h"  // defines: ImageSet, find_fashion_mnist, load_fashion_mnist

namespace course {

class FashionMNIST : public torch::data::datasets::Dataset<FashionMNIST> {
 public:
  /// The train (60,000 images) or test (10,000) split from the folder --data-dir names (empty:
  /// $GPU_LESSONS_DATA_DIR, then the Debian package's; DataError naming the fix when it lacks
  /// the files); `limit` >= 0 keeps only the first `limit` samples (the lessons' --quick runs).
  FashionMNIST(const std::string& data_dir, bool train, std::int64_t limit = -1);
  /// A split already in memory.
  explicit FashionMNIST(ImageSet set);

  /// Sample `index`: data float32 [1, 28, 28], target int64 (a 0-dim tensor).
  torch::data::Example<> get(std::size_t index) override;
  torch::optional<std::size_t> size() const override;
  /// The whole split as two tensors ([N, 28, 28] and [N]).
  const ImageSet& images() const { return set_; }

 private:
  ImageSet set_;
};

}  // namespace course
