// Tests of common/temporary_folder.h: a temporary folder.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "common/temporary_folder.h"

namespace fs = std::filesystem;
TEST(TemporaryFolder, NewEmptyAndGoneWithItsContentsAfterItsScope) {
  fs::path kept;
  {
    const course::TemporaryFolder a("common-test-"), b("common-test-");
    kept = a.path();
    EXPECT_TRUE(fs::is_directory(kept));
    EXPECT_TRUE(fs::is_empty(kept));
    EXPECT_NE(a.path(), b.path());
    EXPECT_EQ(a.file("x.pt"), (kept / "x.pt").string());
    std::ofstream(a.file("x.pt")) << "x";
    fs::create_directory(kept / "inner");
    std::ofstream(kept / "inner" / "y.pt") << "y";
  }
  EXPECT_FALSE(fs::exists(kept));
}
