# SPDX-License-Identifier: MIT
# Finds what bam's headers need and attaches it to an INTERFACE target.
# Used by the build (add_subdirectory included) and by the installed package
# config alike, so it always runs under the CMake of the project that uses bam.
#   required: CCCL (libcu++ <cuda/atomic>), libnvme headers, Threads
#   optional: liburing (io_uring media in the software controller), libext2fs
#             (ext2/3/4 images read without mounting)
include_guard(GLOBAL)
find_package(Threads REQUIRED)

# libcu++ ships with the CUDA toolkit (include/cccl) and as standalone CCCL.
find_path(BAM_CCCL_INCLUDE_DIR cuda/atomic
  HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV CUDA_HOME ENV CUDA_PATH
  PATHS /usr/local/cuda/include /usr/local/cuda/targets/x86_64-linux/include
  PATH_SUFFIXES cccl include/cccl include)
if(NOT BAM_CCCL_INCLUDE_DIR)
  message(FATAL_ERROR "bam: libcu++ (<cuda/atomic>) not found. Install the CUDA toolkit or CCCL, "
                      "or point BAM_CCCL_INCLUDE_DIR at the directory holding cuda/atomic.")
endif()

find_path(BAM_LIBNVME_INCLUDE_DIR nvme/types.h)
if(NOT BAM_LIBNVME_INCLUDE_DIR)
  message(FATAL_ERROR "bam: libnvme headers (nvme/types.h) not found: apt-get install libnvme-dev, "
                      "or set BAM_LIBNVME_INCLUDE_DIR.")
endif()

find_package(PkgConfig QUIET)
set(BAM_HAVE_LIBURING OFF)
if(PkgConfig_FOUND)
  pkg_check_modules(BAM_URING QUIET IMPORTED_TARGET liburing)
  if(BAM_URING_FOUND)
    set(BAM_HAVE_LIBURING ON)
  endif()
endif()
if(NOT BAM_HAVE_LIBURING)
  find_path(BAM_URING_INCLUDE_DIR liburing.h)
  find_library(BAM_URING_LIBRARY uring)
  if(BAM_URING_INCLUDE_DIR AND BAM_URING_LIBRARY)
    set(BAM_HAVE_LIBURING ON)
  endif()
endif()
if(BAM_HAVE_LIBURING)
  message(STATUS "bam: liburing found: file and block-device media use io_uring")
else()
  message(STATUS "bam: liburing not found: file and block-device media fall back to pread/pwrite "
                 "(apt-get install liburing-dev for io_uring)")
endif()

# libext2fs (with com_err): ext2/3/4 file systems read without mounting them
# (bam/file/fs_image.hpp).
set(BAM_HAVE_LIBEXT2FS OFF)
if(PkgConfig_FOUND)
  pkg_check_modules(BAM_EXT2FS QUIET IMPORTED_TARGET ext2fs com_err)
  if(BAM_EXT2FS_FOUND)
    set(BAM_HAVE_LIBEXT2FS ON)
  endif()
endif()
if(BAM_HAVE_LIBEXT2FS)
  message(STATUS "bam: libext2fs found: file extents can be read from ext2/3/4 images (bam/file/fs_image.hpp)")
else()
  message(STATUS "bam: libext2fs not found: bam/file/fs_image.hpp (extents from ext2/3/4 images) is off "
                 "(apt-get install libext2fs-dev comerr-dev, and pkg-config)")
endif()

# C++20 for CUDA sources. bam's headers need C++20 in .cu files as much as in
# .cpp files, but `cxx_std_20` reaches only the CXX language. CMake 3.26 and
# later know nvcc's C++20 flag: `cuda_std_20` raises the standard of every
# consumer target to at least C++20. Older CMake (Debian 12 has 3.25) has no
# C++20 flag for nvcc and refuses `cuda_std_20`: the flag is added directly
# to CUDA compilations instead (nvcc takes the last -std it is given).
function(bam_require_cuda_cxx20 target build_tree)
  get_property(languages GLOBAL PROPERTY ENABLED_LANGUAGES)
  if("CUDA" IN_LIST languages AND CMAKE_CUDA_COMPILER_ID STREQUAL "NVIDIA" AND
     CMAKE_CUDA_COMPILER_VERSION VERSION_LESS 12.0)
    message(FATAL_ERROR "bam: CUDA ${CMAKE_CUDA_COMPILER_VERSION} cannot compile C++20; bam needs "
                        "nvcc 12 or later (set CMAKE_CUDA_COMPILER to a newer toolkit's nvcc).")
  endif()
  if(CMAKE_VERSION VERSION_GREATER_EQUAL 3.26)
    set(feature cuda_std_20)
    if(build_tree)
      set(feature "$<BUILD_INTERFACE:${feature}>")
    endif()
    target_compile_features(${target} INTERFACE ${feature})
  else()
    set(flag "$<$<COMPILE_LANG_AND_ID:CUDA,NVIDIA>:-std=c++20>")
    if(build_tree)
      set(flag "$<BUILD_INTERFACE:${flag}>")
    endif()
    target_compile_options(${target} INTERFACE ${flag})
  endif()
endfunction()

# bam_link_dependencies(TARGET [BUILD_TREE])
# Attach the include directories, definitions, libraries and the CUDA C++20
# rule to TARGET's interface. With BUILD_TREE everything is wrapped in
# $<BUILD_INTERFACE:...>: the exported target then carries only bam's own
# include directory and cxx_std_20, and the installed package config calls
# this function again on the consumer's machine, with the consumer's CMake.
function(bam_link_dependencies target)
  cmake_parse_arguments(B "BUILD_TREE" "" "" ${ARGN})
  set(includes ${BAM_CCCL_INCLUDE_DIR} ${BAM_LIBNVME_INCLUDE_DIR})
  set(libs Threads::Threads)
  set(defs)
  if(BAM_HAVE_LIBURING)
    list(APPEND defs BAM_HAVE_LIBURING=1)
    if(TARGET PkgConfig::BAM_URING)
      list(APPEND libs PkgConfig::BAM_URING)
    else()
      list(APPEND includes ${BAM_URING_INCLUDE_DIR})
      list(APPEND libs ${BAM_URING_LIBRARY})
    endif()
  endif()
  if(BAM_HAVE_LIBEXT2FS)
    list(APPEND defs BAM_HAVE_LIBEXT2FS=1)
    list(APPEND libs PkgConfig::BAM_EXT2FS)
  endif()
  if(B_BUILD_TREE)
    list(TRANSFORM includes REPLACE "^(.+)$" "$<BUILD_INTERFACE:\\1>")
    list(TRANSFORM libs REPLACE "^(.+)$" "$<BUILD_INTERFACE:\\1>")
    list(TRANSFORM defs REPLACE "^(.+)$" "$<BUILD_INTERFACE:\\1>")
  endif()
  target_include_directories(${target} SYSTEM INTERFACE ${includes})
  target_link_libraries(${target} INTERFACE ${libs})
  if(defs)
    target_compile_definitions(${target} INTERFACE ${defs})
  endif()
  bam_require_cuda_cxx20(${target} ${B_BUILD_TREE})
endfunction()
