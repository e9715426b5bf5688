// SPDX-License-Identifier: MIT OR GPL-2.0
/*
 * bam_nvme: hands an NVMe controller to a user-space (and GPU) driver.
 *
 * The module binds only the controllers a user opts in (an empty id table:
 * binding goes through sysfs driver_override or new_id, see
 * scripts/bind-nvme). For each one it creates /dev/bam-nvmeN, which offers:
 *  - the controller brought up by the module, which owns its admin queue;
 *  - per open file, I/O queue pairs in memory that file mapped, with the
 *    doorbell pages mmap()ed (uncached) and the register page read-only;
 *  - admin commands through the module (Identify, Get Log Page, Get
 *    Features for everyone; device-wide changes for CAP_SYS_ADMIN alone);
 *  - ioctls that pin and DMA-map memory *for this controller* and return one
 *    bus address per 4 KiB page: host memory, a dma-buf (GPU memory exported
 *    by CUDA), or GPU memory through nvidia_p2p (bam_nvme_gpu.ko);
 *  - for one file at a time, with no other open, the whole controller
 *    (EXCLUSIVE: BAR0 read-write, the user's own bring-up).
 * The ABI is include/bam/transport/kmod_abi.h.
 *
 * Ownership: everything belongs to the open file that made it; only the
 * process that opened it may use it (-EACCES otherwise, e.g. a forked child
 * or an fd passed over a socket). release() deletes the file's queue pairs
 * (Delete I/O SQ, then CQ, waiting for the controller; a controller that
 * does not answer is reset) *before* it unmaps and unpins, so a process that
 * dies mid-I/O cannot leave the controller writing into freed pages, and the
 * other files' queues go on. Every mapping is VM_DONTCOPY: a child of fork()
 * has no registers, doorbells or queues.
 *
 * Privilege: open() needs file permission (udev: 99-bam.rules) and
 * CAP_SYS_RAWIO, because a controller whose registers a process owns can DMA
 * to any physical address when no IOMMU translates for it. With
 * unprivileged=1 the capability is waived for controllers behind a
 * translating IOMMU, where DMA reaches only what was mapped here.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/cdev.h>
#include <linux/delay.h>
#include <linux/dma-buf.h>
#include <linux/dma-mapping.h>
#include <linux/dma-resv.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/idr.h>
#include <linux/kref.h>
#include <linux/io.h>
#include <linux/io-64-nonatomic-lo-hi.h>
#include <linux/iommu.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/sched/mm.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/version.h>
#include <linux/xarray.h>

#include <bam/transport/kmod_abi.h>

#include "bam_nvme_args.h"
#include "bam_nvme_gpu.h"

#define BAM_MAX_CONTROLLERS 256
#define BAM_DMA_PAGE BAM_KMOD_DMA_PAGE_SIZE

/* NVMe registers the module itself touches (to stop a controller). */
#define NVME_REG_CAP 0x00
#define NVME_REG_VS 0x08
#define NVME_REG_CC 0x14
#define NVME_REG_CSTS 0x1c
#define NVME_REG_AQA 0x24
#define NVME_REG_ASQ 0x28
#define NVME_REG_ACQ 0x30
#define NVME_REG_DBS 0x1000 /* doorbells: SQ y tail at 0x1000 + 2y * (4 << DSTRD), CQ y head after it */
#define NVME_CC_ENABLE 0x1
#define NVME_CC_ENTRY_SIZES ((6u << 16) | (4u << 20)) /* IOSQES 64 B, IOCQES 16 B */
#define NVME_CSTS_RDY 0x1
#define NVME_CSTS_CFS 0x2
#define NVME_CAP_MQES(cap) ((u32)((cap) & 0xffff))	/* 0-based */
#define NVME_CAP_TO(cap) (((cap) >> 24) & 0xff)		/* 500 ms units */
#define NVME_CAP_DSTRD(cap) ((u32)(((cap) >> 32) & 0xf)) /* doorbell stride 4 << DSTRD */
#define NVME_REGS_MAPPED 0x1000

/* Admin commands the module sends itself. */
#define NVME_ADMIN_DELETE_SQ 0x00
#define NVME_ADMIN_CREATE_SQ 0x01
#define NVME_ADMIN_DELETE_CQ 0x04
#define NVME_ADMIN_CREATE_CQ 0x05
#define NVME_FEAT_NUM_QUEUES 0x07
#define NVME_QUEUE_PHYS_CONTIG 0x1

/* The module's admin queue: one command at a time, so a few entries do. */
#define BAM_ADMIN_DEPTH 8u

static unsigned int max_map_mib = 65536;
module_param(max_map_mib, uint, 0444);
MODULE_PARM_DESC(max_map_mib, "Largest single DMA mapping in MiB (1..16777216, default 65536)");

static bool unprivileged;
module_param(unprivileged, bool, 0644);
MODULE_PARM_DESC(unprivileged,
		 "Waive CAP_SYS_RAWIO at open for controllers behind a translating IOMMU (default N)");

static unsigned int max_queues_per_file;
module_param(max_queues_per_file, uint, 0644);
MODULE_PARM_DESC(max_queues_per_file,
		 "I/O queue pairs one open file may hold (0, the default: as many as the controller has)");

static unsigned int admin_timeout_ms = 30000;
module_param(admin_timeout_ms, uint, 0444);
MODULE_PARM_DESC(admin_timeout_ms,
		 "How long the module waits for one admin command (1..600000 ms, default 30000)");

/* Pages pinned and mappings alive, over all controllers; both 0 at exit. */
static atomic64_t bam_pinned_pages = ATOMIC64_INIT(0);
static atomic64_t bam_live_mappings = ATOMIC64_INIT(0);

static dev_t bam_devt;
static DEFINE_IDA(bam_minor_ida);

/* The GPU hook; bam_gpu_lock protects the pointer, a module ref the ops. */
static DEFINE_MUTEX(bam_gpu_lock);
static const struct bam_gpu_ops *bam_gpu;

/* One bound controller. Freed by the release of @dev (last reference). */
struct bam_ctrl {
	struct pci_dev *pdev;
	struct device dev; /* /dev/bam-nvmeN; open files hold a reference */
	struct cdev cdev;
	int minor;
	resource_size_t bar0_start;
	resource_size_t bar0_len;
	void __iomem *regs; /* BAR0: registers and doorbells */
	bool iommu;	    /* bus addresses are translated IOVAs */
	/*
	 * lock serializes open/release, every ioctl that maps, unmaps or sends
	 * an admin command, and remove. It protects everything below.
	 */
	struct mutex lock;
	bool gone; /* removed from the driver: no more DMA or MMIO */
	struct list_head files; /* open files, oldest first */
	unsigned int nfiles;
	struct bam_file *exclusive; /* the file that owns the whole controller, or NULL */

	/* The module's admin queue, running when admin_up. */
	bool admin_up;
	struct nvme_sqe_raw *asq;
	struct nvme_cqe_raw *acq;
	dma_addr_t asq_dma, acq_dma;
	void *admin_buf; /* one page: data of the command in flight */
	dma_addr_t admin_buf_dma;
	u32 admin_depth;
	u16 asq_tail, acq_head, admin_cid;
	u8 acq_phase;
	u64 cap;
	u32 vs;
	u32 db_stride;	   /* bytes between doorbells: 4 << CAP.DSTRD */
	u32 nr_queues;	   /* I/O queue pairs the controller granted */
	u64 generation;	   /* moves on at every reset: queues of older ones are gone */
	unsigned long *qids; /* bit q: I/O queue pair q is held by a file */
	/* This controller's share of bam_pinned_pages and bam_live_mappings. */
	atomic64_t pinned_pages;
	atomic64_t mappings;
};

/* State of one open file: everything it mapped, the queue pairs it holds. */
struct bam_file {
	struct bam_ctrl *ctrl;
	struct list_head node; /* in ctrl->files */
	struct mm_struct *mm; /* opener's mm (grabbed): the only one allowed */
	pid_t tgid;	      /* for messages and the clients attribute */
	char comm[TASK_COMM_LEN];
	struct address_space *mapping; /* to revoke BAR mmaps at remove */
	struct xarray maps;   /* handle -> struct bam_mapping; ctrl->lock */
	struct xarray queues; /* qid -> struct bam_queue; ctrl->lock */
	unsigned int nqueues;
	bool bar_mapped;
};

/* Submission and completion queue entries as the module writes and reads them. */
struct nvme_sqe_raw {
	u8 opcode;
	u8 flags;
	__le16 cid;
	__le32 nsid;
	__le64 rsvd;
	__le64 mptr;
	__le64 prp1;
	__le64 prp2;
	__le32 cdw10[6];
};

struct nvme_cqe_raw {
	__le32 result;
	__le32 rsvd;
	__le16 sq_head;
	__le16 sq_id;
	__le16 cid;
	__le16 status; /* bit 0: phase */
};

enum bam_map_kind { BAM_MAP_HOST, BAM_MAP_DMABUF, BAM_MAP_GPU, BAM_MAP_COHERENT };

/*
 * Coherent allocations can outlive their handle: a process may UNMAP (or
 * close) while the memory is still mmap()ed. The handle and every VMA hold a
 * reference; the last one frees the memory.
 */
#define BAM_COHERENT_SHIFT 32 /* mmap offset of handle h: h << 32 */

struct bam_mapping {
	enum bam_map_kind kind;
	struct kref ref; /* BAM_MAP_COHERENT only */
	u64 length;	      /* bytes the handle covers */
	unsigned int queue_refs; /* queue pairs with a ring here: no UNMAP while > 0 */
	union {
		struct {
			struct page **pages;
			unsigned long npages;
			struct sg_table sgt;
		} host;
		struct {
			struct dma_buf *buf;
			struct dma_buf_attachment *attach;
			struct sg_table *sgt;
			u64 offset; /* of the mapped range in the buffer */
		} dmabuf;
		struct {
			const struct bam_gpu_ops *ops;
			void *priv;
			u64 *bus; /* bus address of each GPU page, for queue rings */
		} gpu;
		struct {
			struct bam_ctrl *ctrl; /* holds a reference on ctrl->dev */
			void *cpu;
			dma_addr_t dma;
			size_t size;
		} coherent;
	};
};

