// fuzz_file.cpp: the per-process scratch file the fuzz targets read their input from.
#include "fuzz_file.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>

namespace fuzz {
namespace {

std::string scratch_path() {
  const std::filesystem::path folder = std::filesystem::is_directory("/dev/shm")
                                           ? std::filesystem::path("/dev/shm")
                                           : std::filesystem::temp_directory_path();
  return (folder / ("gpu-lessons-fuzz-" + std::to_string(::getpid()))).string();
}

const std::string& path() {
  static const std::string kPath = [] {
    std::string p = scratch_path();
    static std::string to_remove;
    to_remove = p;
    std::atexit([] { std::remove(to_remove.c_str()); });
    return p;
  }();
  return kPath;
}

}  // namespace

const std::string& write_input(const std::uint8_t* data, std::size_t size) {
  std::FILE* out = std::fopen(path().c_str(), "wb");
  if (out == nullptr || (size > 0 && std::fwrite(data, 1, size, out) != size) ||
      std::fclose(out) != 0) {
    throw std::runtime_error("cannot write the fuzz input to " + path());
  }
  return path();
}

}  // namespace fuzz
