// dataset.cpp: Fashion-MNIST as a torch::data dataset.
#include "common/dataset.h"

#include <utility>

namespace course {

FashionMNIST::FashionMNIST(const std::string& data_dir, bool train, std::int64_t limit)
    : set_(load_fashion_mnist(find_fashion_mnist(data_dir), train)) {
  if (limit >= 0) set_ = take(set_, limit);
}

FashionMNIST::FashionMNIST(ImageSet set) : set_(std::move(set)) {}

torch::data::Example<> FashionMNIST::get(std::size_t index) {
  const auto i = static_cast<std::int64_t>(index);
  // ToTensor's layout: one channel, 28 x 28. Views of the split, no copy (Stack<> copies).
  return {set_.images[i].unsqueeze(0), set_.labels[i]};
}

torch::optional<std::size_t> FashionMNIST::size() const {
  return static_cast<std::size_t>(set_.labels.size(0));
}

}  // namespace course
