# Decides whether the CUDA parts build. GLM_ENABLE_CUDA=AUTO builds them when nvcc is found;
# the CPU build never needs CUDA. Sets GLM_HAVE_CUDA.
set(GLM_HAVE_CUDA OFF)
if(NOT GLM_ENABLE_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT CMAKE_CUDA_ARCHITECTURES)
      # A800 / A100 (sm_80), H100/H200 (sm_90a), Blackwell (sm_100), GB10 (sm_121a: sm_121 plus
      # the block-scaled FP4 mma.sync of kernels/gemv_quant_fp4mma.cuh, which plain sm_121
      # refuses). sm_80 costs about 460 s of single-job nvcc time over the kernels' .cu files,
      # against about 1650 s for the other three (a shared 2-core machine); kernels/
      # compute_capability.h says what each op runs there. One architecture builds faster:
      # -DCMAKE_CUDA_ARCHITECTURES=80 (A800), 90a or 121a.
      set(CMAKE_CUDA_ARCHITECTURES 80 90a 100 121a)
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(GLM_HAVE_CUDA ON)
  elseif(GLM_ENABLE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "GLM_ENABLE_CUDA=ON but no nvcc was found")
  endif()
endif()
message(STATUS "glmctl: CUDA parts ${GLM_HAVE_CUDA}")
