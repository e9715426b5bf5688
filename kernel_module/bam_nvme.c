// SPDX-License-Identifier: MIT OR GPL-2.0
/*
 * bam_nvme: hands an NVMe controller to a user-space (and GPU) driver.
 *
 * The module binds only the controllers a user opts in (an empty id table:
 * binding goes through sysfs driver_override or new_id, see
 * scripts/bind-nvme). For each one it creates /dev/bam-nvmeN, which offers:
 *  - mmap() of BAR0 (uncached), so the user-space driver owns the registers;
 *  - ioctls that pin and DMA-map memory *for this controller* and return one
 *    bus address per 4 KiB page: host memory, a dma-buf (GPU memory exported
 *    by CUDA), or GPU memory through nvidia_p2p (bam_nvme_gpu.ko).
 * The ABI is include/bam/transport/kmod_abi.h.
 *
 * Ownership: one open file per controller at a time (a second open gets
 * -EBUSY: two drivers on one admin queue cannot work). Everything belongs to
 * that file; only the process that opened it may use it (-EACCES otherwise,
 * e.g. a forked child or an fd passed over a socket). release() stops the
 * controller (CC.EN = 0, bus mastering off) *before* it unmaps and unpins, so
 * a process that dies mid-I/O cannot leave a controller writing into freed
 * pages. The BAR mapping is VM_DONTCOPY: a child of fork() has no registers.
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
#define NVME_REG_CC 0x14
#define NVME_REG_CSTS 0x1c
#define NVME_CC_ENABLE 0x1
#define NVME_CSTS_RDY 0x1
#define NVME_CAP_TO(cap) (((cap) >> 24) & 0xff) /* 500 ms units */
#define NVME_REGS_MAPPED 0x1000

static unsigned int max_map_mib = 65536;
module_param(max_map_mib, uint, 0444);
MODULE_PARM_DESC(max_map_mib, "Largest single DMA mapping in MiB (1..16777216, default 65536)");

static bool unprivileged;
module_param(unprivileged, bool, 0444);
MODULE_PARM_DESC(unprivileged,
		 "Waive CAP_SYS_RAWIO at open for controllers behind a translating IOMMU (default N)");

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
	void __iomem *regs; /* first page of BAR0, to stop the controller */
	bool iommu;	    /* bus addresses are translated IOVAs */
	/*
	 * lock serializes open/release, every ioctl that maps or unmaps, and
	 * remove. It protects gone and open_file.
	 */
	struct mutex lock;
	bool gone; /* removed from the driver: no more DMA or MMIO */
	struct bam_file *open_file;
	/* This controller's share of bam_pinned_pages and bam_live_mappings. */
	atomic64_t pinned_pages;
	atomic64_t mappings;
};

/* State of one open file: everything it mapped. */
struct bam_file {
	struct bam_ctrl *ctrl;
	struct mm_struct *mm; /* opener's mm (grabbed): the only one allowed */
	pid_t tgid;	      /* for messages */
	struct address_space *mapping; /* to revoke BAR mmaps at remove */
	struct xarray maps;   /* handle -> struct bam_mapping; ctrl->lock */
	bool bar_mapped;
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
		} dmabuf;
		struct {
			const struct bam_gpu_ops *ops;
			void *priv;
		} gpu;
		struct {
			struct bam_ctrl *ctrl; /* holds a reference on ctrl->dev */
			void *cpu;
			dma_addr_t dma;
			size_t size;
		} coherent;
	};
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
	ret = ops->map(ctrl->pdev, req->vaddr, req->length, bus, &m->gpu.priv);
	if (ret)
		goto err_free;
	bam_count_mappings(ctrl, 1);
	*out = m;
	return 0;

err_free:
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

/* Undo every mapping of @f. Caller holds ctrl->lock. */
static void bam_file_unmap_all(struct bam_file *f)
{
	struct bam_mapping *m;
	unsigned long handle;

	xa_for_each(&f->maps, handle, m) {
		xa_erase(&f->maps, handle);
		bam_mapping_free(f->ctrl, m);
	}
}

/*
 * Stop the controller's DMA before memory it may target is unpinned: clear
 * CC.EN (a controller reset: it forgets every queue), wait for CSTS.RDY = 0
 * for at most CAP.TO, then turn bus mastering off so that even a controller
 * that ignores the reset cannot write. Caller holds ctrl->lock.
 */
