#include "agent/preflight/preflight_command.h"

#include <cstdio>
#include <iostream>
#include <string>

#include "agent/preflight/preflight.h"

namespace glm::preflight {
namespace {

constexpr char kUsage[] =
    "usage: glm-agent preflight --config FILE --node NAME [--sysfs-root DIR] [--proc-root DIR]\n"
    "                           [--dev-root DIR] [--disk-path DIR] [--allow-no-gpu] [--json]\n";

}  // namespace

int RunPreflightCommand(int argc, char** argv) {
  std::string config;
  std::string node;
  PreflightOptions options;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    bool ok = true;
    if (arg == "--config") ok = value(&config);
    else if (arg == "--node") ok = value(&node);
    else if (arg == "--sysfs-root") ok = value(&options.roots.sysfs);
    else if (arg == "--proc-root") ok = value(&options.roots.proc);
    else if (arg == "--dev-root") ok = value(&options.roots.dev);
    else if (arg == "--disk-path") ok = value(&options.disk_path);
    else if (arg == "--allow-no-gpu") options.require_gpu = false;
    else if (arg == "--json") json = true;
    else if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    } else {
      std::cerr << "preflight: unknown argument '" << arg << "'\n" << kUsage;
      return 2;
    }
    if (!ok) {
      std::cerr << "preflight: " << arg << " needs a value\n" << kUsage;
      return 2;
    }
  }
  if (config.empty() || node.empty()) {
    std::cerr << "preflight: --config and --node are required\n" << kUsage;
    return 2;
  }
  absl::StatusOr<NodePreflightConfig> loaded = LoadNodePreflightConfig(config, node);
  if (!loaded.ok()) {
    std::cerr << "preflight: " << loaded.status().message() << "\n";
    return 2;
  }
  options.node = *loaded;
  PreflightReport report = RunNodePreflight(options);
  if (json) {
    std::cout << report.ToJson().dump(2) << "\n";
  } else {
    std::cout << report.ToText();
  }
  return report.ok() ? 0 : 1;
}

}  // namespace glm::preflight
