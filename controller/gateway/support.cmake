# Gateway support: Prometheus metrics, API keys, replica router (included by CMakeLists.txt).
add_library(glm_gateway_support
  ${CMAKE_CURRENT_LIST_DIR}/metrics.cc
  ${CMAKE_CURRENT_LIST_DIR}/api_keys.cc
  ${CMAKE_CURRENT_LIST_DIR}/router.cc)
target_link_libraries(glm_gateway_support
  PUBLIC glm_common absl::status absl::statusor absl::strings absl::span Threads::Threads
  PRIVATE OpenSSL::Crypto)
glm_set_warnings(glm_gateway_support)

glm_add_test(NAME gateway_support_test
  SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/metrics_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/api_keys_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/router_test.cc
  LIBS glm_gateway_support
  PREFIX gateway_support)
