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
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace bam {

namespace detail {

//! The open device file and its register mappings; shared by the transport
//! and every region it mapped, so that a region may outlive the transport.
//! Shared (the default): the module runs the controller; the register page
//! is mapped read-only and the doorbell pages once a queue pair is held.
//! Exclusive: the whole BAR0 read-write, the controller is this process's.
class kmod_device {
public:
  explicit kmod_device(const std::string& path, bool exclusive = false) : path_(path) {
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
      if (exclusive && ::ioctl(fd_, BAM_KMOD_IOC_EXCLUSIVE) != 0)
        throw_errno("cannot take " + path + " exclusively: other processes have it open (see /sys/class/bam-nvme/" +
                        path.substr(path.rfind('/') + 1) + "/clients)",
                    errno, path);
      if (::ioctl(fd_, BAM_KMOD_IOC_CTRL_INFO, &ctrl_) != 0)
        throw_errno("bam_nvme could not bring " + path + " up (the kernel log says why)", errno, path);
      shared_ = (ctrl_.flags & BAM_KMOD_CTRL_EXCLUSIVE) == 0;
      const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
      bar_bytes_ = shared_ ? std::size_t{BAM_KMOD_DOORBELL_OFFSET} : static_cast<std::size_t>(info_.bar0_size);
      map_bytes_ = (bar_bytes_ + page - 1) / page * page;
      void* p = ::mmap(nullptr, map_bytes_, shared_ ? PROT_READ : PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
      if (p == MAP_FAILED) throw_errno("cannot mmap the registers of " + path, errno, path);
      bar_ = static_cast<volatile unsigned char*>(p);
    } catch (...) {
      ::close(fd_);
      throw;
    }
  }
  ~kmod_device() {
    if (bar_registered_ && bar_unregister_ != nullptr) bar_unregister_(const_cast<unsigned char*>(registered()));
    ::munmap(const_cast<unsigned char*>(bar_), map_bytes_);
    if (doorbells_ != nullptr) ::munmap(const_cast<unsigned char*>(doorbells_), ctrl_.doorbell_bytes);
    ::close(fd_); // the module deletes this process's queue pairs, then unpins what is left
  }
  kmod_device(const kmod_device&) = delete;
  kmod_device& operator=(const kmod_device&) = delete;

  int fd() const noexcept { return fd_; }
  const std::string& path() const noexcept { return path_; }
  const bam_kmod_info& info() const noexcept { return info_; }
  //! What the module says of the controller at open (queue counts are a snapshot).
  const bam_kmod_ctrl_info& ctrl_info() const noexcept { return ctrl_; }
  //! The module runs the controller (not an exclusive open).
  bool shared() const noexcept { return shared_; }
  //! The register mapping: BAR0 (exclusive) or its first page, read-only (shared).
  volatile unsigned char* bar() const noexcept { return bar_; }
  std::size_t bar_bytes() const noexcept { return bar_bytes_; }
  std::size_t bar_map_bytes() const noexcept { return map_bytes_; }
  //! Shared: the doorbell pages (BAR0 from BAM_KMOD_DOORBELL_OFFSET on),
  //! mapped on first use; the module maps them once a queue pair is held.
  volatile unsigned char* doorbells() {
    std::lock_guard<std::mutex> lock(doorbell_mutex_);
    if (doorbells_ == nullptr) {
      void* p = ::mmap(nullptr, ctrl_.doorbell_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_,
                       static_cast<off_t>(BAM_KMOD_DOORBELL_OFFSET));
      if (p == MAP_FAILED) throw_errno("cannot mmap the doorbells of " + path_, errno, path_);
      doorbells_ = static_cast<volatile unsigned char*>(p);
    }
    return doorbells_;
  }
  std::size_t doorbell_bytes() const noexcept { return ctrl_.doorbell_bytes; }
  //! What a GPU registers to ring doorbells: BAR0 (exclusive) or the doorbell pages (shared).
  volatile unsigned char* registered() const noexcept { return shared_ ? doorbells_ : bar_; }
  std::size_t registered_bytes() const noexcept { return shared_ ? ctrl_.doorbell_bytes : map_bytes_; }

  //! The module's handle of the mapping behind `r` (made through this
  //! device, perhaps wrapped by its owner: the wrapper keeps its address and
  //! bus addresses), or 0.
  std::uint64_t handle_of(const dma_region& r) const {
    if (r.page_bus().empty()) return 0;
    std::lock_guard<std::mutex> lock(regions_mutex_);
    const auto it = regions_.find({r.data(), r.page_bus()[0]});
    return it == regions_.end() ? 0 : it->second;
  }
  void remember(const dma_region& r, std::uint64_t handle) {
    if (r.page_bus().empty()) return;
    std::lock_guard<std::mutex> lock(regions_mutex_);
    regions_.insert({{r.data(), r.page_bus()[0]}, handle});
  }
  void forget(const dma_region& r, std::uint64_t handle) noexcept {
    if (r.page_bus().empty()) return;
    std::lock_guard<std::mutex> lock(regions_mutex_);
    const auto range = regions_.equal_range({r.data(), r.page_bus()[0]});
    for (auto it = range.first; it != range.second; ++it)
      if (it->second == handle) {
        regions_.erase(it);
        return;
      }
  }

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
    case EBUSY: return "a process owns this controller exclusively (see /sys/class/bam-nvme/<dev>/clients)";
    default: return "open failed";
    }
  }

  std::string path_;
  int fd_ = -1;
  bam_kmod_info info_{};
  bam_kmod_ctrl_info ctrl_{};
  bool shared_ = true;
  std::mutex doorbell_mutex_;
  mutable std::mutex regions_mutex_;
  //! Live mappings by (address, bus address of page 0): what QUEUE_CREATE names.
  std::multimap<std::pair<const void*, std::uint64_t>, std::uint64_t> regions_;
  volatile unsigned char* doorbells_ = nullptr;
  volatile unsigned char* bar_ = nullptr;
  std::size_t bar_bytes_ = 0;
  std::size_t map_bytes_ = 0;
};

//! A mapping made by the module; UNMAPped when destroyed.
class kmod_region : public dma_region {
public:
  kmod_region(std::shared_ptr<kmod_device> dev, std::uint64_t handle, void* vaddr, std::size_t size, memory_kind kind,
              std::vector<std::uint64_t> bus)
      : dma_region(vaddr, size, kind, std::move(bus)), dev_(std::move(dev)), handle_(handle) {
    dev_->remember(*this, handle_);
  }
  ~kmod_region() override {
    dev_->forget(*this, handle_);
    dev_->unmap(handle_);
  }
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
      : dma_region(vaddr, size, memory_kind::host, std::move(bus)), dev_(std::move(dev)), handle_(handle) {
    dev_->remember(*this, handle_);
  }
  ~kmod_coherent_region() override {
    dev_->forget(*this, handle_);
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
