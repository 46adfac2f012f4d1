// temporary_folder.cpp: mkdtemp and remove_all.
#include "common/temporary_folder.h"

#include <stdlib.h>  // defines: mkdtemp

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <system_error>

namespace course {

TemporaryFolder::TemporaryFolder(const std::string& prefix) {
  std::string name = (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
  if (::mkdtemp(name.data()) == nullptr) {
    throw std::runtime_error("cannot make a temporary folder " + name + ": " +
                             std::strerror(errno));
  }
  path_ = name;
}

TemporaryFolder::~TemporaryFolder() {
  std::error_code ignored;  // a destructor must not throw: a folder left behind is harmless
  std::filesystem::remove_all(path_, ignored);
}

}  // namespace course
