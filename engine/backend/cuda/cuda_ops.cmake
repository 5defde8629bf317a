# The heavy CUDA ops (cuda_ops.h: attention, indexer scoring + top-k, routed experts), included by
# CMakeLists.txt here when the CUDA parts build. Adds their sources to glm_backend_cuda and defines
# their GPU test (against the CPU backend) and bench.
if(NOT TARGET glm_backend_cuda)
  return()
endif()

# CMake 3.25 does not know nvcc 13's C++20 flag (same as kernels/CMakeLists.txt).
set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
# Routed experts: the adapter to kernels/moe.h (plain C++).
target_sources(glm_backend_cuda PRIVATE ${CMAKE_CURRENT_LIST_DIR}/cuda_moe.cc)
target_link_libraries(glm_backend_cuda PUBLIC glm_kernels_moe)
# INT4 / INT8 / NVFP4 experts read narrow (kernels/moe_quant.h), also from cuda_moe.cc.
target_link_libraries(glm_backend_cuda PUBLIC glm_kernels_moe_quant)
# IndexerTopK: the adapter to kernels/dsa_indexer.h (plain C++).
target_sources(glm_backend_cuda PRIVATE ${CMAKE_CURRENT_LIST_DIR}/cuda_indexer.cc)
target_link_libraries(glm_backend_cuda PUBLIC glm_kernels_dsa_indexer)
# Plain C++ adapters from the backend's views to kernels/ launchers: MLA attention and the fp8 KV
# ops (kernels/attention.cmake), the narrow-weight Linear (cuda_linear.cc: gemm_bf16,
# gemm_fp8_block, quant_fp8_group, convert_bf16, gemv_narrow); one-row fp32 Linear with a small
# weight: per_head_gemv.
target_sources(glm_backend_cuda PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/cuda_ops_attention.cc
  ${CMAKE_CURRENT_LIST_DIR}/cuda_ops_kv_fp8.cc
  ${CMAKE_CURRENT_LIST_DIR}/cuda_linear.cc
  ${CMAKE_CURRENT_LIST_DIR}/cuda_quant_linear.cc)
target_link_libraries(glm_backend_cuda PRIVATE glm_kernels_gemm glm_kernels_per_head_gemv
  glm_kernels_attention)

glm_add_test(NAME cuda_ops_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/cuda_ops_test.cc
  LIBS glm_backend_cuda glm_backend_cpu glm_kernels LABELS gpu)
# bf16 / fp8 block-scaled weights (Linear via cuda_linear.h, MoeExperts) vs the CPU backend.
glm_add_test(NAME cuda_narrow_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/cuda_narrow_test.cc
  LIBS glm_backend_cuda glm_backend_cpu glm_kernels_gemm LABELS gpu)

# fp8 KV cache ops (writes, gather, Attention / IndexerTopK over fp8 caches) vs the CPU backend.
glm_add_test(NAME cuda_kv_fp8_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/cuda_kv_fp8_test.cc
  LIBS glm_backend_cuda glm_backend_cpu glm_kernels LABELS gpu)
# MoeExperts through every path (kernels::MoePolicy: decode, token-group, tensor-core, tiled) and
# dtype vs the CPU backend; kAuto against the forced path of each shape, bit for bit.
glm_add_test(NAME cuda_moe_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/cuda_moe_test.cc
  LIBS glm_backend_cuda glm_backend_cpu glm_kernels_gemm LABELS gpu)

add_executable(cuda_ops_bench ${CMAKE_CURRENT_LIST_DIR}/cuda_ops_bench.cc)
target_link_libraries(cuda_ops_bench PRIVATE glm_backend_cuda glm_kernels)
glm_set_warnings(cuda_ops_bench)

# fp32 vs fp8 KV: IndexerTopK / Attention / quantizing writes at GLM-5 decode shapes (cuda_kv_bench.cc).
add_executable(cuda_kv_bench ${CMAKE_CURRENT_LIST_DIR}/cuda_kv_bench.cc)
target_link_libraries(cuda_kv_bench PRIVATE glm_backend_cuda glm_kernels absl::strings)
glm_set_warnings(cuda_kv_bench)

# IndexerTopK selection paths (legacy / multi-CTA / short-row select) vs a host reference of the
# tie rules and the CPU backend, graph replay == eager; and their bench (cuda_indexer_bench.cc).
glm_add_test(NAME cuda_indexer_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/cuda_indexer_test.cc
  LIBS glm_backend_cuda glm_backend_cpu glm_kernels LABELS gpu)
add_executable(cuda_indexer_bench ${CMAKE_CURRENT_LIST_DIR}/cuda_indexer_bench.cc)
target_link_libraries(cuda_indexer_bench PRIVATE glm_backend_cuda glm_kernels absl::strings)
glm_set_warnings(cuda_indexer_bench)
