# SPDX-License-Identifier: MIT
# Finds what bam's headers need and attaches it to an INTERFACE target.
# Used by the build and by the installed package config alike.
#   required: CCCL (libcu++ <cuda/atomic>), libnvme headers, Threads
#   optional: liburing (io_uring media in the software controller)
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

function(bam_link_dependencies target)
  target_include_directories(${target} SYSTEM INTERFACE ${BAM_CCCL_INCLUDE_DIR} ${BAM_LIBNVME_INCLUDE_DIR})
  target_link_libraries(${target} INTERFACE Threads::Threads)
  if(BAM_HAVE_LIBURING)
    target_compile_definitions(${target} INTERFACE BAM_HAVE_LIBURING=1)
    if(TARGET PkgConfig::BAM_URING)
      target_link_libraries(${target} INTERFACE PkgConfig::BAM_URING)
    else()
      target_include_directories(${target} SYSTEM INTERFACE ${BAM_URING_INCLUDE_DIR})
      target_link_libraries(${target} INTERFACE ${BAM_URING_LIBRARY})
    endif()
  endif()
endfunction()
