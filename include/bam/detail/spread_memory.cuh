// SPDX-License-Identifier: MIT
//! GPU memory spread over several GPUs behind one range of addresses: runs
//! of `run_bytes` bytes placed on the GPUs in turn (run k on GPU k mod N),
//! every GPU allowed to read, write and use atomics on all of it (over
//! NVLink or PCIe, peer to peer), in one process or shared by a group of
//! processes (one per GPU). CUDA's virtual memory management API
//! (cuMemCreate, cuMemMap, cuMemSetAccess, shareable handles), reached
//! through the runtime's driver entry points: nothing to link.
#pragma once

#include <bam/cuda.cuh>
#include <bam/error.hpp>

#include <cuda.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace bam::detail {

//! The driver calls spread memory needs, looked up once.
struct vmm_api {
  CUresult (*granularity)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags) = nullptr;
  CUresult (*reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*free_range)(CUdeviceptr, size_t) = nullptr;
  CUresult (*create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long) = nullptr;
  CUresult (*release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) = nullptr;
  CUresult (*unmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  CUresult (*export_handle)(void*, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                            unsigned long long) = nullptr;
  CUresult (*import_handle)(CUmemGenericAllocationHandle*, void*, CUmemAllocationHandleType) = nullptr;

  static const vmm_api& get() {
    static const vmm_api api = [] {
      vmm_api a;
      auto find = [](const char* name, auto& fn) {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult q{};
#if CUDART_VERSION >= 12050
        const cudaError_t e = cudaGetDriverEntryPointByVersion(name, &p, 10020, cudaEnableDefault, &q);
#else
        const cudaError_t e = cudaGetDriverEntryPoint(name, &p, cudaEnableDefault, &q);
#endif
        if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || p == nullptr)
          throw error(std::string("spreading memory over GPUs needs the CUDA driver's ") + name +
                      " (CUDA 10.2 or later), which this driver does not offer");
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
      };
      find("cuMemGetAllocationGranularity", a.granularity);
      find("cuMemAddressReserve", a.reserve);
      find("cuMemAddressFree", a.free_range);
      find("cuMemCreate", a.create);
      find("cuMemRelease", a.release);
      find("cuMemMap", a.map);
      find("cuMemUnmap", a.unmap);
      find("cuMemSetAccess", a.set_access);
      find("cuMemExportToShareableHandle", a.export_handle);
      find("cuMemImportFromShareableHandle", a.import_handle);
      return a;
    }();
    return api;
  }
};

inline void vmm_try(CUresult r, const std::string& what) {
  if (r != CUDA_SUCCESS) throw error(what + " failed (CUDA driver error " + std::to_string(static_cast<int>(r)) + ")");
}

