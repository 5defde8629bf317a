// `glm-agent preflight --config FILE --node NAME [--sysfs-root DIR] [--proc-root DIR]
//  [--dev-root DIR] [--disk-path DIR] [--allow-no-gpu] [--json]`
// Runs the node's checks locally, without a controller. Prints a table (or, with --json, one
// object: {"node", "ok", "checks": [{id, status, message, evidence, fix}], "gid": {...}|null}).
// Exit code: 0 when no check failed, 1 when one did, 2 for a usage or config error.
#pragma once

namespace glm::preflight {

// argv[0] is the subcommand name ("preflight"); the flags follow.
int RunPreflightCommand(int argc, char** argv);

}  // namespace glm::preflight

// Unqualified alias for the agent's main dispatch.
inline int RunPreflightCommand(int argc, char** argv) {
  return glm::preflight::RunPreflightCommand(argc, argv);
}
