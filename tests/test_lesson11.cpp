// Tests of lesson 11: the loaders, each form's training against the tutorial's loop, and the
// accuracy.
#include <gtest/gtest.h>

#include <set>

// The lesson is one file with its own main(); the tests include it for its functions.
#define GPU_LESSONS_NO_MAIN
#include "cuda_test.h"
#include "fashion_mnist_test.h"
#include "fast_training_loop.cpp"
#include "move_asked.h"

namespace {

// A dataset whose first pixel holds the sample's index, so a batch says which samples it has.
course::ImageSet numbered(std::int64_t n) {
  course::ImageSet data;
  data.images = torch::zeros({n, 28, 28});
  data.images.select(2, 0).select(1, 0).copy_(torch::arange(n, torch::kFloat));
  data.labels = torch::arange(n, torch::kLong).remainder(10);
  return data;
}

// The sample indices one epoch of `loader` yields, in order.
std::vector<std::int64_t> one_epoch(lesson11::Loader& loader) {
  std::vector<std::int64_t> seen;
  lesson11::Batch batch;
  loader.start_epoch();
  while (loader.next(batch)) {
    const torch::Tensor ids = batch.images.select(1, 0).to(torch::kCPU).to(torch::kLong);
    EXPECT_TRUE(torch::equal(ids.remainder(10), batch.labels.to(torch::kCPU)));
    for (std::int64_t i = 0; i < ids.size(0); ++i) seen.push_back(ids[i].item<std::int64_t>());
  }
  return seen;
}

void expect_each_sample_once(const std::string& name, const torch::Device& device) {
  constexpr std::int64_t kN = 1000;  // not a multiple of the batch size: a short last batch
  torch::manual_seed(1);
  lesson11::Loader loader(name, numbered(kN), /*batch_size=*/64, device);
  EXPECT_EQ(loader.name(), name);
  EXPECT_EQ(loader.size(), kN);
  const auto first = one_epoch(loader);
  const auto second = one_epoch(loader);
  ASSERT_EQ(first.size(), static_cast<size_t>(kN));
  EXPECT_EQ(std::set<std::int64_t>(first.begin(), first.end()).size(), static_cast<size_t>(kN));
  EXPECT_EQ(*std::min_element(first.begin(), first.end()), 0);
  EXPECT_EQ(*std::max_element(first.begin(), first.end()), kN - 1);
  EXPECT_NE(first, second) << "each epoch must be shuffled anew";
}

}  // namespace

// Tests that both loaders yield every sample exactly once per epoch, reshuffled each epoch.
TEST(Loaders, EverySampleOncePerEpoch) {
  expect_each_sample_once("pinned", torch::kCPU);
  expect_each_sample_once("resident", torch::kCPU);
}

// Tests tutorial 002's loop: its slices cover the tensors once, in order, the last one shorter,
// each moved to the device; and they hold what the same slices of the tensors moved once hold
// (the resident way). On a GPU too (expect_tutorial_002_slices is called by the GPU test).
void expect_tutorial_002_slices(const torch::Device& device) {
  const course::ImageSet data = numbered(25);
  const torch::Tensor X_tensor = data.images.reshape({25, -1}), y_tensor = data.labels;
  const torch::Tensor X_resident = X_tensor.to(device), y_resident = y_tensor.to(device);
  std::vector<std::int64_t> sizes;
  std::int64_t i = 0;
  lesson11::tutorial_002_epoch(X_tensor, y_tensor, 10, device,
                               [&](const torch::Tensor& Xbatch, const torch::Tensor& ybatch) {
                                 EXPECT_EQ(Xbatch.device(), device);
                                 EXPECT_EQ(ybatch.device(), device);
                                 const std::int64_t n = Xbatch.size(0);
                                 EXPECT_TRUE(torch::equal(Xbatch, X_resident.slice(0, i, i + n)));
                                 EXPECT_TRUE(torch::equal(ybatch, y_resident.slice(0, i, i + n)));
                                 sizes.push_back(n);
                                 i += n;
                               });
  EXPECT_EQ(sizes, (std::vector<std::int64_t>{10, 10, 5}));
}

