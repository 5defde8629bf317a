#include "controller/cli/commands.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cluster/spec/cluster_spec.h"
#include "controller/cli/certs.h"
#include "controller/cli/local_cluster.h"
#include "controller/cli/render.h"
#include "controller/orchestrate/spec_adapter.h"
#include "controller/plan/plan.h"
#include "glm/v1/controller.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "proto/rpc/credentials.h"
#include "proto/rpc/listen_policy.h"

namespace glm::cli {
namespace {

namespace fs = std::filesystem;
using orchestrate::ClusterTopology;

constexpr int kOk = 0;
constexpr int kFailed = 1;
constexpr int kUsage = 2;
constexpr int kUnreachable = 3;

fs::path StateDir() {
  if (const char* d = std::getenv("GLMCTL_STATE_DIR"); d && *d) return d;
  if (const char* d = std::getenv("XDG_STATE_HOME"); d && *d) return fs::path(d) / "glmctl";
  if (const char* h = std::getenv("HOME"); h && *h) return fs::path(h) / ".local/state/glmctl";
  return {};
}

void RememberConfig(const std::string& config) {
  fs::path dir = StateDir();
  if (dir.empty()) return;
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::ofstream(dir / "current") << fs::absolute(config, ec).string() << "\n";
}

// Loads the YAML (errors printed, with file:line:column, by the caller).
absl::StatusOr<ClusterTopology> Load(const std::string& config) {
  if (config.empty()) {
    return absl::InvalidArgumentError(
        "no cluster.yaml given and none remembered: pass the file (glmctl status cluster.yaml) "
        "or --controller ADDR");
  }
  std::error_code ec;
  return orchestrate::LoadTopology(fs::absolute(config, ec).string());
}

struct Connection {
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<glm::v1::Controller::Stub> stub;
};

absl::StatusOr<Connection> Connect(const ClusterTopology* topology, const GlobalFlags& flags) {
  Connection c;
  c.address = !flags.controller.empty() ? flags.controller
                                        : DialAddress(topology ? topology->controller_listen : "");
  if (c.address.empty()) {
    return absl::InvalidArgumentError("no controller address: pass cluster.yaml or --controller");
  }
  // The operator's certificate when `glmctl certs` wrote one (certs.h).
  rpc::TlsFiles tls = topology ? OperatorTlsFiles(topology->tls) : rpc::TlsFiles{};
  auto creds = rpc::MakeChannelCredentials(tls);
  if (!creds.ok()) return creds.status();
  c.channel = grpc::CreateChannel(c.address, *creds);
  c.stub = glm::v1::Controller::NewStub(c.channel);
  return c;
}

// Connection for read-only queries (status, health): `config` may be empty when --controller
// names the controller; otherwise the YAML (or the one remembered from the last `up`) says where.
absl::StatusOr<Connection> ConnectForQuery(const std::string& config, const GlobalFlags& flags) {
  if (config.empty() && !flags.controller.empty()) return Connect(nullptr, flags);
  absl::StatusOr<ClusterTopology> topology = Load(config);
  if (!topology.ok()) return topology.status();
  return Connect(&*topology, flags);
}

bool WaitConnected(Connection& c, std::chrono::milliseconds timeout) {
  return c.channel->WaitForConnected(std::chrono::system_clock::now() + timeout);
}

void Deadline(grpc::ClientContext* ctx, std::chrono::seconds s) {
  ctx->set_deadline(std::chrono::system_clock::now() + s);
}

int Unreachable(const Connection& c, const std::string& detail) {
  std::cerr << "glmctl: cannot reach the controller at " << c.address
            << (detail.empty() ? "" : ": ") << detail
            << "\n  fix: run `glmctl up cluster.yaml` (starts it for local clusters), start "
               "glm-controller --config cluster.yaml on the controller host, or pass "
               "--controller ADDR\n";
  return kUnreachable;
}

int ConfigError(const absl::Status& s) {
  std::cerr << "glmctl: " << s.message() << "\n";
  return kUsage;
}

// Starts what is not running of a local cluster. Prints one line per started daemon.
absl::Status EnsureLocalProcesses(const ClusterTopology& topology) {
  auto binaries = FindBinaries();
  if (!binaries.ok()) return binaries.status();
  auto local = LocalCluster::Open(topology);
  if (!local.ok()) return local.status();
  for (const auto& d : local->Daemons(topology, *binaries)) {
    if (LocalCluster::Running(d)) continue;  // an agent's supervisor counts: it restarts it
    if (LocalCluster::Served(d)) {
      // Not ours (an agent restarted by hand, say): a second one could not bind the port.
      std::cout << d.name << ": " << d.listen
                << " is already served by a process glmctl did not start; using it\n";
      continue;
    }
    auto pid = LocalCluster::Start(d);
    if (!pid.ok()) return pid.status();
    std::cout << "started " << d.name << " (pid " << *pid << ", log " << d.log_file << ")\n";
  }
  return absl::OkStatus();
}

}  // namespace

std::string DefaultConfig() {
  if (const char* c = std::getenv("GLMCTL_CONFIG"); c && *c) return c;
  fs::path dir = StateDir();
  if (dir.empty()) return "";
  std::ifstream in(dir / "current");
  std::string path;
  std::getline(in, path);
  std::error_code ec;
  return !path.empty() && fs::exists(path, ec) ? path : "";
}

// For commands that act on a cluster (up, preflight): loads the YAML, starts whatever of a
// `local: true` cluster is not running (all of it the first time), and waits for the controller.
// Returns kOk with both outputs set, or the exit code after printing why.
int OpenCluster(const std::string& config, const GlobalFlags& flags,
                std::optional<ClusterTopology>* topology, std::optional<Connection>* conn) {
  auto loaded = Load(config);
  if (!loaded.ok()) return ConfigError(loaded.status());
  auto connected = Connect(&*loaded, flags);
  if (!connected.ok()) return ConfigError(connected.status());
  topology->emplace(*std::move(loaded));
  conn->emplace(*std::move(connected));
  const ClusterTopology& t = **topology;
  if (t.local) {
    if (auto s = EnsureLocalProcesses(t); !s.ok()) {
      std::cerr << "glmctl: " << s.message() << "\n";
      return kFailed;
    }
  }
  if (!WaitConnected(**conn, std::chrono::seconds(t.local ? 20 : 5))) {
    if (t.local) {
      auto local = LocalCluster::Open(t);
      return Unreachable(**conn, absl::StrCat("the local controller did not come up; see ",
                                              local.ok() ? local->run_dir() : "the run dir",
                                              "/controller.log"));
    }
    return Unreachable(**conn, "");
  }
  return kOk;
}

int RunUp(const std::string& config, const GlobalFlags& flags, bool force) {
  std::optional<ClusterTopology> topology;
  std::optional<Connection> conn;
  if (int code = OpenCluster(config, flags, &topology, &conn); code != kOk) return code;
  RememberConfig(topology->config_path);

  bool tty = ::isatty(STDOUT_FILENO) == 1 && !flags.json;
  std::vector<std::string> names;
  for (const auto& n : topology->nodes) names.push_back(n.name);
  UpProgress progress(std::cout, tty, names);

  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(60));
  glm::v1::UpRequest req;
  req.set_cluster_name(topology->cluster_name);
  req.set_force(force);
  auto reader = conn->stub->Up(&ctx, req);
  glm::v1::UpEvent event;
  bool already_up = false;
  bool got_events = false;
  while (reader->Read(&event)) {
    got_events = true;
    if (event.already_up()) {
      already_up = true;
      std::cout << event.message() << "\n";
      continue;
    }
    progress.OnEvent(event);
  }
  progress.Finish();
  grpc::Status s = reader->Finish();
  if (!s.ok()) {
    if (!got_events && s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      return Unreachable(*conn, s.error_message());
    }
    std::cerr << "glmctl up: bring-up of cluster '" << topology->cluster_name
              << "' stopped:\n  " << s.error_message() << "\n";
    if (topology->local) {
      std::cerr << "  (the local processes keep running; fix the cause and re-run glmctl up, or "
                   "glmctl down "
                << config << ")\n";
    }
    return kFailed;
  }
  if (!already_up) {
    std::cout << "cluster '" << topology->cluster_name << "' is up; controller at "
              << conn->address << "\n";
  }
  return kOk;
}

