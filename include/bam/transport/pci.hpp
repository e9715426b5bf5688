// SPDX-License-Identifier: MIT
//! `bam::pci_transport`: a real (or QEMU-emulated) NVMe controller handed to
//! the bam_nvme kernel module. Registers are BAR0 mapped into the process;
//! DMA memory is pinned and mapped for this controller by the module, which
//! returns one bus address per 4 KiB page (an IOVA when an IOMMU is on).
//!
//! Set-up, once per boot (see kernel_module/README.md):
//!   sudo insmod kernel_module/bam_nvme.ko     # or modprobe after make install
//!   sudo scripts/bind-nvme 0000:01:00.0       # -> /dev/bam-nvme0
//!
//! @code
//!   auto t = std::make_shared<bam::pci_transport>("/dev/bam-nvme0");
//!   bam::controller ctrl(t);                     // I/O queue pairs from the module
//!   auto buf = t->alloc(1 << 20);                // pinned, DMA-mapped host memory
//!   ctrl.read(1, 0, 8, *buf);
//! @endcode
//!
//! Several processes share a controller: the module brings it up and owns
//! its admin queue; each process gets I/O queue pairs of its own (in its own
//! memory) and sends admin commands through the module. With
//! `pci_access::exclusive` one process takes the whole controller instead
//! (BAR0 read-write, its own bring-up), which works only while no other
//! process has it open. Only the process that opened the device may use it;
//! a forked child inherits neither registers, queues nor mappings. Closing
//! (or dying) deletes the process's queue pairs and then unpins everything.
#pragma once

#include <bam/error.hpp>
#include <bam/transport/kmod_abi.h>
#include <bam/transport/detail/kmod_device.hpp>
#include <bam/transport/transport.hpp>
#include <bam/transport/open.hpp>

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#if defined(__CUDACC__) || defined(BAM_WITH_CUDA_RUNTIME)
#include <cuda.h>
#include <cuda_runtime_api.h>
#define BAM_PCI_TRANSPORT_CUDA 1
#else
#define BAM_PCI_TRANSPORT_CUDA 0
#endif

namespace bam {

//! How a process opens a controller of the kernel module.
enum class pci_access : std::uint8_t {
  shared,    //!< the module runs the controller; I/O queue pairs on request (several processes)
  exclusive, //!< the whole controller, registers included (no other process may have it open)
};

class pci_transport : public transport {
public:
  //! Open `/dev/bam-nvmeN`, check the module's ABI and map the registers.
  //! Throws `bam::error` saying what to do when the module or device is missing.
  explicit pci_transport(const std::string& device = BAM_KMOD_DEVICE_PREFIX "0", pci_access access = pci_access::shared)
      : dev_(std::make_shared<detail::kmod_device>(device, access == pci_access::exclusive)) {}

  std::string name() const override { return dev_->path(); }

  //! What the module reports: BAR size, PCI address, DMA mask, IOMMU.
  const bam_kmod_info& info() const noexcept { return dev_->info(); }
  bool iommu() const noexcept { return (dev_->info().flags & BAM_KMOD_INFO_IOMMU) != 0; }
  //! "dddd:bb:dd.f"
  std::string pci_address() const {
    char buf[32];
    const auto& i = dev_->info();
    std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", i.pci_domain, i.pci_bus, i.pci_device, i.pci_function);
    return buf;
  }
  //! The device file descriptor (for tests; do not close it).
  int fd() const noexcept { return dev_->fd(); }
  //! What the module said of the controller at open (queue counts then).
  const bam_kmod_ctrl_info& ctrl_info() const noexcept { return dev_->ctrl_info(); }
  pci_access access() const noexcept { return dev_->shared() ? pci_access::shared : pci_access::exclusive; }

  std::uint32_t read32(std::uint32_t offset) override { return *reg(offset); }
  void write32(std::uint32_t offset, std::uint32_t value) override {
    if (dev_->shared() && offset < BAM_KMOD_DOORBELL_OFFSET) {
      error_context c = ctx(EPERM);
      throw error("register " + std::to_string(offset) +
                      " belongs to the kernel module, which runs this controller for every process "
                      "(open it with bam::pci_access::exclusive to own it)",
                  c);
    }
    *reg(offset) = value;
  }
  volatile std::uint32_t* doorbell(std::uint32_t offset) override { return reg(offset); }

