// Where the preflight reads the kernel's view of the node. Tests point these at fixture trees
// (tests/fixtures/sysfs/<case>/{sys,proc,dev}).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace glm::preflight {

struct SystemRoots {
  std::string sysfs = "/sys";
  std::string proc = "/proc";
  std::string dev = "/dev";
};

// Contents of a small file with trailing whitespace removed. NotFound when absent; other errors
// (sysfs returns EINVAL for unused GID attributes) as Unavailable, naming the path.
absl::StatusOr<std::string> ReadTrimmed(const std::string& path);

// Names in a directory, sorted; empty when the directory is absent or unreadable.
std::vector<std::string> ListDir(const std::string& path);

bool PathExists(const std::string& path);

}  // namespace glm::preflight
