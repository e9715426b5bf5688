/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * The ioctl ABI of the bam_nvme kernel module: one header for the module
 * (C, kernel) and for the library (C++, user space).
 *
 * Rules, so that old libraries keep working with new modules:
 *  - Only fixed-width __u32/__u64/__s32 fields, naturally aligned, explicit
 *    padding. Sizes are asserted below on both sides.
 *  - A struct is never changed once released. New behaviour gets a new ioctl
 *    number and a new struct, and BAM_KMOD_ABI_VERSION goes up.
 *  - Every pad/flags/reserved field must be zero (the module returns -EINVAL
 *    otherwise), so that it can be given a meaning later.
 *  - The library calls BAM_KMOD_IOC_VERSION right after open and refuses a
 *    module whose range [min_abi_version, abi_version] does not include the
 *    ABI it was built with.
 *
 * Fields are marked // in (user -> module) or // out (module -> user).
 * Errors are negative errno values from ioctl(), see each command.
 */
#ifndef BAM_KMOD_ABI_H
#define BAM_KMOD_ABI_H

#include <linux/ioctl.h>
#include <linux/types.h>

/* ABI this header describes, and the oldest ABI a module built from it serves. */
#define BAM_KMOD_ABI_VERSION 2
/*
 * ABI 2: the module owns the controller's bring-up and admin queue; an open
 * file asks for I/O queue pairs (QUEUE_CREATE) instead of owning BAR0. An
 * ABI 1 library would reset a controller other processes use: refused.
 */
#define BAM_KMOD_MIN_ABI_VERSION 2

/* Device nodes: /dev/bam-nvme0, /dev/bam-nvme1, ... (one per bound controller). */
#define BAM_KMOD_DEVICE_PREFIX "/dev/bam-nvme"
#define BAM_KMOD_DRIVER_NAME "bam_nvme"

/* Granularity of every bus address list the module returns. */
#define BAM_KMOD_DMA_PAGE_SIZE 4096u
/* GPU pages handed out by nvidia_p2p_get_pages (MAP_GPU needs this alignment). */
#define BAM_KMOD_GPU_PAGE_SIZE 65536u

#define BAM_KMOD_IOC_MAGIC 0xBA

/* BAM_KMOD_IOC_VERSION: the handshake. Never fails on an open device. */
struct bam_kmod_version {
  __u32 lib_abi_version; /* in: BAM_KMOD_ABI_VERSION the caller was built with */
  __u32 abi_version;     /* out: BAM_KMOD_ABI_VERSION of the module */
  __u32 min_abi_version; /* out: oldest library ABI the module serves */
  __u32 pad;             /* in: zero */
};

/* bam_kmod_info.flags */
#define BAM_KMOD_INFO_IOMMU (1u << 0) /* bus addresses are IOVAs translated by an IOMMU */
#define BAM_KMOD_INFO_GPU (1u << 1)   /* bam_nvme_gpu is loaded: MAP_GPU is available */

/* BAM_KMOD_IOC_INFO: what the controller is and how it is reached. */
struct bam_kmod_info {
  __u64 bar0_size;     /* out: bytes of BAR0; the largest length mmap() accepts */
  __u64 dma_mask;      /* out: DMA mask the module set (e.g. 2^64-1) */
  __u64 max_map_bytes; /* out: largest length one MAP_* ioctl accepts */
  __u32 pci_domain;    /* out: PCI address domain:bus:device.function */
  __u32 pci_bus;       /* out */
  __u32 pci_device;    /* out */
  __u32 pci_function;  /* out */
  __u32 vendor_id;     /* out: PCI vendor and device id */
  __u32 device_id;     /* out */
  __u32 flags;         /* out: BAM_KMOD_INFO_* */
  __s32 numa_node;     /* out: -1 if unknown */
  __u32 minor;         /* out: N of /dev/bam-nvmeN */
  __u32 pad;           /* out: zero */
};

/*
 * BAM_KMOD_IOC_MAP_HOST: pin [vaddr, vaddr + length) of the caller's memory
 * (FOLL_LONGTERM | FOLL_WRITE) and DMA-map it for this controller.
 * bus_addrs points at bus_addr_count __u64; the module writes length / 4096
 * bus addresses there, one per 4 KiB page, in order.
 * Errors: -EINVAL (zero/unaligned vaddr or length, too small array, nonzero
 * flags), -E2BIG (length > max_map_bytes), -EFAULT (bad pointers, memory not
 * mapped writable), -ENOMEM, -EACCES (fd of another process), -ENODEV
 * (controller removed).
 */