  // ---- the module owns the admin queue (shared access) ----------------------

  bool admin_queue_owned_elsewhere() const override { return dev_->shared(); }

  std::uint32_t io_queue_pairs_available() override {
    bam_kmod_ctrl_info i{};
    if (::ioctl(dev_->fd(), BAM_KMOD_IOC_CTRL_INFO, &i) != 0)
      throw_errno("asking bam_nvme for the controller's queue pairs", errno, name());
    const std::uint32_t share = i.queues_per_file > i.queues_held ? i.queues_per_file - i.queues_held : 0;
    return std::min(share, i.queues_free);
  }

  std::uint16_t create_io_queue_pair(const dma_region& rings, std::size_t sq_offset, std::size_t cq_offset,
                                     std::uint32_t depth) override {
    const std::uint64_t handle = dev_->handle_of(rings);
    if (handle == 0) {
      error_context c = ctx(EINVAL);
      throw error("queue rings must be memory this transport mapped (alloc or map)", c);
    }
    bam_kmod_queue_create q{};
    q.sq_handle = handle;
    q.sq_offset = sq_offset;
    q.cq_handle = handle;
    q.cq_offset = cq_offset;
    q.depth = depth;
    if (::ioctl(dev_->fd(), BAM_KMOD_IOC_QUEUE_CREATE, &q) == 0) return static_cast<std::uint16_t>(q.qid);
    const int e = errno;
    const std::string counts = "the controller has " + std::to_string(q.queues_total) + " I/O queue pairs, " +
                               std::to_string(q.queues_free) + " free; this process holds " +
                               std::to_string(q.queues_held) + " of at most " + std::to_string(q.queues_per_file);
    if (e == ENOSPC)
      throw_errno("no I/O queue pair left on " + name() + ": " + counts + " (other processes hold the rest)", e,
                  name());
    if (e == EDQUOT)
      throw_errno("this process may hold no more I/O queue pairs of " + name() + ": " + counts +
                      " (module parameter max_queues_per_file)",
                  e, name());
    if (e == EIO && q.nvme_status != 0) {
      error_context c = ctx(e);
      c.status = nvme::status{static_cast<std::uint16_t>(q.nvme_status)};
      throw error("the controller refused to create an I/O queue pair of " + std::to_string(depth) + " entries", c);
    }
    throw_errno("creating an I/O queue pair of " + std::to_string(depth) + " entries", e, name());
  }

  void delete_io_queue_pair(std::uint16_t qid) override {
    bam_kmod_queue_delete d{};
    d.qid = qid;
    if (::ioctl(dev_->fd(), BAM_KMOD_IOC_QUEUE_DELETE, &d) != 0)
      throw_errno("deleting I/O queue pair " + std::to_string(qid), errno, name());
  }

  nvme::status admin_passthrough(const nvme::command& cmd, void* data, std::size_t bytes, std::uint32_t& dw0) override {
    bam_kmod_admin a{};
    a.opcode = cmd.opcode;
    a.nsid = cmd.nsid;
    a.cdw10 = cmd.cdw10;
    a.cdw11 = cmd.cdw11;
    a.cdw12 = cmd.cdw12;
    a.cdw13 = cmd.cdw13;
    a.cdw14 = cmd.cdw14;
    a.cdw15 = cmd.cdw15;
    if (data != nullptr && bytes != 0) {
      a.data = reinterpret_cast<std::uintptr_t>(data);
      a.data_len = static_cast<std::uint32_t>(std::min<std::size_t>(bytes, BAM_KMOD_MAX_ADMIN_DATA));
    }
    if (::ioctl(dev_->fd(), BAM_KMOD_IOC_ADMIN, &a) != 0) {
      const int e = errno;
      char op[8];
      std::snprintf(op, sizeof op, "%#x", cmd.opcode);
      const std::string what = "admin command " + std::string(op) + " through bam_nvme";
      if (e == EPERM)
        throw_errno(what + " refused: only Identify, Get Log Page and Get Features are open to every process; "
                           "commands that change the device need CAP_SYS_ADMIN",
                    e, name());
      if (e == EBUSY)
        throw_errno(what + " refused: it changes the device for every user, and other processes have it open", e,
                    name());
      throw_errno(what, e, name());
    }
    dw0 = a.result;
    return nvme::status{static_cast<std::uint16_t>(a.status)};
  }

