// Tests of lesson 05: the tutorial's model, LibTorch's data loader over Fashion-MNIST, the loop's
// moves and evaluation without a graph, and the accuracy the lesson's verdict promises.
#include <ATen/record_function.h>  // defines: at::addThreadLocalCallback (watching the operators)
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <vector>

// The lesson is one file with its own main(); the tests include it for its functions.
#define GPU_LESSONS_NO_MAIN
#include "cuda_test.h"
#include "fashion_mnist_test.h"
#include "training_loop.cpp"

namespace {

// `n` samples whose pixels all equal their index and whose label is index % 10.
course::FashionMNIST numbered(std::int64_t n) {
  const torch::Tensor index = torch::arange(n, torch::kFloat);
  return course::FashionMNIST(
      course::ImageSet{index.view({n, 1, 1}).expand({n, 28, 28}).contiguous(),
                       torch::arange(n, torch::kLong).remainder(10)});
}

// What the ATen operators that `work` dispatches on this thread did: how many of each name ran,
// how many ran with gradient recording on (an operator that records a graph), and the sizes of
// the tensor of each aten::to call that names a device (operators call aten::to for a dtype too,
// on tensors of a batch's sizes: only a move names a device).
struct OperatorLog {
  std::map<std::string, int> calls;
  std::vector<std::vector<std::int64_t>> to_sizes;  // of each aten::to naming a device
  int recording = 0;
  int total = 0;
};
OperatorLog watch_operators(const std::function<void()>& work) {
  static thread_local OperatorLog* log = nullptr;
  OperatorLog result;
  log = &result;
  const at::CallbackHandle handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback(
          [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
            ++log->calls[fn.name()];
            ++log->total;
            if (c10::GradMode::is_enabled()) ++log->recording;
            const auto inputs = fn.inputs();
            const bool names_a_device = std::any_of(
                inputs.begin(), inputs.end(), [](const c10::IValue& v) { return v.isDevice(); });
            if (std::string(fn.name()) == "aten::to" && names_a_device && inputs[0].isTensor()) {
              log->to_sizes.push_back(inputs[0].toTensor().sizes().vec());
            }
            return nullptr;
          })
          .needsInputs(true)
          .scopes({at::RecordScope::FUNCTION}));
  work();
  at::removeCallback(handle);
  log = nullptr;
  return result;
}

// The labels of one epoch of the train loader, in the order it gives them.
std::vector<std::int64_t> epoch_labels(std::int64_t n, std::int64_t batch, int workers) {
  torch::manual_seed(lesson05::kSeed);
  auto loader = lesson05::make_train_loader(numbered(n), batch, workers);
  std::vector<std::int64_t> labels;
  for (auto& b : *loader) {
    for (std::int64_t i = 0; i < b.target.size(0); ++i) {
      // The pixel value is the sample's index: it names the sample exactly.
      labels.push_back(static_cast<std::int64_t>(b.data[i][0][0][0].item<float>()));
    }
  }
  return labels;
}

}  // namespace

// Tests that the model has the tutorial's layers under the tutorial's names, so that a state_dict
// Python's ANN saves has the same keys and shapes.
TEST(ANN, TheTutorialsLayersAndNames) {
  lesson05::ANN model;
  std::map<std::string, std::vector<std::int64_t>> shapes;
  for (const auto& p : model->named_parameters()) shapes[p.key()] = p.value().sizes().vec();
  const std::map<std::string, std::vector<std::int64_t>> expected = {
      {"fc1.weight", {128, 784}}, {"fc1.bias", {128}},      {"fc2.weight", {64, 128}},
      {"fc2.bias", {64}},         {"out.weight", {10, 64}}, {"out.bias", {10}}};
  EXPECT_EQ(shapes, expected);
}

// Tests that forward flattens ToTensor's [B, 1, 28, 28] and returns one logit per class.
TEST(ANN, ForwardGivesTenLogitsPerImage) {
  lesson05::ANN model;
  EXPECT_EQ(model->forward(torch::rand({3, 1, 28, 28})).sizes(),
            (std::vector<std::int64_t>{3, 10}));
}