int RunPreflight(const std::string& config, const GlobalFlags& flags) {
  std::optional<ClusterTopology> topology;
  std::optional<Connection> conn;
  if (int code = OpenCluster(config, flags, &topology, &conn); code != kOk) return code;
  grpc::ClientContext ctx;
  Deadline(&ctx, std::chrono::seconds(180));
  glm::v1::ClusterPreflightRequest req;
  req.set_cluster_name(topology->cluster_name);
  glm::v1::ClusterPreflightResponse resp;
  grpc::Status s = conn->stub->Preflight(&ctx, req, &resp);
  if (!s.ok()) {
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) return Unreachable(*conn, s.error_message());
    std::cerr << "glmctl preflight: " << s.error_message() << "\n";
    return kFailed;
  }
  if (flags.json) {
    std::cout << PreflightToJson(resp).dump(2) << "\n";
  } else {
    PrintPreflightTable(std::cout, resp);
  }
  return resp.ok() ? kOk : kFailed;
}

int RunStatus(const std::string& config, const GlobalFlags& flags) {
  auto conn = ConnectForQuery(config, flags);
  if (!conn.ok()) return ConfigError(conn.status());
  grpc::ClientContext ctx;
  Deadline(&ctx, std::chrono::seconds(5));
  glm::v1::ClusterStatus status;
  grpc::Status s = conn->stub->Status(&ctx, {}, &status);
  if (!s.ok()) return Unreachable(*conn, s.error_message());
  if (flags.json) {
    std::cout << StatusToJson(status).dump(2) << "\n";
  } else {
    PrintStatusTable(std::cout, status);
  }
  return kOk;
}

