// scratch_files.h defines: Scratch, a fresh folder for one test (common/temporary_folder.h's
// TemporaryFolder, removed with its contents afterwards), and read_bytes / write_bytes, a file's
// bytes read whole or written whole (to damage a file on purpose).
#pragma once

#include <fstream>
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
