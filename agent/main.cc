// glm-agent: the per-node daemon.
//   glm-agent serve --listen ADDR --node NAME [--tls-ca F --tls-cert F --tls-key F]
//                   [--heartbeat-ms N] [--threads N] [--log-level L] [--allow-no-gpu]
//                   [--sysfs-root DIR] [--proc-root DIR] [--dev-root DIR] [--gid-watch-ms N]
//                   [--fabric-ip IP [--mtu-echo-port N] [--stage-port N]] [--stage-root DIR]
//                   [--model-dir DIR] [--nccl-library FILE] [--insecure]
//   Without --tls-* the agent listens only on loopback (127.0.0.0/8, ::1) unless --insecure.
//   With --fabric-ip the agent serves the path-MTU UDP echo (peers' mtu.path checks) there and
//   adds a second listening port of its gRPC server (same service, same credentials) on
//   fabric_ip:--stage-port, through which peers fetch staged files (FetchFile); Info reports the
//   ports. The agent fetches from peers with its own certificate (--tls-*) as client identity.
//   glm-agent preflight ...   (agent/preflight: checks this node locally, no controller needed)
// Only this file wires concrete implementations together (DESIGN.md §2).
#include <arpa/inet.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "agent/preflight/path_mtu.h"
#include "agent/service/agent_service.h"
#include "common/clock.h"
#include "common/logging.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/resource_quota.h"
#include "proto/rpc/audit.h"
#include "proto/rpc/authz.h"
#include "proto/rpc/credentials.h"
#include "proto/rpc/listen_policy.h"
#if GLM_HAVE_PREFLIGHT
#include "agent/preflight/preflight_command.h"
#endif

#ifndef GLM_VERSION
#define GLM_VERSION "0.0.0"
#endif

