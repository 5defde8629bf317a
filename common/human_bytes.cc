#include "common/human_bytes.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace glm {

std::string HumanBytes(int64_t bytes) {
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes) / 1024;
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  // Three literal formats: absl checks a format string at compile time (clang refuses a
  // conditional expression there).
  if (v < 10) return absl::StrFormat("%.2f %s", v, units[u]);
  if (v < 100) return absl::StrFormat("%.1f %s", v, units[u]);
  return absl::StrFormat("%.0f %s", v, units[u]);
}

}  // namespace glm
