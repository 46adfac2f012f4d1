// fuzz_file.h defines: the file a fuzz target hands its input to. The readers under test take a
// path, as the lessons call them, so each input is written to one file per process first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fuzz {

/// Writes `size` bytes to this process's scratch file (in /dev/shm when it exists, else the
/// temporary folder) and returns its path. The file is removed when the process exits.
const std::string& write_input(const std::uint8_t* data, std::size_t size);

}  // namespace fuzz