struct bam_kmod_map_host {
  __u64 vaddr;          /* in: 4 KiB aligned user address */
  __u64 length;         /* in: bytes, nonzero multiple of 4 KiB */
  __u64 bus_addrs;      /* in: user pointer to __u64[bus_addr_count] */
  __u32 bus_addr_count; /* in: capacity of bus_addrs, >= length / 4096 */
  __u32 flags;          /* in: zero */
  __u64 handle;         /* out: nonzero; pass to UNMAP */
};

/*
 * BAM_KMOD_IOC_MAP_DMABUF: import dma-buf `fd`, attach it to this controller
 * (peer-to-peer allowed), pin and map it, and return the bus addresses of
 * [offset, offset + length) of the buffer. This is how GPU memory exported
 * with cuMemGetHandleForAddressRange(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD) is
 * mapped. Errors as MAP_HOST, plus -EINVAL for an fd that is not a dma-buf
 * or a range outside the buffer, -EBADF for a closed fd.
 */
struct bam_kmod_map_dmabuf {
  __s32 fd;             /* in: dma-buf file descriptor (the caller may close it afterwards) */
  __u32 flags;          /* in: zero */
  __u64 offset;         /* in: 4 KiB aligned offset into the buffer */
  __u64 length;         /* in: bytes, nonzero multiple of 4 KiB */
  __u64 bus_addrs;      /* in: user pointer to __u64[bus_addr_count] */
  __u32 bus_addr_count; /* in: capacity of bus_addrs */
  __u32 pad;            /* in: zero */
  __u64 handle;         /* out */
};

/*
 * BAM_KMOD_IOC_MAP_GPU: pin GPU memory with nvidia_p2p_get_pages and map it
 * for this controller with nvidia_p2p_dma_map_pages. vaddr and length must
 * be 64 KiB aligned (GPU pages). -EOPNOTSUPP when bam_nvme_gpu is not loaded.
 * If the GPU memory is freed while mapped, the mapping is revoked (the bus
 * addresses become invalid); UNMAP still has to be called.
 */
struct bam_kmod_map_gpu {
  __u64 vaddr;          /* in: CUDA device pointer, 64 KiB aligned */
  __u64 length;         /* in: bytes, nonzero multiple of 64 KiB */
  __u64 bus_addrs;      /* in: user pointer to __u64[bus_addr_count] */
  __u32 bus_addr_count; /* in: capacity of bus_addrs, >= length / 4096 */
  __u32 flags;          /* in: zero */
  __u64 handle;         /* out */
};

/*
 * BAM_KMOD_IOC_ALLOC: allocate DMA-coherent memory for this controller
 * (dma_alloc_coherent): zeroed and contiguous in bus address space, as NVMe
 * queues created with PC=1 need (pinned user pages are contiguous only behind
 * an IOMMU). Map it into the process with
 * mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, mmap_offset).
 * It is freed when both UNMAP(handle) (or close) and munmap have happened.
 * Errors: -EINVAL (zero/unaligned length, nonzero flags), -E2BIG (length >
 * BAM_KMOD_MAX_ALLOC_BYTES), -ENOMEM.
 */
struct bam_kmod_alloc {
  __u64 length;      /* in: bytes, nonzero multiple of 4 KiB */
  __u32 flags;       /* in: zero */
  __u32 pad;         /* in: zero */
  __u64 handle;      /* out: pass to UNMAP */
  __u64 bus_addr;    /* out: bus address of byte 0; byte i is at bus_addr + i */
  __u64 mmap_offset; /* out: the mmap() offset of this memory */
};
#define BAM_KMOD_MAX_ALLOC_BYTES (4u << 20)

/* BAM_KMOD_IOC_UNMAP: undo one MAP_* or ALLOC. -EINVAL for an unknown handle. */
struct bam_kmod_unmap {
  __u64 handle; /* in */
};

/*
 * Sharing (ABI 2). The module brings the controller up and owns its admin
 * queue; every open file (process) asks for I/O queue pairs in memory it
 * mapped through this file, and keeps them until it deletes them or closes.
 * Closing (or dying) deletes its queues (Delete I/O SQ, then CQ, waiting for
 * the controller) before its memory is unmapped and unpinned.
 *
 * mmap() offsets of a shared file: 0 maps the register page read-only
 * (CAP, VS, CSTS...); BAM_KMOD_DOORBELL_OFFSET maps the doorbell pages
 * read-write (once the file holds a queue pair). A file that asked for
 * EXCLUSIVE maps the whole BAR0 at offset 0, as an ABI 1 file did.
 */
#define BAM_KMOD_DOORBELL_OFFSET 4096u
/* Largest data transfer of one ADMIN passthrough command. */
#define BAM_KMOD_MAX_ADMIN_DATA 4096u

