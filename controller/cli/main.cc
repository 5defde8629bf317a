// glmctl: the operator's CLI. See `glmctl --help`; exit codes in commands.h.
#include <iostream>

#include "CLI/CLI.hpp"
#include "controller/cli/commands.h"
#include "controller/cli/supervisor.h"

#ifndef GLM_VERSION
#define GLM_VERSION "0.0.0"
#endif

int main(int argc, char** argv) {
  // Hidden: `glmctl up` runs each local agent under `glmctl supervise` (supervisor.h).
  if (argc > 1 && std::string(argv[1]) == "supervise") {
    return glm::cli::SuperviseMain(argc - 2, argv + 2);
  }
  CLI::App app{"glmctl: bring a GLM-5 serving cluster up with one command"};
  app.set_version_flag("--version", GLM_VERSION);
  app.require_subcommand(1);
  glm::cli::GlobalFlags flags;
  app.add_option("--controller", flags.controller,
                 "controller address host:port (default: controller.listen from cluster.yaml)");

  std::string config;
  auto add_config = [&](CLI::App* cmd, bool required) {
    auto* opt = cmd->add_option("cluster_yaml", config, "cluster.yaml");
    if (required) opt->required();
  };

  bool force = false;
  auto* up = app.add_subcommand("up", "validate, start (local) and bring the cluster up");
  add_config(up, true);
  up->add_flag("--force", force, "re-run every bring-up step even if the cluster is Ready");

  auto* status = app.add_subcommand("status", "per-node and per-replica state");
  add_config(status, false);
  status->add_flag("--json", flags.json, "one JSON object");

  auto* health = app.add_subcommand("health", "exit 0 only if every replica is Ready");
  add_config(health, false);
  health->add_flag("--json", flags.json, "one JSON object");

  glm::cli::GenerateFlags gen;
  auto* generate = app.add_subcommand(
      "generate", "one request through a Ready replica; prints the generated token ids last");
  add_config(generate, false);
  generate->add_option("--tokens", gen.tokens, "prompt token ids, comma-separated (1,2,3)")
      ->required();
  generate->add_option("--max-tokens", gen.max_tokens, "tokens to generate (default 16)");
  generate->add_option("--temperature", gen.temperature, "0 = greedy (default)");
  generate->add_option("--seed", gen.seed, "sampling seed (0 = the engine picks one)");
  generate->add_option("--timeout", gen.timeout_s, "seconds before giving up (default 600)");
  generate->add_option("--mtp-draft-tokens", gen.mtp_draft_tokens,
                       "MTP drafts per step for this request, 0 .. model.mtp_draft_tokens "
                       "(default: the replica's)")
      ->check(CLI::Range(0, 16));
  generate->add_flag("--logprobs", gen.logprobs,
                     "print each generated token's raw logprob (a logprobs= line before the ids)");

  glm::cli::LogsFlags logs_flags;
  auto* logs = app.add_subcommand(
      "logs", "a node's recent log lines (or the controller's), through the controller");
  logs->add_option("[cluster.yaml] NODE", logs_flags.args,
                   "cluster.yaml (optional), then a node name from it or `controller`")
      ->expected(1, 2)
      ->required();
  logs->add_flag("-f,--follow", logs_flags.follow, "keep printing new lines until Ctrl-C");
  logs->add_option("--tail", logs_flags.tail, "lines to print first (default 200, at most 10000)");

  glm::cli::RestartFlags restart_flags;
  auto* restart = app.add_subcommand(
      "restart", "restart replicas' shard groups (drain, reload, canary, re-admit)");
  add_config(restart, false);
  restart->add_flag("--rolling", restart_flags.rolling,
                    "one replica at a time; the others keep serving");
  restart->add_option("--replica", restart_flags.replicas, "replica index (repeatable; default all)");
  restart->add_option("--drain-timeout", restart_flags.drain_timeout_s,
                      "seconds to wait for a replica's requests in flight (default "
                      "lifecycle.drain_timeout_s, 30)")
      ->check(CLI::Range(0.0, 86400.0));
  restart->add_flag("--processes", restart_flags.processes,
                    "restart the agent daemons too (systemd, or the local launcher, starts "
                    "them again)");

  auto* down = app.add_subcommand("down", "stop the cluster (and its local processes)");
  add_config(down, false);

  auto* validate = app.add_subcommand("validate", "check a cluster.yaml (no controller needed)");
  add_config(validate, true);
  validate->add_flag("--json", flags.json, "one JSON object");

  auto* plan = app.add_subcommand("plan", "ranks, PP stages, memory and KV capacity (offline)");
  add_config(plan, true);
  plan->add_flag("--json", flags.json, "one JSON object");
  std::string mtp_acceptance;
  auto* mtp_acceptance_option =
      plan->add_option("--mtp-acceptance", mtp_acceptance,
                       "MTP acceptance for the decode projection: accepted / drafted draft "
                       "tokens as `glmctl status` reports it, or 'measured' to read it from the "
                       "running cluster (default: assumed 0.7 per position)");

  auto* preflight = app.add_subcommand(
      "preflight", "run every node's checks (RDMA, GID, MTU, memlock, NCCL, host) side by side");
  add_config(preflight, true);
  preflight->add_flag("--json", flags.json, "one JSON object");

  glm::cli::CertsOptions certs_options;
  auto* certs = app.add_subcommand(
      "certs", "make a cluster CA and controller, node and operator certificates");
  certs->add_option("--out", certs_options.out_dir, "directory for the PEM files")->required();
  certs->add_flag("--force", certs_options.overwrite, "replace the CA and every certificate");
  auto* renew = certs->add_flag("--renew", certs_options.renew,
                                "keep DIR's CA (ca.pem, ca.key); re-issue every leaf certificate");
  certs->add_option("--days", certs_options.valid_days, "validity of the leaf certificates")
      ->capture_default_str()
      ->check(CLI::Range(1, 3650));
  renew->excludes(certs->get_option("--force"));
  add_config(certs, true);

  CLI11_PARSE(app, argc, argv);
  if (config.empty() && !up->parsed() && !validate->parsed() && !plan->parsed() &&
      !preflight->parsed() &&
      !certs->parsed()) {
    config = glm::cli::DefaultConfig();
  }
  if (up->parsed()) return glm::cli::RunUp(config, flags, force);
  if (preflight->parsed()) return glm::cli::RunPreflight(config, flags);
  if (status->parsed()) return glm::cli::RunStatus(config, flags);
  if (health->parsed()) return glm::cli::RunHealth(config, flags);
  if (generate->parsed()) return glm::cli::RunGenerate(config, flags, gen);
  if (logs->parsed()) return glm::cli::RunLogs(config, flags, logs_flags);
  if (restart->parsed()) return glm::cli::RunRestart(config, flags, restart_flags);
  if (down->parsed()) return glm::cli::RunDown(config, flags);
  if (validate->parsed()) return glm::cli::RunValidate(config, flags);
  if (plan->parsed()) {
    return glm::cli::RunPlan(config, flags,
                             mtp_acceptance_option->count() > 0
                                 ? std::optional<std::string>(mtp_acceptance)
                                 : std::nullopt);
  }
  if (certs->parsed()) return glm::cli::RunCerts(config, certs_options);
  return 2;
}
