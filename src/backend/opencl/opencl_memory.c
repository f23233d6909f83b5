/*
 * OpenCL memory: device buffers (clCreateBuffer), page-locked host memory
 * (a CL_MEM_ALLOC_HOST_PTR buffer mapped once), and unified memory
 * (fine-grain buffer SVM wrapped in a cl_mem, so every buffer operation
 * works on it).
 */
#include <stdint.h>
#include <stdlib.h>
#include "backend/opencl/opencl_internal.h"
#include "os/status.h"
#include "os/os.h"
#ifdef MAPPING_OPENCL_HEADERS

static mapping_status wrap(cl_mem mem, void *svm, void **out)
{
    opencl_buffer *b = mapping_os_malloc(sizeof *b);
    if (!b)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "opencl: out of memory");
    b->mem = mem;
    b->svm = svm;
    *out = b;
    return MAPPING_OK;
}

mapping_status mapping__opencl_buffer_alloc(void *dev, size_t bytes, void **out)
{
    opencl_device *d = dev;
    cl_int err = CL_SUCCESS;
    cl_mem mem = mapping__opencl_driver.clCreateBuffer(d->context, CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (err != CL_SUCCESS)
        return mapping__opencl_fail("clCreateBuffer", err);
    mapping_status st = wrap(mem, NULL, out);
    if (st != MAPPING_OK)
        mapping__opencl_driver.clReleaseMemObject(mem);
    return st;
}

/* Fine-grain buffer SVM only: the CPU may then use the memory without
 * map/unmap, which is what "unified" promises. Coarse-grain SVM would need a
 * map around every CPU access, so it is not offered (MAPPING_ERR_UNSUPPORTED). */
mapping_status mapping__opencl_buffer_alloc_unified(void *dev, size_t bytes, void **out, void **host)
{
    opencl_device *d = dev;
    if (!d->svm_fine)
        return mapping__fail(MAPPING_ERR_UNSUPPORTED,
                             "opencl: the device has no fine-grain buffer SVM (OpenCL 2.0), so no unified memory");
    void *svm = mapping__opencl_driver.clSVMAlloc(d->context, CL_MEM_READ_WRITE | CL_MEM_SVM_FINE_GRAIN_BUFFER, bytes, 0);
    if (!svm)
        return mapping__fail(MAPPING_ERR_OUT_OF_DEVICE_MEMORY, "opencl: clSVMAlloc of %zu bytes failed", bytes);
    /* A buffer over an SVM pointer uses that memory (OpenCL 2.0, 5.6.1). */
    cl_int err = CL_SUCCESS;
    cl_mem mem = mapping__opencl_driver.clCreateBuffer(d->context, CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR, bytes, svm, &err);
    if (err != CL_SUCCESS) {
        mapping__opencl_driver.clSVMFree(d->context, svm);
        return mapping__opencl_fail("clCreateBuffer(CL_MEM_USE_HOST_PTR, SVM pointer)", err);
    }
    mapping_status st = wrap(mem, svm, out);
    if (st != MAPPING_OK) {
        mapping__opencl_driver.clReleaseMemObject(mem);
        mapping__opencl_driver.clSVMFree(d->context, svm);
        return st;
    }
    *host = svm;
    return MAPPING_OK;
}

void mapping__opencl_buffer_free(void *dev, void *mem)
{
    opencl_device *d = dev;
    opencl_buffer *b = mem;
    mapping__opencl_driver.clReleaseMemObject(b->mem);
    if (b->svm)
        mapping__opencl_driver.clSVMFree(d->context, b->svm); /* the caller has waited for work using it */
    free(b);
}

/* mapping_backend.map / .unmap. Core offers them on CPU devices only
 * (MAPPING_CAP_CPU_MEMORY), where a mapping is the buffer's own memory (PoCL
 * maps 256 MiB in ~8 us), so the batching layer copies through it instead
 * of packing and scattering. On the device's queue, behind the blocking
 * calls. The map waits; the unmap is queued and flushed, not waited for:
 * what the CPU wrote is in the buffer's memory already, and whatever comes
 * next on the queue (the next map included) runs after it. Waiting for it
 * cost a round trip to PoCL's threads per flush (40-60 us of a 10,000-copy
 * flush of 110-190 us). */
mapping_status mapping__opencl_map(void *dev, void *mem, size_t offset, size_t bytes, void **host)
{
    opencl_device *d = dev;
    cl_int err = CL_SUCCESS;
    *host = mapping__opencl_driver.clEnqueueMapBuffer(d->queue, ((opencl_buffer *)mem)->mem, CL_TRUE,
                                                      CL_MAP_READ | CL_MAP_WRITE, offset, bytes, 0, NULL, NULL, &err);
    if (err != CL_SUCCESS || !*host) {
        *host = NULL;
        return mapping__opencl_fail("clEnqueueMapBuffer", err != CL_SUCCESS ? err : CL_MAP_FAILURE);
    }
    return MAPPING_OK;
}

mapping_status mapping__opencl_unmap(void *dev, void *mem, void *host)
{
    opencl_device *d = dev;
    cl_int err = mapping__opencl_driver.clEnqueueUnmapMemObject(d->queue, ((opencl_buffer *)mem)->mem, host, 0, NULL,
                                                                NULL);
    if (err == CL_SUCCESS)
        err = mapping__opencl_driver.clFlush(d->queue);
    return err == CL_SUCCESS ? MAPPING_OK : mapping__opencl_fail("clEnqueueUnmapMemObject", err);
}

mapping_status mapping__opencl_buffer_native(void *dev, void *mem, void **native)
{
    (void)dev;
    *native = ((opencl_buffer *)mem)->mem;
    return MAPPING_OK;
}

/* ---- page-locked host memory ---- */

/* The cookie of a host_alloc block: the buffer behind the mapping. */
typedef struct opencl_pinned {
    cl_mem mem;
    void  *mapped; /* what clEnqueueMapBuffer returned (unmap needs it) */
} opencl_pinned;

static mapping_status map_pinned(opencl_device *d, size_t bytes, opencl_pinned *p)
{
    cl_int err = CL_SUCCESS;
    p->mem = mapping__opencl_driver.clCreateBuffer(d->context, CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR, bytes, NULL, &err);
    if (err != CL_SUCCESS) {
        /* It is host memory that ran out (or is too large), not device memory. */
        mapping_status st = mapping__opencl_status_of(err);
        return mapping__fail_driver(st == MAPPING_ERR_OUT_OF_DEVICE_MEMORY ? MAPPING_ERR_OUT_OF_HOST_MEMORY : st,
                                    "opencl", "clCreateBuffer(CL_MEM_ALLOC_HOST_PTR)", err, mapping__opencl_error_name(err));
    }
    p->mapped = mapping__opencl_driver.clEnqueueMapBuffer(d->queue, p->mem, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, bytes, 0, NULL,
                                       NULL, &err);
    if (err != CL_SUCCESS) {
        mapping__opencl_driver.clReleaseMemObject(p->mem);
        return mapping__opencl_fail("clEnqueueMapBuffer", err);
    }
    return MAPPING_OK;
}

static void unmap_pinned(opencl_device *d, opencl_pinned *p)
{
    cl_event ev = NULL;
    cl_int err = mapping__opencl_driver.clEnqueueUnmapMemObject(d->queue, p->mem, p->mapped, 0, NULL, &ev);
    if (err == CL_SUCCESS) {
        mapping__opencl_driver.clWaitForEvents(1, &ev);
        mapping__opencl_driver.clReleaseEvent(ev);
    }
    mapping__opencl_driver.clReleaseMemObject(p->mem);
}

/* The mapped pointer is what the caller gets: drivers page-lock the memory
 * behind such a buffer, and clEnqueueWrite/ReadBuffer from it is the fast
 * (DMA) path. The library promises page alignment; a driver that maps at a
 * smaller alignment gets a buffer one page larger, used from its first page
 * boundary. */
mapping_status mapping__opencl_host_alloc(void *dev, size_t bytes, void **ptr, void **cookie)
{
    opencl_device *d = dev;
    opencl_pinned *p = mapping_os_malloc(sizeof *p);
    if (!p)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "opencl: out of memory");
    const size_t page = mapping_os_page_size();
    mapping_status st = map_pinned(d, bytes, p);
    if (st == MAPPING_OK && ((uintptr_t)p->mapped & (page - 1)) != 0) {
        unmap_pinned(d, p);
        st = bytes <= SIZE_MAX - page ? map_pinned(d, bytes + page, p)
                                      : mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "opencl: %zu bytes", bytes);
    }
    if (st != MAPPING_OK) {
        free(p);
        return st;
    }
    *ptr = (void *)(((uintptr_t)p->mapped + page - 1) & ~(uintptr_t)(page - 1));
    *cookie = p;
    return MAPPING_OK;
}

void mapping__opencl_host_free(void *dev, void *ptr, void *cookie)
{
    (void)ptr;
    unmap_pinned(dev, cookie);
    free(cookie);
}
#endif /* MAPPING_OPENCL_HEADERS */
