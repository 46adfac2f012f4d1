// write_atomically.h defines: lesson 13's atomic write, the way to replace a file that matters (a
// checkpoint) so that a process killed at any moment leaves the old file or the new one, never a
// mix. Lesson 14's checkpoints are saved with it.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

namespace lesson13 {

/// A function that takes bytes (a pointer and a count) and returns how many it took: what
/// LibTorch's OutputArchive::save_to(sink) writes into (Python: a file object's `write`).
using Sink = std::function<std::size_t(const void*, std::size_t)>;

/// Runs `write` with a sink into a temporary file beside `path`, flushes it to the disk and
/// renames it over `path` (Python: tempfile.mkstemp, os.fsync, os.replace). Throws
/// course::CheckpointError, with a HINT, when the folder cannot be written or the write fails;
/// `path` is then as it was, and no temporary file is left.
void write_atomically(const std::string& path, const std::function<void(const Sink&)>& write);

}  // namespace lesson13
