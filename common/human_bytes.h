// Byte counts for people (CLI tables, progress lines, error messages).
#pragma once

#include <cstdint>
#include <string>

namespace glm {

// A unit that fits: "512 B", "1.50 KiB", "37.3 MiB", "742 GiB" (three significant digits from
// KiB up; bytes exact). Negative values print as bytes.
std::string HumanBytes(int64_t bytes);

}  // namespace glm
