// glm-agent: the per-node daemon.
//   glm-agent serve --listen ADDR --node NAME [--tls-ca F --tls-cert F --tls-key F]
//                   [--heartbeat-ms N] [--threads N] [--log-level L]
//   glm-agent preflight ...   (agent/preflight: checks this node locally, no controller needed)
// Only this file wires concrete implementations together (DESIGN.md §2).
#include <signal.h>

#include <cstring>
#include <iostream>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "agent/service/agent_service.h"
#include "common/clock.h"
#include "common/logging.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/resource_quota.h"
#include "proto/rpc/credentials.h"
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
};

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
  glm::agent::AgentServiceOptions options;
  options.node = flags.node;
  options.version = GLM_VERSION;
  options.heartbeat = std::chrono::milliseconds(flags.heartbeat_ms);
  options.allow_no_gpu = flags.allow_no_gpu;
  glm::agent::AgentService service(options, glm::Clock::Real());

  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(flags.listen, *creds, &bound_port);
  builder.RegisterService(&service);
  grpc::ResourceQuota quota("glm-agent");
  quota.SetMaxThreads(flags.threads);
  builder.SetResourceQuota(quota);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 4);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || bound_port == 0) {
    std::cerr << "glm-agent: cannot listen on '" << flags.listen
              << "': the address is in use or not local to this host; pick a free port or fix "
                 "nodes[].address in cluster.yaml\n";
    return 1;
  }
  GLM_LOG_INFO("agent started node={} listen={} port={} tls={} version={} instance={}",
               flags.node, flags.listen, bound_port, flags.tls.enabled(), GLM_VERSION,
               service.instance_id());

  int sig = 0;
  sigwait(&signals, &sig);
  GLM_LOG_INFO("agent stopping node={} signal={}", flags.node, strsignal(sig));
  service.Shutdown();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  server->Wait();
  GLM_LOG_INFO("agent stopped node={}", flags.node);
  return 0;
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
  serve->add_option("--tls-ca", flags.tls.ca, "cluster CA certificate (PEM); enables mTLS");
  serve->add_option("--tls-cert", flags.tls.cert, "this node's certificate (PEM)");
  serve->add_option("--tls-key", flags.tls.key, "this node's private key (PEM)");
  serve->add_option("--heartbeat-ms", flags.heartbeat_ms, "default status heartbeat interval")
      ->check(CLI::Range(50, 60000));
  serve->add_option("--threads", flags.threads, "maximum gRPC handler threads")
      ->check(CLI::Range(4, 1024));
  serve->add_option("--log-level", flags.log_level, "debug|info|warn|error");
  serve->add_flag("--allow-no-gpu", flags.allow_no_gpu,
                  "this node runs the CPU backend: no GPU is a preflight warning, not a failure");
  app.add_subcommand("preflight", "check this node locally (RDMA, GID, MTU, memlock, NCCL, ...)");
  CLI11_PARSE(app, argc, argv);
  if (serve->parsed()) return Serve(flags);
  return 2;
}