namespace {

struct ServeFlags {
  std::string listen;
  std::string node;
  glm::rpc::TlsFiles tls;
  int heartbeat_ms = 1000;
  int threads = 32;
  bool allow_no_gpu = false;
  std::string log_level = "info";
  std::string sysfs_root = "/sys";
  std::string proc_root = "/proc";
  std::string dev_root = "/dev";
  int gid_watch_ms = 10000;
  std::string fabric_ip;
  int mtu_echo_port = 47190;
  std::string stage_root;
  int stage_port = 47191;
  std::string model_dir;
  std::string nccl_library;
  std::string group_ip;
  int num_threads = 0;
  bool insecure = false;
};

// The numeric IP this node's shard group binds: --group-ip, else the fabric IP, else the host of
// --listen when it is a numeric address of one interface (not a wildcard), else 127.0.0.1.
std::string GroupHost(const ServeFlags& flags) {
  if (!flags.group_ip.empty()) return flags.group_ip;
  if (!flags.fabric_ip.empty()) return flags.fabric_ip;
  std::string host = flags.listen.substr(0, flags.listen.rfind(':'));
  if (!host.empty() && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  in_addr v4{};
  in6_addr v6{};
  const bool numeric = inet_pton(AF_INET, host.c_str(), &v4) == 1 ||
                       inet_pton(AF_INET6, host.c_str(), &v6) == 1;
  if (!numeric || host == "0.0.0.0" || host == "::") return "127.0.0.1";
  return host;
}

int Serve(const ServeFlags& flags) {
  glm::InitLogging("glm-agent", glm::ParseLogLevel(flags.log_level));
  // Block the shutdown signals before gRPC starts its threads; this thread waits for them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto creds = glm::rpc::MakeServerCredentials(flags.tls);
  if (!creds.ok()) {
    std::cerr << "glm-agent: " << creds.status().message() << "\n";
    return 2;
  }
  // Roles under mTLS: the controller's certificate may call everything, a peer agent's only
  // FetchFile, the operator's nothing (proto/rpc/authz.h).
  if (flags.tls.enabled()) {
    (*creds)->SetAuthMetadataProcessor(
        glm::rpc::MakeAuthzProcessor(&glm::rpc::AgentAuthzPolicy()));
  }
  // Secure by default: plaintext gRPC only on loopback unless --insecure (the stage port on
  // --fabric-ip serves the same service with the same credentials).
  for (const std::string& address :
       {flags.listen, flags.fabric_ip}) {
    if (address.empty() ||
        !glm::rpc::RefuseInsecureListen(address, flags.tls.enabled(), flags.insecure)) {
      continue;
    }
    std::cerr << "glm-agent: refusing to serve the control plane without TLS on '" << address
              << "', which is reachable from the network. Fix: make certificates with `glmctl "
                 "certs --out DIR cluster.yaml` and pass --tls-ca, --tls-cert and --tls-key, or "
                 "listen on 127.0.0.1, or pass --insecure to accept an open control plane\n";
    return 2;
  }
  const bool open_control_plane =
      !flags.tls.enabled() && flags.insecure &&
      (!glm::rpc::IsLoopbackListen(flags.listen) ||
       (!flags.fabric_ip.empty() && !glm::rpc::IsLoopbackListen(flags.fabric_ip)));
  if (open_control_plane) {
    GLM_LOG_WARN("agent control plane is open to the network: plaintext gRPC without "
                 "authentication on listen={} (--insecure); anyone who can reach it can load, "
                 "stop and restart shards. Use --tls-ca/--tls-cert/--tls-key "
                 "(`glmctl certs --out DIR cluster.yaml`)",
                 flags.listen);
  }
  // Peers are fetched from with this node's own certificate (it carries clientAuth).
  auto peer_creds = glm::rpc::MakeChannelCredentials(flags.tls);
  if (!peer_creds.ok()) {
    std::cerr << "glm-agent: " << peer_creds.status().message() << "\n";
    return 2;
  }
  glm::agent::AgentServiceOptions options;
  options.node = flags.node;
  options.version = GLM_VERSION;
  options.insecure = open_control_plane;
  options.heartbeat = std::chrono::milliseconds(flags.heartbeat_ms);
  options.allow_no_gpu = flags.allow_no_gpu;
  options.roots = {flags.sysfs_root, flags.proc_root, flags.dev_root};
  options.probe_paths.proc_root = flags.proc_root;
  options.probe_paths.dev_root = flags.dev_root;
  options.gid_watch_interval = std::chrono::milliseconds(flags.gid_watch_ms);
  // Netlink events are about the real kernel; a fixture tree only changes by re-reading.
  options.gid_netlink = flags.sysfs_root == "/sys";

  options.model_dir = flags.model_dir;
  options.stage_root = flags.stage_root;
  options.nccl_library = flags.nccl_library;
  options.peer_credentials = *peer_creds;
  options.shard.group_host = GroupHost(flags);
  options.shard.num_threads = flags.num_threads;
  // Fabric services on the fabric IP, before the gRPC server (Info reports their ports).
  std::unique_ptr<glm::preflight::UdpEchoResponder> echo;
  if (!flags.fabric_ip.empty()) {
    auto started = glm::preflight::UdpEchoResponder::Start(
        flags.fabric_ip, static_cast<uint16_t>(flags.mtu_echo_port));
    if (!started.ok()) {
      std::cerr << "glm-agent: cannot start the path-MTU echo responder on " << flags.fabric_ip
                << ":" << flags.mtu_echo_port << ": " << started.status().message()
                << "; fix --fabric-ip (an address of this host on the fabric) or pick another "
                   "--mtu-echo-port\n";
      return 1;
    }
    echo = *std::move(started);
    options.fabric_ip = flags.fabric_ip;
    options.mtu_echo_port = echo->port();
  }

  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default: a second process on the same port would bind too and
  // share the connections at random. Refuse instead, so "address in use" is reported.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int bound_port = 0;
  int stage_port = 0;
  builder.AddListeningPort(flags.listen, *creds, &bound_port);
  if (!flags.fabric_ip.empty()) {
    // Staging traffic on the fabric: the same server and credentials on a second port.
    builder.AddListeningPort(absl::StrCat(flags.fabric_ip, ":", flags.stage_port), *creds,
                             &stage_port);
  }
  // Info reports stage_port; the port is only known after BuildAndStart, so the service reads
  // it through this cell.
  auto stage_port_cell = std::make_shared<std::atomic<int>>(0);
  options.stage_port_fn = [stage_port_cell] { return stage_port_cell->load(); };
  // RestartProcess: leave through the signal wait below with exit status 75 (EX_TEMPFAIL), which
  // systemd's Restart=on-failure and the local launcher's supervisor answer with a fresh agent.
  std::atomic<bool> restart_requested{false};
  options.request_process_restart = [&restart_requested] {
    restart_requested.store(true);
    kill(getpid(), SIGTERM);
  };
  glm::agent::AgentService service(options, glm::Clock::Real());
  service.StartGidWatchThread();
  builder.RegisterService(&service);
  // The audit trail: one INFO line per state-changing RPC, with the caller's identity.
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> audit;
  audit.push_back(glm::rpc::MakeAuditInterceptorFactory(
      {"LoadShard", "StartShard", "DrainShard", "StopShard", "RestartProcess", "StageWeights",
       "StageNccl"},
      "node=" + flags.node));
  builder.experimental().SetInterceptorCreators(std::move(audit));
  grpc::ResourceQuota quota("glm-agent");
  quota.SetMaxThreads(flags.threads);
  builder.SetResourceQuota(quota);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 4);
  glm::rpc::LimitRequestSizes(builder);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || bound_port == 0) {
    std::cerr << "glm-agent: cannot listen on '" << flags.listen
              << "': the address is in use or not local to this host; pick a free port or fix "
                 "nodes[].address in cluster.yaml\n";
    return 1;
  }
  if (!flags.fabric_ip.empty() && stage_port == 0) {
    std::cerr << "glm-agent: cannot listen on " << flags.fabric_ip << ":" << flags.stage_port
              << " for staging: pick another --stage-port or fix --fabric-ip\n";
    return 1;
  }
  stage_port_cell->store(stage_port);
  GLM_LOG_INFO("agent started node={} listen={} port={} tls={} version={} instance={} "
               "fabric_ip={} mtu_echo_port={} stage_port={}",
               flags.node, flags.listen, bound_port, flags.tls.enabled(), GLM_VERSION,
               service.instance_id(), flags.fabric_ip, options.mtu_echo_port, stage_port);