  //! A GPU pointer to the doorbell: BAR0 registered with CUDA as I/O memory
  //! (cudaHostRegisterIoMemory). nullptr without CUDA.
  volatile std::uint32_t* device_doorbell(std::uint32_t offset) override {
#if BAM_PCI_TRANSPORT_CUDA
    (void)reg(offset); // bounds check (and, shared, the doorbell mapping)
    if (!dev_->bar_registered_) {
      void* bar = const_cast<unsigned char*>(dev_->registered());
      cudaError_t e =
          cudaHostRegister(bar, dev_->registered_bytes(), cudaHostRegisterIoMemory | cudaHostRegisterMapped);
      if (e != cudaSuccess)
        throw error(std::string("cudaHostRegister(BAR0, cudaHostRegisterIoMemory) failed: ") + cudaGetErrorString(e) +
                        " (the GPU cannot reach this controller's doorbells)",
                    ctx(0));
      e = cudaHostGetDevicePointer(&dev_->bar_device_, bar, 0);
      if (e != cudaSuccess) {
        cudaHostUnregister(bar);
        throw error(std::string("cudaHostGetDevicePointer(BAR0) failed: ") + cudaGetErrorString(e), ctx(0));
      }
      dev_->bar_unregister_ = [](void* p) { cudaHostUnregister(p); };
      dev_->bar_registered_ = true;
    }
    const std::uint32_t base = dev_->shared() ? BAM_KMOD_DOORBELL_OFFSET : 0;
    return reinterpret_cast<volatile std::uint32_t*>(static_cast<unsigned char*>(dev_->bar_device_) + offset - base);
#else
    (void)offset;
    return nullptr;
#endif
  }

  //! Pin and map `[ptr, ptr + size)`: host memory through MAP_HOST; GPU
  //! memory (built with CUDA) through a dma-buf from
  //! cuMemGetHandleForAddressRange, or nvidia_p2p when that is unavailable.
  //! GPU memory is pinned in GPU pages (64 KiB) by nvidia_p2p; dma-buf export
  //! accepts the same granularity. Allocations for this transport use it.
  std::size_t device_map_alignment() const override { return gpu_page_size; }

  std::unique_ptr<dma_region> map(void* ptr, std::size_t size, memory_kind kind) override {
    check_map_args(ptr, size, kind);
    if (kind == memory_kind::host) return map_host(ptr, size);
    return map_device(ptr, size);
  }

  //! Zeroed host memory that a fork() child does not inherit. Up to
  //! `BAM_KMOD_MAX_ALLOC_BYTES` it is DMA-coherent memory from the module and
  //! contiguous in bus address space (what NVMe queues need when no IOMMU
  //! translates); larger requests get pinned anonymous memory whose pages
  //! have their own bus addresses.
  std::unique_ptr<dma_region> alloc(std::size_t size) override {
    const std::size_t bytes = round_up(size == 0 ? 1 : size);
    if (bytes <= BAM_KMOD_MAX_ALLOC_BYTES) return alloc_coherent(bytes);
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw_errno("allocating " + std::to_string(bytes) + " bytes of DMA memory", errno, name());
    (void)::madvise(p, bytes, MADV_DONTFORK);
    try {
      return std::make_unique<detail::kmod_owned_region>(map_host(p, bytes), p, bytes);
    } catch (...) {
      ::munmap(p, bytes);
      throw;
    }
  }

