// glm-agent-preflight: the `glm-agent preflight` subcommand as a standalone binary.
#include "agent/preflight/preflight_command.h"

int main(int argc, char** argv) { return glm::preflight::RunPreflightCommand(argc, argv); }