  int sig = 0;
  sigwait(&signals, &sig);
  GLM_LOG_INFO("agent stopping node={} signal={}", flags.node, strsignal(sig));
  service.Shutdown();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  server->Wait();
  echo.reset();
  GLM_LOG_INFO("agent stopped node={}{}", flags.node,
               restart_requested.load() ? " (exit status 75: restart requested)" : "");
  return restart_requested.load() ? 75 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Subcommand dispatch: each subcommand owns its own flags.
  if (argc >= 2 && std::strcmp(argv[1], "preflight") == 0) {
#if GLM_HAVE_PREFLIGHT
    return RunPreflightCommand(argc - 1, argv + 1);
#else
    std::cerr << "glm-agent: this build has no preflight subcommand (agent/preflight not built)\n";
    return 2;
#endif
  }

  CLI::App app{"glm-agent: per-node daemon of glmctl (serves glm.v1.Agent)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", GLM_VERSION);
  ServeFlags flags;
  CLI::App* serve = app.add_subcommand("serve", "serve glm.v1.Agent over gRPC until SIGTERM");
  serve->add_option("--listen", flags.listen, "address to listen on, e.g. 10.0.0.11:47100")
      ->required();
  serve->add_option("--node", flags.node, "this node's name in cluster.yaml")->required();
  serve->add_option("--group-ip", flags.group_ip,
                    "numeric IP this node's shard group binds for TP/PP traffic (default: "
                    "--fabric-ip, else the --listen host, else 127.0.0.1)");
  serve->add_option("--engine-threads", flags.num_threads,
                    "CPU backend threads of the engine shard (0 = hardware concurrency)");
  serve->add_option("--tls-ca", flags.tls.ca, "cluster CA certificate (PEM); enables mTLS");
  serve->add_option("--tls-cert", flags.tls.cert, "this node's certificate (PEM)");
  serve->add_option("--tls-key", flags.tls.key, "this node's private key (PEM)");
  serve->add_flag("--insecure", flags.insecure,
                  "allow plaintext gRPC on a non-loopback --listen/--fabric-ip (no --tls-*); "
                  "without it the agent refuses to start there");
  serve->add_option("--heartbeat-ms", flags.heartbeat_ms, "default status heartbeat interval")
      ->check(CLI::Range(50, 60000));
  serve->add_option("--threads", flags.threads, "maximum gRPC handler threads")
      ->check(CLI::Range(4, 1024));
  serve->add_option("--log-level", flags.log_level, "debug|info|warn|error");
  serve->add_flag("--allow-no-gpu", flags.allow_no_gpu,
                  "this node runs the CPU backend: no GPU is a preflight warning, not a failure");
  serve->add_option("--sysfs-root", flags.sysfs_root, "sysfs root for preflight (tests: a fixture tree)");
  serve->add_option("--proc-root", flags.proc_root, "procfs root for preflight and host facts");
  serve->add_option("--dev-root", flags.dev_root, "/dev root for preflight and host facts");
  serve->add_option("--gid-watch-ms", flags.gid_watch_ms,
                    "re-read period of the GID table after bring-up")
      ->check(CLI::Range(50, 3600000));
  serve->add_option("--fabric-ip", flags.fabric_ip,
                    "this node's fabric IP: serve the path-MTU echo and a staging gRPC port there");
  serve->add_option("--mtu-echo-port", flags.mtu_echo_port, "UDP port of the path-MTU echo (0: any)")
      ->check(CLI::Range(0, 65535));
  serve->add_option("--stage-root", flags.stage_root,
                    "directory whose files peers may fetch (FetchFile); default: --model-dir, "
                    "else the directory this node staged weights into");
  serve->add_option("--stage-port", flags.stage_port,
                    "second gRPC port on --fabric-ip for staging traffic (0: any)")
      ->check(CLI::Range(0, 65535));
  serve->add_option("--nccl-library", flags.nccl_library,
                    "this node's NCCL library path (instead of cluster.yaml's nccl.library)");
  serve->add_option("--model-dir", flags.model_dir,
                    "where this node keeps the model (StageWeights stages into it instead of "
                    "cluster.yaml's model.path; for nodes that mount the model elsewhere)");
  app.add_subcommand("preflight", "check this node locally (RDMA, GID, MTU, memlock, NCCL, ...)");
  CLI11_PARSE(app, argc, argv);
  if (serve->parsed()) return Serve(flags);
  return 2;
}
