// data.cpp: IDX reader on zlib, Fashion-MNIST lookup and loading, synthetic regression data.
#include "common/data.h"

#include <zlib.h>

#include <array>
#include <cstdlib>
#include <vector>

#include <cstring>

#include <ATen/ATen.h>              // defines: at::empty, at::randn
#include <ATen/CPUGeneratorImpl.h>  // defines: at::detail::createCPUGenerator

namespace course {
namespace {

const std::string kInstallHint =
    "install the data with 'sudo apt-get install dataset-fashion-mnist', or pass --data-dir DIR "
    "(or set " + std::string(kDataDirEnv) + "=DIR) for a folder holding "
    "train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and "
    "t10k-labels-idx1-ubyte.gz";

const std::array<const char*, 4> kFiles = {
    "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz"};

// Reads the whole (decompressed) file; gzread passes plain files through unchanged.
std::vector<std::uint8_t> read_all(const std::filesystem::path& file) {
  gzFile in = gzopen(file.c_str(), "rb");
  if (in == nullptr) {
    throw DataError("cannot open " + file.string(), kInstallHint);
  }
  std::vector<std::uint8_t> bytes;
  std::array<std::uint8_t, 1 << 16> chunk{};
  for (;;) {
    const int n = gzread(in, chunk.data(), static_cast<unsigned>(chunk.size()));
    if (n < 0) {
      int code = 0;
      const std::string reason = gzerror(in, &code);
      gzclose(in);
      throw DataError(file.string() + " is corrupt (" + reason + ")",
                      "the file is damaged: reinstall it (" + kInstallHint + ")");
    }
    if (n == 0) break;
    bytes.insert(bytes.end(), chunk.begin(), chunk.begin() + n);
  }
  gzclose(in);
  return bytes;
}

std::uint32_t big_endian(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}

}  // namespace

at::Tensor read_idx(const std::filesystem::path& file) {
  if (!std::filesystem::is_regular_file(file)) {
    throw DataError(file.string() + " does not exist", kInstallHint);
  }
  const std::vector<std::uint8_t> bytes = read_all(file);
  const std::string damaged = "the file is damaged or is not an IDX file: reinstall it (" +
                              kInstallHint + ")";
  // IDX header: two zero bytes, a type code (0x08 = unsigned byte), the number of dimensions,
  // then each dimension as a big-endian 32-bit integer.
  if (bytes.size() < 4 || bytes[0] != 0 || bytes[1] != 0) {
    throw DataError(file.string() + ": bad magic number (not an IDX file)", damaged);
  }
  if (bytes[2] != 0x08) {
    throw DataError(file.string() + ": IDX element type 0x" + std::to_string(bytes[2]) +
                        " is not unsigned byte (0x08)", damaged);
  }
  const int dims = bytes[3];
  if (dims < 1 || dims > 4 || bytes.size() < 4 + 4 * static_cast<size_t>(dims)) {
    throw DataError(file.string() + ": bad IDX header (" + std::to_string(dims) + " dimensions)",
                    damaged);
  }
  std::vector<std::int64_t> shape;
  std::int64_t count = 1;
  for (int d = 0; d < dims; ++d) {
    shape.push_back(big_endian(&bytes[4 + 4 * d]));
    count *= shape.back();
  }
  const size_t offset = 4 + 4 * static_cast<size_t>(dims);
  const auto have = static_cast<std::int64_t>(bytes.size() - offset);
  if (have != count) {
    throw DataError(file.string() + (have < count ? ": truncated" : ": has trailing bytes") +
                        ": the header promises " + std::to_string(count) + " bytes of data, the "
                        "file holds " + std::to_string(have), damaged);
  }
  at::Tensor tensor = at::empty(shape, at::kByte);
  std::memcpy(tensor.data_ptr<std::uint8_t>(), bytes.data() + offset, static_cast<size_t>(count));
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
      throw DataError("Fashion-MNIST not found: " + (folder / name).string() + " is missing (" +
                          source + ")", kInstallHint);
    }
  }
  return folder;
}

ImageSet load_fashion_mnist(const std::filesystem::path& folder, bool train) {
  const std::string prefix = train ? "train" : "t10k";
  const at::Tensor images = read_idx(folder / (prefix + "-images-idx3-ubyte.gz"));
  const at::Tensor labels = read_idx(folder / (prefix + "-labels-idx1-ubyte.gz"));
  const std::string hint = "the files do not belong together: reinstall them (" + kInstallHint +
                           ")";
  if (images.dim() != 3 || images.size(1) != 28 || images.size(2) != 28) {
    throw DataError(prefix + " images are not N x 28 x 28", hint);
  }
  if (labels.dim() != 1 || labels.size(0) != images.size(0)) {
    throw DataError(prefix + ": " + std::to_string(labels.numel()) + " labels for " +
                        std::to_string(images.size(0)) + " images", hint);
  }
  if (labels.max().item<int>() > 9) {
    throw DataError(prefix + " labels go past class 9", hint);
  }
  return {images.to(at::kFloat).div_(255.0), labels.to(at::kLong)};
}

const char* fashion_mnist_class(std::int64_t label) {
  static const std::array<const char*, 10> kNames = {
      "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
      "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return label >= 0 && label < 10 ? kNames[static_cast<size_t>(label)] : "?";
}

Regression make_regression(std::int64_t n, std::int64_t features, double noise,
                           std::uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  Regression data;
  data.x = at::randn({n, features}, gen, at::kFloat);
  data.weight = at::randn({features, 1}, gen, at::kFloat);
  data.bias = 0.5;
  data.y = at::matmul(data.x, data.weight) + data.bias + noise * at::randn({n, 1}, gen, at::kFloat);
  return data;
}

}  // namespace course