/* bam_kmod_ctrl_info.flags */
#define BAM_KMOD_CTRL_UP (1u << 0)        /* the module's admin queue is running */
#define BAM_KMOD_CTRL_EXCLUSIVE (1u << 1) /* this file owns the whole controller */

/* BAM_KMOD_IOC_CTRL_INFO: the controller as the module runs it (brings it up if needed; -EIO if that fails). */
struct bam_kmod_ctrl_info {
  __u64 cap;             /* out: CAP register */
  __u32 vs;              /* out: VS register */
  __u32 flags;           /* out: BAM_KMOD_CTRL_* */
  __u32 queues_total;    /* out: I/O queue pairs the controller granted (Number of Queues) */
  __u32 queues_free;     /* out: held by no open file */
  __u32 queues_held;     /* out: held by this file */
  __u32 queues_per_file; /* out: most one file may hold (module parameter max_queues_per_file, or total) */
  __u32 files;           /* out: open files of this controller */
  __u32 doorbell_bytes;  /* out: length of the doorbell mapping at BAM_KMOD_DOORBELL_OFFSET */
  __u32 max_admin_data;  /* out: BAM_KMOD_MAX_ADMIN_DATA */
  __u32 pad;             /* out: zero */
};

/*
 * BAM_KMOD_IOC_QUEUE_CREATE: one I/O queue pair (Create I/O CQ, then SQ,
 * physically contiguous, no interrupts). The rings lie in mappings of this
 * file (MAP_HOST, MAP_DMABUF, MAP_GPU or ALLOC handles), each contiguous in
 * bus address space; such a mapping cannot be UNMAPped (-EBUSY) while a
 * queue uses it. Errors: -EINVAL (arguments, unknown handle, range outside
 * the mapping or not contiguous), -ENOSPC (every queue pair of the
 * controller is held), -EDQUOT (this file holds max_queues_per_file), -EBUSY
 * (a file owns the controller exclusively), -EIO (the controller refused:
 * nvme_status says why, or the bring-up failed), -ETIMEDOUT. The queues_*
 * fields are written on success and on -ENOSPC/-EDQUOT.
 */
struct bam_kmod_queue_create {
  __u64 sq_handle;       /* in: mapping holding the submission queue */
  __u64 sq_offset;       /* in: its byte offset there, 4 KiB aligned */
  __u64 cq_handle;       /* in: mapping holding the completion queue */
  __u64 cq_offset;       /* in: 4 KiB aligned */
  __u32 depth;           /* in: entries of each queue, 2..CAP.MQES+1 */
  __u32 flags;           /* in: zero */
  __u32 qid;             /* out: queue id of the pair */
  __u32 sq_doorbell;     /* out: BAR0 offset of its SQ tail doorbell */
  __u32 cq_doorbell;     /* out: BAR0 offset of its CQ head doorbell */
  __u32 queues_total;    /* out: as in bam_kmod_ctrl_info */
  __u32 queues_free;     /* out */
  __u32 queues_held;     /* out */
  __u32 queues_per_file; /* out */
  __u32 nvme_status;     /* out: status field of a failed Create command (SC | SCT << 8 | ...) */
};

/* BAM_KMOD_IOC_QUEUE_DELETE: Delete I/O SQ, then CQ, of a pair this file holds. -EINVAL for any other qid. */
struct bam_kmod_queue_delete {
  __u32 qid; /* in */
  __u32 pad; /* in: zero */
};

/*
 * BAM_KMOD_IOC_ADMIN: one admin command through the module's admin queue.
 * Identify, Get Log Page and Get Features are open to every file. Commands
 * that change the device for every user (Format NVM, Sanitize, Namespace
 * Management and Attachment, Firmware Download and Commit, Set Features,
 * Device Self-test) need CAP_SYS_ADMIN (-EPERM) and no other open file of the
 * controller (-EBUSY). Everything else (queue creation and deletion, Abort,
 * Asynchronous Event Request, vendor commands...) is refused (-EPERM).
 * The data direction follows the opcode (bits 1:0). The ioctl returns 0 when
 * the controller completed the command, whatever its status; -ETIMEDOUT
 * when it did not (the module then resets the controller).
 */
struct bam_kmod_admin {
  __u32 opcode;     /* in: admin opcode */
  __u32 nsid;       /* in */
  __u32 cdw10;      /* in */
  __u32 cdw11;      /* in */
  __u32 cdw12;      /* in */
  __u32 cdw13;      /* in */
  __u32 cdw14;      /* in */
  __u32 cdw15;      /* in */
  __u64 data;       /* in: user pointer, or 0 */
  __u32 data_len;   /* in: bytes at data, at most BAM_KMOD_MAX_ADMIN_DATA, 0 if data is 0 */
  __u32 timeout_ms; /* in: 0 for the module's default */
  __u32 flags;      /* in: zero */
  __u32 result;     /* out: completion dword 0 */
  __u32 status;     /* out: completion status field without the phase bit (0: success) */
  __u32 pad;        /* in: zero */
};

