// Tests of common/compare.h: comparing results: differences, gradients in order, checksums,
// tolerances.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "common/compare.h"
// Tests the differences: absolute, relative to the largest element, and of whole vectors; a
// missing tensor or another shape is never close.
TEST(Compare, Differences) {
  const torch::Tensor b = torch::tensor({1.0f, -4.0f, 2.0f});
  const torch::Tensor a = torch::tensor({1.0f, -4.0f, 2.5f});
  EXPECT_DOUBLE_EQ(course::max_abs_diff(a, b), 0.5);
  EXPECT_DOUBLE_EQ(course::max_rel_diff(a, b), 0.5 / 4);
  EXPECT_NEAR(course::relative_diff(a, b), 0.5 / std::sqrt(21.0), 1e-12);
  EXPECT_EQ(course::max_abs_diff(b, b), 0.0);
  EXPECT_EQ(course::relative_diff(torch::zeros({3}), torch::zeros({3})), 0.0);
  EXPECT_TRUE(std::isinf(course::max_abs_diff(a, torch::Tensor())));
  EXPECT_TRUE(std::isinf(course::max_abs_diff(a, b.reshape({3, 1}))));
  EXPECT_TRUE(std::isinf(course::max_rel_diff(std::vector<torch::Tensor>{a}, {})));
  EXPECT_DOUBLE_EQ(course::max_rel_diff(std::vector<torch::Tensor>{a, b}, {b, b}), 0.5 / 4);
}

// Tests that gradients() lists each parameter's gradient in order, undefined where none is, and
// that such a list never compares as close.
TEST(Compare, GradientsInParameterOrder) {
  const torch::Tensor w = torch::ones({2}, torch::requires_grad());
  const torch::Tensor v = torch::ones({3}, torch::requires_grad());
  (w * 3).sum().backward();
  const std::vector<torch::Tensor> grads = course::gradients({w, v});
  ASSERT_EQ(grads.size(), 2u);
  EXPECT_TRUE(torch::equal(grads[0], torch::full({2}, 3.0f)));
  EXPECT_FALSE(grads[1].defined());
  EXPECT_TRUE(std::isinf(course::max_rel_diff(grads, {grads[0], torch::zeros({3})})));
}

// Tests that the checksum of a tensor's bytes sees a single changed bit, wherever the tensor is.
TEST(Compare, ChecksumSeesOneBit) {
  torch::Tensor a = torch::randn({1000});
  torch::Tensor b = a.clone();
  EXPECT_EQ(course::checksum(a), course::checksum(b));
  EXPECT_EQ(course::checksum(a), course::checksum(a.reshape({10, 100}).t().contiguous().t()));
  torch::Tensor bits = b.view(torch::kInt);
  bits[500] = bits[500].bitwise_xor(1);  // one bit of one float
  EXPECT_NE(course::checksum(a), course::checksum(b));
}

// Tests the reasoning behind the tolerances on real sums: 4,096 terms added by two kernels
// (a reduction and a matrix product, which order their additions differently) agree within
// each dtype's tolerance, a 512 x 512 matmul agrees with float64's, and a sum missing one term
// does not.
TEST(Compare, ToleranceHoldsForSumsInAnotherOrder) {
  EXPECT_LT(course::tolerance_for(torch::kDouble), course::tolerance_for(torch::kFloat));
  EXPECT_LT(course::tolerance_for(torch::kFloat), course::tolerance_for(torch::kBFloat16));
  EXPECT_EQ(course::tolerance_for(torch::kHalf), course::tolerance_for(torch::kBFloat16));
  torch::manual_seed(3);
  for (const auto dtype : {torch::kDouble, torch::kFloat}) {
    const torch::Tensor terms = torch::rand({64, 4096}, dtype);
    const torch::Tensor by_reduction = terms.sum(1);
    const torch::Tensor by_matmul = terms.matmul(torch::ones({4096}, dtype));
    EXPECT_LE(course::max_rel_diff(by_reduction, by_matmul), course::tolerance_for(dtype)) << dtype;
    EXPECT_GT(course::max_rel_diff(terms.slice(1, 1).sum(1), by_matmul),
              course::tolerance_for(dtype))
        << dtype;
  }
  const torch::Tensor a = torch::randn({512, 512}), b = torch::randn({512, 512});
  EXPECT_LE(course::max_rel_diff(a.matmul(b), a.to(torch::kDouble).matmul(b.to(torch::kDouble))),
            course::tolerance_for(torch::kFloat));
}