//! Memory on device `device` can be created with this granularity (bytes; 2 MiB on current GPUs).
inline std::size_t spread_granularity(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  std::size_t g = 0;
  vmm_try(vmm_api::get().granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity");
  return g;
}

//! Most runs (allocations) of spread memory on one GPU, where runs of the
//! granularity would make more.
inline constexpr std::size_t max_spread_runs_per_part = 64;

//! Bytes per run of `bytes` spread over `parts` GPUs: a multiple of the GPUs'
//! allocation `granularity` (2 MiB on current GPUs), as small as keeps a
//! GPU's part within `max_spread_runs_per_part` runs. Parts then differ by
//! a run at most: a 64th of a part, or 2 MiB. (A page cache spreads its
//! pages and its state words alike, each in runs of their own, so a slot's
//! state word may be on another GPU than its page.)
inline std::size_t spread_run_bytes(std::size_t bytes, std::size_t parts, std::size_t granularity) {
  const std::size_t per_part = (bytes + parts - 1) / parts;
  const std::size_t most = max_spread_runs_per_part * granularity;
  return std::max<std::size_t>(1, (per_part + most - 1) / most) * granularity;
}

//! `bytes` of GPU memory at one address range, in runs of `run_bytes` (a
//! multiple of every device's granularity) placed on GPUs in turn, zeroed.
//!
//!  - One process: run k on `devices[k % N]`; every device in `devices` may
//!    access all of it.
//!  - A group of N processes (`spread_device_memory(bytes, run_bytes,
//!    group_part{...})`): each makes the runs k with k % N == its rank on its
//!    own GPU, shareable as POSIX file descriptors (`export_run`), and maps
//!    the others' runs (`import_run`); `grant` then lets its GPU access the
//!    whole range. Each process's range holds the same bytes at the same
//!    offsets (at its own address).
class spread_device_memory {
public:
  //! This process's part of memory spread over a group of processes.
  struct group_part {
    std::size_t parts = 1; //!< processes in the group
    std::size_t rank = 0;  //!< this one's place
    int device = 0;        //!< its GPU
  };

  spread_device_memory(std::size_t bytes, std::size_t run_bytes, const std::vector<int>& devices)
      : run_bytes_(run_bytes), devices_(devices) {
    if (devices.empty() || run_bytes == 0) throw error("spread_device_memory: no devices, or empty runs");
    std::size_t gran = 1;
    for (const int d : devices)
      gran = std::max(gran, spread_granularity(d));
    layout(bytes, gran);
    try {
      for (std::size_t k = 0; k < runs(); ++k)
        create_run(k, devices[k % devices.size()], false);
      grant(devices);
      const device_scope on(devices[0]);
      BAM_CUDA_TRY(cudaMemset(data(), 0, size_));
      BAM_CUDA_TRY(cudaDeviceSynchronize());
    } catch (...) {
      release();
      throw;
    }
  }

  spread_device_memory(std::size_t bytes, std::size_t run_bytes, group_part part) : run_bytes_(run_bytes), part_(part) {
    if (part.parts == 0 || part.rank >= part.parts || run_bytes == 0)
      throw error("spread_device_memory: a rank outside its group, or empty runs");
    devices_ = std::vector<int>(part.parts, -1);
    devices_[part.rank] = part.device;
    layout(bytes, spread_granularity(part.device));
    try {
      const device_scope on(part.device);
      for (std::size_t k = part.rank; k < runs(); k += part.parts) {
        create_run(k, part.device, true);
        grant_run(k, {part.device});
        BAM_CUDA_TRY(cudaMemset(data() + k * run_bytes_, 0, mapped_[k]));
      }
      BAM_CUDA_TRY(cudaDeviceSynchronize());
    } catch (...) {
      release();
      throw;
    }
  }
  ~spread_device_memory() { release(); }
  spread_device_memory(const spread_device_memory&) = delete;
  spread_device_memory& operator=(const spread_device_memory&) = delete;

  std::uint8_t* data() const { return reinterpret_cast<std::uint8_t*>(base_); }
  std::size_t size() const { return size_; }
  std::size_t runs() const { return mapped_.size(); }
  //! The device that holds byte `offset` (-1: another process's GPU).
  int device_of(std::size_t offset) const { return devices_[part_index(offset)]; }
  //! The index (of `devices`, or the rank in a group) of the GPU that holds byte `offset`.
  std::size_t part_index(std::size_t offset) const { return (offset / run_bytes_) % devices_.size(); }
  //! The runs this process made (a group: those others import from it).
  std::vector<std::size_t> own_runs() const {
    std::vector<std::size_t> out;
    for (std::size_t k = part_.rank; k < runs(); k += part_.parts)
      out.push_back(k);
    return out;
  }
  //! The runs a rank of the group makes.
  std::size_t runs_of(std::size_t rank) const {
    return rank < runs() ? (runs() - rank + part_.parts - 1) / part_.parts : 0;
  }

  //! A new file descriptor sharing run `k` (one of `own_runs`) with another process.
  int export_run(std::size_t k) const {
    int fd = -1;
    vmm_try(vmm_api::get().export_handle(&fd, handles_.at(k), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
            "sharing GPU memory with another process (cuMemExportToShareableHandle)");
    return fd;
  }
  //! Map run `k` from another process's file descriptor `fd` (closed here).
  void import_run(std::size_t k, int fd) {
    struct closer {
      int fd;
      ~closer() { ::close(fd); }
    } own{fd};
    if (k >= runs() || handles_[k] != 0)
      throw error("spread_device_memory: run " + std::to_string(k) + " imported twice");
    const vmm_api& api = vmm_api::get();
    CUmemGenericAllocationHandle h{};
    vmm_try(api.import_handle(&h, reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd)),
                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
            "taking GPU memory of another process (cuMemImportFromShareableHandle)");
    handles_[k] = h;
    const std::size_t n = run_size(k);
    vmm_try(api.map(base_ + k * run_bytes_, n, 0, h, 0), "mapping GPU memory of another process");
    mapped_[k] = n;
  }
  //! Let `devices` access every run (a group: once all are imported).
  void grant(const std::vector<int>& devices) {
    for (std::size_t k = 0; k < runs(); ++k)
      if (mapped_[k] == 0) throw error("spread_device_memory: run " + std::to_string(k) + " is not mapped");
    std::vector<CUmemAccessDesc> access(devices.size());
    for (std::size_t i = 0; i < devices.size(); ++i) {
      access[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      access[i].location.id = devices[i];
      access[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
    vmm_try(vmm_api::get().set_access(base_, size_, access.data(), access.size()),
            "giving every GPU of the set access to spread memory (peer access between them)");
  }

private:
  void layout(std::size_t bytes, std::size_t gran) {
    if (run_bytes_ % gran != 0)
      throw error("spread_device_memory: runs of " + std::to_string(run_bytes_) +
                  " bytes are not a multiple of the allocation granularity " + std::to_string(gran));
    const std::size_t runs = (bytes + run_bytes_ - 1) / run_bytes_;
    // The last run holds only what is left (rounded up to the granularity).
    last_ = ((bytes - (runs - 1) * run_bytes_) + gran - 1) / gran * gran;
    reserved_ = runs * run_bytes_;
    size_ = (runs - 1) * run_bytes_ + last_;
    mapped_.assign(runs, 0);
    handles_.assign(runs, 0);
    CUdeviceptr base = 0;
    // Runs aligned to their size where that is a power of two (else to the granularity).
    const std::size_t align = (run_bytes_ & (run_bytes_ - 1)) == 0 ? run_bytes_ : 0;
    vmm_try(vmm_api::get().reserve(&base, reserved_, align, 0, 0),
            "reserving " + std::to_string(reserved_) + " bytes of GPU address space");
    base_ = base;
  }
  std::size_t run_size(std::size_t k) const { return k + 1 == runs() ? last_ : run_bytes_; }
  void create_run(std::size_t k, int device, bool shareable) {
    const vmm_api& api = vmm_api::get();
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    if (shareable) prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    const std::size_t n = run_size(k);
    CUmemGenericAllocationHandle h{};
    vmm_try(api.create(&h, n, &prop, 0), "allocating " + std::to_string(n) + " bytes on CUDA device " +
                                             std::to_string(device) + (shareable ? " (shareable)" : ""));
    handles_[k] = h;
    vmm_try(api.map(base_ + k * run_bytes_, n, 0, h, 0), "mapping spread GPU memory");
    mapped_[k] = n;
  }
  void grant_run(std::size_t k, const std::vector<int>& devices) {
    std::vector<CUmemAccessDesc> access(devices.size());
    for (std::size_t i = 0; i < devices.size(); ++i) {
      access[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      access[i].location.id = devices[i];
      access[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
    vmm_try(vmm_api::get().set_access(base_ + k * run_bytes_, mapped_[k], access.data(), access.size()),
            "giving a GPU access to its spread memory");
  }
  void release() noexcept {
    const vmm_api& api = vmm_api::get();
    for (std::size_t k = 0; k < mapped_.size(); ++k)
      if (mapped_[k] != 0) (void)api.unmap(base_ + k * run_bytes_, mapped_[k]);
    for (auto h : handles_)
      if (h != 0) (void)api.release(h);
    if (base_ != 0) (void)api.free_range(base_, reserved_);
    handles_.clear();
    mapped_.clear();
    base_ = 0;
  }

  CUdeviceptr base_ = 0;
  std::size_t size_ = 0;
  std::size_t run_bytes_ = 0;
  std::size_t reserved_ = 0;
  std::size_t last_ = 0;            //!< bytes of the last run
  std::vector<std::size_t> mapped_; //!< bytes mapped of each run (0: not yet)
  std::vector<int> devices_;        //!< by part; -1: another process's GPU
  group_part part_{};               //!< one process: parts 1, rank 0 (unused)
  std::vector<CUmemGenericAllocationHandle> handles_;
};

} // namespace bam::detail