/* One I/O queue pair held by an open file. */
struct bam_queue {
	u16 qid;
	u64 generation; /* ctrl->generation at creation: a reset since ended it */
	struct bam_mapping *sq, *cq; /* their queue_refs count this pair */
};

/* Pinned pages and mappings are counted per controller and over all. */
static void bam_count_pins(struct bam_ctrl *ctrl, s64 delta)
{
	atomic64_add(delta, &ctrl->pinned_pages);
	atomic64_add(delta, &bam_pinned_pages);
}

static void bam_count_mappings(struct bam_ctrl *ctrl, s64 delta)
{
	atomic64_add(delta, &ctrl->mappings);
	atomic64_add(delta, &bam_live_mappings);
}

/* ---------------------------------------------------------------------- */
/* Sysfs: /sys/class/bam-nvme/{pinned_pages,mappings}                      */
/* ---------------------------------------------------------------------- */

#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 4, 0)
#define BAM_CLASS_CONST const
#else
#define BAM_CLASS_CONST
#endif

static ssize_t pinned_pages_show(BAM_CLASS_CONST struct class *c,
				 BAM_CLASS_CONST struct class_attribute *a, char *buf)
{
	return sysfs_emit(buf, "%lld\n", (long long)atomic64_read(&bam_pinned_pages));
}
static CLASS_ATTR_RO(pinned_pages);

static ssize_t mappings_show(BAM_CLASS_CONST struct class *c,
			     BAM_CLASS_CONST struct class_attribute *a, char *buf)
{
	return sysfs_emit(buf, "%lld\n", (long long)atomic64_read(&bam_live_mappings));
}
static CLASS_ATTR_RO(mappings);

static struct attribute *bam_class_attrs[] = {
	&class_attr_pinned_pages.attr,
	&class_attr_mappings.attr,
	NULL,
};
ATTRIBUTE_GROUPS(bam_class);

static struct class bam_class = {
	.name = "bam-nvme",
	.class_groups = bam_class_groups,
};

/* ---------------------------------------------------------------------- */
/* The GPU hook                                                            */
/* ---------------------------------------------------------------------- */

int bam_nvme_register_gpu(const struct bam_gpu_ops *ops)
{
	int ret = 0;

	mutex_lock(&bam_gpu_lock);
	if (bam_gpu)
		ret = -EBUSY;
	else
		bam_gpu = ops;
	mutex_unlock(&bam_gpu_lock);
	return ret;
}
EXPORT_SYMBOL_GPL(bam_nvme_register_gpu);

void bam_nvme_unregister_gpu(const struct bam_gpu_ops *ops)
{
	mutex_lock(&bam_gpu_lock);
	if (bam_gpu == ops)
		bam_gpu = NULL;
	mutex_unlock(&bam_gpu_lock);
}
EXPORT_SYMBOL_GPL(bam_nvme_unregister_gpu);

/* Take a reference on the GPU ops, or NULL if bam_nvme_gpu is not loaded. */
static const struct bam_gpu_ops *bam_gpu_get(void)
{
	const struct bam_gpu_ops *ops;

	mutex_lock(&bam_gpu_lock);
	ops = bam_gpu;
	if (ops && !try_module_get(ops->owner))
		ops = NULL;
	mutex_unlock(&bam_gpu_lock);
	return ops;
}

/* ---------------------------------------------------------------------- */
/* Mappings                                                                */
/* ---------------------------------------------------------------------- */

static u64 bam_max_map_bytes(void)
{
	return (u64)max_map_mib << 20;
}


/*
 * Write the bus address of every 4 KiB page of [skip, skip + npages * 4 KiB)
 * of a DMA-mapped table to @bus. Every DMA segment must be 4 KiB aligned.
 */
static int bam_sgt_to_bus(struct sg_table *sgt, u64 skip, u64 npages, u64 *bus)
{
	struct scatterlist *sg;
	u64 done = 0;
	unsigned int i;

	for_each_sgtable_dma_sg(sgt, sg, i) {
		dma_addr_t addr = sg_dma_address(sg);
		u64 len = sg_dma_len(sg);

		if (!IS_ALIGNED(addr, BAM_DMA_PAGE) || !IS_ALIGNED(len, BAM_DMA_PAGE))
			return -EINVAL;
		if (skip >= len) {
			skip -= len;
			continue;
		}
		addr += skip;
		len -= skip;
		skip = 0;
		for (; len != 0 && done < npages; len -= BAM_DMA_PAGE, addr += BAM_DMA_PAGE)
			bus[done++] = addr;
		if (done == npages)
			return 0;
	}
	return -EINVAL; /* the table is shorter than the range */
}

static void bam_coherent_release(struct kref *ref)
{
	struct bam_mapping *m = container_of(ref, struct bam_mapping, ref);
	struct bam_ctrl *ctrl = m->coherent.ctrl;

	dma_free_coherent(&ctrl->pdev->dev, m->coherent.size, m->coherent.cpu, m->coherent.dma);
	bam_count_mappings(ctrl, -1);
	put_device(&ctrl->dev); /* may free ctrl */
	kfree(m);
}

static void bam_mapping_free(struct bam_ctrl *ctrl, struct bam_mapping *m)
{
	struct device *dev = &ctrl->pdev->dev;

	switch (m->kind) {
	case BAM_MAP_COHERENT:
		/* VMAs may still hold it; the last reference frees it. */
		kref_put(&m->ref, bam_coherent_release);
		return;
	case BAM_MAP_HOST:
		dma_unmap_sgtable(dev, &m->host.sgt, DMA_BIDIRECTIONAL, 0);
		sg_free_table(&m->host.sgt);
		/* The controller may have written any page: mark them dirty. */
		unpin_user_pages_dirty_lock(m->host.pages, m->host.npages, true);
		bam_count_pins(ctrl, -(s64)m->host.npages);
		kvfree(m->host.pages);
		break;
	case BAM_MAP_DMABUF:
		dma_resv_lock(m->dmabuf.buf->resv, NULL);
		dma_buf_unmap_attachment(m->dmabuf.attach, m->dmabuf.sgt, DMA_BIDIRECTIONAL);
		dma_buf_unpin(m->dmabuf.attach);
		dma_resv_unlock(m->dmabuf.buf->resv);
		dma_buf_detach(m->dmabuf.buf, m->dmabuf.attach);
		dma_buf_put(m->dmabuf.buf);
		break;
	case BAM_MAP_GPU:
		m->gpu.ops->unmap(ctrl->pdev, m->gpu.priv);
		module_put(m->gpu.ops->owner);
		kvfree(m->gpu.bus);
		break;
	}
	bam_count_mappings(ctrl, -1);
	kfree(m);
}

static int bam_map_host(struct bam_ctrl *ctrl, const struct bam_kmod_map_host *req,
			u64 npages4k, u64 *bus, struct bam_mapping **out)
{
	unsigned long npages = req->length >> PAGE_SHIFT;
	unsigned long pinned = 0;
	struct bam_mapping *m;
	int ret;

	/* A CPU page larger than 4 KiB must be whole. */
	if (!PAGE_ALIGNED(req->vaddr) || !PAGE_ALIGNED(req->length))
		return -EINVAL;
	m = kzalloc(sizeof(*m), GFP_KERNEL);
	if (!m)
		return -ENOMEM;
	m->kind = BAM_MAP_HOST;
	m->host.pages = kvmalloc_array(npages, sizeof(struct page *), GFP_KERNEL);
	if (!m->host.pages) {
		ret = -ENOMEM;
		goto err_free;
	}
	while (pinned < npages) {
		int n = (int)min_t(unsigned long, npages - pinned, INT_MAX >> 1);

		ret = pin_user_pages_fast(req->vaddr + (pinned << PAGE_SHIFT), n,
					  FOLL_WRITE | FOLL_LONGTERM, m->host.pages + pinned);
		if (ret <= 0) {
			ret = ret ? ret : -EFAULT;
			goto err_unpin;
		}
		pinned += ret;
		bam_count_pins(ctrl, ret);
	}
	m->host.npages = npages;
	m->length = req->length;
	ret = sg_alloc_table_from_pages(&m->host.sgt, m->host.pages, npages, 0, req->length,
					GFP_KERNEL);
	if (ret)
		goto err_unpin;
	ret = dma_map_sgtable(&ctrl->pdev->dev, &m->host.sgt, DMA_BIDIRECTIONAL, 0);
	if (ret)
		goto err_table;
	ret = bam_sgt_to_bus(&m->host.sgt, 0, npages4k, bus);
	if (ret)
		goto err_dma;
	bam_count_mappings(ctrl, 1);
	*out = m;
	return 0;

err_dma:
	dma_unmap_sgtable(&ctrl->pdev->dev, &m->host.sgt, DMA_BIDIRECTIONAL, 0);
err_table:
	sg_free_table(&m->host.sgt);
err_unpin:
	unpin_user_pages(m->host.pages, pinned);
	bam_count_pins(ctrl, -(s64)pinned);
	kvfree(m->host.pages);
err_free:
	kfree(m);
	return ret;
}

/*
 * The exporter wants to move the buffer. It never should: the attachment is
 * pinned. Nothing can be done safely here except say so.
 */
static void bam_dmabuf_move_notify(struct dma_buf_attachment *attach)
{
	pr_err_ratelimited("dma-buf exporter moved a pinned buffer; its bus addresses are stale\n");
}

