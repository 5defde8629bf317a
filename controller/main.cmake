# glm-controller: the control-plane daemon (controller/main.cc wires spec, plan, orchestrate).
add_executable(glm-controller ${CMAKE_CURRENT_SOURCE_DIR}/main.cc)
target_link_libraries(glm-controller PRIVATE glm_orchestrate_spec glm_orchestrate glm_manifest glm_rpc
  glm_gateway glm_common CLI11::CLI11)
target_compile_definitions(glm-controller PRIVATE GLM_VERSION="${PROJECT_VERSION}")
glm_set_warnings(glm-controller)
set_target_properties(glm-controller PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})
