#include "controller/cli/render.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <iomanip>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "controller/cli/certs.h"
#include "controller/cli/shard_render.h"

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

// " [#####-----]  52% 1.2 GiB/2.3 GiB" for byte progress; "" without a total.
std::string Bar(const glm::v1::Progress& p) {
  if (p.total_bytes() <= 0) return "";
  double frac = std::clamp(static_cast<double>(p.done_bytes()) / p.total_bytes(), 0.0, 1.0);
  int filled = static_cast<int>(frac * 20);
  return absl::StrFormat(" [%s%s] %3d%% %s/%s", std::string(filled, '#'),
                         std::string(20 - filled, '-'), static_cast<int>(frac * 100),
                         HumanBytes(p.done_bytes()), HumanBytes(p.total_bytes()));
}

// What an operator must act on: certificates near expiry, and a control plane open to the
// network (plaintext gRPC beyond loopback by explicit opt-out).
std::vector<std::string> StatusWarnings(const glm::v1::ClusterStatus& s) {
  std::vector<std::string> out = CertificateExpiryWarnings(s);
  if (!s.insecure_listen().empty()) {
    out.push_back(absl::StrCat(
        "the controller serves plaintext gRPC on ", s.insecure_listen(),
        " (controller.insecure: true): anyone who reaches it can bring the cluster up or down. "
        "Fix: `glmctl certs --out DIR ", s.config_path(), "` and set controller.tls"));
  }
  std::vector<std::string> open_nodes;
  for (const auto& n : s.nodes()) {
    if (n.insecure()) open_nodes.push_back(n.name());
  }
  if (!open_nodes.empty()) {
    out.push_back(absl::StrCat(
        "agent(s) ", absl::StrJoin(open_nodes, ", "),
        " serve plaintext gRPC beyond loopback (glm-agent --insecure): anyone who reaches them "
        "can load, stop and restart shards. Fix: start them with --tls-ca/--tls-cert/--tls-key "
        "from `glmctl certs`"));
  }
  return out;
}

// Drafts accepted / drafts verified on a replica's head; 0 before any draft.
double SpecAcceptanceRate(const glm::v1::ReplicaStatus& r) {
  return r.spec_draft_tokens() > 0
             ? static_cast<double>(r.spec_accepted_tokens()) / r.spec_draft_tokens()
             : 0.0;
}

// A replica of several PP stages while it runs: the head's micro-batches in flight (now / the
// most at once) and each stage's busy fraction over the last status interval, e.g.
//   "  pipeline: 2 steps in flight (at most 2); stage busy: node-0 41%, node-1 38%"
void PrintPipelineLine(std::ostream& out, const glm::v1::ClusterStatus& s,
                       const glm::v1::ReplicaStatus& r) {
  const glm::v1::ShardStatus* head = nullptr;
  std::vector<std::string> busy;
  for (const std::string& name : r.nodes()) {
    for (const auto& n : s.nodes()) {
      if (n.name() != name || !n.has_shard()) continue;
      const glm::v1::ShardStatus& shard = n.shard();
      if (shard.pp_size() <= 1 || shard.state() != glm::v1::SHARD_STATE_RUNNING) continue;
      if (shard.head()) head = &shard;
      busy.push_back(
          absl::StrFormat("%s %.0f%%", name, 100.0 * shard.stage_busy_fraction()));
    }
  }
  if (head == nullptr) return;
  out << "  pipeline: " << head->steps_in_flight() << " steps in flight (at most "
      << head->max_steps_in_flight_observed() << "); stage busy: " << absl::StrJoin(busy, ", ")
      << "\n";
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
std::string ClusterHealthName(glm::v1::ClusterHealth h) {
  return Pascal(glm::v1::ClusterHealth_Name(h), strlen("CLUSTER_HEALTH_"));
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
    if (e.message().rfind("warning: ", 0) == 0) warnings_.push_back(e.message());
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

void UpProgress::Finish() {
  drawn_ = 0;
  for (const auto& w : warnings_) out_ << w << "\n";
  warnings_.clear();
}

nlohmann::json StatusToJson(const glm::v1::ClusterStatus& s) {
  nlohmann::json j;
  j["cluster"] = s.cluster_name();
  j["config"] = s.config_path();
  j["phase"] = PhaseName(s.phase());
  j["phase_message"] = s.phase_message();
  j["health"] = ClusterHealthName(s.health());
  j["health_message"] = s.health_message();
  j["controller"] = {{"version", s.controller_version()},
                     {"uptime_ms", s.controller_uptime_ms()}};
  if (s.has_controller_cert_expires_in_s()) {
    j["controller"]["cert_expires_in_s"] = s.controller_cert_expires_in_s();
  }
  if (s.has_ca_expires_in_s()) j["controller"]["ca_expires_in_s"] = s.ca_expires_in_s();
  if (!s.insecure_listen().empty()) j["controller"]["insecure"] = true;
  if (auto warnings = StatusWarnings(s); !warnings.empty()) j["warnings"] = warnings;
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
                          {"replica", n.replica()},
                          {"gid", n.has_gid() ? GidToJson(n.gid()) : nlohmann::json(nullptr)},
                          {"gid_fingerprint", n.gid_fingerprint()},
                          {"insecure", n.insecure()},
                          {"shard", ShardToJson(n)}});
  }
  j["replicas"] = nlohmann::json::array();
  for (const auto& r : s.replicas()) {
    j["replicas"].push_back({{"index", r.index()},
                             {"state", ReplicaStateName(r.state())},
                             {"message", r.message()},
                             {"epoch", r.epoch()},
                             {"auto_restarts", r.auto_restarts()},
                             {"restart_budget", r.restart_budget()},
                             {"budget_exhausted", r.budget_exhausted()},
                             {"nodes", std::vector<std::string>(r.nodes().begin(),
                                                                r.nodes().end())}});
    if (r.mtp_draft_tokens() > 0) {
      j["replicas"].back()["spec_decode"] = {
          {"draft_tokens_per_step", r.mtp_draft_tokens()},
          {"drafts", r.spec_drafts()},
          {"draft_tokens", r.spec_draft_tokens()},
          {"accepted_tokens", r.spec_accepted_tokens()},
          {"acceptance_rate", SpecAcceptanceRate(r)},
          {"accepted_per_position",
           std::vector<int64_t>(r.spec_accepted_per_position().begin(),
                                r.spec_accepted_per_position().end())}};
    }
  }
  return j;
}

