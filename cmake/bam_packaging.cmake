# SPDX-License-Identifier: MIT
# Debian packages (cpack -G DEB in the build directory):
#   bam-dev    headers, CMake package config, pkg-config file
#   bam-dkms   kernel module sources under /usr/src/bam_nvme-VERSION, built by DKMS
#   bam-tools  the bam command, the udev rule, the "bam" group
include_guard(GLOBAL)

set(BAM_DKMS_DIR src/bam_nvme-${PROJECT_VERSION})
install(FILES kernel_module/Kbuild kernel_module/Makefile kernel_module/dkms.conf kernel_module/bam_nvme.c
              kernel_module/bam_nvme_gpu.h kernel_module/bam_nvme_args.h
        DESTINATION ${BAM_DKMS_DIR} COMPONENT dkms)
install(FILES kernel_module/gpu/Kbuild kernel_module/gpu/bam_nvme_gpu.c DESTINATION ${BAM_DKMS_DIR}/gpu COMPONENT dkms)
install(FILES include/bam/transport/kmod_abi.h DESTINATION ${BAM_DKMS_DIR}/include/bam/transport COMPONENT dkms)
install(FILES kernel_module/99-bam.rules DESTINATION lib/udev/rules.d COMPONENT tools)

foreach(script dkms-postinst dkms-prerm tools-postinst)
  string(REPLACE "-" ";" parts ${script})
  list(GET parts 0 component)
  list(GET parts 1 name)
  configure_file(cmake/debian/${script}.in ${PROJECT_BINARY_DIR}/debian/${component}/${name} @ONLY
                 FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
endforeach()

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME bam)
set(CPACK_PACKAGE_VENDOR "bam developers")
set(CPACK_PACKAGE_CONTACT "bam developers")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL dev dkms)
if(BAM_TOOL_BUILT)
  list(APPEND CPACK_COMPONENTS_ALL tools)
endif()
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)

set(CPACK_DEBIAN_DEV_PACKAGE_NAME bam-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_ARCHITECTURE all)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libnvme-dev, libxxhash-dev, liburing-dev")
set(CPACK_DEBIAN_DEV_PACKAGE_SUGGESTS "libext2fs-dev, comerr-dev")
set(CPACK_COMPONENT_DEV_DESCRIPTION
    "bam: GPU kernels reading and writing NVMe storage directly (headers)\n"
    "Header-only C++20/CUDA library, CMake package config (find_package(bam)) and pkg-config file. "
    "Needs the CUDA toolkit 12 or later (libcu++) for GPU and host code alike.")

set(CPACK_DEBIAN_DKMS_PACKAGE_NAME bam-dkms)
set(CPACK_DEBIAN_DKMS_PACKAGE_ARCHITECTURE all)
set(CPACK_DEBIAN_DKMS_PACKAGE_SECTION kernel)
set(CPACK_DEBIAN_DKMS_PACKAGE_DEPENDS "dkms")
set(CPACK_DEBIAN_DKMS_PACKAGE_CONTROL_EXTRA "${PROJECT_BINARY_DIR}/debian/dkms/postinst;${PROJECT_BINARY_DIR}/debian/dkms/prerm")
set(CPACK_COMPONENT_DKMS_DESCRIPTION
    "bam: kernel modules handing NVMe controllers to user space and GPUs (DKMS)\n"
    "bam_nvme maps a controller's BAR0 into one process and DMA-maps host memory and dma-bufs for it; "
    "bam_nvme_gpu (built when NVIDIA's driver source is installed) maps GPU memory through nvidia_p2p.")

set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME bam-tools)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_TOOLS_PACKAGE_RECOMMENDS "bam-dkms")
set(CPACK_DEBIAN_TOOLS_PACKAGE_CONTROL_EXTRA "${PROJECT_BINARY_DIR}/debian/tools/postinst")
set(CPACK_COMPONENT_TOOLS_DESCRIPTION
    "bam: the bam command and the udev rule for /dev/bam-nvme*\n"
    "bam list, bind, unbind, identify, smart, load, dump and checksum, with --json. "
    "Creates the system group bam, which may open /dev/bam-nvme* (with CAP_SYS_RAWIO).")

include(CPack)
