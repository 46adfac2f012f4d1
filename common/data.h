// data.h defines: Fashion-MNIST read straight from its gzipped IDX files (zlib, no unpacked
// copies), the data folder lookup (flag, then $GPU_LESSONS_DATA_DIR, then the Debian package),
// the errors that name the fix, and take(), a split's first samples (--quick's subset).
#pragma once

#include <ATen/core/Tensor.h>  // defines: at::Tensor

#include <cstdint>
#include <filesystem>
#include <string>

#include "common/verdict.h"  // defines: CourseError

namespace course {

/// A missing, truncated or malformed data file; hint() names the package or flag that fixes it.
class DataError : public CourseError {
 public:
  using CourseError::CourseError;
};

/// Environment variable that points at the Fashion-MNIST folder when --data-dir is not given.
constexpr const char* kDataDirEnv = "GPU_LESSONS_DATA_DIR";

/// Reads one IDX file (gzipped or plain) into a uint8 tensor shaped by the file's dimensions.
/// Throws DataError on a missing file, bad magic number, unsupported type, or truncated data.
at::Tensor read_idx(const std::filesystem::path& file);

/// The folder holding Fashion-MNIST: `flag` if not empty, else $GPU_LESSONS_DATA_DIR, else the
/// Debian package's folder. Throws DataError when the folder lacks the four files.
std::filesystem::path find_fashion_mnist(const std::string& flag);

/// One split of Fashion-MNIST.
struct ImageSet {
  at::Tensor images;  ///< float32 [N, 28, 28], pixels scaled to [0, 1]
  at::Tensor labels;  ///< int64 [N], classes 0..9
};

/// Loads the train (60,000) or test (10,000) split from `folder`.
ImageSet load_fashion_mnist(const std::filesystem::path& folder, bool train);

/// The first `n` samples of `data` (all of it when n >= its size), as views: nothing is copied.
ImageSet take(const ImageSet& data, std::int64_t n);

/// Both splits as a training lesson starts with them: the folder found from `flag`
/// (find_fashion_mnist), the training split cut to its first `quick_samples` images when `quick`
/// (a --quick run), the test split whole.
struct FashionMnist {
  std::filesystem::path folder;
  ImageSet train, test;
};
FashionMnist load_fashion_mnist_splits(const std::string& flag, bool quick,
                                       std::int64_t quick_samples);

}  // namespace course
