# SPDX-License-Identifier: MIT
# bam_enable_cuda(MODE OUT PREFIX): enables the CUDA language where a CUDA
# compiler exists. MODE: ON (required), OFF, or AUTO. OUT is set to ON when
# CUDA is enabled, else OFF. Builds for sm_90 (H100/H200) unless
# CMAKE_CUDA_ARCHITECTURES says otherwise. A macro: enable_language and the
# variables it sets belong to the caller's directory.
macro(bam_enable_cuda mode out prefix)
  set(${out} OFF)
  if(NOT "${mode}" STREQUAL "OFF")
    include(CheckLanguage)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90 CACHE STRING "CUDA architectures to build for")
    endif()
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      # CMake < 3.26 knows no C++20 flag for nvcc; nvcc 12+ takes -std=c++20.
      if(CMAKE_VERSION VERSION_LESS 3.26 AND NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
        set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
        set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
      endif()
      enable_language(CUDA)
      if(NOT DEFINED CMAKE_CUDA_STANDARD)
        set(CMAKE_CUDA_STANDARD 20)
        set(CMAKE_CUDA_STANDARD_REQUIRED ON)
      endif()
      find_package(CUDAToolkit REQUIRED)
      set(${out} ON)
      message(STATUS "${prefix}: CUDA ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}")
    elseif("${mode}" STREQUAL "ON")
      message(FATAL_ERROR "${prefix}: CUDA was asked for (ON) but no CUDA compiler was found (set CMAKE_CUDA_COMPILER)")
    endif()
  endif()
endmacro()
