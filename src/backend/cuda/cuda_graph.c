/*
 * Copies that a captured CUDA graph replays with new ranges (the mirror syncs
 * recorded in a graph, src/coherence/mirror_graph.c; docs/cuda.md, "Mirror
 * syncs in CUDA graphs"):
 * - copy_table: the kernel mapping_copy_table (cuda_kernels.cu), which reads
 *   its count and ranges from a table in page-locked host memory when it
 *   runs, and copies between device memory and page-locked host memory
 *   through the device's address of that memory (zero-copy: no DMA node, so
 *   the ranges need not be known when the graph is captured). The device
 *   addresses come from cuMemHostGetDevicePointer_v2 (unified addressing:
 *   every page-locked allocation is mapped; for registered memory the device
 *   address may differ from the host one).
 * - graph_retain: a CUDA user object on the graph being captured
 *   (cuStreamGetCaptureInfo_v2/_v3 names it), so the caller's object lives as
 *   long as the graph and its executables; its destructor runs on a driver
 *   thread once they are gone.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include "backend/cuda/cuda_device.h"
#include "os/os.h"
#include "os/status.h"

enum {
    TABLE_THREADS = 256,
    TABLE_WARPS = TABLE_THREADS / 32, /* a warp per entry */
    TABLE_MAX_BLOCKS = 65535,
    CU_USER_OBJECT_NO_DESTRUCTOR_SYNC_ = 1,
    CU_GRAPH_USER_OBJECT_MOVE_ = 1,
};

/* The device's addresses of the table and of the host side. */
static mapping_status mapped(cuda_device *d, const uint64_t *table, void *host, cu_deviceptr *t, cu_deviceptr *h)
{
    const cuda_driver *cu = d->cu;
    cu_result r = cu->cuMemHostGetDevicePointer_v2(t, (void *)(uintptr_t)table, 0);
    if (r == CU_SUCCESS)
        r = cu->cuMemHostGetDevicePointer_v2(h, host, 0);
    if (r == CU_ERROR_INVALID_VALUE)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                             "cuda: cuMemHostGetDevicePointer_v2 failed: CUDA_ERROR_INVALID_VALUE (1): the host memory "
                             "of a table copy is not page-locked memory the device can reach");
    return mapping__cuda_check(r, "cuMemHostGetDevicePointer_v2");
}

mapping_status mapping__cuda_copy_table(void *dev, void *stream, const uint64_t *table, size_t capacity, void *host,
                                        void *mem, size_t mem_offset, bool to_host)
{
    cuda_device *d = dev;
    if (!d->copy_table || !d->cu->cuMemHostGetDevicePointer_v2)
        return mapping__fail(MAPPING_ERR_UNSUPPORTED, "cuda: the table copy kernel is not loaded on this device "
                                                      "(MAPPING_CUDA_SCATTER=copies, or a driver without it)");
    size_t blocks = (capacity + TABLE_WARPS - 1) / TABLE_WARPS;
    if (blocks > TABLE_MAX_BLOCKS)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "cuda: a table copy of %zu entries is too large (at most %d)",
                             capacity, TABLE_MAX_BLOCKS * TABLE_WARPS);
    cuda_scope scope;
    mapping_status st = mapping__cuda_enter(d, &scope);
    if (st != MAPPING_OK)
        return st;
    cu_stream s = stream ? stream : d->internal;
    cu_deviceptr t = 0, h = 0, dptr = cuda_ptr(mem) + mem_offset;
    unsigned long long cap = capacity;
    unsigned back = to_host;
    void *params[] = {&t, &cap, &h, &dptr, &back};
    if (!stream)
        st = mapping__cuda_after_legacy(d);
    if (st == MAPPING_OK)
        st = mapped(d, table, host, &t, &h);
    if (st == MAPPING_OK)
        st = mapping__cuda_check(d->cu->cuLaunchKernel(d->copy_table, (unsigned)(blocks ? blocks : 1), 1, 1,
                                                       TABLE_THREADS, 1, 1, 0, s, params, NULL),
                                 "cuLaunchKernel");
    if (st == MAPPING_OK && !stream)
        st = mapping__cuda_check(d->cu->cuStreamSynchronize(s), "cuStreamSynchronize");
    mapping__cuda_leave(d, &scope);
    return st;
}

/* What a user object carries: the caller's release, unless the graph never
 * took the object (then only this goes). */
typedef struct retained {
    void (*release)(void *user);
    void       *user;
    atomic_bool armed;
} retained;

static void retained_end(void *p) /* a driver thread: no driver call */
{
    retained *r = p;
    if (atomic_load(&r->armed))
        r->release(r->user);
    free(r);
}

/* The graph of the capture in progress on s. */
static mapping_status capture_graph(cuda_device *d, cu_stream s, void **graph)
{
    const cuda_driver *cu = d->cu;
    int status = CU_STREAM_CAPTURE_STATUS_NONE_;
    unsigned long long id = 0;
    cu_result r = cu->cuStreamGetCaptureInfo_v3 ? cu->cuStreamGetCaptureInfo_v3(s, &status, &id, graph, NULL, NULL, NULL)
                                                : cu->cuStreamGetCaptureInfo_v2(s, &status, &id, graph, NULL, NULL);
    mapping_status st = mapping__cuda_check(r, cu->cuStreamGetCaptureInfo_v3 ? "cuStreamGetCaptureInfo_v3"
                                                                             : "cuStreamGetCaptureInfo_v2");
    if (st == MAPPING_OK && (status != CU_STREAM_CAPTURE_STATUS_ACTIVE_ || !*graph))
        st = mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "cuda: the stream is not being captured into a graph");
    return st;
}

mapping_status mapping__cuda_graph_retain(void *dev, void *stream, void (*release)(void *user), void *user)
{
    cuda_device *d = dev;
    const cuda_driver *cu = d->cu;
    if (!cu->cuUserObjectCreate || !cu->cuUserObjectRelease || !cu->cuGraphRetainUserObject ||
        !(cu->cuStreamGetCaptureInfo_v3 || cu->cuStreamGetCaptureInfo_v2))
        return mapping__fail(MAPPING_ERR_UNSUPPORTED,
                             "cuda: the driver has no user objects for graphs (CUDA 11.3: cuUserObjectCreate, "
                             "cuGraphRetainUserObject, cuStreamGetCaptureInfo_v2)");
    retained *r = mapping_os_malloc(sizeof *r);
    if (!r)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "cuda: out of memory");
    r->release = release;
    r->user = user;
    atomic_init(&r->armed, true);
    cuda_scope scope;
    mapping_status st = mapping__cuda_enter(d, &scope);
    if (st != MAPPING_OK) {
        free(r);
        return st;
    }
    void *graph = NULL, *obj = NULL;
    if ((st = capture_graph(d, stream, &graph)) == MAPPING_OK)
        st = mapping__cuda_check(cu->cuUserObjectCreate(&obj, r, retained_end, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC_),
                                 "cuUserObjectCreate");
    if (st == MAPPING_OK) {
        st = mapping__cuda_check(cu->cuGraphRetainUserObject(graph, obj, 1, CU_GRAPH_USER_OBJECT_MOVE_),
                                 "cuGraphRetainUserObject");
        if (st != MAPPING_OK) { /* not taken: the object goes, without the caller's release */
            atomic_store(&r->armed, false);
            cu->cuUserObjectRelease(obj, 1);
        }
    } else {
        free(r); /* no object holds it */
    }
    mapping__cuda_leave(d, &scope);
    return st;
}
