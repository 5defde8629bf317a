#include "controller/cli/render.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <iomanip>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace glm::cli {
namespace {

// "NODE_STATE_UNREACHABLE" -> "Unreachable".
std::string Pascal(const std::string& enum_name, size_t prefix_len) {
  std::string out;
  bool upper = true;
  for (size_t i = prefix_len; i < enum_name.size(); ++i) {
    char c = enum_name[i];
    if (c == '_') {
      upper = true;
      continue;
    }
    out.push_back(upper ? c : static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
    upper = false;
  }
  return out;
}

std::string OneLine(std::string s, size_t max) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  if (s.size() > max) s = s.substr(0, max - 3) + "...";
  return s;
}

// " [#####-----]  52% 1.2/2.3 GiB" for byte progress; "" without a total.
std::string Bar(const glm::v1::Progress& p) {
  if (p.total_bytes() <= 0) return "";
  double frac = std::clamp(static_cast<double>(p.done_bytes()) / p.total_bytes(), 0.0, 1.0);
  int filled = static_cast<int>(frac * 20);
  return absl::StrFormat(" [%s%s] %3d%% %.1f/%.1f GiB", std::string(filled, '#'),
                         std::string(20 - filled, '-'), static_cast<int>(frac * 100),
                         p.done_bytes() / 1073741824.0, p.total_bytes() / 1073741824.0);
}

}  // namespace

std::string NodeStateName(glm::v1::NodeState s) {
  return Pascal(glm::v1::NodeState_Name(s), strlen("NODE_STATE_"));
}
std::string ReplicaStateName(glm::v1::ReplicaState s) {
  return Pascal(glm::v1::ReplicaState_Name(s), strlen("REPLICA_STATE_"));
}
std::string PhaseName(glm::v1::BringUpPhase p) {
  return Pascal(glm::v1::BringUpPhase_Name(p), strlen("BRING_UP_PHASE_"));
}

std::string HumanDuration(int64_t ms) {
  if (ms < 0) return "-";
  int64_t s = ms / 1000;
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrCat(s / 60, "m", s % 60, "s");
  if (s < 86400) return absl::StrCat(s / 3600, "h", (s % 3600) / 60, "m");
  return absl::StrCat(s / 86400, "d", (s % 86400) / 3600, "h");
}

UpProgress::UpProgress(std::ostream& out, bool tty, std::vector<std::string> nodes)
    : out_(out), tty_(tty), nodes_(std::move(nodes)) {
  for (const auto& n : nodes_) lines_[n] = {"Pending", ""};
}

void UpProgress::OnEvent(const glm::v1::UpEvent& e) {
  if (!tty_) {
    std::string phase = PhaseName(e.phase());
    if (e.node().empty()) {
      out_ << "[" << phase << "] " << e.message() << "\n";
    } else {
      out_ << "[" << phase << "] " << e.node() << ": " << NodeStateName(e.node_state()) << ": "
           << e.message() << Bar(e.progress()) << "\n";
    }
    out_.flush();
    return;
  }
  if (e.node().empty()) {
    phase_ = PhaseName(e.phase());
    phase_message_ = e.message();
  } else {
    if (!lines_.count(e.node())) nodes_.push_back(e.node());
    lines_[e.node()] = {NodeStateName(e.node_state()), e.message() + Bar(e.progress())};
  }
  Redraw();
}

void UpProgress::Redraw() {
  if (drawn_ > 0) out_ << "\x1b[" << drawn_ << "A";
  size_t width = 4;
  for (const auto& n : nodes_) width = std::max(width, n.size());
  out_ << "\r\x1b[2K" << "phase: " << phase_
       << (phase_message_.empty() ? "" : "  ") << OneLine(phase_message_, 100) << "\n";
  for (const auto& n : nodes_) {
    const auto& [state, msg] = lines_[n];
    out_ << "\r\x1b[2K  " << std::left << std::setw(static_cast<int>(width)) << n << "  "
         << std::setw(12) << state << OneLine(msg, 90) << "\n";
  }
  drawn_ = static_cast<int>(nodes_.size()) + 1;
  out_.flush();
}

void UpProgress::Finish() { drawn_ = 0; }

nlohmann::json StatusToJson(const glm::v1::ClusterStatus& s) {
  nlohmann::json j;
  j["cluster"] = s.cluster_name();
  j["config"] = s.config_path();
  j["phase"] = PhaseName(s.phase());
  j["phase_message"] = s.phase_message();
  j["controller"] = {{"version", s.controller_version()},
                     {"uptime_ms", s.controller_uptime_ms()}};
  j["nodes"] = nlohmann::json::array();
  for (const auto& n : s.nodes()) {
    j["nodes"].push_back({{"name", n.name()},
                          {"address", n.address()},
                          {"state", NodeStateName(n.state())},
                          {"version", n.agent_version()},
                          {"instance_id", n.instance_id()},
                          {"uptime_ms", n.uptime_ms()},
                          {"status_version", n.status_version()},
                          {"last_heartbeat_age_ms", n.last_heartbeat_age_ms()},
                          {"last_error", n.last_error()},
                          {"replica", n.replica()}});
  }
  j["replicas"] = nlohmann::json::array();
  for (const auto& r : s.replicas()) {
    j["replicas"].push_back({{"index", r.index()},
                             {"state", ReplicaStateName(r.state())},
                             {"nodes", std::vector<std::string>(r.nodes().begin(),
                                                                r.nodes().end())}});
  }
  return j;
}

void PrintStatusTable(std::ostream& out, const glm::v1::ClusterStatus& s) {
  out << "cluster " << s.cluster_name() << "  phase " << PhaseName(s.phase()) << "  controller "
      << s.controller_version() << " up " << HumanDuration(s.controller_uptime_ms()) << "\n";
  if (!s.phase_message().empty()) out << "  " << s.phase_message() << "\n";
  std::vector<std::vector<std::string>> rows = {
      {"NODE", "ADDRESS", "STATE", "VERSION", "UPTIME", "HEARTBEAT", "LAST ERROR"}};
  for (const auto& n : s.nodes()) {
    rows.push_back({n.name(), n.address(), NodeStateName(n.state()),
                    n.agent_version().empty() ? "-" : n.agent_version(),
                    n.uptime_ms() > 0 ? HumanDuration(n.uptime_ms()) : "-",
                    n.last_heartbeat_age_ms() < 0
                        ? "-"
                        : absl::StrFormat("%.1fs ago", n.last_heartbeat_age_ms() / 1000.0),
                    n.last_error().empty() ? "-" : OneLine(n.last_error(), 80)});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  for (const auto& r : rows) {
    for (size_t i = 0; i < r.size(); ++i) {
      out << std::left << std::setw(static_cast<int>(i + 1 == r.size() ? 0 : width[i] + 2))
          << r[i];
    }
    out << "\n";
  }
  out << "\n";
  if (s.replicas_size() == 0) {
    out << "no replicas planned yet (run glmctl up)\n";
    return;
  }
  out << std::left << std::setw(9) << "REPLICA" << std::setw(10) << "STATE" << "NODES\n";
  for (const auto& r : s.replicas()) {
    out << std::left << std::setw(9) << r.index() << std::setw(10)
        << ReplicaStateName(r.state())
        << absl::StrJoin(std::vector<std::string>(r.nodes().begin(), r.nodes().end()), ",")
        << "\n";
  }
}

}  // namespace glm::cli
