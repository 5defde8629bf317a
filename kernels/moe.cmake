# Routed experts (MoE, kernels/moe.h): the decode, token-group, fp8 tensor-core and tiled kernels
# behind one launcher. Included by CMakeLists.txt here in CUDA builds.
set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
add_library(glm_kernels_moe
  ${CMAKE_CURRENT_LIST_DIR}/moe.cu
  ${CMAKE_CURRENT_LIST_DIR}/moe_decode.cu
  ${CMAKE_CURRENT_LIST_DIR}/moe_grouped.cu
  ${CMAKE_CURRENT_LIST_DIR}/moe_mma.cu
  ${CMAKE_CURRENT_LIST_DIR}/moe_tiled.cu)
target_link_libraries(glm_kernels_moe PUBLIC glm_kernels)
target_compile_options(glm_kernels_moe PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo -Xptxas=-warn-spills>)
set_target_properties(glm_kernels_moe PROPERTIES CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON
  CUDA_SEPARABLE_COMPILATION OFF)

# Launcher input checks (they run without a GPU); every path against the CPU backend and the
# tiled reference: engine/backend/cuda/cuda_moe_test.
glm_add_test(NAME moe_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/moe_test.cc LIBS glm_kernels_moe
  LABELS gpu)

# Routed experts with INT4 / INT8 / NVFP4 weights read narrow (moe_quant.h): the device token
# lists above, gemv_quant's warp arithmetic (gemv_quant.cuh) per unit of one expert, the combine.
add_library(glm_kernels_moe_quant ${CMAKE_CURRENT_LIST_DIR}/moe_quant.cu)
target_link_libraries(glm_kernels_moe_quant PUBLIC glm_kernels_moe glm_kernels_gemm)
target_compile_options(glm_kernels_moe_quant PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo -Xptxas=-warn-spills>)
set_target_properties(glm_kernels_moe_quant PROPERTIES CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON
  CUDA_SEPARABLE_COMPILATION OFF)
# Against GemvQuantHost per pair + silu + combine (GPU); the planning and the table checks run
# without a GPU.
glm_add_test(NAME moe_quant_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/moe_quant_test.cc
  LIBS glm_kernels_moe_quant LABELS gpu)
# GLM-5 widths, batches 1 / 8 / 64: us per call and the fraction of a D2D copy.
add_executable(moe_quant_bench ${CMAKE_CURRENT_LIST_DIR}/moe_quant_bench.cc)
target_link_libraries(moe_quant_bench PRIVATE glm_kernels_moe_quant)
glm_set_warnings(moe_quant_bench)
