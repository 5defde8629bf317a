#include "engine/backend/cpu/cpu_backend.h"

#include <gtest/gtest.h>

namespace glm::engine {
namespace {
TEST(CpuBackend, Placeholder) {}
}  // namespace
}  // namespace glm::engine