static const struct dma_buf_attach_ops bam_importer_ops = {
	.allow_peer2peer = true, /* GPU memory is reached peer to peer */
	.move_notify = bam_dmabuf_move_notify,
};

static int bam_map_dmabuf(struct bam_ctrl *ctrl, const struct bam_kmod_map_dmabuf *req,
			  u64 npages4k, u64 *bus, struct bam_mapping **out)
{
	struct bam_mapping *m;
	struct dma_buf *buf;
	int ret;

	buf = dma_buf_get(req->fd);
	if (IS_ERR(buf))
		return PTR_ERR(buf);
	if (req->offset > buf->size || req->length > buf->size - req->offset) {
		ret = -EINVAL;
		goto err_put;
	}
	m = kzalloc(sizeof(*m), GFP_KERNEL);
	if (!m) {
		ret = -ENOMEM;
		goto err_put;
	}
	m->kind = BAM_MAP_DMABUF;
	m->dmabuf.buf = buf;
	m->dmabuf.offset = req->offset;
	m->length = req->length;
	m->dmabuf.attach = dma_buf_dynamic_attach(buf, &ctrl->pdev->dev, &bam_importer_ops, m);
	if (IS_ERR(m->dmabuf.attach)) {
		ret = PTR_ERR(m->dmabuf.attach);
		goto err_free;
	}
	dma_resv_lock(buf->resv, NULL);
	ret = dma_buf_pin(m->dmabuf.attach);
	if (ret)
		goto err_unlock;
	m->dmabuf.sgt = dma_buf_map_attachment(m->dmabuf.attach, DMA_BIDIRECTIONAL);
	if (IS_ERR(m->dmabuf.sgt)) {
		ret = PTR_ERR(m->dmabuf.sgt);
		goto err_unpin;
	}
	dma_resv_unlock(buf->resv);
	ret = bam_sgt_to_bus(m->dmabuf.sgt, req->offset, npages4k, bus);
	if (ret)
		goto err_unmap;
	bam_count_mappings(ctrl, 1);
	*out = m;
	return 0;

err_unmap:
	dma_resv_lock(buf->resv, NULL);
	dma_buf_unmap_attachment(m->dmabuf.attach, m->dmabuf.sgt, DMA_BIDIRECTIONAL);
err_unpin:
	dma_buf_unpin(m->dmabuf.attach);
err_unlock:
	dma_resv_unlock(buf->resv);
	if (!IS_ERR(m->dmabuf.attach))
		dma_buf_detach(buf, m->dmabuf.attach);
err_free:
	kfree(m);
err_put:
	dma_buf_put(buf);
	return ret;
}

static int bam_map_gpu(struct bam_ctrl *ctrl, const struct bam_kmod_map_gpu *req, u64 *bus,
		       struct bam_mapping **out)
{
	const struct bam_gpu_ops *ops = bam_gpu_get();
	struct bam_mapping *m;
	u64 i, per_gpu_page;
	int ret;

	if (!ops)
		return -EOPNOTSUPP;
	m = kzalloc(sizeof(*m), GFP_KERNEL);
	if (!m) {
		ret = -ENOMEM;
		goto err_put;
	}
	m->kind = BAM_MAP_GPU;
	m->gpu.ops = ops;
	m->length = req->length;
	/* One bus address per GPU page (each is contiguous) to place queue rings. */
	per_gpu_page = BAM_KMOD_GPU_PAGE_SIZE / BAM_DMA_PAGE;
	m->gpu.bus = kvmalloc_array(req->length / BAM_KMOD_GPU_PAGE_SIZE, sizeof(u64), GFP_KERNEL);
	if (!m->gpu.bus) {
		ret = -ENOMEM;
		goto err_free;
	}
	ret = ops->map(ctrl->pdev, req->vaddr, req->length, bus, &m->gpu.priv);
	if (ret)
		goto err_free;
	for (i = 0; i < req->length / BAM_KMOD_GPU_PAGE_SIZE; i++)
		m->gpu.bus[i] = bus[i * per_gpu_page];
	bam_count_mappings(ctrl, 1);
	*out = m;
	return 0;

err_free:
	kvfree(m->gpu.bus);
	kfree(m);
err_put:
	module_put(ops->owner);
	return ret;
}

/* BAM_KMOD_IOC_ALLOC. Caller holds ctrl->lock. */
static long bam_ioctl_alloc(struct bam_file *f, void __user *arg)
{
	struct bam_ctrl *ctrl = f->ctrl;
	struct bam_kmod_alloc req;
	struct bam_mapping *m;
	u32 handle;
	int ret;

	if (copy_from_user(&req, arg, sizeof(req)))
		return -EFAULT;
	ret = bam_check_alloc(&req, PAGE_SIZE);
	if (ret)
		return ret;
	m = kzalloc(sizeof(*m), GFP_KERNEL);
	if (!m)
		return -ENOMEM;
	m->kind = BAM_MAP_COHERENT;
	kref_init(&m->ref);
	m->length = req.length;
	m->coherent.size = req.length;
	m->coherent.cpu = dma_alloc_coherent(&ctrl->pdev->dev, req.length, &m->coherent.dma,
					     GFP_KERNEL);
	if (!m->coherent.cpu) {
		kfree(m);
		return -ENOMEM;
	}
	m->coherent.ctrl = ctrl;
	get_device(&ctrl->dev);
	bam_count_mappings(ctrl, 1);
	ret = xa_alloc(&f->maps, &handle, m, xa_limit_32b, GFP_KERNEL);
	if (ret) {
		kref_put(&m->ref, bam_coherent_release);
		return ret;
	}
	req.handle = handle;
	req.bus_addr = m->coherent.dma;
	req.mmap_offset = (u64)handle << BAM_COHERENT_SHIFT;
	if (copy_to_user(arg, &req, sizeof(req))) {
		xa_erase(&f->maps, handle);
		kref_put(&m->ref, bam_coherent_release);
		return -EFAULT;
	}
	return 0;
}

/* ---------------------------------------------------------------------- */
/* The controller and the module's admin queue                             */
/* ---------------------------------------------------------------------- */

static void __iomem *bam_doorbell(struct bam_ctrl *ctrl, u32 qid, bool cq)
{
	return ctrl->regs + NVME_REG_DBS + (2 * qid + (cq ? 1 : 0)) * ctrl->db_stride;
}

/* Wait (CAP.TO at most) until CSTS.RDY reads @rdy. */
static int bam_ctrl_wait_rdy(struct bam_ctrl *ctrl, u32 rdy)
{
	u64 cap = lo_hi_readq(ctrl->regs + NVME_REG_CAP);
	unsigned long deadline = jiffies + msecs_to_jiffies((NVME_CAP_TO(cap) + 1) * 500);
	u32 csts;

	for (;;) {
		csts = readl(ctrl->regs + NVME_REG_CSTS);
		if (csts == ~0u)
			return -ENODEV;
		if (rdy && (csts & NVME_CSTS_CFS))
			return -EIO;
		if ((csts & NVME_CSTS_RDY) == rdy)
			return 0;
		if (time_after(jiffies, deadline))
			return -ETIMEDOUT;
		usleep_range(1000, 2000);
	}
}

/*
 * Stop the controller's DMA before memory it may target is unpinned: clear
 * CC.EN (a controller reset: it forgets every queue, the module's admin
 * queue included), wait for CSTS.RDY = 0 for at most CAP.TO, then turn bus
 * mastering off so that even a controller that ignores the reset cannot
 * write. Every queue pair of every file ends here (generation moves on).
 * Caller holds ctrl->lock.
 */
static void bam_ctrl_quiesce(struct bam_ctrl *ctrl)
{
	u32 cc = readl(ctrl->regs + NVME_REG_CC);

	if (cc == ~0u) {
		dev_warn(&ctrl->pdev->dev, "controller is gone (registers read all ones)\n");
	} else if (cc & NVME_CC_ENABLE) {
		writel(cc & ~NVME_CC_ENABLE, ctrl->regs + NVME_REG_CC);
		if (bam_ctrl_wait_rdy(ctrl, 0))
			dev_warn(&ctrl->pdev->dev, "controller did not reset in time\n");
	}
	pci_clear_master(ctrl->pdev);
	ctrl->admin_up = false;
	ctrl->generation++;
}

/*
 * Run one admin command on the module's queue and wait for it (polled: the
 * module takes no interrupts). Returns 0 with the completion's status field
 * (phase bit dropped) in *status, or -errno when it did not complete; the
 * controller may then still act on it, so it is reset, which ends every
 * queue pair. Caller holds ctrl->lock.
 */
static int bam_admin_exec(struct bam_ctrl *ctrl, struct nvme_sqe_raw *cmd, u32 timeout_ms,
			  u32 *result, u16 *status)
{
	struct nvme_cqe_raw *cqe;
	unsigned long deadline;
	u16 cid, st;
	u32 csts;
	int ret;

	if (!ctrl->admin_up)
		return -EIO;
	cid = ++ctrl->admin_cid;
	cmd->cid = cpu_to_le16(cid);
	memcpy(&ctrl->asq[ctrl->asq_tail], cmd, sizeof(*cmd));
	ctrl->asq_tail = (ctrl->asq_tail + 1) % ctrl->admin_depth;
	/* writel orders the entry (coherent memory) before the doorbell. */
	writel(ctrl->asq_tail, bam_doorbell(ctrl, 0, false));
	deadline = jiffies + msecs_to_jiffies(timeout_ms);
	for (;;) {
		cqe = &ctrl->acq[ctrl->acq_head];
		if ((le16_to_cpu(READ_ONCE(cqe->status)) & 1) == ctrl->acq_phase)
			break;
		csts = readl(ctrl->regs + NVME_REG_CSTS);
		if (csts == ~0u || (csts & NVME_CSTS_CFS)) {
			ret = csts == ~0u ? -ENODEV : -EIO;
			goto err_reset;
		}
		if (time_after(jiffies, deadline)) {
			ret = -ETIMEDOUT;
			goto err_reset;
		}
		usleep_range(20, 200);
	}
	dma_rmb(); /* the entry after its phase bit */
	st = le16_to_cpu(cqe->status) >> 1;
	*result = le32_to_cpu(cqe->result);
	if (le16_to_cpu(cqe->cid) != cid) {
		ret = -EIO;
		goto err_reset;
	}
	if (++ctrl->acq_head == ctrl->admin_depth) {
		ctrl->acq_head = 0;
		ctrl->acq_phase ^= 1;
	}
	writel(ctrl->acq_head, bam_doorbell(ctrl, 0, true));
	*status = st;
	return 0;

err_reset:
	dev_err(&ctrl->pdev->dev, "admin command %#x %s (%d): resetting the controller, every queue pair ends\n",
		cmd->opcode, ret == -ETIMEDOUT ? "timed out" : "failed", ret);
	bam_ctrl_quiesce(ctrl);
	return ret;
}