// Tests that the train loader gives batches in ToTensor's layout, every sample once per epoch, in
// a random order (not the dataset's).
TEST(Loaders, TrainLoaderGivesEverySampleOnceInRandomOrder) {
  torch::manual_seed(1);
  auto loader = lesson05::make_train_loader(numbered(100), 64, /*workers=*/0);
  std::vector<std::int64_t> sizes;
  for (auto& b : *loader) {
    EXPECT_EQ(b.data.sizes().slice(1), (std::vector<std::int64_t>{1, 28, 28}));
    EXPECT_EQ(b.data.scalar_type(), torch::kFloat);
    EXPECT_EQ(b.target.scalar_type(), torch::kLong);
    sizes.push_back(b.data.size(0));
  }
  EXPECT_EQ(sizes, (std::vector<std::int64_t>{64, 36}));
  std::vector<std::int64_t> seen = epoch_labels(100, 64, 0);
  std::vector<std::int64_t> in_order(100);
  for (std::int64_t i = 0; i < 100; ++i) in_order[static_cast<size_t>(i)] = i;
  EXPECT_NE(seen, in_order);
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, in_order);
}

// Tests that worker threads load the same batches in the same order as the main thread does.
TEST(Loaders, WorkersGiveTheSameBatchesInTheSameOrder) {
  const auto plain = epoch_labels(1000, 64, 0);
  EXPECT_EQ(epoch_labels(1000, 64, 2), plain);
  EXPECT_EQ(epoch_labels(1000, 64, 4), plain);
}

// Tests that the test loader keeps the dataset's order.
TEST(Loaders, TestLoaderKeepsTheOrder) {
  auto loader = lesson05::make_test_loader(numbered(100), 64);
  std::int64_t next = 0;
  for (auto& b : *loader) {
    for (std::int64_t i = 0; i < b.target.size(0); ++i, ++next) {
      EXPECT_EQ(b.data[i][0][0][0].item<float>(), static_cast<float>(next));
    }
  }
  EXPECT_EQ(next, 100);
}

// Tests the moves where a CPU can see them: each step of the loop asks for its batch's features
// and labels on the device (two aten::to calls a batch, on the batch's own tensors; on the CPU
// they copy nothing).
TEST(Moves, EachBatchGoesToTheDevice) {
  torch::manual_seed(lesson05::kSeed);
  lesson05::ANN model;
  torch::nn::CrossEntropyLoss criterion;
  torch::optim::Adam optimizer(model->parameters(),
                               torch::optim::AdamOptions(lesson05::kLearningRate));
  auto loader = lesson05::make_train_loader(numbered(256), 64, /*workers=*/0);
  const OperatorLog log = watch_operators(
      [&] { lesson05::train_epoch(model, *loader, criterion, optimizer, torch::kCPU); });
  const auto count = [&](const std::vector<std::int64_t>& sizes) {
    return std::count(log.to_sizes.begin(), log.to_sizes.end(), sizes);
  };
  EXPECT_EQ(count({64, 1, 28, 28}), 4)
      << "a batch's features stayed on the host: copy them with .to(device) in the loop";
  EXPECT_EQ(count({64}), 4)
      << "a batch's labels stayed on the host: copy them with .to(device) in the loop";
}

// Tests that evaluation builds no graph: no operator of evaluate() runs with gradient recording
// on (NoGradGuard), and the model is left in eval mode.
TEST(Evaluate, RecordsNoGraph) {
  lesson05::ANN model;
  auto loader = lesson05::make_test_loader(numbered(100), 64);
  const OperatorLog log = watch_operators([&] { lesson05::evaluate(model, *loader, torch::kCPU); });
  EXPECT_GT(log.total, 0);
  EXPECT_EQ(log.recording, 0) << "evaluation recorded a graph: turn gradient recording off with "
                                 "a torch::NoGradGuard";
  EXPECT_FALSE(model->is_training());
}

// Tests that evaluate() counts with torch::max: a model whose logits favour each sample's own
// label scores 1, one that favours another class scores 0.
TEST(Evaluate, AccuracyIsTheShareOfRightAnswers) {
  lesson05::ANN model;
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.zero_();
    model->out->bias[3] = 1.0;  // every image is called class 3
  }
  auto loader = lesson05::make_test_loader(numbered(100), 64);  // labels 0..9, ten of each
  EXPECT_DOUBLE_EQ(lesson05::evaluate(model, *loader, torch::kCPU), 0.1);
}

