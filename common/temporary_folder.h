// temporary_folder.h defines: TemporaryFolder, a new empty folder that is removed, with all it
// holds, when the object goes out of scope, however the scope ends (Python's
// tempfile.TemporaryDirectory in a `with` block).
#pragma once

#include <filesystem>
#include <string>

namespace course {

/// A folder made by mkdtemp under the system's temporary folder (a name no other process has),
/// removed with its contents by the destructor.
class TemporaryFolder {
 public:
  /// Makes `prefix` plus six random characters in the system's temporary folder; throws
  /// std::runtime_error when it cannot.
  explicit TemporaryFolder(const std::string& prefix);
  ~TemporaryFolder();  // removes the folder; never throws
  TemporaryFolder(const TemporaryFolder&) = delete;
  TemporaryFolder& operator=(const TemporaryFolder&) = delete;

  const std::filesystem::path& path() const { return path_; }
  /// path() / name, as a string (the form torch::save and torch::load take).
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace course
