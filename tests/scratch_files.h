// scratch_files.h defines: Scratch, a fresh folder for one test (common/temporary_folder.h's
// TemporaryFolder, removed with its contents afterwards), and read_bytes / write_bytes, a file's
// bytes read whole or written whole (to damage a file on purpose), and damage_everywhere, a file
// damaged in many ways, one after another.
#pragma once

#include <cstddef>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>

#include "common/temporary_folder.h"  // defines: TemporaryFolder

struct Scratch : course::TemporaryFolder {
  Scratch() : course::TemporaryFolder("gpu-lessons-test-") {}
};

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// Writes `bytes` to `path` damaged in 308 ways, calling `check(what)` after each: truncated at 97
// offsets from 0 to the whole file less a 97th, then with one byte changed at 211 positions spread
// evenly over it (the zip's headers, the pickles, the tensors).
constexpr int kDamagedCopies = 97 + 211;
inline void damage_everywhere(const std::string& bytes, const std::string& path,
                              const std::function<void(const std::string&)>& check) {
  for (int i = 0; i <= 96; ++i) {
    const std::size_t keep = bytes.size() * static_cast<std::size_t>(i) / 97;
    write_bytes(path, bytes.substr(0, keep));
    check("truncated to " + std::to_string(keep));
  }
  for (int i = 0; i < 211; ++i) {
    std::string copy = bytes;
    const std::size_t at = (copy.size() - 1) * static_cast<std::size_t>(i) / 210;
    copy[at] = static_cast<char>(copy[at] ^ 0x5a);
    write_bytes(path, copy);
    check("byte " + std::to_string(at) + " changed");
  }
}