  //! DMA-coherent memory, contiguous in bus address space (at most
  //! `BAM_KMOD_MAX_ALLOC_BYTES`).
  std::unique_ptr<dma_region> alloc_coherent(std::size_t size) {
    bam_kmod_alloc req{};
    req.length = round_up(size == 0 ? 1 : size);
    if (::ioctl(dev_->fd(), BAM_KMOD_IOC_ALLOC, &req) != 0)
      throw_errno("allocating " + std::to_string(req.length) + " bytes of DMA-coherent memory", errno, name());
    void* p = ::mmap(nullptr, req.length, PROT_READ | PROT_WRITE, MAP_SHARED, dev_->fd(),
                     static_cast<off_t>(req.mmap_offset));
    if (p == MAP_FAILED) {
      const int e = errno;
      dev_->unmap(req.handle);
      throw_errno("mapping DMA-coherent memory into the process", e, name());
    }
    std::vector<std::uint64_t> bus(req.length / dma_page_size);
    for (std::size_t i = 0; i < bus.size(); ++i)
      bus[i] = req.bus_addr + i * dma_page_size;
    return std::make_unique<detail::kmod_coherent_region>(dev_, req.handle, p, req.length, std::move(bus));
  }

  //! Map `[offset, offset + size)` of dma-buf `dmabuf_fd` for this controller.
  //! `vaddr` is what the region reports as its data() (a CPU or GPU pointer to
  //! the same bytes, or nullptr). The fd may be closed afterwards.
  std::unique_ptr<dma_region> map_dmabuf(int dmabuf_fd, std::size_t offset, std::size_t size, void* vaddr,
                                         memory_kind kind = memory_kind::device) {
    bam_kmod_map_dmabuf req{};
    std::vector<std::uint64_t> bus(size / dma_page_size);
    req.fd = dmabuf_fd;
    req.offset = offset;
    req.length = size;
    req.bus_addrs = reinterpret_cast<std::uintptr_t>(bus.data());
    req.bus_addr_count = static_cast<std::uint32_t>(bus.size());
    if (::ioctl(dev_->fd(), BAM_KMOD_IOC_MAP_DMABUF, &req) != 0)
      throw_errno("mapping " + std::to_string(size) + " bytes of dma-buf fd " + std::to_string(dmabuf_fd) +
                      " for the controller",
                  errno, name());
    return std::make_unique<detail::kmod_region>(dev_, req.handle, vaddr, size, kind, std::move(bus));
  }

  //! Map GPU memory through nvidia_p2p (needs bam_nvme_gpu.ko); 64 KiB aligned.
  std::unique_ptr<dma_region> map_gpu(void* dptr, std::size_t size) {
    bam_kmod_map_gpu req{};
    std::vector<std::uint64_t> bus(size / dma_page_size);
    req.vaddr = reinterpret_cast<std::uintptr_t>(dptr);
    req.length = size;
    req.bus_addrs = reinterpret_cast<std::uintptr_t>(bus.data());
    req.bus_addr_count = static_cast<std::uint32_t>(bus.size());
    if (::ioctl(dev_->fd(), BAM_KMOD_IOC_MAP_GPU, &req) != 0) {
      const int e = errno;
      throw_errno(e == EOPNOTSUPP ? "mapping GPU memory through nvidia_p2p: bam_nvme_gpu.ko is not loaded "
                                    "(build kernel_module with the NVIDIA driver source and modprobe bam_nvme_gpu)"
                                  : "mapping " + std::to_string(size) +
                                        " bytes of GPU memory through nvidia_p2p "
                                        "(64 KiB aligned cudaMalloc memory required)",
                  e, name());
    }
    return std::make_unique<detail::kmod_region>(dev_, req.handle, dptr, size, memory_kind::device, std::move(bus));
  }

private:
  //! Exclusive: BAR0. Shared: the register page (read-only) below the
  //! doorbells, the doorbell mapping from there on.
  volatile std::uint32_t* reg(std::uint32_t offset) const {
    const bool doorbell = dev_->shared() && offset >= BAM_KMOD_DOORBELL_OFFSET;
    const std::size_t limit = doorbell ? BAM_KMOD_DOORBELL_OFFSET + dev_->doorbell_bytes() : dev_->bar_bytes();
    if (offset % 4 != 0 || std::size_t{offset} + 4 > limit) {
      error_context c = ctx(EINVAL);
      throw error("register offset " + std::to_string(offset) + " outside the " + std::to_string(limit) +
                      " bytes of BAR0 mapped" + (dev_->shared() ? " (shared: registers and doorbells)" : ""),
                  c);
    }
    if (doorbell)
      return reinterpret_cast<volatile std::uint32_t*>(dev_->doorbells() + (offset - BAM_KMOD_DOORBELL_OFFSET));
    return reinterpret_cast<volatile std::uint32_t*>(dev_->bar() + offset);
  }