void PrintStatusTable(std::ostream& out, const glm::v1::ClusterStatus& s) {
  out << "cluster " << s.cluster_name() << "  " << ClusterHealthName(s.health()) << "  phase "
      << PhaseName(s.phase()) << "  controller " << s.controller_version() << " up "
      << HumanDuration(s.controller_uptime_ms()) << "\n";
  if (!s.phase_message().empty()) out << "  " << s.phase_message() << "\n";
  for (const std::string& w : StatusWarnings(s)) out << "  warning: " << w << "\n";
  std::vector<std::vector<std::string>> rows = {
      {"NODE", "ADDRESS", "STATE", "VERSION", "UPTIME", "HEARTBEAT", "GID", "LAST ERROR"}};
  for (const auto& n : s.nodes()) {
    rows.push_back({n.name(), n.address(), NodeStateName(n.state()),
                    n.agent_version().empty() ? "-" : n.agent_version(),
                    n.uptime_ms() > 0 ? HumanDuration(n.uptime_ms()) : "-",
                    n.last_heartbeat_age_ms() < 0
                        ? "-"
                        : absl::StrFormat("%.1fs ago", n.last_heartbeat_age_ms() / 1000.0),
                    n.has_gid() ? absl::StrCat(n.gid().index()) : "-",
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
  // Degraded nodes: the whole message (old and new entries, fix), not cut to the column.
  for (const auto& n : s.nodes()) {
    if (n.state() == glm::v1::NODE_STATE_DEGRADED) {
      out << "  " << n.name() << " degraded: " << n.last_error() << "\n";
    }
  }
  out << "\n";
  PrintShardTable(out, s);
  out << "\n";
  if (s.replicas_size() == 0) {
    out << "no replicas planned yet (run glmctl up)\n";
    return;
  }
  out << std::left << std::setw(9) << "REPLICA" << std::setw(12) << "STATE" << std::setw(10)
      << "RESTARTS" << "NODES\n";
  for (const auto& r : s.replicas()) {
    // Automatic restarts in the window / the budget ("-" before bring-up sets one).
    std::string restarts = r.restart_budget() > 0 || r.auto_restarts() > 0
                               ? absl::StrCat(r.auto_restarts(), "/", r.restart_budget())
                               : "-";
    out << std::left << std::setw(9) << r.index() << std::setw(12)
        << ReplicaStateName(r.state()) << std::setw(10) << restarts
        << absl::StrJoin(std::vector<std::string>(r.nodes().begin(), r.nodes().end()), ",")
        << "\n";
    if (!r.message().empty()) out << "  " << r.message() << "\n";
    PrintPipelineLine(out, s, r);
    if (r.mtp_draft_tokens() > 0) {
      out << "  speculative decoding: " << r.mtp_draft_tokens() << " MTP drafts per step; "
          << r.spec_accepted_tokens() << " of " << r.spec_draft_tokens() << " drafts accepted ("
          << absl::StrFormat("%.1f%%", 100.0 * SpecAcceptanceRate(r)) << ") in "
          << r.spec_drafts() << " verify steps";
      if (r.spec_accepted_per_position_size() > 0) {
        out << "; by position " << absl::StrJoin(r.spec_accepted_per_position(), "/");
      }
      out << "\n";
    }
  }
}

nlohmann::json GidToJson(const glm::v1::GidEntry& g) {
  if (g.hca().empty()) return nullptr;
  return {{"hca", g.hca()},   {"port", g.port()}, {"index", g.index()},
          {"gid", g.gid()},   {"type", g.type()}, {"netdev", g.netdev()}};
}

namespace {

const char* CheckStatusWord(glm::v1::CheckStatus s) {
  switch (s) {
    case glm::v1::CHECK_STATUS_PASS: return "pass";
    case glm::v1::CHECK_STATUS_WARN: return "warn";
    case glm::v1::CHECK_STATUS_FAIL: return "FAIL";
    default: return "?";
  }
}

// Row keys per node: the check id, with " #2", " #3" for repeats (mtu.path: one per peer).
std::vector<std::string> CheckKeys(const glm::v1::NodePreflightResult& n) {
  std::map<std::string, int> seen;
  std::vector<std::string> keys;
  for (const auto& c : n.checks()) {
    int k = ++seen[c.id()];
    keys.push_back(k == 1 ? c.id() : absl::StrCat(c.id(), " #", k));
  }
  return keys;
}

}  // namespace

nlohmann::json PreflightToJson(const glm::v1::ClusterPreflightResponse& resp) {
  nlohmann::json j;
  j["ok"] = resp.ok();
  j["gid_warning"] = resp.gid_warning();
  j["nodes"] = nlohmann::json::array();
  for (const auto& n : resp.nodes()) {
    nlohmann::json checks = nlohmann::json::array();
    for (const auto& c : n.checks()) {
      std::string status = CheckStatusWord(c.status());
      for (auto& ch : status) ch = static_cast<char>(std::tolower(ch));
      checks.push_back({{"id", c.id()},
                        {"status", status},
                        {"message", c.message()},
                        {"evidence", c.evidence()},
                        {"fix", c.fix()}});
    }
    j["nodes"].push_back({{"node", n.node()},
                          {"address", n.address()},
                          {"ok", n.ok()},
                          {"error", n.error()},
                          {"gid", n.has_gid() ? GidToJson(n.gid()) : nlohmann::json(nullptr)},
                          {"checks", checks}});
  }
  return j;
}

void PrintPreflightTable(std::ostream& out, const glm::v1::ClusterPreflightResponse& resp) {
  // Rows in first-seen order over all nodes.
  std::vector<std::string> order;
  std::map<std::string, std::map<std::string, std::string>> cells;  // key -> node -> status
  for (const auto& n : resp.nodes()) {
    std::vector<std::string> keys = CheckKeys(n);
    for (int i = 0; i < n.checks_size(); ++i) {
      if (!cells.count(keys[i])) order.push_back(keys[i]);
      cells[keys[i]][n.node()] = CheckStatusWord(n.checks(i).status());
    }
  }
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> header = {"CHECK"};
  for (const auto& n : resp.nodes()) header.push_back(n.node());
  rows.push_back(header);
  for (const auto& key : order) {
    std::vector<std::string> row = {key};
    for (const auto& n : resp.nodes()) {
      auto it = cells[key].find(n.node());
      row.push_back(!n.error().empty() ? "unreachable" : it == cells[key].end() ? "-" : it->second);
    }
    rows.push_back(row);
  }
  std::vector<std::string> gid_row = {"GID index"};
  for (const auto& n : resp.nodes()) {
    gid_row.push_back(n.has_gid() ? absl::StrCat(n.gid().index()) : "-");
  }
  rows.push_back(gid_row);
  std::vector<size_t> width(header.size(), 0);
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
  for (const auto& n : resp.nodes()) {
    if (n.has_gid()) {
      out << n.node() << ": GID " << n.gid().hca() << " port " << n.gid().port() << " index "
          << n.gid().index() << " " << n.gid().gid() << " (" << n.gid().type() << ", "
          << n.gid().netdev() << ")\n";
    }
  }
  for (const auto& n : resp.nodes()) {
    if (!n.error().empty()) out << n.node() << ": UNREACHABLE: " << n.error() << "\n";
    for (const auto& c : n.checks()) {
      if (c.status() != glm::v1::CHECK_STATUS_WARN && c.status() != glm::v1::CHECK_STATUS_FAIL) {
        continue;
      }
      out << n.node() << ": " << c.id() << " " << CheckStatusWord(c.status()) << ": "
          << c.message() << "\n";
      if (!c.evidence().empty() && c.status() == glm::v1::CHECK_STATUS_FAIL) {
        out << "    evidence: " << OneLine(c.evidence(), 200) << "\n";
      }
      if (!c.fix().empty()) out << "    fix: " << c.fix() << "\n";
    }
  }
  if (!resp.gid_warning().empty()) out << "WARNING: " << resp.gid_warning() << "\n";
  out << (resp.ok() ? "preflight ok: no check failed\n" : "preflight FAILED\n");
}

}  // namespace glm::cli
