// fuzz_torch_file: libFuzzer target for course::check_torch_file, the check every lesson runs on
// a torch file before LibTorch reads it, and for what follows it when the check passes: LibTorch's
// unpickler (course::read_torch_save) and the check of every tensor it makes against its storage.
// Every input must be refused with a reason, or read; a crash, a leak, a hang or a huge allocation
// is a bug. Run by scripts/fuzz, seeds in fuzz/corpus/fuzz_checkpoint/ (torch files both ways).
#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz_file.h"               // defines: fuzz::write_input
#include "torch_files/torch_file.h"  // defines: course::check_torch_file, read_torch_save

namespace {
// Every tensor inside `value`, read whole when it lies inside its storage.
void read_tensors(const c10::IValue& value) {
  std::vector<c10::IValue> todo{value};
  while (!todo.empty()) {
    const c10::IValue v = todo.back();
    todo.pop_back();
    if (v.isTensor() && course::storage_refusal(v.toTensor()).empty()) {
      volatile double sum = v.toTensor().to(at::kDouble).sum().item<double>();
      (void)sum;
    } else if (v.isGenericDict()) {
      for (const auto& item : v.toGenericDict()) todo.push_back(item.value());
    } else if (v.isList()) {
      for (const auto& item : v.toListRef()) todo.push_back(item);
    } else if (v.isTuple()) {
      for (const auto& item : v.toTupleRef().elements()) todo.push_back(item);
    }
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string& path = fuzz::write_input(data, size);
  const course::TorchFile file = course::check_torch_file(path, course::CrcCheck::kEveryRecord);
  if (!file.refusal.empty()) return 0;
  try {
    read_tensors(course::read_torch_save(file));
  } catch (const std::exception&) {
    // LibTorch's own errors for what the check lets through (an unknown class, a missing record)
  }
  return 0;
}
