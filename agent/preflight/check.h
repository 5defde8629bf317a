// Preflight check results: one record per check, with a stable id, what was seen and the fix.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace glm::preflight {

enum class CheckStatus { kPass, kWarn, kFail };

// "pass" | "warn" | "fail".
const char* CheckStatusName(CheckStatus status);

// One check's outcome. `id` is stable (e.g. "gid.index"); operators and tests key on it.
struct CheckResult {
  std::string id;
  CheckStatus status = CheckStatus::kPass;
  std::string message;   // what was found, one sentence naming the device/file/value.
  std::string evidence;  // raw values read (file paths and contents), for the operator.
  std::string fix;       // what to do; empty only when status is kPass.
};

// A GID table entry as read from sysfs (or libibverbs).
struct GidEntry {
  std::string hca;
  int port = 1;
  int index = -1;
  std::string gid;     // sysfs spelling: "0000:0000:0000:0000:0000:ffff:c0a8:6401".
  std::string type;    // "RoCE v2", "IB/RoCE v1", or "" when unknown.
  std::string netdev;  // "" when the entry is not bound to a netdev.

  bool operator==(const GidEntry&) const = default;
  // "rocep1s0f0 port 1 index 3 gid ::ffff:192.168.100.1 (RoCE v2, enp1s0f0np0)".
  std::string Describe() const;
};

struct PreflightReport {
  std::string node;
  std::vector<CheckResult> checks;
  std::optional<GidEntry> gid;  // the resolved GID entry, when one was found.

  // True when no check failed (warnings allowed).
  bool ok() const;
  // Null when no check has that id.
  const CheckResult* Find(const std::string& id) const;
  // {"node":..., "ok":..., "checks":[{id,status,message,evidence,fix}], "gid":{hca,port,index,gid,type,netdev}|null}
  nlohmann::json ToJson() const;
  // Human-readable table, one line per check plus fix lines for warn/fail.
  std::string ToText() const;
};

}  // namespace glm::preflight
