#include "agent/preflight/node_config.h"

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "yaml-cpp/yaml.h"

namespace glm::preflight {
namespace {

std::string Where(const std::string& source, const YAML::Node& node) {
  if (node.Mark().line >= 0) return absl::StrCat(source, ":", node.Mark().line + 1);
  return source;
}

absl::Status ReadString(const YAML::Node& parent, const char* key, const std::string& source,
                        std::string* out) {
  YAML::Node v = parent[key];
  if (!v) return absl::OkStatus();
  if (!v.IsScalar()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(source, v), ": field '", key, "' must be a scalar"));
  }
  *out = v.as<std::string>();
  return absl::OkStatus();
}

absl::Status ReadInt(const YAML::Node& parent, const char* key, const std::string& source,
                     int* out) {
  YAML::Node v = parent[key];
  if (!v) return absl::OkStatus();
  try {
    *out = v.as<int>();
  } catch (const YAML::Exception&) {
    return absl::InvalidArgumentError(absl::StrCat(Where(source, v), ": field '", key,
                                                   "' must be an integer, got '",
                                                   v.IsScalar() ? v.as<std::string>() : "?", "'"));
  }
  return absl::OkStatus();
}

absl::Status ReadSection(const YAML::Node& root, const std::string& source,
                         NodePreflightConfig* c) {
  if (YAML::Node nccl = root["nccl"]; nccl && nccl.IsMap()) {
    if (auto s = ReadString(nccl, "library", source, &c->nccl_library); !s.ok()) return s;
    if (auto s = ReadString(nccl, "expected_version", source, &c->nccl_expected_version); !s.ok()) return s;
  }
  if (YAML::Node fabric = root["fabric"]; fabric && fabric.IsMap()) {
    if (auto s = ReadInt(fabric, "mtu", source, &c->fabric_mtu); !s.ok()) return s;
    if (auto s = ReadString(fabric, "subnet", source, &c->fabric_subnet); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<NodePreflightConfig> ParseNodePreflightConfig(const std::string& yaml_text,
                                                             const std::string& node_name,
                                                             const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::ParserException& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ":", e.mark.line + 1, ": YAML syntax error: ", e.msg));
  }
  NodePreflightConfig c;
  if (auto s = ReadSection(root, source, &c); !s.ok()) return s;
  YAML::Node nodes = root["nodes"];
  if (!nodes || !nodes.IsSequence()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": missing 'nodes:' list; add one entry per node with name, fabric_ip, hca, netdev"));
  }
  std::vector<std::string> names;
  for (const YAML::Node& n : nodes) {
    std::string name;
    if (auto s = ReadString(n, "name", source, &name); !s.ok()) return s;
    names.push_back(name);
    if (name != node_name) continue;
    c.name = name;
    if (auto s = ReadString(n, "address", source, &c.address); !s.ok()) return s;
    if (auto s = ReadString(n, "fabric_ip", source, &c.fabric_ip); !s.ok()) return s;
    if (auto s = ReadString(n, "hca", source, &c.hca); !s.ok()) return s;
    if (auto s = ReadInt(n, "port", source, &c.port); !s.ok()) return s;
    if (auto s = ReadString(n, "netdev", source, &c.netdev); !s.ok()) return s;
    if (YAML::Node g = n["gid_index"]; g) {
      if (g.IsScalar() && g.as<std::string>() == "auto") {
        c.gid_index.reset();
      } else {
        int index = 0;
        if (auto s = ReadInt(n, "gid_index", source, &index); !s.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat(s.message(), "; use an integer or 'auto'"));
        }
        c.gid_index = index;
      }
    }
    if (auto s = ReadSection(n, source, &c); !s.ok()) return s;
    for (const char* required : {"fabric_ip", "hca", "netdev"}) {
      if (!n[required]) {
        return absl::InvalidArgumentError(absl::StrCat(Where(source, n), ": node '", name,
                                                       "' has no '", required, "' field; add it"));
      }
    }
    return c;
  }
  return absl::NotFoundError(absl::StrCat(source, ": no node named '", node_name,
                                          "' in nodes: (have: ", absl::StrJoin(names, ", "), ")"));
}

absl::StatusOr<NodePreflightConfig> LoadNodePreflightConfig(const std::string& path,
                                                            const std::string& node_name) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the cluster YAML"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return ParseNodePreflightConfig(buffer.str(), node_name, path);
}

}  // namespace glm::preflight
