// fuzz_idx: libFuzzer target for course::read_idx, the function every lesson's Fashion-MNIST goes
// through (gzipped or plain IDX). Every input must give a tensor that matches its header, or a
// course::DataError; anything else (a crash, another exception, a hang, a huge allocation) is a
// bug. Run by scripts/fuzz, seeds in fuzz/corpus/fuzz_idx/.
#include <ATen/ATen.h>  // defines: at::Tensor

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "common/data.h"  // defines: course::read_idx, course::DataError
#include "fuzz_file.h"    // defines: fuzz::write_input

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string& path = fuzz::write_input(data, size);
  try {
    const at::Tensor tensor = course::read_idx(path);
    // What read_idx promises: unsigned bytes, 1 to 4 dimensions, every byte of the data read.
    if (tensor.scalar_type() != at::kByte || tensor.dim() < 1 || tensor.dim() > 4 ||
        !tensor.is_contiguous()) {
      std::abort();
    }
    volatile std::int64_t sum = tensor.sum().item<std::int64_t>();  // touches every element
    (void)sum;
  } catch (const course::DataError&) {
    // the clear error a damaged file must give
  }
  return 0;
}