int RunHealth(const std::string& config, const GlobalFlags& flags) {
  auto conn = ConnectForQuery(config, flags);
  if (!conn.ok()) return ConfigError(conn.status());
  grpc::ClientContext ctx;
  Deadline(&ctx, std::chrono::seconds(5));
  glm::v1::HealthResponse resp;
  grpc::Status s = conn->stub->Health(&ctx, {}, &resp);
  if (!s.ok()) return Unreachable(*conn, s.error_message());
  if (flags.json) {
    std::cout << nlohmann::json{{"cluster", resp.cluster_name()},
                                {"healthy", resp.healthy()},
                                {"health", ClusterHealthName(resp.health())},
                                {"message", resp.message()}}
                     .dump()
              << "\n";
  } else {
    // Degraded still serves (some replicas are Ready); the exit status says "not all".
    const char* word = resp.healthy() ? "healthy: "
                       : resp.health() == glm::v1::CLUSTER_HEALTH_DEGRADED ? "degraded: "
                                                                          : "unhealthy: ";
    std::cout << word << resp.cluster_name() << ": " << resp.message() << "\n";
  }
  return resp.healthy() ? kOk : kFailed;
}

int RunRestart(const std::string& config, const GlobalFlags& flags, const RestartFlags& restart) {
  std::optional<ClusterTopology> topology;
  std::optional<Connection> conn;
  if (int code = OpenCluster(config, flags, &topology, &conn); code != kOk) return code;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::hours(6));
  glm::v1::RestartRequest req;
  req.set_cluster_name(topology->cluster_name);
  req.set_rolling(restart.rolling);
  for (int r : restart.replicas) req.add_replicas(r);
  req.set_drain_timeout_ms(static_cast<int64_t>(restart.drain_timeout_s * 1000));
  req.set_processes(restart.processes);
  const auto start = std::chrono::steady_clock::now();
  auto reader = conn->stub->Restart(&ctx, req);
  glm::v1::UpEvent event;
  bool got_events = false;
  while (reader->Read(&event)) {
    got_events = true;
    const double t =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << absl::StrFormat("[%6.1fs] ", t);
    if (!event.node().empty() && !absl::StrContains(event.message(), event.node())) {
      std::cout << event.node() << ": ";
    }
    std::cout << event.message() << "\n" << std::flush;
  }
  grpc::Status s = reader->Finish();
  if (!s.ok()) {
    if (!got_events && s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      return Unreachable(*conn, s.error_message());
    }
    std::cerr << "glmctl restart: " << s.error_message() << "\n";
    return kFailed;
  }
  return kOk;
}

