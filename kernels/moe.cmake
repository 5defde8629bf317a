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
