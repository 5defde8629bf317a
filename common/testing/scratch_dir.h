// A fresh scratch directory for the running test. ctest runs each test of a binary as its own
// process, two at a time, so a fixed name under TempDir() would be shared (and removed) by tests
// running at once; this one is named after the process and the test.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <string_view>

namespace glm::testing_util {

// Returns TempDir()/<prefix>_<pid>_<suite>_<test>, created; emptied on its first use in this
// process (a leftover of an earlier run under the same pid), kept on later calls.
inline std::filesystem::path ScratchDir(std::string_view prefix) {
  std::string name = std::string(prefix) + "_" + std::to_string(::getpid());
  if (const auto* info = ::testing::UnitTest::GetInstance()->current_test_info()) {
    name += std::string("_") + info->test_suite_name() + "_" + info->name();
  }
  std::replace(name.begin(), name.end(), '/', '_');  // parameterized names hold '/'
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / name;
  static std::set<std::string>* emptied = new std::set<std::string>;
  if (emptied->insert(dir.string()).second) std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace glm::testing_util
