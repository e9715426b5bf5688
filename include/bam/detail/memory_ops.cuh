// SPDX-License-Identifier: MIT
//! Loads and stores that bypass L1 (not coherent across SMs) *and* stay where
//! the program put them. CUDA's `__ldcg`/`__stcg` are non-volatile asm without
//! a memory clobber: the compiler may hoist such a load above an acquire (a
//! doorbell read, say) or sink such a store below a release, which reads a
//! stale queue entry or publishes a completion before its data. These are
//! `asm volatile` with a "memory" clobber.
#pragma once

#include <bam/detail/macros.hpp>

#include <cstdint>

#if defined(__CUDACC__)
#include <vector_types.h>

namespace bam::detail {

//! 0, computed from `v`: an instruction that waits for `v` (a load's value).
//! An operation fed with it is issued only after `v` has arrived: ordering
//! without a fence. `zero` must be 0 at run time but unknown to the compiler
//! (a field of a kernel argument): with a literal 0 the compiler folds the
//! instruction away and the dependency with it.
BAM_DEVICE inline unsigned dependency_token(unsigned v, unsigned zero) {
  unsigned t;
  asm volatile("and.b32 %0, %1, %2;" : "=r"(t) : "r"(v), "r"(zero));
  return t;
}
BAM_DEVICE inline unsigned dependency_token(unsigned long long v, unsigned zero) {
  return dependency_token(static_cast<unsigned>(v), zero);
}

BAM_DEVICE inline uint4 ld_cg(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
BAM_DEVICE inline unsigned long long ld_cg(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
BAM_DEVICE inline unsigned ld_cg(const unsigned* p) {
  unsigned v;
  asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
BAM_DEVICE inline unsigned short ld_cg(const unsigned short* p) {
  unsigned short v;
  asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(v) : "l"(p) : "memory");
  return v;
}
BAM_DEVICE inline void st_cg(unsigned short* p, unsigned short v) {
  asm volatile("st.global.cg.u16 [%0], %1;" ::"l"(p), "h"(v) : "memory");
}
BAM_DEVICE inline unsigned char ld_cg(const unsigned char* p) {
  unsigned short v;
  asm volatile("ld.global.cg.u8 %0, [%1];" : "=h"(v) : "l"(p) : "memory");
  return static_cast<unsigned char>(v);
}
BAM_DEVICE inline void st_cg(uint4* p, uint4 v) {
  asm volatile("st.global.cg.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
BAM_DEVICE inline void st_cg(unsigned long long* p, unsigned long long v) {
  asm volatile("st.global.cg.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
BAM_DEVICE inline void st_cg(unsigned* p, unsigned v) {
  asm volatile("st.global.cg.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
BAM_DEVICE inline void st_cg(unsigned char* p, unsigned char v) {
  asm volatile("st.global.cg.u8 [%0], %1;" ::"l"(p), "h"(static_cast<unsigned short>(v)) : "memory");
}

//! Loads that fetch again every time (`ld.cv`): bytes another agent (the
//! host) rewrites at the same address, e.g. staging memory reused for
//! command after command, are never served from a cached copy.
BAM_DEVICE inline uint4 ld_cv(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.cv.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
BAM_DEVICE inline unsigned long long ld_cv(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.global.cv.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
BAM_DEVICE inline unsigned ld_cv(const unsigned* p) {
  unsigned v;
  asm volatile("ld.global.cv.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
BAM_DEVICE inline unsigned char ld_cv(const unsigned char* p) {
  unsigned short v;
  asm volatile("ld.global.cv.u8 %0, [%1];" : "=h"(v) : "l"(p) : "memory");
  return static_cast<unsigned char>(v);
}

} // namespace bam::detail
#endif