TEST(Tutorial002, SlicesMovedOneByOneHoldTheResidentSlices) {
  expect_tutorial_002_slices(torch::kCPU);
}

// Tests that a progress line prints every `every` updates when enabled, clears itself at the end,
// and prints nothing when disabled (as off a terminal).
TEST(ProgressLine, EveryNthUpdateOnlyOnATerminal) {
  testing::internal::CaptureStdout();
  {
    lesson11::ProgressLine line(/*total=*/600, /*enabled=*/true, /*every=*/2);
    for (int done = 100; done <= 600; done += 100) line.update(done);
  }
  const std::string shown = testing::internal::GetCapturedStdout();
  EXPECT_NE(shown.find("\r     200/600 samples"), std::string::npos) << shown;
  EXPECT_NE(shown.find("\r     600/600 samples"), std::string::npos) << shown;
  EXPECT_EQ(shown.find("100/600"), std::string::npos) << shown;
  EXPECT_EQ(shown.back(), '\r') << "cleared at the end";
  testing::internal::CaptureStdout();
  {
    lesson11::ProgressLine line(600, /*enabled=*/false);
    for (int done = 0; done < 1000; ++done) line.update(done);
  }
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");
}

// Tests that an unknown loader or run name is a usage error.
TEST(Loaders, UnknownNameIsUsageError) {
  EXPECT_THROW(lesson11::Loader("prefetch", numbered(10), 4, torch::kCPU), course::UsageError);
  EXPECT_THROW(
      lesson11::train_and_evaluate(numbered(10), numbered(10), "batches", 1, 4, torch::kCPU, 1),
      course::UsageError);
}

// ---- with Fashion-MNIST ------------------------------------------------------------------------
// Tests that on the CPU the same seed gives identical results, whichever loader is used (the
// tutorial's LibTorch DataLoader, this lesson's pinned or resident one), with or without worker
// threads gathering the batches: the lesson's loaders draw their orders as LibTorch's
// RandomSampler does, so the pinned run is lesson 05's loop, loss for loss.
TEST_F(FashionMnistTest, SameSeedSameResultOnCpu) {
  const course::ImageSet subset = course::take(train(), 3000);
  const course::ImageSet eval = course::take(test(), 1000);
  const auto a = lesson11::train_and_evaluate(subset, eval, "resident", 2, 64, torch::kCPU, 11);
  const auto b = lesson11::train_and_evaluate(subset, eval, "resident", 2, 64, torch::kCPU, 11);
  const auto c = lesson11::train_and_evaluate(subset, eval, "pinned", 2, 64, torch::kCPU, 11);
  const auto d = lesson11::train_and_evaluate(subset, eval, "pinned", 2, 64, torch::kCPU, 11,
                                              /*workers=*/2);
  const auto t = lesson11::train_and_evaluate(subset, eval, "tutorial", 2, 64, torch::kCPU, 11);
  const auto u = lesson11::train_and_evaluate(subset, eval, "tutorial", 2, 64, torch::kCPU, 11,
                                              /*workers=*/2);
  ASSERT_EQ(t.epochs.size(), 2u);
  for (size_t e = 0; e < a.epochs.size(); ++e) {
    EXPECT_EQ(a.epochs[e].mean_loss, b.epochs[e].mean_loss);
    EXPECT_EQ(a.epochs[e].mean_loss, c.epochs[e].mean_loss);
    EXPECT_EQ(a.epochs[e].mean_loss, d.epochs[e].mean_loss);
    EXPECT_EQ(a.epochs[e].mean_loss, t.epochs[e].mean_loss) << "epoch " << e;
    EXPECT_EQ(a.epochs[e].mean_loss, u.epochs[e].mean_loss) << "epoch " << e;
  }
  EXPECT_EQ(a.accuracy, b.accuracy);
  EXPECT_EQ(a.accuracy, c.accuracy);
  EXPECT_EQ(a.accuracy, d.accuracy);
  EXPECT_EQ(a.accuracy, t.accuracy);
  EXPECT_EQ(a.accuracy, u.accuracy);
}

