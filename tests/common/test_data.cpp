// Tests of common/data.h: IDX files (bad ones are data errors), Fashion-MNIST (the real files, when
// installed) and take().

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/data.h"
#include "fashion_mnist_test.h"

namespace fs = std::filesystem;
class IdxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("gpu_lessons_idx_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // An IDX header for unsigned bytes with the given dimensions.
  static std::vector<std::uint8_t> header(const std::vector<std::uint32_t>& dims) {
    std::vector<std::uint8_t> bytes = {0, 0, 0x08, static_cast<std::uint8_t>(dims.size())};
    for (std::uint32_t d : dims) {
      for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back((d >> shift) & 0xff);
    }
    return bytes;
  }
  fs::path write_gz(const std::string& name, const std::vector<std::uint8_t>& bytes) {
    const fs::path path = dir_ / name;
    gzFile out = gzopen(path.c_str(), "wb");
    gzwrite(out, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(out);
    return path;
  }
  fs::path write_plain(const std::string& name, const std::vector<std::uint8_t>& bytes) {
    const fs::path path = dir_ / name;
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
    return path;
  }
  fs::path dir_;
};

// Tests that a well-formed gzipped IDX file reads back with its shape and values.
TEST_F(IdxTest, ReadsGoodFile) {
  auto bytes = header({2, 3, 4});
  for (int i = 0; i < 24; ++i) bytes.push_back(static_cast<std::uint8_t>(i * 10));
  const torch::Tensor t = course::read_idx(write_gz("good.gz", bytes));
  EXPECT_EQ(t.sizes(), torch::IntArrayRef({2, 3, 4}));
  EXPECT_EQ(t.scalar_type(), torch::kByte);
  EXPECT_EQ(t.flatten()[23].item<int>(), 230);
}

// Tests that an uncompressed IDX file is read too.
TEST_F(IdxTest, ReadsPlainFile) {
  auto bytes = header({5});
  for (int i = 0; i < 5; ++i) bytes.push_back(static_cast<std::uint8_t>(i));
  EXPECT_EQ(course::read_idx(write_plain("plain.idx", bytes)).sum().item<int>(), 10);
}

// Tests that a truncated file is a DataError that says so and names the package.
TEST_F(IdxTest, TruncatedFileIsDataError) {
  auto bytes = header({10, 28, 28});
  bytes.resize(bytes.size() + 100);
  try {
    course::read_idx(write_gz("truncated.gz", bytes));
    FAIL() << "no error";
  } catch (const course::DataError& error) {
    EXPECT_NE(std::string(error.what()).find("truncated"), std::string::npos) << error.what();
    EXPECT_NE(error.hint().find("dataset-fashion-mnist"), std::string::npos);
  }
}

// Tests that a header promising more data than any dataset is refused before anything is
// allocated, and that the product of the dimensions cannot wrap around: 2^31 x 4 x 2^31 x 4 is
// 4 modulo 2^64, which 4 bytes of data would otherwise match.
TEST_F(IdxTest, HugeHeaderIsDataErrorBeforeAllocating) {
  for (const auto& dims : std::vector<std::vector<std::uint32_t>>{
           {0xffffffffu}, {65536, 65536}, {0x80000000u, 4, 0x80000000u, 4}, {1, 1, 1, 1u << 31}}) {
    auto bytes = header(dims);
    bytes.resize(bytes.size() + 4);
    try {
      course::read_idx(write_plain("huge.idx", bytes));
      FAIL() << "no error for " << dims.size() << " dimensions";
    } catch (const course::DataError& error) {
      EXPECT_NE(std::string(error.what()).find("promises more than"), std::string::npos)
          << error.what();
    }
  }
}

// Tests that data past what the header promises is refused, and that a gzip bomb (a small file
// inflating to far more than the header promises) is refused after reading one byte too many.
TEST_F(IdxTest, TrailingBytesAndGzipBombAreDataErrors) {
  auto bytes = header({4});
  bytes.resize(bytes.size() + 5);
  EXPECT_THROW(course::read_idx(write_plain("trailing.idx", bytes)), course::DataError);
  bytes = header({4});
  bytes.resize(bytes.size() + (std::size_t{256} << 20));  // 256 MiB of zeros: about 256 KiB gzipped
  const fs::path bomb = write_gz("bomb.gz", bytes);
  EXPECT_LT(fs::file_size(bomb), std::uintmax_t{1} << 20);
  try {
    course::read_idx(bomb);
    FAIL() << "no error";
  } catch (const course::DataError& error) {
    EXPECT_NE(std::string(error.what()).find("trailing bytes"), std::string::npos) << error.what();
  }
}

// Tests that a file with the wrong magic number is a DataError.
TEST_F(IdxTest, WrongMagicIsDataError) {
  const std::vector<std::uint8_t> bytes = {0x1f, 0x00, 0x08, 0x01, 0, 0, 0, 1, 42};
  try {
    course::read_idx(write_gz("magic.gz", bytes));
    FAIL() << "no error";
  } catch (const course::DataError& error) {
    EXPECT_NE(std::string(error.what()).find("magic"), std::string::npos) << error.what();
  }
}

// Tests that a missing file and a missing folder are DataErrors naming the package and flag.
TEST_F(IdxTest, MissingFileAndFolderAreDataErrors) {
  EXPECT_THROW(course::read_idx(dir_ / "absent.gz"), course::DataError);
  try {
    course::find_fashion_mnist((dir_ / "nowhere").string());
    FAIL() << "no error";
  } catch (const course::DataError& error) {
    EXPECT_NE(error.hint().find("dataset-fashion-mnist"), std::string::npos);
    EXPECT_NE(error.hint().find("--data-dir"), std::string::npos);
  }
}

// Tests that a corrupt gzip stream is a DataError, not a crash or silent garbage.
TEST_F(IdxTest, CorruptGzipIsDataError) {
  auto bytes = header({64});
  bytes.resize(bytes.size() + 64, 7);
  const fs::path path = write_gz("corrupt.gz", bytes);
  std::vector<char> raw(fs::file_size(path));
  std::ifstream(path, std::ios::binary).read(raw.data(), static_cast<std::streamsize>(raw.size()));
  for (size_t i = 12; i + 8 < raw.size(); ++i) raw[i] = static_cast<char>(raw[i] ^ 0x5a);
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(raw.data(), static_cast<std::streamsize>(raw.size()));
  EXPECT_THROW(course::read_idx(path), course::DataError);
}

// Tests the real splits' shapes, label range and pixel range.
TEST_F(FashionMnistTest, ShapesAndRanges) {
  const course::ImageSet& train = this->train();
  const course::ImageSet& test = this->test();
  EXPECT_EQ(train.images.sizes(), torch::IntArrayRef({60000, 28, 28}));
  EXPECT_EQ(test.images.sizes(), torch::IntArrayRef({10000, 28, 28}));
  EXPECT_EQ(train.labels.sizes(), torch::IntArrayRef({60000}));
  EXPECT_EQ(train.labels.min().item<int64_t>(), 0);
  EXPECT_EQ(train.labels.max().item<int64_t>(), 9);
  // Balanced: 6,000 training images per class.
  EXPECT_TRUE(torch::equal(torch::bincount(train.labels), torch::full({10}, 6000, torch::kLong)));
  EXPECT_EQ(train.images.min().item<float>(), 0.0f);
  EXPECT_EQ(train.images.max().item<float>(), 1.0f);
}

// Tests that the environment variable is the fallback for the flag, and the flag wins over it.
TEST_F(FashionMnistTest, EnvironmentVariableIsUsed) {
  const fs::path found = course::find_fashion_mnist("");
  const char* previous = std::getenv(course::kDataDirEnv);
  const std::string saved = previous != nullptr ? previous : "";
  ::setenv(course::kDataDirEnv, "/definitely/not/here", 1);
  EXPECT_THROW(course::find_fashion_mnist(""), course::DataError);
  EXPECT_EQ(course::find_fashion_mnist(found.string()), found);
  if (previous != nullptr) {
    ::setenv(course::kDataDirEnv, saved.c_str(), 1);
  } else {
    ::unsetenv(course::kDataDirEnv);
  }
}

// Tests that a lesson's start reads both splits from the folder found, the training split cut for
// a --quick run and whole otherwise, the test split always whole, the same images as
// load_fashion_mnist's.
TEST_F(FashionMnistTest, SplitsAsALessonStarts) {
  const std::string folder = course::find_fashion_mnist("").string();
  const course::FashionMnist quick = course::load_fashion_mnist_splits(folder, true, 1000);
  EXPECT_EQ(quick.folder, fs::path(folder));
  EXPECT_EQ(quick.train.labels.size(0), 1000);
  EXPECT_EQ(quick.test.labels.size(0), 10000);
  EXPECT_TRUE(torch::equal(quick.train.images, this->train().images.slice(0, 0, 1000)));
  EXPECT_TRUE(torch::equal(quick.test.labels, this->test().labels));
  const course::FashionMnist full = course::load_fashion_mnist_splits(folder, false, 1000);
  EXPECT_EQ(full.train.labels.size(0), 60000);
  EXPECT_THROW(course::load_fashion_mnist_splits("/definitely/not/here", true, 10),
               course::DataError);
}

// Tests that take() gives a split's first samples as views of it, and all of it when asked for
// more.
TEST(Take, FirstSamplesAsViews) {
  const course::ImageSet data{torch::rand({10, 28, 28}), torch::arange(10, torch::kLong)};
  const course::ImageSet first = course::take(data, 4);
  EXPECT_EQ(first.images.sizes(), torch::IntArrayRef({4, 28, 28}));
  EXPECT_TRUE(torch::equal(first.labels, torch::arange(4, torch::kLong)));
  EXPECT_EQ(first.images.data_ptr(), data.images.data_ptr()) << "a view, not a copy";
  EXPECT_EQ(course::take(data, 100).labels.size(0), 10);
}
