// SPDX-License-Identifier: MIT
//! GPU memory spread over several GPUs behind one range of addresses: runs
//! of `run_bytes` bytes placed on the GPUs in turn (run k on GPU k mod N),
//! every GPU allowed to read, write and use atomics on all of it (over
//! NVLink or PCIe, peer to peer). CUDA's virtual memory management API
//! (cuMemCreate, cuMemMap, cuMemSetAccess), reached through the runtime's
//! driver entry points: nothing to link.
#pragma once

#include <bam/cuda.cuh>
#include <bam/error.hpp>

#include <cuda.h>

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

//! `bytes` of GPU memory at one address range, in runs of `run_bytes` (a
//! multiple of every device's granularity) placed on `devices` in turn,
//! zeroed; every device in `devices` may access all of it.
class spread_device_memory {
public:
  spread_device_memory(std::size_t bytes, std::size_t run_bytes, const std::vector<int>& devices)
      : run_bytes_(run_bytes), devices_(devices) {
    const vmm_api& api = vmm_api::get();
    if (devices.empty() || run_bytes == 0) throw error("spread_device_memory: no devices, or empty runs");
    const std::size_t runs = (bytes + run_bytes - 1) / run_bytes;
    size_ = runs * run_bytes;
    std::size_t gran = 1;
    for (const int d : devices)
      gran = std::max(gran, spread_granularity(d));
    if (run_bytes % gran != 0)
      throw error("spread_device_memory: runs of " + std::to_string(run_bytes) +
                  " bytes are not a multiple of the allocation granularity " + std::to_string(gran));
    // The last run holds only what is left (rounded up to the granularity).
    const std::size_t last = ((bytes - (runs - 1) * run_bytes) + gran - 1) / gran * gran;
    CUdeviceptr base = 0;
    vmm_try(api.reserve(&base, size_, run_bytes, 0, 0),
            "reserving " + std::to_string(size_) + " bytes of GPU address space");
    base_ = base;
    reserved_ = size_;
    try {
      for (std::size_t k = 0; k < runs; ++k) {
        CUmemAllocationProp prop{};
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = devices[k % devices.size()];
        const std::size_t n = k + 1 == runs ? last : run_bytes;
        CUmemGenericAllocationHandle h{};
        vmm_try(api.create(&h, n, &prop, 0),
                "allocating " + std::to_string(n) + " bytes on CUDA device " + std::to_string(prop.location.id));
        handles_.push_back(h);
        vmm_try(api.map(base_ + k * run_bytes, n, 0, h, 0), "mapping spread GPU memory");
        mapped_.push_back(n);
      }
      size_ = (runs - 1) * run_bytes + last; // what is mapped (the reservation stays runs * run_bytes)
      std::vector<CUmemAccessDesc> access(devices.size());
      for (std::size_t i = 0; i < devices.size(); ++i) {
        access[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        access[i].location.id = devices[i];
        access[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      }
      vmm_try(api.set_access(base_, size_, access.data(), access.size()),
              "giving every GPU of the set access to spread memory (peer access between them)");
      const device_scope on(devices[0]);
      BAM_CUDA_TRY(cudaMemset(data(), 0, size_));
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
  //! The device that holds byte `offset`.
  int device_of(std::size_t offset) const { return devices_[(offset / run_bytes_) % devices_.size()]; }

private:
  void release() noexcept {
    const vmm_api& api = vmm_api::get();
    for (std::size_t k = 0; k < mapped_.size(); ++k)
      (void)api.unmap(base_ + k * run_bytes_, mapped_[k]);
    for (auto h : handles_)
      (void)api.release(h);
    if (base_ != 0) (void)api.free_range(base_, reserved_);
    handles_.clear();
    mapped_.clear();
    base_ = 0;
  }

  CUdeviceptr base_ = 0;
  std::size_t size_ = 0;
  std::size_t run_bytes_ = 0;
  std::size_t reserved_ = 0;
  std::vector<std::size_t> mapped_; //!< bytes mapped of each run
  std::vector<int> devices_;
  std::vector<CUmemGenericAllocationHandle> handles_;
};

} // namespace bam::detail