/* I/O queue pairs whose doorbells BAR0 has room for. */
static u32 bam_doorbell_room(struct bam_ctrl *ctrl)
{
	u64 pairs = (ctrl->bar0_len - NVME_REG_DBS) / (2 * (u64)ctrl->db_stride);

	return pairs > 1 ? (u32)min_t(u64, pairs - 1, BAM_ARGS_MAX_QID) : 0;
}

/* Bytes of the doorbell mapping: every I/O queue pair's, whole pages. */
static u32 bam_doorbell_bytes(struct bam_ctrl *ctrl)
{
	u64 want = PAGE_ALIGN((u64)2 * (ctrl->nr_queues + 1) * ctrl->db_stride);
	u64 room = PAGE_ALIGN(ctrl->bar0_len) - NVME_REG_DBS;

	return (u32)min(want, room);
}

/*
 * Bring the controller up with the module's admin queue: reset, admin queue
 * registers, enable, and Set Features (Number of Queues) for as many I/O
 * queue pairs as the controller gives. Caller holds ctrl->lock.
 */
static int bam_ctrl_start(struct bam_ctrl *ctrl)
{
	struct nvme_sqe_raw cmd = {};
	u32 result, want;
	u16 status;
	int ret;

	ctrl->cap = lo_hi_readq(ctrl->regs + NVME_REG_CAP);
	ctrl->vs = readl(ctrl->regs + NVME_REG_VS);
	if ((u32)ctrl->cap == ~0u)
		return -ENODEV;
	ctrl->db_stride = 4u << NVME_CAP_DSTRD(ctrl->cap);
	bam_ctrl_quiesce(ctrl);
	if (readl(ctrl->regs + NVME_REG_CSTS) & NVME_CSTS_RDY)
		return -ETIMEDOUT;
	want = bam_doorbell_room(ctrl);
	if (want == 0)
		return -ENODEV;
	ctrl->admin_depth = min_t(u32, BAM_ADMIN_DEPTH, NVME_CAP_MQES(ctrl->cap) + 1);
	memset(ctrl->asq, 0, PAGE_SIZE);
	memset(ctrl->acq, 0, PAGE_SIZE);
	ctrl->asq_tail = 0;
	ctrl->acq_head = 0;
	ctrl->acq_phase = 1;
	writel(((ctrl->admin_depth - 1) << 16) | (ctrl->admin_depth - 1), ctrl->regs + NVME_REG_AQA);
	lo_hi_writeq(ctrl->asq_dma, ctrl->regs + NVME_REG_ASQ);
	lo_hi_writeq(ctrl->acq_dma, ctrl->regs + NVME_REG_ACQ);
	pci_set_master(ctrl->pdev);
	writel(NVME_CC_ENTRY_SIZES | NVME_CC_ENABLE, ctrl->regs + NVME_REG_CC);
	ret = bam_ctrl_wait_rdy(ctrl, 1);
	if (ret)
		goto err;
	ctrl->admin_up = true;

	cmd.opcode = BAM_ADMIN_SET_FEATURES;
	cmd.cdw10[0] = cpu_to_le32(NVME_FEAT_NUM_QUEUES);
	cmd.cdw10[1] = cpu_to_le32(((want - 1) << 16) | (want - 1)); /* NCQR, NSQR: 0-based */
	ret = bam_admin_exec(ctrl, &cmd, admin_timeout_ms, &result, &status);
	if (ret)
		return ret; /* reset already */
	if (status) {
		dev_err(&ctrl->pdev->dev, "Set Features (Number of Queues) failed: status %#x\n", status);
		ret = -EIO;
		goto err;
	}
	ctrl->nr_queues = min3(want, (result & 0xffff) + 1, (result >> 16) + 1);
	return 0;

err:
	bam_ctrl_quiesce(ctrl);
	return ret;
}

/* The module's admin queue running, or why not. Caller holds ctrl->lock. */
static int bam_ctrl_ensure_up(struct bam_ctrl *ctrl)
{
	int ret;

	if (ctrl->admin_up)
		return 0;
	if (ctrl->exclusive)
		return -EBUSY;
	ret = bam_ctrl_start(ctrl);
	if (ret) {
		dev_err_ratelimited(&ctrl->pdev->dev, "bring-up failed (%d)\n", ret);
		return ret == -ENODEV ? -ENODEV : -EIO;
	}
	return 0;
}

/* ---------------------------------------------------------------------- */
/* I/O queue pairs                                                         */
/* ---------------------------------------------------------------------- */

/*
 * Bus address of [off, off + len) of DMA-mapped table @sgt, if that range is
 * one run of bus addresses.
 */
static int bam_sgt_contig(struct sg_table *sgt, u64 off, u64 len, dma_addr_t *out)
{
	struct scatterlist *sg;
	dma_addr_t next = 0;
	bool started = false;
	unsigned int i;

	for_each_sgtable_dma_sg(sgt, sg, i) {
		dma_addr_t addr = sg_dma_address(sg);
		u64 seg = sg_dma_len(sg);

		if (!started) {
			if (off >= seg) {
				off -= seg;
				continue;
			}
			addr += off;
			seg -= off;
			*out = addr;
			started = true;
		} else if (addr != next) {
			return -EINVAL;
		}
		if (len <= seg)
			return 0;
		len -= seg;
		next = addr + seg;
	}
	return -EINVAL;
}

/* Bus address of [off, off + len) of mapping @m, if it is one run of bus addresses there. */
static int bam_mapping_contig(struct bam_mapping *m, u64 off, u64 len, dma_addr_t *out)
{
	u64 first, last, i;

	if (off > m->length || len > m->length - off)
		return -EINVAL;
	switch (m->kind) {
	case BAM_MAP_COHERENT:
		*out = m->coherent.dma + off;
		return 0;
	case BAM_MAP_HOST:
		return bam_sgt_contig(&m->host.sgt, off, len, out);
	case BAM_MAP_DMABUF:
		return bam_sgt_contig(m->dmabuf.sgt, m->dmabuf.offset + off, len, out);
	case BAM_MAP_GPU:
		first = off / BAM_KMOD_GPU_PAGE_SIZE;
		last = (off + len - 1) / BAM_KMOD_GPU_PAGE_SIZE;
		for (i = first + 1; i <= last; i++)
			if (m->gpu.bus[i] != m->gpu.bus[first] + (i - first) * BAM_KMOD_GPU_PAGE_SIZE)
				return -EINVAL;
		*out = m->gpu.bus[first] + off % BAM_KMOD_GPU_PAGE_SIZE;
		return 0;
	}
	return -EINVAL;
}

static u32 bam_queues_per_file(struct bam_ctrl *ctrl)
{
	u32 limit = READ_ONCE(max_queues_per_file);

	return limit && limit < ctrl->nr_queues ? limit : ctrl->nr_queues;
}

static u32 bam_queues_free(struct bam_ctrl *ctrl)
{
	u32 held = bitmap_weight(ctrl->qids, ctrl->nr_queues + 1);

	return held < ctrl->nr_queues ? ctrl->nr_queues - held : 0;
}

/* "Invalid Queue Identifier": the controller does not have that queue. */
#define NVME_SC_INVALID_QID 0x101

/*
 * Delete I/O SQ or CQ @qid and wait for it. A controller that refuses for
 * any reason but not having the queue is reset: after this call it does no
 * DMA for @qid either way. Caller holds ctrl->lock.
 */
static void bam_delete_queue(struct bam_ctrl *ctrl, u8 opcode, u16 qid)
{
	struct nvme_sqe_raw cmd = {};
	u32 result;
	u16 status;

	if (!ctrl->admin_up)
		return; /* reset since: the controller forgot the queue */
	cmd.opcode = opcode;
	cmd.cdw10[0] = cpu_to_le32(qid);
	if (bam_admin_exec(ctrl, &cmd, admin_timeout_ms, &result, &status))
		return; /* reset */
	if (status && (status & 0x7ff) != NVME_SC_INVALID_QID) {
		dev_err(&ctrl->pdev->dev, "Delete I/O %s %u failed (status %#x): resetting the controller\n",
			opcode == NVME_ADMIN_DELETE_SQ ? "SQ" : "CQ", qid, status);
		bam_ctrl_quiesce(ctrl);
	}
}

/*
 * End queue pair @q of @f: Delete I/O SQ (the controller completes or aborts
 * every command it took from it), then the CQ, and only then let go of the
 * ring memory. Caller holds ctrl->lock.
 */
static void bam_queue_destroy(struct bam_file *f, struct bam_queue *q)
{
	struct bam_ctrl *ctrl = f->ctrl;

	if (!ctrl->gone && q->generation == ctrl->generation) {
		bam_delete_queue(ctrl, NVME_ADMIN_DELETE_SQ, q->qid);
		if (q->generation == ctrl->generation)
			bam_delete_queue(ctrl, NVME_ADMIN_DELETE_CQ, q->qid);
	}
	xa_erase(&f->queues, q->qid);
	q->sq->queue_refs--;
	q->cq->queue_refs--;
	clear_bit(q->qid, ctrl->qids);
	f->nqueues--;
	kfree(q);
}

