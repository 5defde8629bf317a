// One Progress message of an agent operation (the Stage*/LoadShard/StopShard streams).
#pragma once

#include <cstdint>
#include <string>

#include "glm/v1/agent.pb.h"

namespace glm::agent {

inline glm::v1::Progress MakeProgress(const std::string& step, const std::string& message,
                                      int64_t done_bytes = 0, int64_t total_bytes = 0,
                                      bool done = false) {
  glm::v1::Progress p;
  p.set_step(step);
  p.set_message(message);
  p.set_done_bytes(done_bytes);
  p.set_total_bytes(total_bytes);
  p.set_done(done);
  return p;
}

}  // namespace glm::agent
