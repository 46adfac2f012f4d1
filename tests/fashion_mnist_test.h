// fashion_mnist_test.h defines: FashionMnistTest, the fixture of tests that need the real
// Fashion-MNIST (loaded once per test binary, skipped with the reason where it is missing), and
// fashion_mnist(), the same data for tests in other fixtures.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "common/data.h"

/// Both splits, or nullptr with the reason in `*why` when the data cannot be found.
struct FashionMnistSplits {
  course::ImageSet train;
  course::ImageSet test;
};
inline const FashionMnistSplits* fashion_mnist(std::string* why) {
  static std::string reason;
  static const FashionMnistSplits* splits = []() -> const FashionMnistSplits* {
    try {
      const auto folder = course::find_fashion_mnist("");
      return new FashionMnistSplits{course::load_fashion_mnist(folder, true),
                                    course::load_fashion_mnist(folder, false)};
    } catch (const course::DataError& error) {
      reason = error.what();
      return nullptr;
    }
  }();
  if (why != nullptr) *why = reason;
  return splits;
}

class FashionMnistTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    data_ = fashion_mnist(&why);
    if (data_ == nullptr) GTEST_SKIP() << why;
  }
  const course::ImageSet& train() const { return data_->train; }
  const course::ImageSet& test() const { return data_->test; }

 private:
  const FashionMnistSplits* data_ = nullptr;
};
