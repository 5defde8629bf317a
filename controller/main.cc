// glm-controller: the cluster's control-plane daemon.
//   glm-controller --config cluster.yaml [--listen ADDR] [--heartbeat-ms N] [--log-level L]
//                  [--state-dir DIR]
// State (the hash cache of the source's weight files and NCCL build, so `up` re-hashes only what
// changed): --state-dir, default <cluster.yaml dir>/.glmctl/<cluster>/source-hashes.json.
// Serves glm.v1.Controller on controller.listen (mTLS when controller.tls is set), drives
// bring-up on `Up`, watches every agent's status stream, and is the shard groups' rendezvous.
// Serves the OpenAI-compatible gateway on controller.gateway (API keys from
// controller.api_key_file, re-read on SIGHUP) over the replicas' head shards.
// Only this file wires concrete implementations together (DESIGN.md §2).
#include <signal.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <utility>

#include "CLI/CLI.hpp"
#include "cluster/manifest/hash_cache.h"
#include "common/clock.h"
#include "common/logging.h"
#include "controller/gateway/gateway.h"
#include "controller/orchestrate/controller_service.h"
#include "controller/orchestrate/grpc_replica_backend.h"
#include "controller/orchestrate/spec_adapter.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/resource_quota.h"
#include "proto/rpc/audit.h"
#include "proto/rpc/authz.h"
#include "proto/rpc/credentials.h"
#include "proto/rpc/listen_policy.h"

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
  sigaddset(&signals, SIGHUP);
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
  // Roles under mTLS: the operator's and the controller's certificates may call everything, an
  // agent's only the rendezvous (proto/rpc/authz.h).
  if (topology->tls.enabled()) {
    (*creds)->SetAuthMetadataProcessor(
        glm::rpc::MakeAuthzProcessor(&glm::rpc::ControllerAuthzPolicy()));
  }
  // Secure by default: plaintext gRPC only on loopback unless controller.insecure. (The gateway's
  // HTTP listen is separate: API keys protect it.)
  if (glm::rpc::RefuseInsecureListen(listen, topology->tls.enabled(), topology->insecure)) {
    std::cerr << "glm-controller: " << config_path << ": refusing to serve the control plane "
              << "without TLS on '" << listen << "', which is reachable from the network. Fix: "
              << "make certificates with `glmctl certs --out DIR " << config_path
              << "` and set controller.tls {ca, cert, key}, or listen on 127.0.0.1, or set "
                 "controller.insecure: true to accept an open control plane\n";
    return 2;
  }
  if (!topology->tls.enabled() && topology->insecure && !glm::rpc::IsLoopbackListen(listen)) {
    GLM_LOG_WARN("controller control plane is open to the network: plaintext gRPC without "
                 "authentication on listen={} (controller.insecure: true); anyone who can reach "
                 "it can bring the cluster up or down. Set controller.tls "
                 "(`glmctl certs --out DIR {}`)",
                 listen, config_path);
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
  if (!topology->tls.enabled() && topology->insecure && !glm::rpc::IsLoopbackListen(listen)) {
    options.insecure_listen = listen;
  }
  // Certificate expiry: reported by Status, and a warning here within 14 days.
  if (topology->tls.enabled()) {
    const auto now = std::chrono::system_clock::now();
    const std::pair<std::string, std::optional<int64_t>*> certs[] = {
        {topology->tls.cert, &options.cert_expires_in_s},
        {topology->tls.ca, &options.ca_expires_in_s}};
    for (const auto& [path, left] : certs) {
      absl::StatusOr<int64_t> seconds = glm::rpc::CertificateSecondsLeft(path, now);
      if (!seconds.ok()) {
        GLM_LOG_WARN("cannot read the expiry of {}: {}", path,
                     std::string(seconds.status().message()));
        continue;
      }
      *left = *seconds;
      if (*seconds < glm::rpc::kCertificateExpiryWarningS) {
        GLM_LOG_WARN("certificate {} expires in {} days; fix: glmctl certs --renew --out {} {} "
                     "(a CA: glmctl certs --force), then restart glm-controller and every "
                     "glm-agent",
                     path, *seconds / 86400,
                     std::filesystem::path(topology->tls.ca).parent_path().string(), config_path);
      }
    }
  }
  // The checkpoint's tokenizer and chat template (model.path on this host): the gateway's text
  // routes and the canary's text prompt and readable diffs. Without them both still serve ids.
  auto model = glm::gateway::ModelFiles::Load(topology->model_dir);
  if (!model.ok()) {
    GLM_LOG_WARN("no tokenizer on this host: the gateway serves no text routes and "
                 "model.canary needs ids: {}", std::string(model.status().message()));
    model = glm::gateway::ModelFiles::Missing(topology->model_dir,
                                              std::string(model.status().message()));
  }
  if (model->tokenizer) {
    std::shared_ptr<const glm::tokenizer::Tokenizer> tok = model->tokenizer;
    options.canary_tokenizer.encode =
        [tok](const std::string& text) -> absl::StatusOr<std::vector<int32_t>> {
      return tok->Encode(text);
    };
    options.canary_tokenizer.decode = [tok](const std::vector<int32_t>& ids) {
      return tok->Decode(ids, /*skip_special_tokens=*/false);
    };
  }
  glm::orchestrate::ControllerService service(options, *topology, glm::Clock::Real());

  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default: a second process on the same port would bind too and
  // share the connections at random. Refuse instead, so "address in use" is reported.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int port = 0;
  builder.AddListeningPort(listen, *creds, &port);
  glm::rpc::LimitRequestSizes(builder);
  builder.RegisterService(&service);
  // The audit trail: one INFO line per state-changing RPC, with the caller's identity.
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> audit;
  audit.push_back(glm::rpc::MakeAuditInterceptorFactory({"Up", "Down", "Restart"},
                                                        "cluster=" + topology->cluster_name));
  builder.experimental().SetInterceptorCreators(std::move(audit));
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

  // The gateway: the checkpoint's tokenizer and chat template from model.path, the replicas
  // from the controller's live state. A gateway that cannot listen stops the controller (a
  // cluster nobody can reach is a failure to see at once, not in a log).
  glm::orchestrate::GrpcReplicaBackend backend(&service.state(), &service.channels(),
                                               glm::Clock::Real(),
                                               {std::chrono::milliseconds(heartbeat_ms) * 5,
                                                std::chrono::seconds(30)});
  glm::gateway::GatewayMetrics metrics(topology->served_name, topology->max_model_len);
  std::shared_ptr<glm::gateway::ApiKeys> api_keys;
  if (!topology->api_key_file.empty()) {
    auto keys = glm::gateway::ApiKeys::Load(topology->api_key_file);
    if (!keys.ok()) {
      std::cerr << "glm-controller: " << config_path << ": controller.api_key_file: "
                << keys.status().message() << "\n";
      return 2;
    }
    api_keys = std::move(*keys);
    if (!api_keys->warning().empty()) GLM_LOG_WARN("{}", api_keys->warning());
  }
  std::unique_ptr<glm::gateway::Gateway> gateway;
  std::unique_ptr<glm::http::Server> http_server;
  if (!topology->gateway_listen.empty()) {
    glm::gateway::GatewayOptions gateway_options;
    gateway_options.served_name = topology->served_name;
    gateway_options.max_model_len = topology->max_model_len;
    gateway_options.version = GLM_VERSION;
    gateway_options.max_queued = topology->gateway_queue_max;
    gateway_options.queue_timeout = std::chrono::milliseconds(
        std::llround(topology->gateway_queue_timeout_s * 1000.0));
    gateway = std::make_unique<glm::gateway::Gateway>(gateway_options, std::move(*model),
                                                      &backend, api_keys, &metrics,
                                                      glm::Clock::Real());
    glm::http::ServerOptions http_options;
    http_options.listen = topology->gateway_listen;
    http_options.io_threads = 2;
    auto started = glm::http::Server::Start(
        http_options,
        [g = gateway.get()](std::shared_ptr<glm::http::Exchange> ex) { g->Handle(ex); });
    if (!started.ok()) {
      std::cerr << "glm-controller: " << config_path << ": controller.gateway: "
                << started.status().message() << "\n";
      return 1;
    }
    http_server = std::move(*started);
    GLM_LOG_INFO("gateway started listen={} port={} model={} api_keys={} queue_max={} "
                 "queue_timeout_s={}",
                 topology->gateway_listen, http_server->port(), topology->served_name,
                 api_keys ? api_keys->size() : 0, topology->gateway_queue_max,
                 topology->gateway_queue_timeout_s);
  }

  int sig = 0;
  for (;;) {
    sigwait(&signals, &sig);
    if (sig != SIGHUP) break;
    if (!api_keys) {
      GLM_LOG_INFO("SIGHUP: no controller.api_key_file to reload");
      continue;
    }
    absl::Status reloaded = api_keys->Reload();
    if (reloaded.ok()) {
      GLM_LOG_INFO("api keys reloaded file={} keys={}", api_keys->path(), api_keys->size());
    } else {
      GLM_LOG_ERROR("api keys not reloaded, the previous keys stay in force: {}",
                    std::string(reloaded.message()));
    }
  }
  GLM_LOG_INFO("controller stopping signal={}", strsignal(sig));
  if (gateway) {
    // Finish what is streaming (new requests get 503), then stop serving HTTP.
    gateway->StopAdmitting();
    http_server->Shutdown(std::chrono::seconds(10));
  }
  service.Shutdown();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  server->Wait();
  GLM_LOG_INFO("controller stopped");
  return 0;
}
