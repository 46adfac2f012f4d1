// ranks_test.h defines: on_ranks(), the ranks of a job as threads of the test (each its own group
// member, meeting in one store, as processes would), GlooTest, the fixture of the tests that
// need c10d's Gloo backend (skipped, saying why, in a build without Gloo's headers), and
// FashionMnistGlooTest, that of the tests whose ranks train on Fashion-MNIST with Gloo.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "fashion_mnist_test.h"

/// Runs fn(rank) on `world` threads, one rank each, and rethrows the first rank's failure.
inline void on_ranks(int world, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

class GlooTest : public ::testing::Test {
 protected:
  void SetUp() override {
#ifndef GPU_LESSONS_WITH_GLOO
    GTEST_SKIP() << "this build has no Gloo (Gloo's headers were not found: install libgloo-dev)";
#endif
  }
};

/// The fixture of the tests whose ranks train on the real Fashion-MNIST with Gloo: skipped, saying
/// why, without the data or without Gloo.
class FashionMnistGlooTest : public FashionMnistTest {
 protected:
  void SetUp() override {
    FashionMnistTest::SetUp();
#ifndef GPU_LESSONS_WITH_GLOO
    GTEST_SKIP() << "this build has no Gloo";
#endif
  }
};
