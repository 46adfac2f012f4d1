// resume_test.h defines: CheckpointTest, the fixture of lessons 14's and 15's tests: lesson 14's
// run on the first 2,000 training images (a few dozen steps per epoch), saved to and resumed from
// a checkpoint as the lesson does; and copy_of, to tell whether a load changed a model.
// Included after exact_resume.cpp (GPU_LESSONS_NO_MAIN), whose functions it calls.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "fashion_mnist_test.h"
#include "scratch_files.h"

namespace fs = std::filesystem;
using course::CheckpointError;
using lesson14::Progress;
using lesson14::Training;

constexpr std::int64_t kSamples = 2000;  // a few dozen steps per epoch: seconds, not minutes
inline const torch::Device kCpu(torch::kCPU);

inline Progress fresh_progress() {
  Progress progress;
  progress.samples = kSamples;
  progress.batch_size = lesson14::kBatchSize;
  return progress;
}

// A copy of every parameter, to tell afterwards whether a load changed the model.
inline std::vector<torch::Tensor> copy_of(Training& run) {
  std::vector<torch::Tensor> copies;
  for (const auto& p : run.model->parameters()) copies.push_back(p.detach().clone());
  return copies;
}

class CheckpointTest : public FashionMnistTest {
 protected:
  void SetUp() override {
    FashionMnistTest::SetUp();
    if (IsSkipped()) return;
    small = std::make_unique<course::FashionMNIST>(course::ImageSet{
        train().images.slice(0, 0, kSamples), train().labels.slice(0, 0, kSamples)});
  }
  // `epochs` epochs from the seed, resumed from `path` when it exists and saving to it (if any)
  // after each, as the lesson resumes: the model and Adam, then the loader, then the load.
  Training run(int epochs, const std::string& path = "") {
    Progress progress = fresh_progress();
    Training training = lesson14::new_training(kCpu, lesson14::kSeed);
    auto loader = course::make_train_loader(*small, lesson14::kBatchSize, lesson14::kWorkers);
    if (!path.empty() && fs::exists(path)) {
      progress = lesson14::load_checkpoint(training, kCpu, path).progress;
    }
    lesson14::train_to(training, progress, epochs, *loader, kCpu, path);
    return training;
  }
  std::unique_ptr<course::FashionMNIST> small;
  Scratch scratch;
};