// Tests that worker threads gathering the batches change nothing but who gathers: the same
// samples in the same order, epoch after epoch, also when an epoch is left half-way.
TEST(Loaders, WorkersGiveTheSameBatchesInTheSameOrder) {
  torch::manual_seed(9);
  lesson11::Loader plain("pinned", numbered(1000), 64, torch::kCPU, /*workers=*/0);
  plain.start_epoch();  // an epoch not taken, as the threaded ones leave theirs below
  const auto first = one_epoch(plain), second = one_epoch(plain);
  for (const int workers : {1, 2, 3}) {
    torch::manual_seed(9);
    lesson11::Loader threaded("pinned", numbered(1000), 64, torch::kCPU, workers);
    lesson11::Batch batch;
    threaded.start_epoch();             // an epoch left after one batch, as a `break` leaves it:
    ASSERT_TRUE(threaded.next(batch));  // its workers stop, the next epoch starts afresh
    EXPECT_EQ(one_epoch(threaded), first) << workers << " workers";
    EXPECT_EQ(one_epoch(threaded), second) << workers << " workers";
  }
}

// Tests the moves where a CPU can see them: make_trainer asks for the model's move
// (move_asked.h), and the pinned loader copies every batch to the device it is given (a plain
// tensor can go to the meta device, which stands in for a GPU here).
TEST(Moves, TrainerAndBatchesGoToTheDevice) {
  expect_move_asked(
      [](const c10::Device& device) { (void)lesson11::make_trainer(device, lesson11::kSeed); },
      "make_trainer");
  const torch::Device meta(torch::kMeta);
  lesson11::Loader loader("pinned", numbered(100), 64, meta, /*workers=*/0);
  lesson11::Batch batch;
  loader.start_epoch();
  ASSERT_TRUE(loader.next(batch));
  EXPECT_EQ(batch.images.device(), meta) << "the batch's images stayed on the host: copy them "
                                            "with .to(device)";
  EXPECT_EQ(batch.labels.device(), meta) << "the batch's labels stayed on the host: copy them "
                                            "with .to(device)";
}

// Tests the lesson's verdict: the default run (5 epochs, batch 64, all 60,000 images) reaches
// the accuracy bar. About 3 seconds on 2 cores.
TEST_F(FashionMnistTest, DefaultRunReachesAccuracyBar) {
  const auto run = lesson11::train_and_evaluate(train(), test(), "resident", lesson11::kEpochs,
                                                lesson11::kBatchSize, torch::kCPU, lesson11::kSeed);
  EXPECT_GE(run.accuracy, lesson11::kAccuracyBar);
  EXPECT_LT(run.epochs.back().mean_loss, run.epochs.front().mean_loss);
}

// Tests the quick mode's bar on its subset.
TEST_F(FashionMnistTest, QuickRunReachesQuickBar) {
  const auto run = lesson11::train_and_evaluate(course::take(train(), lesson11::kQuickSamples),
                                                test(), "tutorial", lesson11::kQuickEpochs,
                                                lesson11::kBatchSize, torch::kCPU, lesson11::kSeed);
  EXPECT_GE(run.accuracy, lesson11::kQuickAccuracyBar);
}

// Tests both loaders on the GPU: every sample once, and training lowers the loss.
TEST_F(CudaTest, LoadersAndTrainingOnGpu) {
  expect_tutorial_002_slices(device);
  expect_each_sample_once("pinned", device);
  expect_each_sample_once("resident", device);
  course::ImageSet data = numbered(2000);
  data.images = torch::rand({2000, 28, 28});
  lesson11::Trainer trainer = lesson11::make_trainer(device, lesson11::kSeed);
  lesson11::Loader loader("resident", data, 64, device);
  const double first = lesson11::train_epoch_loaded(trainer, loader, device).mean_loss;
  double last = first;
  for (int e = 0; e < 3; ++e)
    last = lesson11::train_epoch_loaded(trainer, loader, device).mean_loss;
  EXPECT_LT(last, first);
}
