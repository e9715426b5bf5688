// SPDX-License-Identifier: MIT
//! Machinery of `bam::pci_transport`: the open device file with its BAR0
//! mapping, and the DMA regions the kernel module maps. Every member exists in
//! every build, so the classes have one layout whether a translation unit is
//! compiled by nvcc or by a plain C++ compiler.
#pragma once

#include <bam/error.hpp>
#include <bam/transport/kmod_abi.h>
#include <bam/transport/transport.hpp>

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace bam {

namespace detail {

//! The open device file and its BAR0 mapping; shared by the transport and
//! every region it mapped, so that a region may outlive the transport.
class kmod_device {
public:
  explicit kmod_device(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd_ < 0) {
      const int e = errno;
      throw_errno("cannot open " + path + ": " + open_hint(e), e, path);
    }
    try {
      bam_kmod_version v{};
      v.lib_abi_version = BAM_KMOD_ABI_VERSION;
      if (::ioctl(fd_, BAM_KMOD_IOC_VERSION, &v) != 0)
        throw_errno(path + " does not answer the bam_nvme VERSION ioctl: is it a bam_nvme device?", errno, path);
      if (BAM_KMOD_ABI_VERSION < v.min_abi_version || BAM_KMOD_ABI_VERSION > v.abi_version) {
        error_context c;
        c.controller = path;
        c.errnum = EPROTO;
        throw error("bam_nvme module ABI " + std::to_string(v.min_abi_version) + ".." + std::to_string(v.abi_version) +
                        " does not serve this library (ABI " + std::to_string(BAM_KMOD_ABI_VERSION) +
                        "): rebuild and reload the module from this source tree "
                        "(make -C kernel_module && rmmod bam_nvme && insmod kernel_module/bam_nvme.ko)",
                    c);
      }
      if (::ioctl(fd_, BAM_KMOD_IOC_INFO, &info_) != 0) throw_errno("bam_nvme INFO ioctl failed", errno, path);
      bar_bytes_ = static_cast<std::size_t>(info_.bar0_size);
      const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
      map_bytes_ = (bar_bytes_ + page - 1) / page * page;
      void* p = ::mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
      if (p == MAP_FAILED) throw_errno("cannot mmap BAR0 of " + path, errno, path);
      bar_ = static_cast<volatile unsigned char*>(p);
    } catch (...) {
      ::close(fd_);
      throw;
    }
  }
  ~kmod_device() {
    if (bar_registered_ && bar_unregister_ != nullptr) bar_unregister_(const_cast<unsigned char*>(bar_));
    ::munmap(const_cast<unsigned char*>(bar_), map_bytes_);
    ::close(fd_); // the module stops the controller and unpins what is left
  }
  kmod_device(const kmod_device&) = delete;
  kmod_device& operator=(const kmod_device&) = delete;

  int fd() const noexcept { return fd_; }
  const std::string& path() const noexcept { return path_; }
  const bam_kmod_info& info() const noexcept { return info_; }
  volatile unsigned char* bar() const noexcept { return bar_; }
  std::size_t bar_bytes() const noexcept { return bar_bytes_; }
  std::size_t bar_map_bytes() const noexcept { return map_bytes_; }

  void unmap(std::uint64_t handle) const noexcept {
    bam_kmod_unmap u{};
    u.handle = handle;
    (void)::ioctl(fd_, BAM_KMOD_IOC_UNMAP, &u);
  }

  // Present in every build (CUDA or not), so that the class has one layout
  // in every translation unit of a program mixing .cpp and .cu files.
  bool bar_registered_ = false; //!< BAR0 registered with CUDA (cudaHostRegisterIoMemory)
  void* bar_device_ = nullptr;  //!< BAR0 as the GPU sees it, once registered
  //! Undoes the CUDA registration of BAR0; set by the code that made it (CUDA builds).
  void (*bar_unregister_)(void*) = nullptr;

private:
  static std::string open_hint(int e) {
    switch (e) {
    case ENOENT:
    case ENXIO:
    case ENODEV:
      return "no such bam_nvme device. Load the module (insmod kernel_module/bam_nvme.ko, or "
             "modprobe bam_nvme after make -C kernel_module install) and hand it a controller "
             "(scripts/bind-nvme <pci address>)";
    case EACCES: return "permission denied: install kernel_module/99-bam.rules (group bam) and join the group";
    case EPERM:
      return "opening a bam_nvme device needs CAP_SYS_RAWIO (run as root, or setcap "
             "cap_sys_rawio+ep on the program)";
    case EBUSY: return "another process has this controller open (see /sys/class/bam-nvme/<dev>/owner_pid)";
    default: return "open failed";
    }
  }

  std::string path_;
  int fd_ = -1;
  bam_kmod_info info_{};
  volatile unsigned char* bar_ = nullptr;
  std::size_t bar_bytes_ = 0;
  std::size_t map_bytes_ = 0;
};

//! A mapping made by the module; UNMAPped when destroyed.
class kmod_region : public dma_region {
public:
  kmod_region(std::shared_ptr<kmod_device> dev, std::uint64_t handle, void* vaddr, std::size_t size, memory_kind kind,
              std::vector<std::uint64_t> bus)
      : dma_region(vaddr, size, kind, std::move(bus)), dev_(std::move(dev)), handle_(handle) {}
  ~kmod_region() override { dev_->unmap(handle_); }
  std::uint64_t handle() const noexcept { return handle_; }

private:
  std::shared_ptr<kmod_device> dev_;
  std::uint64_t handle_;
};

//! DMA-coherent memory from the module (BAM_KMOD_IOC_ALLOC), mmap()ed through the device.
class kmod_coherent_region : public dma_region {
public:
  kmod_coherent_region(std::shared_ptr<kmod_device> dev, std::uint64_t handle, void* vaddr, std::size_t size,
                       std::vector<std::uint64_t> bus)
      : dma_region(vaddr, size, memory_kind::host, std::move(bus)), dev_(std::move(dev)), handle_(handle) {}
  ~kmod_coherent_region() override {
    ::munmap(data(), size());
    dev_->unmap(handle_);
  }

private:
  std::shared_ptr<kmod_device> dev_;
  std::uint64_t handle_;
};

//! Anonymous memory that a fork() child does not inherit (MADV_DONTFORK), plus its mapping.
class kmod_owned_region : public dma_region {
public:
  kmod_owned_region(std::unique_ptr<dma_region> m, void* mem, std::size_t bytes)
      : dma_region(m->data(), m->size(), m->kind(), m->page_bus()), mapping_(std::move(m)), mem_(mem), bytes_(bytes) {}
  ~kmod_owned_region() override {
    mapping_.reset();
    ::munmap(mem_, bytes_);
  }

private:
  std::unique_ptr<dma_region> mapping_;
  void* mem_;
  std::size_t bytes_;
};

} // namespace detail

} // namespace bam
