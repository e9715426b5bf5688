// SPDX-License-Identifier: MIT OR GPL-2.0
/*
 * bam_test_dmabuf: a test-only dma-buf exporter. Each buffer is a set of
 * separately allocated pages (so its DMA mapping has many segments, like
 * GPU memory seen through an IOMMU), mapped for whichever device attaches,
 * and mmap-able so the test can check what a controller wrote there.
 * Stands in for udmabuf (not built in Debian 12's kernel) and for CUDA's
 * exporter in QEMU tests.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/dma-buf.h>
#include <linux/dma-mapping.h>
#include <linux/fs.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/version.h>

#include "bam_test_dmabuf.h"

struct bam_test_buffer {
	struct page **pages;
	unsigned long npages;
};

static struct sg_table *bam_test_map(struct dma_buf_attachment *attach,
				     enum dma_data_direction dir)
{
	struct bam_test_buffer *b = attach->dmabuf->priv;
	struct sg_table *sgt;
	int ret;

	sgt = kzalloc(sizeof(*sgt), GFP_KERNEL);
	if (!sgt)
		return ERR_PTR(-ENOMEM);
	ret = sg_alloc_table_from_pages(sgt, b->pages, b->npages, 0, b->npages << PAGE_SHIFT,
					GFP_KERNEL);
	if (ret)
		goto err_free;
	ret = dma_map_sgtable(attach->dev, sgt, dir, 0);
	if (ret)
		goto err_table;
	return sgt;

err_table:
	sg_free_table(sgt);
err_free:
	kfree(sgt);
	return ERR_PTR(ret);
}

static void bam_test_unmap(struct dma_buf_attachment *attach, struct sg_table *sgt,
			   enum dma_data_direction dir)
{
	dma_unmap_sgtable(attach->dev, sgt, dir, 0);
	sg_free_table(sgt);
	kfree(sgt);
}

static void bam_test_release(struct dma_buf *buf)
{
	struct bam_test_buffer *b = buf->priv;
	unsigned long i;

	for (i = 0; i < b->npages; i++)
		__free_page(b->pages[i]);
	kvfree(b->pages);
	kfree(b);
}

static int bam_test_mmap(struct dma_buf *buf, struct vm_area_struct *vma)
{
	struct bam_test_buffer *b = buf->priv;

	return vm_map_pages(vma, b->pages, b->npages);
}

static const struct dma_buf_ops bam_test_ops = {
	.map_dma_buf = bam_test_map,
	.unmap_dma_buf = bam_test_unmap,
	.release = bam_test_release,
	.mmap = bam_test_mmap,
};

static long bam_test_create(struct bam_test_dmabuf_create __user *arg)
{
	DEFINE_DMA_BUF_EXPORT_INFO(info);
	struct bam_test_dmabuf_create req;
	struct bam_test_buffer *b;
	struct dma_buf *buf;
	unsigned long i;
	int fd, ret;

	if (copy_from_user(&req, arg, sizeof(req)))
		return -EFAULT;
	if (req.pad || req.size == 0 || !PAGE_ALIGNED(req.size) ||
	    req.size > BAM_TEST_DMABUF_MAX_BYTES)
		return -EINVAL;
	b = kzalloc(sizeof(*b), GFP_KERNEL);
	if (!b)
		return -ENOMEM;
	b->pages = kvcalloc(req.size >> PAGE_SHIFT, sizeof(struct page *), GFP_KERNEL);
	if (!b->pages) {
		kfree(b);
		return -ENOMEM;
	}
	for (i = 0; i < (req.size >> PAGE_SHIFT); i++) {
		b->pages[i] = alloc_page(GFP_KERNEL | __GFP_ZERO);
		if (!b->pages[i]) {
			ret = -ENOMEM;
			goto err_pages;
		}
		b->npages++;
	}
	info.ops = &bam_test_ops;
	info.size = req.size;
	info.flags = O_RDWR;
	info.priv = b;
	buf = dma_buf_export(&info);
	if (IS_ERR(buf)) {
		ret = PTR_ERR(buf);
		goto err_pages;
	}
	/* From here on the buffer's release frees b. */
	fd = dma_buf_fd(buf, O_CLOEXEC);
	if (fd < 0) {
		dma_buf_put(buf);
		return fd;
	}
	req.fd = fd;
	if (copy_to_user(arg, &req, sizeof(req))) {
		/* The fd is installed; the caller owns it even if it cannot see it. */
		return -EFAULT;
	}
	return 0;

err_pages:
	for (i = 0; i < b->npages; i++)
		__free_page(b->pages[i]);
	kvfree(b->pages);
	kfree(b);
	return ret;
}

static long bam_test_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	if (cmd != BAM_TEST_DMABUF_CREATE)
		return -ENOTTY;
	return bam_test_create((struct bam_test_dmabuf_create __user *)arg);
}

static const struct file_operations bam_test_fops = {
	.owner = THIS_MODULE,
	.unlocked_ioctl = bam_test_ioctl,
	.llseek = noop_llseek,
};

static struct miscdevice bam_test_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "bam-test-dmabuf",
	.fops = &bam_test_fops,
	.mode = 0600,
};

module_misc_device(bam_test_misc);

MODULE_DESCRIPTION("Test-only dma-buf exporter for bam_nvme's QEMU tests");
MODULE_LICENSE("Dual MIT/GPL");
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 13, 0)
MODULE_IMPORT_NS("DMA_BUF");
#else
MODULE_IMPORT_NS(DMA_BUF);
#endif