int RunGenerate(const std::string& config, const GlobalFlags& flags, const GenerateFlags& gen) {
  glm::v1::GenerateRequest req;
  for (absl::string_view part : absl::StrSplit(gen.tokens, ',', absl::SkipWhitespace())) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &id) || id < 0) {
      std::cerr << "glmctl generate: --tokens: '" << part
                << "' is not a token id; give comma-separated non-negative integers, e.g. "
                   "--tokens 1,2,3\n";
      return kUsage;
    }
    req.add_prompt_token_ids(id);
  }
  if (req.prompt_token_ids_size() == 0) {
    std::cerr << "glmctl generate: --tokens is empty; give the prompt's token ids, e.g. "
                 "--tokens 1,2,3\n";
    return kUsage;
  }
  if (gen.max_tokens < 1) {
    std::cerr << "glmctl generate: --max-tokens must be >= 1\n";
    return kUsage;
  }
  req.set_max_tokens(gen.max_tokens);
  req.set_temperature(static_cast<float>(gen.temperature));
  req.set_seed(gen.seed);
  if (gen.mtp_draft_tokens >= 0) req.set_mtp_draft_tokens(gen.mtp_draft_tokens);
  req.set_return_logprobs(gen.logprobs);
  auto conn = ConnectForQuery(config, flags);
  if (!conn.ok()) return ConfigError(conn.status());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(gen.timeout_s * 1000)));
  auto reader = conn->stub->Generate(&ctx, req);
  std::vector<int32_t> ids;
  std::vector<std::string> logprobs;
  glm::v1::TokenEvent ev;
  std::string reason;
  while (reader->Read(&ev)) {
    ids.insert(ids.end(), ev.token_ids().begin(), ev.token_ids().end());
    for (const glm::v1::TokenLogprob& lp : ev.logprobs()) {
      logprobs.push_back(absl::StrFormat("%.9g", lp.logprob()));
    }
    if (ev.finished()) reason = ev.finish_reason();
  }
  grpc::Status s = reader->Finish();
  if (!s.ok()) {
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE && !WaitConnected(*conn, std::chrono::milliseconds(1))) {
      return Unreachable(*conn, s.error_message());
    }
    std::cerr << "glmctl generate: " << s.error_message() << "\n";
    if (!ids.empty()) std::cerr << "(" << ids.size() << " token(s) arrived before the error)\n";
    return kFailed;
  }
  std::cout << "finish_reason=" << reason << " prompt_tokens=" << req.prompt_token_ids_size()
            << " completion_tokens=" << ids.size() << "\n";
  if (gen.logprobs) std::cout << "logprobs=" << absl::StrJoin(logprobs, ",") << "\n";
  std::cout << absl::StrJoin(ids, ",") << "\n";
  return kOk;
}

namespace {

// Set by SIGINT/SIGTERM while `glmctl logs --follow` runs: the stream is cancelled and glmctl
// exits 0 (the operator ended it).
std::atomic<bool> logs_interrupted{false};
static_assert(std::atomic<bool>::is_always_lock_free, "set from a signal handler");

extern "C" void OnLogsSignal(int) { logs_interrupted.store(true); }

}  // namespace