static void bam_ctrl_quiesce(struct bam_ctrl *ctrl)
{
	u64 cap = lo_hi_readq(ctrl->regs + NVME_REG_CAP);
	u32 cc = readl(ctrl->regs + NVME_REG_CC);
	unsigned long deadline;

	if (cc == ~0u) {
		dev_warn(&ctrl->pdev->dev, "controller is gone (registers read all ones)\n");
	} else if (cc & NVME_CC_ENABLE) {
		writel(cc & ~NVME_CC_ENABLE, ctrl->regs + NVME_REG_CC);
		deadline = jiffies + msecs_to_jiffies((NVME_CAP_TO(cap) + 1) * 500);
		while (readl(ctrl->regs + NVME_REG_CSTS) & NVME_CSTS_RDY) {
			if (time_after(jiffies, deadline)) {
				dev_warn(&ctrl->pdev->dev, "controller did not reset in time\n");
				break;
			}
			usleep_range(1000, 2000);
		}
	}
	pci_clear_master(ctrl->pdev);
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
	f->ctrl = ctrl;
	f->tgid = task_tgid_nr(current);
	f->mapping = file->f_mapping;

	mutex_lock(&ctrl->lock);
	if (ctrl->gone)
		ret = -ENODEV;
	else if (ctrl->open_file)
		ret = -EBUSY;
	if (ret) {
		mutex_unlock(&ctrl->lock);
		kfree(f);
		return ret;
	}
	ctrl->open_file = f;
	pci_set_master(ctrl->pdev); /* release() turned it off */
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
		bam_ctrl_quiesce(ctrl);
		bam_file_unmap_all(f);
	}
	WARN_ON(!xa_empty(&f->maps));
	ctrl->open_file = NULL;
	mutex_unlock(&ctrl->lock);

	xa_destroy(&f->maps);
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
	int ret;

	ret = bam_check_owner(f);
	if (ret)
		return ret;
	if (!(vma->vm_flags & VM_SHARED))
		return -EINVAL;
	if (vma->vm_pgoff != 0) {
		mutex_lock(&ctrl->lock);
		ret = ctrl->gone ? -ENODEV : bam_mmap_coherent(f, vma);
		mutex_unlock(&ctrl->lock);
		return ret;
	}
	if (size > PAGE_ALIGN(ctrl->bar0_len))
		return -EINVAL;

	mutex_lock(&ctrl->lock);
	if (ctrl->gone) {
		ret = -ENODEV;
		goto out;
	}
	bam_vma_flags(vma);
	vma->vm_page_prot = pgprot_noncached(vma->vm_page_prot);
	vma->vm_ops = &bam_bar_vm_ops;
	ret = io_remap_pfn_range(vma, vma->vm_start, ctrl->bar0_start >> PAGE_SHIFT, size,
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
	struct bam_mapping *m;
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
		m = xa_erase(&f->maps, (unsigned long)unmap.handle);
		if (m)
			bam_mapping_free(ctrl, m);
		mutex_unlock(&ctrl->lock);
		return m ? 0 : -EINVAL;
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
	if (ctrl->open_file)
		pid = ctrl->open_file->tgid;
	mutex_unlock(&ctrl->lock);
	return sysfs_emit(buf, "%d\n", pid);
}
static DEVICE_ATTR_RO(owner_pid);

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
	kfree(ctrl);
}

static bool bam_iommu_translates(struct device *dev)
{
	struct iommu_domain *dom = iommu_get_domain_for_dev(dev);

	return dom && (dom->type & __IOMMU_DOMAIN_PAGING);
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
	ctrl->regs = pci_iomap(pdev, 0, NVME_REGS_MAPPED);
	if (!ctrl->regs) {
		ret = -ENOMEM;
		goto err_release;
	}
	csts = readl(ctrl->regs + NVME_REG_CSTS);
	if (csts == ~0u) {
		dev_err(&pdev->dev, "registers read all ones: controller not present\n");
		ret = -ENODEV;
		goto err_unmap;
	}
	ctrl->iommu = bam_iommu_translates(&pdev->dev);
	pci_set_master(pdev);
	pci_set_drvdata(pdev, ctrl);

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

	cdev_device_del(&ctrl->cdev, &ctrl->dev); /* no new opens */
	mutex_lock(&ctrl->lock);
	bam_ctrl_quiesce(ctrl);
	if (ctrl->open_file) {
		struct bam_file *f = ctrl->open_file;

		dev_warn(&pdev->dev, "unbound while pid %d has it open: revoking\n", f->tgid);
		bam_file_unmap_all(f);
		/* Later accesses to the registers get SIGBUS (bam_bar_fault). */
		unmap_mapping_range(f->mapping, 0, 0, 1);
	}
	ctrl->gone = true;
	mutex_unlock(&ctrl->lock);

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
MODULE_DESCRIPTION("NVMe controllers for user-space and GPU drivers: BAR0 mmap and DMA mapping");
MODULE_LICENSE("Dual MIT/GPL");
MODULE_VERSION("0.1.0");
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 13, 0)
MODULE_IMPORT_NS("DMA_BUF");
#else
MODULE_IMPORT_NS(DMA_BUF);
#endif
