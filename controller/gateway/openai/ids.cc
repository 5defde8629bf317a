#include "controller/gateway/openai/ids.h"

#include <cstdint>
#include <random>

namespace glm::openai {

std::string NewId(std::string_view prefix) {
  thread_local std::mt19937_64 generator = [] {
    std::random_device device;
    std::seed_seq seed{device(), device(), device(), device()};
    return std::mt19937_64(seed);
  }();
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(prefix);
  for (int word = 0; word < 2; ++word) {
    uint64_t bits = generator();
    for (int i = 0; i < 16; ++i, bits >>= 4) id.push_back(kHex[bits & 0xf]);
  }
  return id;
}

}  // namespace glm::openai
