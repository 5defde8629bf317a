# glm_gateway: the routes (gateway.cc) over the pieces above; the controller's main wires it to
# the HTTP server and to GrpcReplicaBackend (controller/orchestrate).
add_library(glm_gateway gateway.cc model_files.cc)
target_include_directories(glm_gateway PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(glm_gateway PUBLIC glm_http_server glm_openai glm_jinja glm_gateway_support
  glm_tokenizer glm_common absl::status absl::statusor PRIVATE absl::strings)
glm_set_warnings(glm_gateway)

glm_add_test(NAME gateway_test SOURCES gateway_test.cc LIBS glm_gateway)

# glm-gateway-bench: requests/s, latency, CPU per streamed token and bytes per open stream of the
# gateway against a bare http::Server baseline, on loopback (a program that prints figures; not a
# test, no timing asserts).
add_executable(glm-gateway-bench gateway_bench.cc)
target_link_libraries(glm-gateway-bench PRIVATE glm_gateway Threads::Threads)
glm_set_warnings(glm-gateway-bench)
