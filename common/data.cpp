// data.cpp: IDX reader on zlib, Fashion-MNIST lookup and loading.
#include "common/data.h"

#include <ATen/ATen.h>  // defines: at::empty
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <vector>

namespace course {
namespace {

const std::string kInstallHint =
    "install the data with 'sudo apt-get install dataset-fashion-mnist', or pass --data-dir DIR "
    "(or set " +
    std::string(kDataDirEnv) +
    "=DIR) for a folder holding "
    "train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and "
    "t10k-labels-idx1-ubyte.gz";

const std::array<const char*, 4> kFiles = {
    "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz"};

// The largest IDX file the reader accepts, decompressed: Fashion-MNIST's largest is 47 MB. A
// header promising more is refused before anything is allocated, so a damaged (or hostile) file
// cannot make the reader allocate or inflate gigabytes.
constexpr std::int64_t kMaxIdxBytes = std::int64_t{1} << 30;

// A gzipped (or plain: gzread passes it through unchanged) file, read a piece at a time.
class GzReader {
 public:
  explicit GzReader(const std::filesystem::path& file)
      : file_(file), in_(gzopen(file.c_str(), "rb")) {
    if (in_ == nullptr) throw DataError("cannot open " + file.string(), kInstallHint);
  }
  ~GzReader() { gzclose(in_); }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  // Reads up to `size` bytes into `out`; returns how many there were (fewer at the end).
  std::int64_t read(void* out, std::int64_t size) {
    std::int64_t done = 0;
    while (done < size) {
      const auto piece = static_cast<unsigned>(std::min<std::int64_t>(size - done, 1 << 20));
      const int n = gzread(in_, static_cast<char*>(out) + done, piece);
      if (n < 0) {
        int code = 0;
        const std::string reason = gzerror(in_, &code);
        throw DataError(file_.string() + " is corrupt (" + reason + ")",
                        "the file is damaged: reinstall it (" + kInstallHint + ")");
      }
      if (n == 0) break;
      done += n;
    }
    return done;
  }

 private:
  std::filesystem::path file_;
  gzFile in_;
};

std::uint32_t big_endian(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}

}  // namespace

at::Tensor read_idx(const std::filesystem::path& file) {
  if (!std::filesystem::is_regular_file(file)) {
    throw DataError(file.string() + " does not exist", kInstallHint);
  }
  GzReader in(file);
  const std::string damaged =
      "the file is damaged or is not an IDX file: reinstall it (" + kInstallHint + ")";
  // IDX header: two zero bytes, a type code (0x08 = unsigned byte), the number of dimensions,
  // then each dimension as a big-endian 32-bit integer.
  std::array<std::uint8_t, 4 + 4 * 4> header{};
  const std::int64_t got = in.read(header.data(), 4);
  if (got < 4 || header[0] != 0 || header[1] != 0) {
    throw DataError(file.string() + ": bad magic number (not an IDX file)", damaged);
  }
  if (header[2] != 0x08) {
    throw DataError(file.string() + ": IDX element type 0x" + std::to_string(header[2]) +
                        " is not unsigned byte (0x08)",
                    damaged);
  }
  const int dims = header[3];
  if (dims < 1 || dims > 4 || in.read(header.data() + 4, 4 * dims) < 4 * dims) {
    throw DataError(file.string() + ": bad IDX header (" + std::to_string(dims) + " dimensions)",
                    damaged);
  }
  std::vector<std::int64_t> shape;
  std::int64_t count = 1;
  for (int d = 0; d < dims; ++d) {
    shape.push_back(big_endian(&header[4 + 4 * d]));
    if (shape.back() == 0) {
      throw DataError(file.string() + ": dimension " + std::to_string(d + 1) +
                          " of the IDX header is 0 (no data)",
                      damaged);
    }
    count *= shape.back();  // below 2^30 x 2^32: no overflow
    if (count > kMaxIdxBytes) {
      throw DataError(file.string() + ": the header promises more than " +
                          std::to_string(kMaxIdxBytes) +
                          " bytes of data, more than any "
                          "dataset of this course",
                      damaged);
    }
  }
  at::Tensor tensor = at::empty(shape, at::kByte);
  const std::int64_t have = in.read(tensor.data_ptr<std::uint8_t>(), count);
  std::uint8_t extra = 0;
  if (have < count || in.read(&extra, 1) != 0) {
    throw DataError(file.string() + (have < count ? ": truncated" : ": has trailing bytes") +
                        ": the header promises " + std::to_string(count) +
                        " bytes of data, the "
                        "file holds " +
                        (have < count ? std::to_string(have) : "more"),
                    damaged);
  }
  return tensor;
}

std::filesystem::path find_fashion_mnist(const std::string& flag) {
  std::filesystem::path folder;
  std::string source;
  if (!flag.empty()) {
    folder = flag;
    source = "--data-dir";
  } else if (const char* env = std::getenv(kDataDirEnv); env != nullptr && *env != '\0') {
    folder = env;
    source = kDataDirEnv;
  } else {
    folder = GPU_LESSONS_DEFAULT_DATA_DIR;
    source = "the default folder";
  }
  for (const char* name : kFiles) {
    if (!std::filesystem::is_regular_file(folder / name)) {
      throw DataError(
          "Fashion-MNIST not found: " + (folder / name).string() + " is missing (" + source + ")",
          kInstallHint);
    }
  }
  return folder;
}

ImageSet load_fashion_mnist(const std::filesystem::path& folder, bool train) {
  const std::string prefix = train ? "train" : "t10k";
  const at::Tensor images = read_idx(folder / (prefix + "-images-idx3-ubyte.gz"));
  const at::Tensor labels = read_idx(folder / (prefix + "-labels-idx1-ubyte.gz"));
  const std::string hint =
      "the files do not belong together: reinstall them (" + kInstallHint + ")";
  if (images.dim() != 3 || images.size(1) != 28 || images.size(2) != 28) {
    throw DataError(prefix + " images are not N x 28 x 28", hint);
  }
  if (labels.dim() != 1 || labels.size(0) != images.size(0)) {
    throw DataError(prefix + ": " + std::to_string(labels.numel()) + " labels for " +
                        std::to_string(images.size(0)) + " images",
                    hint);
  }
  if (labels.max().item<int>() > 9) {
    throw DataError(prefix + " labels go past class 9", hint);
  }
  return {images.to(at::kFloat).div_(255.0), labels.to(at::kLong)};
}

ImageSet take(const ImageSet& data, std::int64_t n) {
  return {data.images.slice(0, 0, n), data.labels.slice(0, 0, n)};
}

FashionMnist load_fashion_mnist_splits(const std::string& flag, bool quick,
                                       std::int64_t quick_samples) {
  const std::filesystem::path folder = find_fashion_mnist(flag);
  ImageSet train = load_fashion_mnist(folder, /*train=*/true);
  if (quick) train = take(train, quick_samples);
  return {folder, train, load_fashion_mnist(folder, /*train=*/false)};
}

}  // namespace course