int RunLogs(const std::string& config, const GlobalFlags& flags, const LogsFlags& logs) {
  if (logs.args.empty() || logs.args.size() > 2 || logs.args.back().empty()) {
    std::cerr << "glmctl logs: give the node: glmctl logs [cluster.yaml] NODE (a node name from "
                 "cluster.yaml, or controller)\n";
    return kUsage;
  }
  if (logs.tail < 0) {
    std::cerr << "glmctl logs: --tail " << logs.tail
              << " is negative; give a line count (0 or none: the last 200 lines)\n";
    return kUsage;
  }
  const std::string yaml = logs.args.size() == 2 ? logs.args[0] : config;
  const std::string& node = logs.args.back();
  auto conn = ConnectForQuery(yaml, flags);
  if (!conn.ok()) return ConfigError(conn.status());
  if (!WaitConnected(*conn, std::chrono::seconds(5))) return Unreachable(*conn, "");

  grpc::ClientContext ctx;
  if (!logs.follow) Deadline(&ctx, std::chrono::seconds(30));
  glm::v1::ClusterLogsRequest req;
  req.set_node(node);
  req.set_tail_lines(logs.tail);
  req.set_follow(logs.follow);

  // Ctrl-C ends a follow cleanly: the handler only sets a flag; this thread cancels the call.
  struct sigaction old_int {}, old_term {};
  std::atomic<bool> done{false};
  std::thread interrupt_watch;
  if (logs.follow) {
    logs_interrupted.store(false);
    struct sigaction sa {};
    sa.sa_handler = OnLogsSignal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, &old_int);
    ::sigaction(SIGTERM, &sa, &old_term);
    interrupt_watch = std::thread([&] {
      while (!done.load()) {
        if (logs_interrupted.load()) {
          ctx.TryCancel();
          return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
  }
  auto reader = conn->stub->Logs(&ctx, req);
  glm::v1::LogLine line;
  int64_t printed = 0;
  while (reader->Read(&line)) {
    if (line.dropped_before() > 0) {
      std::cout << std::flush;
      std::cerr << "glmctl logs: " << line.dropped_before() << " line(s) of " << node
                << " before this point are no longer in its log ring (it keeps the newest 10000 "
                   "lines, 4 MiB)\n";
    }
    std::cout << line.text() << "\n";
    if (logs.follow) std::cout << std::flush;
    ++printed;
  }
  grpc::Status s = reader->Finish();
  std::cout << std::flush;
  if (logs.follow) {
    done.store(true);
    interrupt_watch.join();
    ::sigaction(SIGINT, &old_int, nullptr);
    ::sigaction(SIGTERM, &old_term, nullptr);
    if (logs_interrupted.load()) return kOk;
  }
  if (s.ok()) {
    if (logs.follow) {
      std::cerr << "glmctl logs: the log stream of " << node
                << " ended (the daemon is shutting down)\n";
    } else if (printed == 0) {
      std::cerr << "glmctl logs: " << node << " has logged nothing yet\n";
    }
    return kOk;
  }
  switch (s.error_code()) {
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::INVALID_ARGUMENT:
      std::cerr << "glmctl logs: " << s.error_message() << "\n";
      return kUsage;
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      if (!WaitConnected(*conn, std::chrono::milliseconds(1))) {
        return Unreachable(*conn, s.error_message());
      }
      break;
    case grpc::StatusCode::UNIMPLEMENTED:
      if (!s.error_message().empty()) break;  // the agent's (the controller names the node)
      std::cerr << "glmctl logs: the controller at " << conn->address
                << " has no Logs RPC (an older glm-controller); fix: upgrade glm-controller\n";
      return kFailed;
    default:
      break;
  }
  std::cerr << "glmctl logs: " << s.error_message() << "\n";
  return kFailed;
}

int RunDown(const std::string& config, const GlobalFlags& flags) {
  auto topology = Load(config);
  if (!topology.ok()) return ConfigError(topology.status());
  auto conn = Connect(&*topology, flags);
  if (!conn.ok()) return ConfigError(conn.status());
  bool reached = false;
  if (WaitConnected(*conn, std::chrono::seconds(2))) {
    grpc::ClientContext ctx;
    Deadline(&ctx, std::chrono::seconds(10));
    glm::v1::DownResponse resp;
    grpc::Status s = conn->stub->Down(&ctx, {}, &resp);
    if (s.ok()) {
      reached = true;
      std::cout << resp.message() << "\n";
    } else {
      std::cerr << "glmctl down: controller refused: " << s.error_message() << "\n";
      if (!topology->local) return kFailed;
    }
  }
  if (!topology->local) {
    if (!reached) return Unreachable(*conn, "");
    return kOk;
  }
  auto binaries = FindBinaries();
  auto local = LocalCluster::Open(*topology);
  if (!local.ok()) return ConfigError(local.status());
  Binaries names = binaries.ok() ? *binaries : Binaries{"glm-controller", "glm-agent"};
  int stopped = 0;
  // The controller first, so it does not report the agents going away as failures.
  auto daemons = local->Daemons(*topology, names);
  std::rotate(daemons.rbegin(), daemons.rbegin() + 1, daemons.rend());
  for (const auto& d : daemons) {
    std::string line = LocalCluster::Stop(d, std::chrono::seconds(5));
    if (!line.empty()) {
      std::cout << line << "\n";
      ++stopped;
    }
  }
  std::cout << (stopped ? absl::StrCat("stopped ", stopped, " local process(es) of cluster '",
                                       topology->cluster_name, "'")
                        : absl::StrCat("no local processes of cluster '", topology->cluster_name,
                                       "' were running"))
            << "\n";
  return kOk;
}

ControlPlaneCheck CheckControlPlane(const cluster::ClusterSpec& spec, const std::string& config) {
  ControlPlaneCheck out;
  if (spec.controller.tls.has_value()) return out;
  const bool open = !rpc::IsLoopbackListen(spec.controller.listen);
  if (open && !spec.controller.insecure) {
    out.error = absl::StrCat(
        "controller.listen ", spec.controller.listen,
        " is reachable from the network and controller.tls is not set: glm-controller refuses "
        "to serve plaintext gRPC there. Fix: `glmctl certs --out DIR ", config,
        "` and set controller.tls {ca, cert, key}, or listen on 127.0.0.1, or set "
        "controller.insecure: true to accept an open control plane");
  } else if (open) {
    out.warnings.push_back(absl::StrCat(
        "controller.insecure: true: the controller serves plaintext gRPC on ",
        spec.controller.listen,
        " and the agents need --insecure too; anyone who reaches them can bring the cluster up "
        "or down. Fix: `glmctl certs --out DIR ", config, "` and set controller.tls"));
  } else if (!spec.local) {
    out.warnings.push_back(
        "no controller.tls: controller and agents talk plaintext gRPC, so every agent must "
        "listen on loopback (or run --insecure); nodes on other hosts need controller.tls "
        "(`glmctl certs`)");
  }
  return out;
}

int RunValidate(const std::string& config, const GlobalFlags& flags) {
  std::error_code ec;
  auto spec = cluster::LoadClusterSpec(fs::absolute(config, ec).string());
  if (!spec.ok()) {
    std::cerr << spec.status().message() << "\n";
    return kUsage;
  }
  // The control plane's exposure: the controller refuses plaintext beyond loopback unless the
  // YAML opts out (proto/rpc/listen_policy.h); say so before `glmctl up` finds out.
  const ControlPlaneCheck exposure = CheckControlPlane(*spec, config);
  if (!exposure.error.empty()) {
    std::cerr << config << ": " << exposure.error << "\n";
    return kUsage;
  }
  if (flags.json) {
    std::cout << nlohmann::json{{"ok", true}, {"cluster", spec->name},
                                {"nodes", spec->nodes.size()}, {"warnings", exposure.warnings}}
                     .dump()
              << "\n";
    return kOk;
  }
  for (const std::string& w : exposure.warnings) std::cerr << config << ": warning: " << w << "\n";
  {
    std::cout << config << ": ok: cluster '" << spec->name << "', " << spec->nodes.size()
              << " nodes, TP" << spec->parallel.tensor << " x PP" << spec->parallel.pipeline
              << " x " << spec->parallel.replicas << " replica(s)"
              << (spec->local ? ", local" : "") << "\n";
  }
  return kOk;
}

namespace {

// The MTP acceptance measured by the running cluster: accepted / drafted draft tokens summed
// over its replicas, with a line on stderr saying where it came from.
absl::StatusOr<double> MeasuredMtpAcceptance(const std::string& config, const GlobalFlags& flags) {
  auto conn = ConnectForQuery(config, flags);
  if (!conn.ok()) return conn.status();
  grpc::ClientContext ctx;
  Deadline(&ctx, std::chrono::seconds(5));
  glm::v1::ClusterStatus status;
  grpc::Status s = conn->stub->Status(&ctx, {}, &status);
  if (!s.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "--mtp-acceptance measured: cannot read the cluster's status from the controller at ",
        conn->address, ": ", s.error_message(),
        "; fix: bring the cluster up (glmctl up) or pass the acceptance as a number"));
  }
  int64_t drafted = 0, accepted = 0;
  for (const glm::v1::ReplicaStatus& r : status.replicas()) {
    drafted += r.spec_draft_tokens();
    accepted += r.spec_accepted_tokens();
  }
  if (drafted == 0) {
    return absl::FailedPreconditionError(
        "--mtp-acceptance measured: no replica of the running cluster has drafted a token yet "
        "(model.mtp_draft_tokens is 0, or no request has run); fix: send some traffic with "
        "drafting on, or pass the acceptance as a number in [0, 1]");
  }
  const double rate = static_cast<double>(accepted) / static_cast<double>(drafted);
  std::cerr << "mtp acceptance measured by the running cluster: " << accepted << " of " << drafted
            << " draft tokens accepted (" << absl::StrFormat("%.3f", rate) << ")\n";
  return rate;
}

}  // namespace

int RunPlan(const std::string& config, const GlobalFlags& flags,
            const std::optional<std::string>& mtp_acceptance) {
  std::error_code ec;
  controller::PlanOptions options;
  if (mtp_acceptance == "measured") {
    absl::StatusOr<double> rate = MeasuredMtpAcceptance(config, flags);
    if (!rate.ok()) {
      std::cerr << "glmctl plan: " << rate.status().message() << "\n";
      return kFailed;
    }
    options.decode.mtp_acceptance_rate = *rate;
  } else if (mtp_acceptance.has_value()) {
    double rate = 0;
    if (!absl::SimpleAtod(*mtp_acceptance, &rate) || !(rate >= 0 && rate <= 1)) {
      std::cerr << "glmctl plan: --mtp-acceptance '" << *mtp_acceptance
                << "' is neither a number in [0, 1] nor 'measured'\n";
      return kUsage;
    }
    options.decode.mtp_acceptance_rate = rate;
  }
  auto plan = controller::PlanFromFiles(fs::absolute(config, ec).string(), options);
  if (!plan.ok()) {
    std::cerr << plan.status().message() << "\n";
    return kUsage;
  }
  if (flags.json) {
    std::cout << controller::PlanToJson(*plan).dump(2) << "\n";
  } else {
    std::cout << controller::PlanToText(*plan);
  }
  return plan->fits ? kOk : kFailed;
}

int RunCerts(const std::string& config, const CertsOptions& options) {
  auto topology = Load(config);
  if (!topology.ok()) return ConfigError(topology.status());
  const std::string& out_dir = options.out_dir;
  auto written = MakeClusterCerts(*topology, options);
  if (!written.ok()) {
    std::cerr << "glmctl certs: " << written.status().message() << "\n";
    return kFailed;
  }
  for (const auto& f : *written) std::cout << "wrote " << f << "\n";
  if (options.renew) {
    std::cout << "renewed for " << options.valid_days << " days from " << out_dir
              << "/ca.pem; restart glm-controller and every glm-agent to load them\n";
    return kOk;
  }
  std::cout << "to use them, add to " << config << ":\n  controller:\n    tls: {ca: " << out_dir
            << "/ca.pem, cert: " << out_dir << "/controller.pem, key: " << out_dir
            << "/controller.key}\nand start each agent with --tls-ca " << out_dir
            << "/ca.pem --tls-cert " << out_dir << "/<node>.pem --tls-key " << out_dir
            << "/<node>.key (glmctl up does this for local clusters); glmctl itself presents "
            << out_dir << "/operator.pem, which may call the controller only\n";
  return kOk;
}

}  // namespace glm::cli