  error_context ctx(int errnum) const {
    error_context c;
    c.controller = name();
    c.errnum = errnum;
    return c;
  }

  std::unique_ptr<dma_region> map_host(void* ptr, std::size_t size) {
    bam_kmod_map_host req{};
    std::vector<std::uint64_t> bus(size / dma_page_size);
    req.vaddr = reinterpret_cast<std::uintptr_t>(ptr);
    req.length = size;
    req.bus_addrs = reinterpret_cast<std::uintptr_t>(bus.data());
    req.bus_addr_count = static_cast<std::uint32_t>(bus.size());
    if (::ioctl(dev_->fd(), BAM_KMOD_IOC_MAP_HOST, &req) != 0)
      throw_errno("pinning and mapping " + std::to_string(size) + " bytes of host memory", errno, name());
    return std::make_unique<detail::kmod_region>(dev_, req.handle, ptr, size, memory_kind::host, std::move(bus));
  }

  std::unique_ptr<dma_region> map_device(void* ptr, std::size_t size) {
#if BAM_PCI_TRANSPORT_CUDA
    using get_handle_fn = CUresult (*)(void*, CUdeviceptr, size_t, CUmemRangeHandleType, unsigned long long);
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
#if CUDART_VERSION >= 12050
    cudaError_t e =
        cudaGetDriverEntryPointByVersion("cuMemGetHandleForAddressRange", &fn, 11070, cudaEnableDefault, &q);
#else
    cudaError_t e = cudaGetDriverEntryPoint("cuMemGetHandleForAddressRange", &fn, cudaEnableDefault, &q);
#endif
    int dmabuf_fd = -1;
    if (e == cudaSuccess && q == cudaDriverEntryPointSuccess && fn != nullptr &&
        reinterpret_cast<get_handle_fn>(fn)(&dmabuf_fd, reinterpret_cast<CUdeviceptr>(ptr), size,
                                            CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0) == CUDA_SUCCESS) {
      struct closer {
        int fd;
        ~closer() { ::close(fd); }
      } c{dmabuf_fd};
      return map_dmabuf(dmabuf_fd, 0, size, ptr, memory_kind::device);
    }
    // No dma-buf export (older driver, or a kernel without P2P dma-buf): nvidia_p2p.
    return map_gpu(ptr, size);
#else
    (void)ptr;
    (void)size;
    throw error("mapping GPU memory needs a CUDA build (compile with nvcc or define "
                "BAM_WITH_CUDA_RUNTIME and link cudart)",
                ctx(ENOTSUP));
#endif
  }

  std::shared_ptr<detail::kmod_device> dev_;
};

namespace detail {

inline std::vector<std::shared_ptr<transport>> open_pci_host_transports(const device_spec& spec) {
  std::vector<std::shared_ptr<transport>> out;
  for (const auto& path : spec.devices)
    out.push_back(std::make_shared<pci_transport>(path));
  return out;
}

inline gpu_transports open_pci_gpu_transports(const device_spec& spec) {
  gpu_transports g;
  g.controllers = open_pci_host_transports(spec);
  g.rings = queue_ring_memory::gpu;
  g.description = "pci (kernel module)";
  return g;
}

} // namespace detail

//! Real controllers through the kernel module, for host I/O and GPU submitters.
inline const bool pci_transport_registered =
    register_host_transport(device_kind::pci, &detail::open_pci_host_transports) &&
    register_gpu_transport(device_kind::pci, &detail::open_pci_gpu_transports);

} // namespace bam