/* End every queue pair of @f. Caller holds ctrl->lock. */
static void bam_file_end_queues(struct bam_file *f)
{
	struct bam_queue *q;
	unsigned long qid;

	xa_for_each(&f->queues, qid, q)
		bam_queue_destroy(f, q);
}

/* Undo every mapping of @f; its queues are gone. Caller holds ctrl->lock. */
static void bam_file_unmap_all(struct bam_file *f)
{
	struct bam_mapping *m;
	unsigned long handle;

	xa_for_each(&f->maps, handle, m) {
		xa_erase(&f->maps, handle);
		bam_mapping_free(f->ctrl, m);
	}
}

static void bam_queue_counts(struct bam_file *f, struct bam_kmod_queue_create *r)
{
	r->queues_total = f->ctrl->nr_queues;
	r->queues_free = bam_queues_free(f->ctrl);
	r->queues_held = f->nqueues;
	r->queues_per_file = bam_queues_per_file(f->ctrl);
}

/* Create the CQ, then the SQ, of pair @qid. 0, an NVMe status (> 0), or -errno. */
static int bam_create_pair(struct bam_ctrl *ctrl, u16 qid, u32 depth, dma_addr_t sq_bus, dma_addr_t cq_bus)
{
	struct nvme_sqe_raw cmd = {};
	u32 result;
	u16 status;
	int ret;

	cmd.opcode = NVME_ADMIN_CREATE_CQ;
	cmd.prp1 = cpu_to_le64(cq_bus);
	cmd.cdw10[0] = cpu_to_le32(((depth - 1) << 16) | qid);
	cmd.cdw10[1] = cpu_to_le32(NVME_QUEUE_PHYS_CONTIG); /* IEN = 0: the user polls */
	ret = bam_admin_exec(ctrl, &cmd, admin_timeout_ms, &result, &status);
	if (ret || status)
		return ret ? ret : status;
	memset(&cmd, 0, sizeof(cmd));
	cmd.opcode = NVME_ADMIN_CREATE_SQ;
	cmd.prp1 = cpu_to_le64(sq_bus);
	cmd.cdw10[0] = cpu_to_le32(((depth - 1) << 16) | qid);
	cmd.cdw10[1] = cpu_to_le32(((u32)qid << 16) | NVME_QUEUE_PHYS_CONTIG);
	ret = bam_admin_exec(ctrl, &cmd, admin_timeout_ms, &result, &status);
	if (ret)
		return ret; /* reset: the CQ is gone too */
	if (status)
		bam_delete_queue(ctrl, NVME_ADMIN_DELETE_CQ, qid);
	return status;
}

/* BAM_KMOD_IOC_QUEUE_CREATE. Caller holds ctrl->lock. */
static long bam_ioctl_queue_create(struct bam_file *f, void __user *arg)
{
	struct bam_ctrl *ctrl = f->ctrl;
	struct bam_kmod_queue_create req;
	struct bam_mapping *sqm, *cqm;
	dma_addr_t sq_bus, cq_bus;
	struct bam_queue *q;
	unsigned long qid;
	int ret;

	if (copy_from_user(&req, arg, sizeof(req)))
		return -EFAULT;
	if (ctrl->exclusive)
		return -EBUSY;
	ret = bam_ctrl_ensure_up(ctrl);
	if (ret)
		return ret;
	ret = bam_check_queue_create(&req, NVME_CAP_MQES(ctrl->cap) + 1);
	if (ret)
		return ret;
	sqm = xa_load(&f->maps, req.sq_handle);
	cqm = xa_load(&f->maps, req.cq_handle);
	if (!sqm || !cqm ||
	    bam_mapping_contig(sqm, req.sq_offset, (u64)req.depth * sizeof(struct nvme_sqe_raw), &sq_bus) ||
	    bam_mapping_contig(cqm, req.cq_offset, (u64)req.depth * sizeof(struct nvme_cqe_raw), &cq_bus))
		return -EINVAL;
	qid = find_next_zero_bit(ctrl->qids, ctrl->nr_queues + 1, 1);
	if (qid > ctrl->nr_queues)
		ret = -ENOSPC;
	else if (f->nqueues >= bam_queues_per_file(ctrl))
		ret = -EDQUOT;
	if (ret) {
		bam_queue_counts(f, &req);
		return copy_to_user(arg, &req, sizeof(req)) ? -EFAULT : ret;
	}
	q = kzalloc(sizeof(*q), GFP_KERNEL);
	if (!q)
		return -ENOMEM;
	q->qid = qid;
	q->sq = sqm;
	q->cq = cqm;
	ret = xa_insert(&f->queues, qid, q, GFP_KERNEL);
	if (ret) {
		kfree(q);
		return ret;
	}
	ret = bam_create_pair(ctrl, qid, req.depth, sq_bus, cq_bus);
	if (ret) {
		xa_erase(&f->queues, qid);
		kfree(q);
		if (ret < 0)
			return ret;
		req.nvme_status = ret;
		bam_queue_counts(f, &req);
		return copy_to_user(arg, &req, sizeof(req)) ? -EFAULT : -EIO;
	}
	q->generation = ctrl->generation;
	set_bit(qid, ctrl->qids);
	sqm->queue_refs++;
	cqm->queue_refs++;
	f->nqueues++;
	req.qid = qid;
	req.sq_doorbell = NVME_REG_DBS + 2 * qid * ctrl->db_stride;
	req.cq_doorbell = req.sq_doorbell + ctrl->db_stride;
	req.nvme_status = 0;
	bam_queue_counts(f, &req);
	if (copy_to_user(arg, &req, sizeof(req))) {
		bam_queue_destroy(f, q);
		return -EFAULT;
	}
	return 0;
}

/* BAM_KMOD_IOC_ADMIN. Caller holds ctrl->lock. */
static long bam_ioctl_admin(struct bam_file *f, void __user *arg)
{
	struct bam_ctrl *ctrl = f->ctrl;
	struct bam_kmod_admin req;
	struct nvme_sqe_raw cmd = {};
	void __user *data;
	u16 status;
	u32 result;
	int ret;

	if (copy_from_user(&req, arg, sizeof(req)))
		return -EFAULT;
	ret = bam_check_admin(&req);
	if (ret < 0)
		return ret;
	if (ret == BAM_ADMIN_DESTRUCTIVE) {
		if (!capable(CAP_SYS_ADMIN))
			return -EPERM;
		if (ctrl->nfiles > 1)
			return -EBUSY; /* others use the device */
	}
	if (ctrl->exclusive)
		return -EBUSY;
	ret = bam_ctrl_ensure_up(ctrl);
	if (ret)
		return ret;
	data = u64_to_user_ptr(req.data);
	/* Never hand one file what the controller wrote for another. */
	memset(ctrl->admin_buf, 0, PAGE_SIZE);
	if (req.data_len && (req.opcode & 1) && copy_from_user(ctrl->admin_buf, data, req.data_len))
		return -EFAULT;
	cmd.opcode = req.opcode;
	cmd.nsid = cpu_to_le32(req.nsid);
	/* Every command that moves data moves it here (at most one page, checked). */
	cmd.prp1 = cpu_to_le64(ctrl->admin_buf_dma);
	cmd.cdw10[0] = cpu_to_le32(req.cdw10);
	cmd.cdw10[1] = cpu_to_le32(req.cdw11);
	cmd.cdw10[2] = cpu_to_le32(req.cdw12);
	cmd.cdw10[3] = cpu_to_le32(req.cdw13);
	cmd.cdw10[4] = cpu_to_le32(req.cdw14);
	cmd.cdw10[5] = cpu_to_le32(req.cdw15);
	ret = bam_admin_exec(ctrl, &cmd, req.timeout_ms ? req.timeout_ms : admin_timeout_ms, &result,
			     &status);
	if (ret)
		return ret;
	req.result = result;
	req.status = status;
	if (req.data_len && (req.opcode & 2) && copy_to_user(data, ctrl->admin_buf, req.data_len))
		return -EFAULT;
	return copy_to_user(arg, &req, sizeof(req)) ? -EFAULT : 0;
}

/* BAM_KMOD_IOC_CTRL_INFO. Caller holds ctrl->lock. */
static long bam_ioctl_ctrl_info(struct bam_file *f, void __user *arg)
{
	struct bam_ctrl *ctrl = f->ctrl;
	struct bam_kmod_ctrl_info r = {};
	int ret;

	r.files = ctrl->nfiles;
	r.max_admin_data = BAM_KMOD_MAX_ADMIN_DATA;
	if (ctrl->exclusive == f) {
		r.flags = BAM_KMOD_CTRL_EXCLUSIVE;
		r.cap = lo_hi_readq(ctrl->regs + NVME_REG_CAP);
		r.vs = readl(ctrl->regs + NVME_REG_VS);
	} else {
		ret = bam_ctrl_ensure_up(ctrl);
		if (ret)
			return ret;
		r.flags = BAM_KMOD_CTRL_UP;
		r.cap = ctrl->cap;
		r.vs = ctrl->vs;
		r.queues_total = ctrl->nr_queues;
		r.queues_free = bam_queues_free(ctrl);
		r.queues_held = f->nqueues;
		r.queues_per_file = bam_queues_per_file(ctrl);
		r.doorbell_bytes = bam_doorbell_bytes(ctrl);
	}
	return copy_to_user(arg, &r, sizeof(r)) ? -EFAULT : 0;
}

/*
 * BAM_KMOD_IOC_EXCLUSIVE: hand @f the whole controller. The module's admin
 * queue stops (reset); the file brings the controller up itself. Caller
 * holds ctrl->lock.
 */