#define BAM_KMOD_IOC_VERSION _IOWR(BAM_KMOD_IOC_MAGIC, 0x00, struct bam_kmod_version)
#define BAM_KMOD_IOC_INFO _IOR(BAM_KMOD_IOC_MAGIC, 0x01, struct bam_kmod_info)
#define BAM_KMOD_IOC_MAP_HOST _IOWR(BAM_KMOD_IOC_MAGIC, 0x02, struct bam_kmod_map_host)
#define BAM_KMOD_IOC_MAP_DMABUF _IOWR(BAM_KMOD_IOC_MAGIC, 0x03, struct bam_kmod_map_dmabuf)
#define BAM_KMOD_IOC_MAP_GPU _IOWR(BAM_KMOD_IOC_MAGIC, 0x04, struct bam_kmod_map_gpu)
#define BAM_KMOD_IOC_UNMAP _IOW(BAM_KMOD_IOC_MAGIC, 0x05, struct bam_kmod_unmap)
#define BAM_KMOD_IOC_ALLOC _IOWR(BAM_KMOD_IOC_MAGIC, 0x06, struct bam_kmod_alloc)
#define BAM_KMOD_IOC_CTRL_INFO _IOR(BAM_KMOD_IOC_MAGIC, 0x07, struct bam_kmod_ctrl_info)
#define BAM_KMOD_IOC_QUEUE_CREATE _IOWR(BAM_KMOD_IOC_MAGIC, 0x08, struct bam_kmod_queue_create)
#define BAM_KMOD_IOC_QUEUE_DELETE _IOW(BAM_KMOD_IOC_MAGIC, 0x09, struct bam_kmod_queue_delete)
#define BAM_KMOD_IOC_ADMIN _IOWR(BAM_KMOD_IOC_MAGIC, 0x0a, struct bam_kmod_admin)
/*
 * BAM_KMOD_IOC_EXCLUSIVE: this file takes the whole controller, as an ABI 1
 * file did (for benchmarks and tools that bring the controller up
 * themselves): BAR0 read-write at offset 0, no module admin queue. Only when
 * no other file is open and this one holds no queue pair (-EBUSY). Other
 * opens get -EBUSY until it closes; closing resets the controller.
 */
#define BAM_KMOD_IOC_EXCLUSIVE _IO(BAM_KMOD_IOC_MAGIC, 0x0b)

#ifdef __cplusplus
#define BAM_KMOD_STATIC_ASSERT(c, m) static_assert(c, m)
#else
#define BAM_KMOD_STATIC_ASSERT(c, m) _Static_assert(c, m)
#endif
BAM_KMOD_STATIC_ASSERT(sizeof(struct bam_kmod_version) == 16, "bam_kmod_version is ABI");
BAM_KMOD_STATIC_ASSERT(sizeof(struct bam_kmod_info) == 64, "bam_kmod_info is ABI");
BAM_KMOD_STATIC_ASSERT(sizeof(struct bam_kmod_map_host) == 40, "bam_kmod_map_host is ABI");
BAM_KMOD_STATIC_ASSERT(sizeof(struct bam_kmod_map_dmabuf) == 48, "bam_kmod_map_dmabuf is ABI");
BAM_KMOD_STATIC_ASSERT(sizeof(struct bam_kmod_map_gpu) == 40, "bam_kmod_map_gpu is ABI");
BAM_KMOD_STATIC_ASSERT(sizeof(struct bam_kmod_unmap) == 8, "bam_kmod_unmap is ABI");
BAM_KMOD_STATIC_ASSERT(sizeof(struct bam_kmod_alloc) == 40, "bam_kmod_alloc is ABI");
BAM_KMOD_STATIC_ASSERT(sizeof(struct bam_kmod_ctrl_info) == 48, "bam_kmod_ctrl_info is ABI");
BAM_KMOD_STATIC_ASSERT(sizeof(struct bam_kmod_queue_create) == 72, "bam_kmod_queue_create is ABI");
BAM_KMOD_STATIC_ASSERT(sizeof(struct bam_kmod_queue_delete) == 8, "bam_kmod_queue_delete is ABI");
BAM_KMOD_STATIC_ASSERT(sizeof(struct bam_kmod_admin) == 64, "bam_kmod_admin is ABI");
#undef BAM_KMOD_STATIC_ASSERT

#endif /* BAM_KMOD_ABI_H */
