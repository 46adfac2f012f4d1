// Tests of common/ann.h: the tutorials' ANN and its test accuracy.

#include <gtest/gtest.h>
#include <signal.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "common/ann.h"
#include "common/interrupt.h"
// Tests the tutorials' ANN: its layers' names, and its accuracy on a split.
TEST(Ann, TheTutorialsLayersNamesAndAccuracy) {
  torch::manual_seed(0);
  course::ANN model;
  std::vector<std::string> names;
  for (const auto& item : model->named_parameters()) names.push_back(item.key());
  EXPECT_EQ(names, (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                                             "out.weight", "out.bias"}));
  course::ImageSet test{torch::rand({6, 28, 28}), torch::zeros({6}, torch::kLong)};
  const torch::Tensor logits = model->forward(test.images);
  ASSERT_EQ(logits.sizes(), (std::vector<std::int64_t>{6, 10}));
  // Labels that agree with the model's choice on the first four images only: 4/6.
  test.labels = std::get<1>(logits.max(1)).clone();
  test.labels.slice(0, 4) = (test.labels.slice(0, 4) + 1) % 10;
  model->train();
  EXPECT_DOUBLE_EQ(course::test_accuracy(model, test, torch::kCPU), 4.0 / 6.0);
  EXPECT_FALSE(model->is_training());
}

// Tests the FLOPs a training sample costs against the ANN's own weights: a multiply-add (2 FLOPs)
// per weight forward and again for its gradient, and one more for the gradient of each input
// except the images (fc2's and out's weights).
TEST(Ann, TrainingFlopsPerSampleCountTheWeights) {
  course::ANN model;
  const double weights = static_cast<double>(
      model->fc1->weight.numel() + model->fc2->weight.numel() + model->out->weight.numel());
  const double past_first =
      static_cast<double>(model->fc2->weight.numel() + model->out->weight.numel());
  EXPECT_EQ(course::kTrainingFlopsPerSample, 2 * 2 * weights + 2 * past_first);
}

// Tests that test_accuracy takes a lesson's own model as well (any module holder whose forward
// takes the images): lesson 09's is a Cloneable ANN.
TEST(Ann, TestAccuracyOfAnotherModel) {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Flatten(), torch::nn::Linear(28 * 28, 10));
  course::ImageSet test{torch::rand({8, 28, 28}), torch::zeros({8}, torch::kLong)};
  test.labels = std::get<1>(model->forward(test.images).max(1)).clone();
  test.labels.slice(0, 6) = (test.labels.slice(0, 6) + 1) % 10;  // wrong on the last two: 6/8
  EXPECT_DOUBLE_EQ(course::test_accuracy(model, test, torch::kCPU), 6.0 / 8.0);
  EXPECT_FALSE(model->is_training());
}

// Tests one epoch of the tutorial's loop: every batch is a step, the loss falls from one epoch to
// the next, and a Ctrl-C ends the epoch after the step under way.
TEST(Ann, OneEpochOfTheTutorialsLoopStopsOnCtrlC) {
  torch::manual_seed(1);
  const torch::Tensor images = torch::rand({256, 28, 28});
  const course::FashionMNIST train(
      course::ImageSet{images, torch::randint(10, {256}, torch::kLong)});
  course::ANN model;
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
  auto loader = course::make_train_loader(train, 64, 1);
  const auto [steps, first_loss] = course::train_epoch(model, adam, *loader, torch::kCPU);
  EXPECT_EQ(steps, 4);
  EXPECT_TRUE(model->is_training());
  EXPECT_LT(course::train_epoch(model, adam, *loader, torch::kCPU).second, first_loss);
  course::StopOnInterrupt guard;
  ::raise(SIGINT);
  try {
    course::train_epoch(model, adam, *loader, torch::kCPU);
    ADD_FAILURE() << "the epoch went on after a Ctrl-C";
  } catch (const course::Interrupted& stop) {
    EXPECT_STREQ(stop.what(), "after step 1");
  }
}
