// torch_file.h defines: check_torch_file(), the check of a file in LibTorch's zip format (what
// torch::save and Python's torch.save write) before LibTorch reads it, which returns why the file
// is refused; the checks of what LibTorch then makes of it (a tensor inside its storage, a
// generator state); and reading and writing torch.save's files with LibTorch's own unpickler and
// pickler (a state_dict's pickle rewritten as a plain dict, which that unpickler can read).
// Why each check exists (measured and read in LibTorch 1.13 and 2.11): torch_file.cpp.
#pragma once

#include <ATen/core/Dict.h>    // defines: c10::impl::GenericDict
#include <ATen/core/Tensor.h>  // defines: at::Tensor
#include <ATen/core/ivalue.h>  // defines: c10::IValue
#include <c10/core/Device.h>   // defines: c10::Device

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace course {

/// True in a fuzzing build (scripts/fuzz): failed checksums are let through, so that the fuzzer's
/// mutations reach the checks behind them instead of stopping at the first checksum they break.
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
constexpr bool kFuzzingBuild = true;
#else
constexpr bool kFuzzingBuild = false;
#endif

/// One entry of a zip's central directory.
struct ZipEntry {
  std::string name;
  std::uint32_t crc = 0;
  std::uint64_t compressed = 0, size = 0, local_header = 0, method = 0, flags = 0, attributes = 0;
};

/// A file read once, and what its check found. LibTorch then reads `bytes`, not the file again,
/// so that what was checked is what it reads.
struct TorchFile {
  std::string bytes;                ///< the whole file
  std::vector<ZipEntry> directory;  ///< the zip's central directory (empty: none found)
  /// Why LibTorch must not read the file; empty when it may.
  std::string refusal;
  /// With every record checked: the record (e.g. "data/0") whose bytes do not match the CRC-32
  /// the zip records for them, or empty. (A damaged file, rather than a file of the wrong kind.)
  std::string damaged_record;
  /// False when the file was saved without CRC-32s (every record's is 0, as Python writes after
  /// torch.serialization.set_crc32_options(False)): then no record's bytes could be checked.
  bool crcs_recorded = true;
  /// Whether the archive has `record` (e.g. "data.pkl"), found as LibTorch's reader finds it:
  /// in the archive's folder, ignoring ASCII case.
  bool has_record(const std::string& record) const;
};

/// What check_torch_file checks the CRC-32 of.
enum class CrcCheck {
  kStructure,    ///< the records LibTorch reads to open the file: version, id, pickles
  kEveryRecord,  ///< every record: for a file with no checksum of its own (a state_dict)
};

/// Reads `path` (a regular file: the caller says what it means when there is none) and checks it
/// as strictly as LibTorch's readers need: the zip's directory where LibTorch's zip reader finds
/// it, the first entry's folder, the format version and serialization id, every entry's sizes
/// against the bytes it holds, the CRC-32s (`crc`), and every pickle run on a stack of its own
/// (pickle_refusal). A fuzzing build (FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION) lets failed
/// CRC-32s through, so that mutations reach what lies behind them.
TorchFile check_torch_file(const std::string& path, CrcCheck crc);

/// Why LibTorch's unpickler must not run `pickle`, a pickle of `file` stored as `record` (its
/// storages are the records in the folder of that name, e.g. "data.pkl" reads "data/<key>"), or
/// empty when it may. check_torch_file runs it on every pickle; call it again on a pickle you
/// rewrote.
std::string pickle_refusal(const std::string& pickle, const TorchFile& file,
                           const std::string& record);

/// The object a torch.save file holds (`file`, checked, with no refusal), read by LibTorch's own
/// unpickler, every tensor made on the CPU (map_location="cpu"). A state_dict comes back as a
/// plain dict with one extra entry under kPlaceholderKey (plain_dict_pickle). Throws what
/// LibTorch throws, or std::runtime_error for a rewritten pickle the check refuses.
c10::IValue read_torch_save(const TorchFile& file);

/// Writes `dict` (names to tensors, on the CPU) to `write` in torch.save's format, so that
/// Python's torch.load(path, weights_only=True) reads it: a plain dict, without the TorchScript
/// type tag that torch::pickle_save adds and torch.load refuses.
void write_torch_save(const c10::impl::GenericDict& dict,
                      const std::function<std::size_t(const void*, std::size_t)>& write);

/// A state_dict's pickle as torch.save writes it (a collections.OrderedDict, which LibTorch's
/// unpickler cannot read: "Expected GenericDict but got None") rewritten as a plain dict, which it
/// reads, with one extra entry under kPlaceholderKey to drop; any other pickle is returned as it
/// is.
std::string plain_dict_pickle(std::string pickle);
constexpr const char* kPlaceholderKey = "collections.OrderedDict";

/// Why `tensor`, as LibTorch's unpickler made it from a file's sizes and strides, reaches past
/// the bytes of its storage ("(SHAPE) reaches past the N bytes stored for it"), or empty when
/// every element it can reach lies inside.
std::string storage_refusal(const at::Tensor& tensor);

/// Why `state` cannot be restored into `device`'s default generator ("not a contiguous byte
/// vector", or LibTorch's own reason), or empty when it can. The generator is tried with it and
/// put back as it was.
std::string generator_state_refusal(const c10::Device& device, const at::Tensor& state);

}  // namespace course