// Tests what one run learns: one epoch on the first kQuickSamples images reaches the quick bar,
// and the same seed gives the same loss with two loader workers as with none.
TEST_F(FashionMnistTest, QuickRunReachesQuickBarTheSameWithWorkers) {
  std::vector<double> losses;
  for (int workers : {0, 2}) {
    torch::manual_seed(lesson05::kSeed);
    lesson05::ANN model;
    torch::nn::CrossEntropyLoss criterion;
    torch::optim::Adam optimizer(model->parameters(),
                                 torch::optim::AdamOptions(lesson05::kLearningRate));
    course::ImageSet quick{train().images.slice(0, 0, lesson05::kQuickSamples),
                           train().labels.slice(0, 0, lesson05::kQuickSamples)};
    auto train_loader =
        lesson05::make_train_loader(course::FashionMNIST(quick), lesson05::kBatchSize, workers);
    losses.push_back(
        lesson05::train_epoch(model, *train_loader, criterion, optimizer, torch::kCPU));
    auto test_loader =
        lesson05::make_test_loader(course::FashionMNIST(test()), lesson05::kBatchSize);
    EXPECT_GE(lesson05::evaluate(model, *test_loader, torch::kCPU), lesson05::kQuickAccuracyBar);
  }
  EXPECT_EQ(losses[0], losses[1]);
}

// Tests the lesson's verdict: the default run (kEpochs epochs, batch 64, all 60,000 images)
// reaches the accuracy bar, and its epoch loss falls.
TEST_F(FashionMnistTest, DefaultRunReachesAccuracyBar) {
  torch::manual_seed(lesson05::kSeed);
  lesson05::ANN model;
  torch::nn::CrossEntropyLoss criterion;
  torch::optim::Adam optimizer(model->parameters(),
                               torch::optim::AdamOptions(lesson05::kLearningRate));
  auto train_loader = lesson05::make_train_loader(course::FashionMNIST(train()),
                                                  lesson05::kBatchSize, lesson05::kWorkers);
  std::vector<double> losses;
  for (int epoch = 0; epoch < lesson05::kEpochs; ++epoch) {
    losses.push_back(
        lesson05::train_epoch(model, *train_loader, criterion, optimizer, torch::kCPU));
  }
  auto test_loader = lesson05::make_test_loader(course::FashionMNIST(test()), lesson05::kBatchSize);
  EXPECT_GE(lesson05::evaluate(model, *test_loader, torch::kCPU), lesson05::kAccuracyBar);
  EXPECT_LT(losses.back(), losses.front());
}

// Tests the loop on a GPU: a quick run with every batch copied there trains and evaluates there.
TEST_F(CudaTest, QuickRunOnTheGpu) {
  std::string why;
  const FashionMnistSplits* data = fashion_mnist(&why);
  if (data == nullptr) GTEST_SKIP() << why;
  torch::manual_seed(lesson05::kSeed);
  lesson05::ANN model;
  model->to(device);
  torch::nn::CrossEntropyLoss criterion;
  torch::optim::Adam optimizer(model->parameters(),
                               torch::optim::AdamOptions(lesson05::kLearningRate));
  course::ImageSet quick{data->train.images.slice(0, 0, lesson05::kQuickSamples),
                         data->train.labels.slice(0, 0, lesson05::kQuickSamples)};
  auto train_loader = lesson05::make_train_loader(course::FashionMNIST(quick), lesson05::kBatchSize,
                                                  lesson05::kWorkers);
  lesson05::train_epoch(model, *train_loader, criterion, optimizer, device);
  EXPECT_TRUE(model->out->weight.is_cuda());
  auto test_loader =
      lesson05::make_test_loader(course::FashionMNIST(data->test), lesson05::kBatchSize);
  EXPECT_GE(lesson05::evaluate(model, *test_loader, device), lesson05::kQuickAccuracyBar);
}
