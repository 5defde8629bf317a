# glm_lazy_random_weights: random GlmMoeDsa checkpoints generated tensor by tensor
# (engine/model/lazy_random_weights.h), for benchmarks at full GLM-5 widths. Built everywhere;
# its test runs on the CPU backend.
add_library(glm_lazy_random_weights ${PROJECT_SOURCE_DIR}/engine/model/lazy_random_weights.cc)
target_include_directories(glm_lazy_random_weights PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(glm_lazy_random_weights PUBLIC glm_model_config glm_model absl::status
  absl::statusor Threads::Threads PRIVATE absl::strings)
glm_set_warnings(glm_lazy_random_weights)
glm_add_test(NAME lazy_random_weights_test
  SOURCES ${PROJECT_SOURCE_DIR}/engine/model/lazy_random_weights_test.cc
  LIBS glm_lazy_random_weights glm_model)

# glm-bench-cuda-decode: decode step at GLM-5 widths on one GPU vs its HBM roofline (CUDA builds
# only; not a test, no timing asserts). Runs on a GPU machine: tools/gpu/run_decode_bench.sh.
if(GLM_HAVE_CUDA)
  add_executable(glm-bench-cuda-decode ${CMAKE_CURRENT_LIST_DIR}/cuda_decode_bench.cc)
  target_link_libraries(glm-bench-cuda-decode PRIVATE glm_lazy_random_weights glm_model
    glm_backend glm_backend_cuda glm_kernels CUDA::cudart absl::strings)
  glm_set_warnings(glm-bench-cuda-decode)
endif()
