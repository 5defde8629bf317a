// glm-controller: the cluster's control-plane daemon.
//   glm-controller --config cluster.yaml [--listen ADDR] [--heartbeat-ms N] [--log-level L]
//                  [--state-dir DIR]
// State (the hash cache of the source's weight files and NCCL build, so `up` re-hashes only what
// changed): --state-dir, default <cluster.yaml dir>/.glmctl/<cluster>/source-hashes.json.
// Serves glm.v1.Controller on controller.listen (mTLS when controller.tls is set), drives
// bring-up on `Up`, watches every agent's status stream, and is the shard groups' rendezvous.
// Only this file wires concrete implementations together (DESIGN.md §2).
#include <signal.h>

#include <cstring>
#include <filesystem>
#include <iostream>

#include "CLI/CLI.hpp"
#include "cluster/manifest/hash_cache.h"
#include "common/clock.h"
#include "common/logging.h"
#include "controller/orchestrate/controller_service.h"
#include "controller/orchestrate/spec_adapter.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/resource_quota.h"
#include "proto/rpc/credentials.h"

#ifndef GLM_VERSION
#define GLM_VERSION "0.0.0"
#endif


int main(int argc, char** argv) {
  CLI::App app{"glm-controller: control-plane daemon of a glmctl cluster"};
  std::string config;
  std::string listen;
  int heartbeat_ms = 1000;
  std::string log_level = "info";
  std::string state_dir;
  app.set_version_flag("--version", GLM_VERSION);
  app.add_option("--config", config, "cluster.yaml this controller serves")->required();
  app.add_option("--listen", listen, "override controller.listen from cluster.yaml");
  app.add_option("--heartbeat-ms", heartbeat_ms, "agent status heartbeat interval")
      ->check(CLI::Range(50, 60000));
  app.add_option("--log-level", log_level, "debug|info|warn|error");
  app.add_option("--state-dir", state_dir,
                 "controller state (hash cache); default <cluster.yaml dir>/.glmctl/<cluster>");
  CLI11_PARSE(app, argc, argv);
  glm::InitLogging("glm-controller", glm::ParseLogLevel(log_level));

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::error_code ec;
  std::string config_path = std::filesystem::absolute(config, ec).string();
  auto topology = glm::orchestrate::LoadTopology(config_path);
  if (!topology.ok()) {
    std::cerr << "glm-controller: " << topology.status().message() << "\n";
    return 2;
  }
  if (listen.empty()) listen = topology->controller_listen;
  auto creds = glm::rpc::MakeServerCredentials(topology->tls);
  if (!creds.ok()) {
    std::cerr << "glm-controller: " << config_path << ": controller.tls: "
              << creds.status().message() << "\n";
    return 2;
  }

  glm::orchestrate::ControllerServiceOptions options;
  options.version = GLM_VERSION;
  options.config_path = config_path;
  options.loader = [config_path] { return glm::orchestrate::LoadTopology(config_path); };
  options.planner = [config_path](const glm::orchestrate::ClusterTopology& t) {
    return glm::orchestrate::PlanReplicas(config_path, t);
  };
  options.plan_text = glm::orchestrate::PlanText;
  std::string state = glm::orchestrate::ControllerStateDir(*topology, state_dir);
  if (state.empty()) {
    GLM_LOG_WARN("no writable state directory (--state-dir); source files are hashed on every up");
  }
  auto hashes = std::make_shared<glm::cluster::HashCache>(
      state.empty() ? std::string() : state + "/source-hashes.json");
  hashes->Load();
  options.stage_manifest = [hashes](const glm::orchestrate::ClusterTopology& t) {
    return glm::orchestrate::SourceManifestJson(t, hashes.get());
  };
  options.nccl_source = [hashes](const glm::orchestrate::ClusterTopology& t) {
    return glm::orchestrate::ControllerNcclSource(t, hashes.get());
  };
  options.heartbeat = std::chrono::milliseconds(heartbeat_ms);
  glm::orchestrate::ControllerService service(options, *topology, glm::Clock::Real());

  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default: a second process on the same port would bind too and
  // share the connections at random. Refuse instead, so "address in use" is reported.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int port = 0;
  builder.AddListeningPort(listen, *creds, &port);
  builder.RegisterService(&service);
  grpc::ResourceQuota quota("glm-controller");
  quota.SetMaxThreads(256);  // one per watched agent stream, per Up stream, per rendezvous wait
  builder.SetResourceQuota(quota);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    std::cerr << "glm-controller: cannot listen on '" << listen
              << "': the address is in use or not local to this host; fix controller.listen in "
              << config_path << " or stop the process holding the port\n";
    return 1;
  }
  GLM_LOG_INFO("controller started cluster={} listen={} port={} tls={} nodes={} version={}",
               topology->cluster_name, listen, port, topology->tls.enabled(),
               topology->nodes.size(), GLM_VERSION);

  int sig = 0;
  sigwait(&signals, &sig);
  GLM_LOG_INFO("controller stopping signal={}", strsignal(sig));
  service.Shutdown();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  server->Wait();
  GLM_LOG_INFO("controller stopped");
  return 0;
}