static long bam_ioctl_exclusive(struct bam_file *f)
{
	struct bam_ctrl *ctrl = f->ctrl;

	if (ctrl->exclusive == f)
		return 0;
	if (ctrl->nfiles > 1 || f->nqueues)
		return -EBUSY;
	bam_ctrl_quiesce(ctrl);
	pci_set_master(ctrl->pdev);
	ctrl->exclusive = f;
	return 0;
}

/* ---------------------------------------------------------------------- */
/* File operations                                                         */
/* ---------------------------------------------------------------------- */

/* Only the process that opened the file may use it (not a fork child, not
 * a process the fd was passed to). */
static int bam_check_owner(struct bam_file *f)
{
	if (current->mm != f->mm) {
		pr_debug("pid %d used a file opened by pid %d\n", task_tgid_nr(current), f->tgid);
		return -EACCES;
	}
	return 0;
}

static int bam_open(struct inode *inode, struct file *file)
{
	struct bam_ctrl *ctrl = container_of(inode->i_cdev, struct bam_ctrl, cdev);
	struct bam_file *f;
	int ret = 0;

	if (!current->mm)
		return -EINVAL;
	if (!capable(CAP_SYS_RAWIO) && !(unprivileged && ctrl->iommu))
		return -EPERM;
	f = kzalloc(sizeof(*f), GFP_KERNEL);
	if (!f)
		return -ENOMEM;
	xa_init_flags(&f->maps, XA_FLAGS_ALLOC1);
	xa_init(&f->queues);
	f->ctrl = ctrl;
	f->tgid = task_tgid_nr(current);
	get_task_comm(f->comm, current);
	f->mapping = file->f_mapping;

	mutex_lock(&ctrl->lock);
	if (ctrl->gone)
		ret = -ENODEV;
	else if (ctrl->exclusive)
		ret = -EBUSY; /* one file owns the whole controller */
	if (ret) {
		mutex_unlock(&ctrl->lock);
		kfree(f);
		return ret;
	}
	list_add_tail(&f->node, &ctrl->files);
	ctrl->nfiles++;
	mutex_unlock(&ctrl->lock);

	mmgrab(current->mm);
	f->mm = current->mm;
	get_device(&ctrl->dev);
	file->private_data = f;
	return 0;
}

static int bam_release(struct inode *inode, struct file *file)
{
	struct bam_file *f = file->private_data;
	struct bam_ctrl *ctrl = f->ctrl;

	mutex_lock(&ctrl->lock);
	if (!ctrl->gone) {
		if (ctrl->exclusive == f) {
			/* The file ran the controller: stop it; the next user brings it up. */
			bam_ctrl_quiesce(ctrl);
			ctrl->exclusive = NULL;
		} else {
			bam_file_end_queues(f); /* before the rings and buffers go */
		}
		bam_file_unmap_all(f);
	}
	WARN_ON(!xa_empty(&f->maps));
	WARN_ON(!xa_empty(&f->queues));
	list_del(&f->node);
	ctrl->nfiles--;
	mutex_unlock(&ctrl->lock);

	xa_destroy(&f->maps);
	xa_destroy(&f->queues);
	mmdrop(f->mm);
	put_device(&ctrl->dev);
	kfree(f);
	return 0;
}

static vm_fault_t bam_bar_fault(struct vm_fault *vmf)
{
	/* Only after remove() revoked the mapping. */
	return VM_FAULT_SIGBUS;
}

static const struct vm_operations_struct bam_bar_vm_ops = {
	.fault = bam_bar_fault,
};

static void bam_coherent_vm_open(struct vm_area_struct *vma)
{
	struct bam_mapping *m = vma->vm_private_data;

	kref_get(&m->ref);
}

static void bam_coherent_vm_close(struct vm_area_struct *vma)
{
	struct bam_mapping *m = vma->vm_private_data;

	kref_put(&m->ref, bam_coherent_release);
}

static const struct vm_operations_struct bam_coherent_vm_ops = {
	.open = bam_coherent_vm_open,
	.close = bam_coherent_vm_close,
	.fault = bam_bar_fault,
};

static void bam_vma_flags(struct vm_area_struct *vma)
{
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 3, 0)
	vm_flags_set(vma, VM_IO | VM_DONTCOPY | VM_DONTEXPAND | VM_DONTDUMP);
#else
	vma->vm_flags |= VM_IO | VM_DONTCOPY | VM_DONTEXPAND | VM_DONTDUMP;
#endif
}

/* A read-only mapping stays read-only (no mprotect to writable). */
static void bam_vma_read_only(struct vm_area_struct *vma)
{
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 3, 0)
	vm_flags_clear(vma, VM_MAYWRITE);
#else
	vma->vm_flags &= ~VM_MAYWRITE;
#endif
}

/* mmap of a coherent allocation: offset = handle << 32. Caller holds ctrl->lock. */
static int bam_mmap_coherent(struct bam_file *f, struct vm_area_struct *vma)
{
	const unsigned long shift = BAM_COHERENT_SHIFT - PAGE_SHIFT;
	unsigned long size = vma->vm_end - vma->vm_start;
	unsigned long handle = vma->vm_pgoff >> shift;
	struct bam_mapping *m;
	int ret;

	if (vma->vm_pgoff & ((1ul << shift) - 1))
		return -EINVAL;
	m = xa_load(&f->maps, handle);
	if (!m || m->kind != BAM_MAP_COHERENT || size > m->coherent.size)
		return -EINVAL;
	bam_vma_flags(vma);
	/* dma_mmap_coherent() wants the offset inside the buffer in vm_pgoff. */
	vma->vm_pgoff = 0;
	ret = dma_mmap_coherent(&f->ctrl->pdev->dev, vma, m->coherent.cpu, m->coherent.dma, size);
	vma->vm_pgoff = handle << shift;
	if (ret)
		return ret;
	vma->vm_private_data = m;
	vma->vm_ops = &bam_coherent_vm_ops;
	kref_get(&m->ref);
	return 0;
}

static int bam_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct bam_file *f = file->private_data;
	struct bam_ctrl *ctrl = f->ctrl;
	unsigned long size = vma->vm_end - vma->vm_start;
	u64 off;
	int ret;

	ret = bam_check_owner(f);
	if (ret)
		return ret;
	if (!(vma->vm_flags & VM_SHARED))
		return -EINVAL;
	if (vma->vm_pgoff >= (1ul << (BAM_COHERENT_SHIFT - PAGE_SHIFT))) {
		mutex_lock(&ctrl->lock);
		ret = ctrl->gone ? -ENODEV : bam_mmap_coherent(f, vma);
		mutex_unlock(&ctrl->lock);
		return ret;
	}
	off = (u64)vma->vm_pgoff << PAGE_SHIFT;

	mutex_lock(&ctrl->lock);
	if (ctrl->gone) {
		ret = -ENODEV;
		goto out;
	}
	ret = -EINVAL;
	if (ctrl->exclusive == f) {
		/* The whole BAR0, read-write. */
		if (off != 0 || size > PAGE_ALIGN(ctrl->bar0_len))
			goto out;
	} else if (off == 0) {
		/* The register page, read-only: CC, AQA, ASQ and ACQ are the module's. */
		if (size > NVME_REGS_MAPPED || size > PAGE_SIZE)
			goto out;
		if (vma->vm_flags & VM_WRITE) {
			ret = -EACCES;
			goto out;
		}
		bam_vma_read_only(vma);
	} else if (off == BAM_KMOD_DOORBELL_OFFSET) {
		/* The doorbells, once the file holds a queue pair. */
		if (!f->nqueues) {
			ret = -EPERM;
			goto out;
		}
		if (size > bam_doorbell_bytes(ctrl))
			goto out;
	} else {
		goto out;
	}
	bam_vma_flags(vma);
	vma->vm_page_prot = pgprot_noncached(vma->vm_page_prot);
	vma->vm_ops = &bam_bar_vm_ops;
	ret = io_remap_pfn_range(vma, vma->vm_start, (ctrl->bar0_start + off) >> PAGE_SHIFT, size,
				 vma->vm_page_prot);
	if (!ret)
		f->bar_mapped = true;
out:
	mutex_unlock(&ctrl->lock);
	return ret;
}

static long bam_ioctl_info(struct bam_ctrl *ctrl, void __user *arg)
{
	struct pci_dev *pdev = ctrl->pdev;
	struct bam_kmod_info info = {
		.bar0_size = ctrl->bar0_len,
		.dma_mask = dma_get_mask(&pdev->dev),
		.max_map_bytes = bam_max_map_bytes(),
		.pci_domain = pci_domain_nr(pdev->bus),
		.pci_bus = pdev->bus->number,
		.pci_device = PCI_SLOT(pdev->devfn),
		.pci_function = PCI_FUNC(pdev->devfn),
		.vendor_id = pdev->vendor,
		.device_id = pdev->device,
		.numa_node = dev_to_node(&pdev->dev),
		.minor = ctrl->minor,
	};
	const struct bam_gpu_ops *ops;

	if (ctrl->iommu)
		info.flags |= BAM_KMOD_INFO_IOMMU;
	mutex_lock(&bam_gpu_lock);
	ops = bam_gpu;
	mutex_unlock(&bam_gpu_lock);
	if (ops)
		info.flags |= BAM_KMOD_INFO_GPU;
	return copy_to_user(arg, &info, sizeof(info)) ? -EFAULT : 0;
}

/*
 * The MAP ioctls share one shape: check the range, build the mapping and its
 * bus addresses, copy them out, file the mapping under a new handle, copy
 * the handle out. Any failure undoes everything. Caller holds ctrl->lock.
 */
