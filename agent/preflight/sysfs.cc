#include "agent/preflight/sysfs.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace glm::preflight {

absl::StatusOr<std::string> ReadTrimmed(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      return absl::NotFoundError(absl::StrCat(path, ": not found"));
    }
    return absl::UnavailableError(absl::StrCat(path, ": ", std::strerror(err)));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::UnavailableError(absl::StrCat(path, ": read failed"));
  std::string s = buffer.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\t' || s.back() == '\0')) {
    s.pop_back();
  }
  return s;
}

std::vector<std::string> ListDir(const std::string& path) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(path, ec)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

bool PathExists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

}  // namespace glm::preflight
