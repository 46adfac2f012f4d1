// write_atomically.cpp: lesson 13's atomic write, with the operating system's own calls (POSIX),
// each beside its Python twin in `os` or `tempfile`.
#include "write_atomically.h"

#include <fcntl.h>     // defines: open, O_DIRECTORY
#include <sys/stat.h>  // defines: fchmod, umask
#include <unistd.h>    // defines: write, fsync, close, unlink

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>

#include "common/verdict.h"          // defines: error_message
#include "torch_files/state_dict.h"  // defines: CheckpointError

namespace lesson13 {

namespace fs = std::filesystem;
using course::CheckpointError;

//! [write-atomically]
// Runs `write` with a sink into a temporary file beside `path`, flushes it to the disk and renames
// it over `path`: a process killed at any moment leaves the old file or the new one, never a mix.
void write_atomically(const std::string& path, const std::function<void(const Sink&)>& write) {
  const fs::path target = fs::absolute(path), folder = target.parent_path();
  // The temporary file, .NAME.tmp-XXXXXX, lives in the same folder: rename() is atomic only within
  // one file system. mkstemp (tempfile.mkstemp) writes a unique name over XXXXXX in the string's
  // own characters (.data()), creates and opens the file: its number (os.open's fd), or -1.
  std::string temporary = (folder / ".").string() + target.filename().string() + ".tmp-XXXXXX";
  const int fd = ::mkstemp(temporary.data());
  if (fd < 0) {
    throw CheckpointError("cannot write " + path + ": " + std::strerror(errno),
                          "check that the folder " + folder.string() + " exists and is writable");
  }
  int error = 0;  // the sink never throws (LibTorch's zip writer calls it); it records the error
  // mkstemp's file is its owner's alone; give it a new file's mode: 0666 (read and write for all)
  // less the umask, which umask() reads only by replacing it (so it is put back at once).
  const mode_t mask = ::umask(0);
  ::umask(mask);
  if (::fchmod(fd, 0666 & ~mask) != 0) error = errno;
  const Sink sink = [&](const void* data, std::size_t size) -> std::size_t {
    const char* bytes = static_cast<const char*>(data);
    for (std::size_t done = 0; done < size && error == 0;) {
      // os.write: it may write fewer bytes than asked (loop), or return -1 with the error in
      // errno; EINTR (a signal came) means "try again". ssize_t: a byte count that can be -1.
      const ssize_t n = ::write(fd, bytes + done, size - done);
      if (n < 0 && errno != EINTR) error = errno;
      if (n == 0) error = EIO;  // wrote nothing and said no error: give up, not loop forever
      if (n > 0) done += static_cast<std::size_t>(n);
    }
    return error == 0 ? size : 0;
  };
  std::string failure;
  try {
    write(sink);
  } catch (const std::exception& e) {
    failure = course::error_message(e);
  } catch (...) {  // whatever it threw, the temporary file is removed below
    failure = "the writer failed";
  }
  // 1. os.fsync: the file's bytes on the disk, not only in the kernel's cache.
  if (error == 0 && failure.empty() && ::fsync(fd) != 0) error = errno;
  if (::close(fd) != 0 && error == 0) error = errno;
  // >>> lab: rename the flushed file over `target`; on failure, set error = errno
  if (error == 0 && failure.empty() && std::rename(temporary.c_str(), target.c_str()) != 0) {
    error = errno;  // 2. then the name points at them: readers see the old file or the new one
  }
  // <<< lab
  if (error != 0 || !failure.empty()) {
    ::unlink(temporary.c_str());  // os.remove
    throw CheckpointError(
        "saving " + path + " failed: " + (error != 0 ? std::strerror(error) : failure),
        "free some disk space or save somewhere else; the previous file at " + path +
            " is untouched");
  }
  // 3. the folder, which records the rename, is flushed too: a power cut must not undo it
  // (O_DIRECTORY: open it only if it is one). The new file is in place by now: a folder that
  // cannot be flushed is said, not thrown.
  const int dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY);
  if (dir < 0 || ::fsync(dir) != 0) {
    std::fprintf(stderr, "note: %s is saved, but a power cut may undo it: %s\n", path.c_str(),
                 std::strerror(errno));
  }
  if (dir >= 0) ::close(dir);
}
//! [write-atomically]

}  // namespace lesson13