static long bam_ioctl_map(struct bam_file *f, unsigned int cmd, void __user *arg)
{
	union {
		struct bam_kmod_map_host host;
		struct bam_kmod_map_dmabuf dmabuf;
		struct bam_kmod_map_gpu gpu;
	} req;
	struct bam_mapping *m = NULL;
	u64 __user *ubus;
	u64 *handle_field;
	u64 *bus = NULL;
	size_t req_size;
	long npages;
	u32 handle;
	int ret;

	req_size = _IOC_SIZE(cmd);
	if (copy_from_user(&req, arg, req_size))
		return -EFAULT;

	switch (cmd) {
	case BAM_KMOD_IOC_MAP_HOST:
		npages = bam_check_map_host(&req.host, bam_max_map_bytes());
		ubus = u64_to_user_ptr(req.host.bus_addrs);
		handle_field = &req.host.handle;
		break;
	case BAM_KMOD_IOC_MAP_DMABUF:
		npages = bam_check_map_dmabuf(&req.dmabuf, bam_max_map_bytes());
		ubus = u64_to_user_ptr(req.dmabuf.bus_addrs);
		handle_field = &req.dmabuf.handle;
		break;
	case BAM_KMOD_IOC_MAP_GPU:
		npages = bam_check_map_gpu(&req.gpu, bam_max_map_bytes());
		ubus = u64_to_user_ptr(req.gpu.bus_addrs);
		handle_field = &req.gpu.handle;
		break;
	default:
		return -ENOTTY;
	}
	if (npages < 0)
		return npages;

	bus = kvmalloc_array(npages, sizeof(u64), GFP_KERNEL);
	if (!bus)
		return -ENOMEM;
	if (cmd == BAM_KMOD_IOC_MAP_HOST)
		ret = bam_map_host(f->ctrl, &req.host, npages, bus, &m);
	else if (cmd == BAM_KMOD_IOC_MAP_DMABUF)
		ret = bam_map_dmabuf(f->ctrl, &req.dmabuf, npages, bus, &m);
	else
		ret = bam_map_gpu(f->ctrl, &req.gpu, bus, &m);
	if (ret)
		goto out;
	if (copy_to_user(ubus, bus, npages * sizeof(u64))) {
		ret = -EFAULT;
		goto err_mapping;
	}
	ret = xa_alloc(&f->maps, &handle, m, xa_limit_32b, GFP_KERNEL);
	if (ret)
		goto err_mapping;
	*handle_field = handle;
	if (copy_to_user(arg, &req, req_size)) {
		xa_erase(&f->maps, handle);
		ret = -EFAULT;
		goto err_mapping;
	}
	goto out;

err_mapping:
	bam_mapping_free(f->ctrl, m);
out:
	kvfree(bus);
	return ret;
}

static long bam_ioctl(struct file *file, unsigned int cmd, unsigned long uarg)
{
	struct bam_file *f = file->private_data;
	struct bam_ctrl *ctrl = f->ctrl;
	void __user *arg = (void __user *)uarg;
	struct bam_kmod_version ver;
	struct bam_kmod_unmap unmap;
	struct bam_kmod_queue_delete del;
	struct bam_mapping *m;
	struct bam_queue *q;
	long ret;

	ret = bam_check_owner(f);
	if (ret)
		return ret;

	switch (cmd) {
	case BAM_KMOD_IOC_VERSION:
		if (copy_from_user(&ver, arg, sizeof(ver)))
			return -EFAULT;
		ret = bam_check_version(&ver);
		if (ret)
			return ret;
		ver.abi_version = BAM_KMOD_ABI_VERSION;
		ver.min_abi_version = BAM_KMOD_MIN_ABI_VERSION;
		return copy_to_user(arg, &ver, sizeof(ver)) ? -EFAULT : 0;
	case BAM_KMOD_IOC_INFO:
		return bam_ioctl_info(ctrl, arg);
	case BAM_KMOD_IOC_MAP_HOST:
	case BAM_KMOD_IOC_MAP_DMABUF:
	case BAM_KMOD_IOC_MAP_GPU:
		mutex_lock(&ctrl->lock);
		ret = ctrl->gone ? -ENODEV : bam_ioctl_map(f, cmd, arg);
		mutex_unlock(&ctrl->lock);
		return ret;
	case BAM_KMOD_IOC_ALLOC:
		mutex_lock(&ctrl->lock);
		ret = ctrl->gone ? -ENODEV : bam_ioctl_alloc(f, arg);
		mutex_unlock(&ctrl->lock);
		return ret;
	case BAM_KMOD_IOC_UNMAP:
		if (copy_from_user(&unmap, arg, sizeof(unmap)))
			return -EFAULT;
		ret = bam_check_unmap(&unmap);
		if (ret)
			return ret;
		mutex_lock(&ctrl->lock);
		m = xa_load(&f->maps, (unsigned long)unmap.handle);
		if (!m) {
			ret = -EINVAL;
		} else if (m->queue_refs) {
			ret = -EBUSY; /* a queue pair's ring lies there */
		} else {
			xa_erase(&f->maps, (unsigned long)unmap.handle);
			bam_mapping_free(ctrl, m);
			ret = 0;
		}
		mutex_unlock(&ctrl->lock);
		return ret;
	case BAM_KMOD_IOC_CTRL_INFO:
	case BAM_KMOD_IOC_QUEUE_CREATE:
	case BAM_KMOD_IOC_ADMIN:
	case BAM_KMOD_IOC_EXCLUSIVE:
		mutex_lock(&ctrl->lock);
		if (ctrl->gone)
			ret = -ENODEV;
		else if (cmd == BAM_KMOD_IOC_CTRL_INFO)
			ret = bam_ioctl_ctrl_info(f, arg);
		else if (cmd == BAM_KMOD_IOC_QUEUE_CREATE)
			ret = bam_ioctl_queue_create(f, arg);
		else if (cmd == BAM_KMOD_IOC_ADMIN)
			ret = bam_ioctl_admin(f, arg);
		else
			ret = bam_ioctl_exclusive(f);
		mutex_unlock(&ctrl->lock);
		return ret;
	case BAM_KMOD_IOC_QUEUE_DELETE:
		if (copy_from_user(&del, arg, sizeof(del)))
			return -EFAULT;
		ret = bam_check_queue_delete(&del);
		if (ret)
			return ret;
		mutex_lock(&ctrl->lock);
		q = xa_load(&f->queues, del.qid);
		if (ctrl->gone) {
			ret = -ENODEV;
		} else if (!q) {
			ret = -EINVAL;
		} else {
			bam_queue_destroy(f, q);
			ret = 0;
		}
		mutex_unlock(&ctrl->lock);
		return ret;
	default:
		return -ENOTTY;
	}
}

static const struct file_operations bam_fops = {
	.owner = THIS_MODULE,
	.open = bam_open,
	.release = bam_release,
	.mmap = bam_mmap,
	.unlocked_ioctl = bam_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.llseek = noop_llseek,
};

/* ---------------------------------------------------------------------- */
/* PCI driver                                                              */
/* ---------------------------------------------------------------------- */

static ssize_t owner_pid_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	struct bam_ctrl *ctrl = container_of(dev, struct bam_ctrl, dev);
	pid_t pid = 0;

	mutex_lock(&ctrl->lock);
	if (!list_empty(&ctrl->files))
		pid = list_first_entry(&ctrl->files, struct bam_file, node)->tgid;
	mutex_unlock(&ctrl->lock);
	return sysfs_emit(buf, "%d\n", pid);
}
static DEVICE_ATTR_RO(owner_pid);

/*
 * One line per open file, oldest first: "PID MODE QUEUES COMM", MODE being
 * shared or exclusive and QUEUES the queue ids it holds ("1,2") or "-".
 */
static ssize_t clients_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	struct bam_ctrl *ctrl = container_of(dev, struct bam_ctrl, dev);
	struct bam_file *f;
	struct bam_queue *q;
	unsigned long qid;
	int len = 0;
	bool first;

	mutex_lock(&ctrl->lock);
	list_for_each_entry(f, &ctrl->files, node) {
		len += sysfs_emit_at(buf, len, "%d %s", f->tgid, ctrl->exclusive == f ? "exclusive" : "shared");
		first = true;
		xa_for_each(&f->queues, qid, q) {
			len += sysfs_emit_at(buf, len, "%s%lu", first ? " " : ",", qid);
			first = false;
		}
		len += sysfs_emit_at(buf, len, "%s %s\n", first ? " -" : "", f->comm);
	}
	mutex_unlock(&ctrl->lock);
	return len;
}
static DEVICE_ATTR_RO(clients);

/* "TOTAL FREE PER_FILE": I/O queue pairs (0 0 0 before the first bring-up). */
static ssize_t io_queues_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	struct bam_ctrl *ctrl = container_of(dev, struct bam_ctrl, dev);
	ssize_t ret;

	mutex_lock(&ctrl->lock);
	ret = sysfs_emit(buf, "%u %u %u\n", ctrl->nr_queues, bam_queues_free(ctrl), bam_queues_per_file(ctrl));
	mutex_unlock(&ctrl->lock);
	return ret;
}
static DEVICE_ATTR_RO(io_queues);

static ssize_t bam_ctrl_pinned_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	struct bam_ctrl *ctrl = container_of(dev, struct bam_ctrl, dev);

	return sysfs_emit(buf, "%lld\n", (long long)atomic64_read(&ctrl->pinned_pages));
}
static DEVICE_ATTR(pinned_pages, 0444, bam_ctrl_pinned_show, NULL);

static ssize_t bam_ctrl_mappings_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	struct bam_ctrl *ctrl = container_of(dev, struct bam_ctrl, dev);

	return sysfs_emit(buf, "%lld\n", (long long)atomic64_read(&ctrl->mappings));
}
static DEVICE_ATTR(mappings, 0444, bam_ctrl_mappings_show, NULL);

