# glm-agent: the per-node daemon (agent/main.cc wires the service, shard host and preflight).
add_executable(glm-agent ${CMAKE_CURRENT_SOURCE_DIR}/main.cc)
target_link_libraries(glm-agent PRIVATE glm_agent_service glm_preflight glm_stage glm_rpc glm_common
  CLI11::CLI11)
target_compile_definitions(glm-agent PRIVATE GLM_VERSION="${PROJECT_VERSION}")
if(TARGET glm_preflight)
  target_link_libraries(glm-agent PRIVATE glm_preflight)
  target_compile_definitions(glm-agent PRIVATE GLM_HAVE_PREFLIGHT=1)
endif()
glm_set_warnings(glm-agent)
set_target_properties(glm-agent PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})