static struct attribute *bam_dev_attrs[] = {
	&dev_attr_owner_pid.attr,
	&dev_attr_clients.attr,
	&dev_attr_io_queues.attr,
	&dev_attr_pinned_pages.attr,
	&dev_attr_mappings.attr,
	NULL,
};
ATTRIBUTE_GROUPS(bam_dev);

static void bam_ctrl_release(struct device *dev)
{
	struct bam_ctrl *ctrl = container_of(dev, struct bam_ctrl, dev);

	ida_free(&bam_minor_ida, ctrl->minor);
	pci_dev_put(ctrl->pdev);
	bitmap_free(ctrl->qids);
	kfree(ctrl);
}

static bool bam_iommu_translates(struct device *dev)
{
	struct iommu_domain *dom = iommu_get_domain_for_dev(dev);

	return dom && (dom->type & __IOMMU_DOMAIN_PAGING);
}

static void bam_admin_free(struct bam_ctrl *ctrl)
{
	struct device *dev = &ctrl->pdev->dev;

	if (ctrl->admin_buf)
		dma_free_coherent(dev, PAGE_SIZE, ctrl->admin_buf, ctrl->admin_buf_dma);
	if (ctrl->acq)
		dma_free_coherent(dev, PAGE_SIZE, ctrl->acq, ctrl->acq_dma);
	if (ctrl->asq)
		dma_free_coherent(dev, PAGE_SIZE, ctrl->asq, ctrl->asq_dma);
	ctrl->admin_buf = NULL;
	ctrl->acq = NULL;
	ctrl->asq = NULL;
}

/* The module's admin queue memory and the queue id map, for the controller's life. */
static int bam_admin_alloc(struct bam_ctrl *ctrl)
{
	struct device *dev = &ctrl->pdev->dev;

	ctrl->qids = bitmap_zalloc(BAM_ARGS_MAX_QID + 1, GFP_KERNEL);
	ctrl->asq = dma_alloc_coherent(dev, PAGE_SIZE, &ctrl->asq_dma, GFP_KERNEL);
	ctrl->acq = dma_alloc_coherent(dev, PAGE_SIZE, &ctrl->acq_dma, GFP_KERNEL);
	ctrl->admin_buf = dma_alloc_coherent(dev, PAGE_SIZE, &ctrl->admin_buf_dma, GFP_KERNEL);
	if (ctrl->qids && ctrl->asq && ctrl->acq && ctrl->admin_buf)
		return 0;
	bam_admin_free(ctrl);
	return -ENOMEM;
}

static int bam_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct bam_ctrl *ctrl;
	u32 csts;
	int ret;

	/* new_id could point us at anything: take NVMe controllers only. */
	if (pdev->class != PCI_CLASS_STORAGE_EXPRESS) {
		dev_info(&pdev->dev, "not an NVMe controller (class %06x)\n", pdev->class);
		return -ENODEV;
	}
	ctrl = kzalloc(sizeof(*ctrl), GFP_KERNEL);
	if (!ctrl)
		return -ENOMEM;
	ret = ida_alloc_max(&bam_minor_ida, BAM_MAX_CONTROLLERS - 1, GFP_KERNEL);
	if (ret < 0) {
		kfree(ctrl);
		return ret;
	}
	ctrl->minor = ret;
	ctrl->pdev = pci_dev_get(pdev);
	mutex_init(&ctrl->lock);
	INIT_LIST_HEAD(&ctrl->files);
	/* From here on the device's release frees ctrl. */
	device_initialize(&ctrl->dev);
	ctrl->dev.class = &bam_class;
	ctrl->dev.parent = &pdev->dev;
	ctrl->dev.devt = MKDEV(MAJOR(bam_devt), ctrl->minor);
	ctrl->dev.groups = bam_dev_groups;
	ctrl->dev.release = bam_ctrl_release;
	ret = dev_set_name(&ctrl->dev, "bam-nvme%d", ctrl->minor);
	if (ret)
		goto err_put;

	ret = pci_enable_device_mem(pdev);
	if (ret)
		goto err_put;
	ret = pci_request_mem_regions(pdev, KBUILD_MODNAME);
	if (ret)
		goto err_disable;
	if (!(pci_resource_flags(pdev, 0) & IORESOURCE_MEM) ||
	    pci_resource_len(pdev, 0) < 2 * NVME_REGS_MAPPED) {
		ret = -ENODEV;
		goto err_release;
	}
	ctrl->bar0_start = pci_resource_start(pdev, 0);
	ctrl->bar0_len = pci_resource_len(pdev, 0);
	ret = dma_set_mask_and_coherent(&pdev->dev, DMA_BIT_MASK(64));
	if (ret)
		ret = dma_set_mask_and_coherent(&pdev->dev, DMA_BIT_MASK(32));
	if (ret)
		goto err_release;
	ctrl->regs = pci_iomap(pdev, 0, 0); /* registers and every doorbell */
	if (!ctrl->regs) {
		ret = -ENOMEM;
		goto err_release;
	}
	ret = bam_admin_alloc(ctrl);
	if (ret)
		goto err_unmap;
	csts = readl(ctrl->regs + NVME_REG_CSTS);
	if (csts == ~0u) {
		dev_err(&pdev->dev, "registers read all ones: controller not present\n");
		ret = -ENODEV;
		goto err_unmap;
	}
	ctrl->iommu = bam_iommu_translates(&pdev->dev);
	pci_set_drvdata(pdev, ctrl); /* bus mastering waits for the bring-up */

	cdev_init(&ctrl->cdev, &bam_fops);
	ctrl->cdev.owner = THIS_MODULE;
	ret = cdev_device_add(&ctrl->cdev, &ctrl->dev);
	if (ret)
		goto err_master;
	dev_info(&pdev->dev, "bound as /dev/%s (BAR0 %llu bytes, %s)\n", dev_name(&ctrl->dev),
		 (unsigned long long)ctrl->bar0_len, ctrl->iommu ? "IOMMU" : "no IOMMU");
	return 0;

err_master:
	pci_set_drvdata(pdev, NULL);
	pci_clear_master(pdev);
	bam_admin_free(ctrl);
err_unmap:
	pci_iounmap(pdev, ctrl->regs);
err_release:
	pci_release_mem_regions(pdev);
err_disable:
	pci_disable_device(pdev);
err_put:
	put_device(&ctrl->dev);
	return ret;
}

static void bam_remove(struct pci_dev *pdev)
{
	struct bam_ctrl *ctrl = pci_get_drvdata(pdev);
	struct bam_file *f;

	cdev_device_del(&ctrl->cdev, &ctrl->dev); /* no new opens */
	mutex_lock(&ctrl->lock);
	bam_ctrl_quiesce(ctrl); /* every queue pair ends: no commands needed */
	list_for_each_entry(f, &ctrl->files, node) {
		dev_warn(&pdev->dev, "unbound while pid %d has it open: revoking\n", f->tgid);
		bam_file_end_queues(f);
		bam_file_unmap_all(f);
		/* Later accesses to the registers get SIGBUS (bam_bar_fault). */
		unmap_mapping_range(f->mapping, 0, 0, 1);
	}
	ctrl->gone = true;
	mutex_unlock(&ctrl->lock);

	bam_admin_free(ctrl);
	pci_iounmap(pdev, ctrl->regs);
	pci_release_mem_regions(pdev);
	pci_disable_device(pdev);
	pci_set_drvdata(pdev, NULL);
	put_device(&ctrl->dev);
}

/* No ids: a controller is handed over explicitly (driver_override/new_id). */
static struct pci_driver bam_pci_driver = {
	.name = KBUILD_MODNAME,
	.id_table = NULL,
	.probe = bam_probe,
	.remove = bam_remove,
};

static int __init bam_init(void)
{
	int ret;

	if (max_map_mib == 0 || max_map_mib > (1u << 24)) {
		pr_err("max_map_mib must be in 1..16777216 (got %u)\n", max_map_mib);
		return -EINVAL;
	}
	if (admin_timeout_ms == 0 || admin_timeout_ms > 600000) {
		pr_err("admin_timeout_ms must be in 1..600000 (got %u)\n", admin_timeout_ms);
		return -EINVAL;
	}
	ret = alloc_chrdev_region(&bam_devt, 0, BAM_MAX_CONTROLLERS, "bam-nvme");
	if (ret)
		return ret;
	ret = class_register(&bam_class);
	if (ret)
		goto err_chrdev;
	ret = pci_register_driver(&bam_pci_driver);
	if (ret)
		goto err_class;
	pr_info("ABI %u loaded; bind a controller with scripts/bind-nvme\n", BAM_KMOD_ABI_VERSION);
	return 0;

err_class:
	class_unregister(&bam_class);
err_chrdev:
	unregister_chrdev_region(bam_devt, BAM_MAX_CONTROLLERS);
	return ret;
}

static void __exit bam_exit(void)
{
	pci_unregister_driver(&bam_pci_driver);
	class_unregister(&bam_class);
	unregister_chrdev_region(bam_devt, BAM_MAX_CONTROLLERS);
	/* Every file is closed (we hold no module ref otherwise): nothing is pinned. */
	WARN(atomic64_read(&bam_pinned_pages) != 0, "%lld pages still pinned at exit\n",
	     (long long)atomic64_read(&bam_pinned_pages));
	WARN(atomic64_read(&bam_live_mappings) != 0, "%lld mappings alive at exit\n",
	     (long long)atomic64_read(&bam_live_mappings));
}

module_init(bam_init);
module_exit(bam_exit);

MODULE_AUTHOR("bam developers");
MODULE_DESCRIPTION("NVMe controllers shared by user-space and GPU drivers: admin queue, I/O queue pairs per process, DMA mapping");
MODULE_LICENSE("Dual MIT/GPL");
MODULE_VERSION("0.1.0");
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 13, 0)
MODULE_IMPORT_NS("DMA_BUF");
#else
MODULE_IMPORT_NS(DMA_BUF);
#endif
