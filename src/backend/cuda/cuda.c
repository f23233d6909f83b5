/*
 * The cuda back end: the CUDA driver API, loaded at run time (cuda_loader.c).
 *
 * - A device object retains the device's primary context (shared with the
 *   CUDA runtime and other libraries) and makes it current around each call,
 *   on whatever thread calls: pushed only when another context is current.
 * - Buffers are CUdeviceptrs (the back end's `mem` is the address itself);
 *   host memory is cuMemHostAlloc (portable) or cuMemHostRegister.
 * - Streams are CU_STREAM_NON_BLOCKING: they never wait for the legacy
 *   default stream, which the blocking calls use.
 * - Blocking calls return when the work is done. cuMemcpyHtoD from pageable
 *   memory, cuMemcpyDtoD and cuMemsetD8 may return before that, so those are
 *   followed by a synchronize of the legacy stream.
 * - Calls on a stream return once queued; copies of pageable memory go
 *   through the staging arena of cuda_staging.c so they never wait for the
 *   stream.
 * - The blocking stream (mapping_backend.stream_blocking) is the special
 *   handle CU_STREAM_LEGACY: work queued on it is ordered exactly as the
 *   legacy default stream's (it is that stream), so a blocking call of many
 *   steps queues them there on the async paths and waits once with
 *   cuStreamSynchronize(CU_STREAM_LEGACY). The handle is never created, so
 *   nothing destroys it (cuda_stream_destroy refuses to).
 * - No driver allocation or free on a path that may run while the caller's
 *   streams hold work (copies, synchronizes, host functions): a real driver
 *   may synchronize them with every stream. The arena is made at open.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cuda/cuda_device.h"
#include "os/status.h"
#include "os/os.h"

/* The legacy default stream (the non-_ptsz entry points take 0 for it). */
#define LEGACY_STREAM ((cu_stream)0)

static mapping_status status_of(cu_result r)
{
    switch (r) {
    case CU_SUCCESS:
        return MAPPING_OK;
    case CU_ERROR_OUT_OF_MEMORY:
        return MAPPING_ERR_OUT_OF_DEVICE_MEMORY;
    case CU_ERROR_NOT_READY:
        return MAPPING_ERR_NOT_READY;
    case CU_ERROR_NOT_SUPPORTED:
        return MAPPING_ERR_UNSUPPORTED;
    default:
        return MAPPING_ERR_DRIVER;
    }
}

mapping_status mapping__cuda_check(cu_result r, const char *call)
{
    if (r == CU_SUCCESS)
        return MAPPING_OK;
    return mapping__fail_driver(status_of(r), "cuda", call, r, mapping__cuda_error_name(r));
}

mapping_status mapping__cuda_enter(cuda_device *d, cuda_scope *scope)
{
    cu_context current = NULL;
    scope->pushed = scope->relaxed = false;
    if (d->cu->cuCtxGetCurrent(&current) != CU_SUCCESS || current != d->ctx) {
        mapping_status st = mapping__cuda_check(d->cu->cuCtxPushCurrent_v2(d->ctx), "cuCtxPushCurrent_v2");
        if (st != MAPPING_OK)
            return st;
        scope->pushed = true;
    }
    scope->mode = CU_STREAM_CAPTURE_MODE_RELAXED_;
    if (d->cu->cuThreadExchangeStreamCaptureMode)
        scope->relaxed = d->cu->cuThreadExchangeStreamCaptureMode(&scope->mode) == CU_SUCCESS;
    return MAPPING_OK;
}

void mapping__cuda_leave(cuda_device *d, const cuda_scope *scope)
{
    if (scope->relaxed) {
        int mode = scope->mode;
        d->cu->cuThreadExchangeStreamCaptureMode(&mode);
    }
    if (scope->pushed) {
        cu_context popped;
        d->cu->cuCtxPopCurrent_v2(&popped);
    }
}

/* ---- loading and devices ---- */

static mapping_status cuda_load(char *why, size_t why_size, int *device_count)
{
    const cuda_driver *cu = mapping__cuda_driver_load(why, why_size);
    if (!cu)
        return MAPPING_ERR_NO_BACKEND;
    int count = 0;
    cu_result r = cu->cuDeviceGetCount(&count);
    if (r != CU_SUCCESS) {
        snprintf(why, why_size, "cuDeviceGetCount failed: %s (%d)", mapping__cuda_error_name(r), r);
        return MAPPING_ERR_NO_BACKEND;
    }
    *device_count = count;
    return MAPPING_OK;
}

static int attribute(const cuda_driver *cu, cu_device dev, int attr)
{
    int value = 0;
    return cu->cuDeviceGetAttribute(&value, attr, dev) == CU_SUCCESS ? value : 0;
}

static bool scatter_mode_parse(const char *v, cuda_scatter_mode *mode);

/* The scatter mode a device opened now uses, by its setting and the
 * driver's entry points (a driver whose JIT refuses the kernels fails the
 * open instead): "kernel", "batch" or "copies". */
static const char *scatter_mode_name(const cuda_driver *cu)
{
    cuda_scatter_mode mode;
    bool valid = scatter_mode_parse(getenv("MAPPING_CUDA_SCATTER"), &mode); /* mapping_open reports a bad one */
    bool kernel = mapping__cuda_driver_has_kernels(cu), batch = mapping__cuda_driver_has_batch_copy(cu);
    if (!valid)
        return "invalid MAPPING_CUDA_SCATTER";
    if (mode == CUDA_SCATTER_AUTO)
        mode = kernel ? CUDA_SCATTER_KERNEL : batch ? CUDA_SCATTER_BATCH : CUDA_SCATTER_COPIES;
    if (mode == CUDA_SCATTER_BATCH && !batch)
        mode = kernel ? CUDA_SCATTER_KERNEL : CUDA_SCATTER_COPIES;
    if (mode == CUDA_SCATTER_KERNEL && !kernel)
        mode = CUDA_SCATTER_COPIES;
    return mode == CUDA_SCATTER_KERNEL ? "kernel" : mode == CUDA_SCATTER_BATCH ? "batch" : "copies";
}

static mapping_status cuda_device_info(int index, mapping_device_info *info)
{
    const cuda_driver *cu = mapping__cuda_driver_get();
    cu_device dev;
    mapping_status st = mapping__cuda_check(cu->cuDeviceGet(&dev, index), "cuDeviceGet");
    if (st != MAPPING_OK)
        return st;
    memset(info, 0, sizeof *info);
    strcpy(info->backend, "cuda");
    info->index = index;
    strcpy(info->kind, "gpu");
    strcpy(info->vendor, "NVIDIA");
    if (cu->cuDeviceGetName(info->name, (int)sizeof info->name, dev) != CU_SUCCESS)
        strcpy(info->name, "CUDA device");
    info->name[sizeof info->name - 1] = '\0';
    size_t total = 0;
    if (cu->cuDeviceTotalMem_v2(&total, dev) == CU_SUCCESS)
        info->memory_bytes = total;
    snprintf(info->driver, sizeof info->driver, "CUDA driver %d.%d, compute capability %d.%d, scatter %s",
             cu->version / 1000, cu->version % 1000 / 10, attribute(cu, dev, CU_ATTR_COMPUTE_CAPABILITY_MAJOR),
             attribute(cu, dev, CU_ATTR_COMPUTE_CAPABILITY_MINOR), scatter_mode_name(cu));
    info->caps = MAPPING_CAP_PINNED_HOST | MAPPING_CAP_ASYNC_COPY | MAPPING_CAP_TIMING;
    if (cu->cuMemAllocManaged && attribute(cu, dev, CU_ATTR_MANAGED_MEMORY))
        info->caps |= MAPPING_CAP_UNIFIED;
    if ((info->caps & MAPPING_CAP_UNIFIED) && attribute(cu, dev, CU_ATTR_CONCURRENT_MANAGED_ACCESS))
        info->caps |= MAPPING_CAP_CONCURRENT_UNIFIED;
    if (mapping__cuda_driver_has_batch_copy(cu))
        info->caps |= MAPPING_CAP_BATCH_COPY;
    if (attribute(cu, dev, CU_ATTR_HOST_REGISTER_SUPPORTED))
        info->caps |= MAPPING_CAP_HOST_REGISTER;
    if (mapping__cuda_driver_has_kernels(cu))
        info->caps |= MAPPING_CAP_DEVICE_KERNELS;
    return MAPPING_OK;
}

/* A value of $MAPPING_CUDA_SCATTER: auto (or NULL / empty), batch, kernel
 * or copies; false for anything else. */
static bool scatter_mode_parse(const char *v, cuda_scatter_mode *mode)
{
    *mode = CUDA_SCATTER_AUTO;
    if (!v || !*v || !strcmp(v, "auto"))
        return true;
    if (!strcmp(v, "batch"))
        *mode = CUDA_SCATTER_BATCH;
    else if (!strcmp(v, "kernel"))
        *mode = CUDA_SCATTER_KERNEL;
    else if (!strcmp(v, "copies"))
        *mode = CUDA_SCATTER_COPIES;
    else
        return false;
    return true;
}

/* $MAPPING_CUDA_SCATTER; anything but its four words fails mapping_open. */
static mapping_status scatter_mode_from_env(cuda_scatter_mode *mode)
{
    const char *v = getenv("MAPPING_CUDA_SCATTER");
    if (!scatter_mode_parse(v, mode))
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                             "mapping_open: MAPPING_CUDA_SCATTER=\"%s\" is not auto, batch, kernel or copies", v);
    return MAPPING_OK;
}

mapping_status mapping__cuda_after_legacy(cuda_device *d)
{
    mapping_status st = mapping__cuda_check(d->cu->cuEventRecord(d->legacy_mark, LEGACY_STREAM), "cuEventRecord");
    if (st == MAPPING_OK)
        st = mapping__cuda_check(d->cu->cuStreamWaitEvent(d->internal, d->legacy_mark, 0), "cuStreamWaitEvent");
    return st;
}

/* The link (latency of a 64-byte copy, bandwidth of 8 MiB ones, medians),
 * measured once at open from page-locked memory of the staging arena into
 * the device pool's region (both made at open, unused yet), on the
 * private internal stream: never on the legacy stream, where it would wait
 * for whatever the user (PyTorch, say) has queued there. Best effort: when
 * it cannot be measured, the core measures on first use. The context is
 * current; nothing else uses the device yet. */
enum { LINK_PROBE_BYTES = 8 << 20, LINK_SMALL = 64, LINK_SMALL_RUNS = 21, LINK_BIG_RUNS = 3 };

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double timed_copy(cuda_device *d, cu_deviceptr dst, const void *src, size_t bytes)
{
    double t0 = mapping_os_now();
    if (d->cu->cuMemcpyHtoDAsync_v2(dst, src, bytes, d->internal) != CU_SUCCESS ||
        d->cu->cuStreamSynchronize(d->internal) != CU_SUCCESS)
        return -1;
    return mapping_os_now() - t0;
}

static void measure_link(cuda_device *d)
{
    cuda_stage_chunk *c = d->staging.chunks;
    /* The device pool's region, nothing carved from it yet: no allocation
     * or free here (a free would wait for every stream, the user's too). */
    cu_deviceptr mem = d->device_pool_mem;
    if (!c || c->size < LINK_PROBE_BYTES || !mem || d->device_pool.units * CUDA_POOL_UNIT < LINK_PROBE_BYTES)
        return;
    memset(c->base, 1, LINK_PROBE_BYTES);
    double small[LINK_SMALL_RUNS], big[LINK_BIG_RUNS];
    bool ok = true;
    for (int i = 0; i < LINK_SMALL_RUNS && ok; i++)
        ok = (small[i] = timed_copy(d, mem, c->base, LINK_SMALL)) >= 0;
    for (int i = 0; i < LINK_BIG_RUNS && ok; i++)
        ok = (big[i] = timed_copy(d, mem, c->base, LINK_PROBE_BYTES)) >= 0;
    if (!ok)
        return;
    qsort(small, LINK_SMALL_RUNS, sizeof small[0], compare_doubles);
    qsort(big, LINK_BIG_RUNS, sizeof big[0], compare_doubles);
    double lat = small[LINK_SMALL_RUNS / 2], t_big = big[LINK_BIG_RUNS / 2];
    d->link_latency = lat > 1e-9 ? lat : 1e-9;
    d->link_bandwidth = t_big > lat ? (double)LINK_PROBE_BYTES / (t_big - lat) : (double)LINK_PROBE_BYTES / t_big;
}

static bool cuda_device_link(void *dev, double *latency, double *bandwidth)
{
    cuda_device *d = dev;
    if (d->link_latency <= 0 || d->link_bandwidth <= 0)
        return false;
    *latency = d->link_latency;
    *bandwidth = d->link_bandwidth;
    return true;
}

/* What a device makes at open, with its context current; on failure,
 * nothing of it is left (the event pools are empty yet). */
static mapping_status open_in_context(cuda_device *d)
{
    const cuda_driver *cu = d->cu;
    mapping_status st = mapping__cuda_check(cu->cuStreamCreate(&d->internal, CU_STREAM_NON_BLOCKING_), "cuStreamCreate");
    if (st == MAPPING_OK &&
        (st = mapping__cuda_check(cu->cuEventCreate(&d->legacy_mark, CU_EVENT_DISABLE_TIMING_), "cuEventCreate")) !=
            MAPPING_OK)
        cu->cuStreamDestroy_v2(d->internal);
    /* The staging arena's first chunk: no page-locked allocation per copy. */
    if (st == MAPPING_OK && (st = mapping__cuda_staging_init(d)) != MAPPING_OK) {
        cu->cuEventDestroy_v2(d->legacy_mark);
        cu->cuStreamDestroy_v2(d->internal);
    }
    if (st != MAPPING_OK)
        return st;
    mapping__cuda_pools_init(d); /* best effort: without them, the driver serves every allocation */
    /* Never inside a flush; a JIT that refuses the kernels fails the open. */
    if ((st = mapping__cuda_kernels_load(d)) != MAPPING_OK) {
        cu->cuStreamSynchronize(d->internal);
        mapping__cuda_pools_destroy(d);
        mapping__cuda_staging_destroy(d);
        cu->cuEventDestroy_v2(d->legacy_mark);
        cu->cuStreamDestroy_v2(d->internal);
        return st;
    }
    measure_link(d);
    return MAPPING_OK;
}

static mapping_status cuda_device_open(int index, const mapping_device_desc *desc, void **out)
{
    (void)desc;
    const cuda_driver *cu = mapping__cuda_driver_get();
    cuda_scatter_mode scatter_mode;
    mapping_status st = scatter_mode_from_env(&scatter_mode);
    if (st != MAPPING_OK)
        return st;
    cuda_device *d = mapping_os_calloc(1, sizeof *d);
    if (!d)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "cuda: out of memory");
    d->cu = cu;
    d->ordinal = index;
    st = mapping__cuda_check(cu->cuDeviceGet(&d->device, index), "cuDeviceGet");
    if (st == MAPPING_OK)
        st = mapping__cuda_check(cu->cuDevicePrimaryCtxRetain(&d->ctx, d->device), "cuDevicePrimaryCtxRetain");
    if (st != MAPPING_OK) {
        free(d);
        return st;
    }
    d->scatter_mode = scatter_mode;
    mapping__cuda_event_pools_init(d);
    mapping__cuda_locked_init(d);
    IN_CONTEXT(d, st = open_in_context(d));
    if (st != MAPPING_OK) {
        mapping__cuda_locked_destroy(d);
        cu->cuDevicePrimaryCtxRelease_v2(d->device);
        free(d);
        return st;
    }
    d->managed = cu->cuMemAllocManaged && attribute(cu, d->device, CU_ATTR_MANAGED_MEMORY);
    d->concurrent_managed = d->managed && attribute(cu, d->device, CU_ATTR_CONCURRENT_MANAGED_ACCESS);
    *out = d;
    return MAPPING_OK;
}

static void cuda_device_close(void *dev)
{
    cuda_device *d = dev;
    mapping_status st;
    IN_CONTEXT(d, {
        d->cu->cuStreamSynchronize(d->internal);
        d->cu->cuStreamDestroy_v2(d->internal);
        d->cu->cuEventDestroy_v2(d->legacy_mark);
        mapping__cuda_event_pools_destroy(d);
        mapping__cuda_kernels_unload(d);
        mapping__cuda_staging_destroy(d);
        mapping__cuda_pools_destroy(d);
    });
    (void)st;
    mapping__cuda_locked_destroy(d);
    d->cu->cuDevicePrimaryCtxRelease_v2(d->device);
    free(d);
}

static mapping_status cuda_device_native(void *dev, mapping_native_device *out)
{
    cuda_device *d = dev;
    out->context = d->ctx;
    out->device = (void *)(intptr_t)d->device;
    out->platform = NULL;
    out->queue = NULL; /* the legacy default stream */
    return MAPPING_OK;
}

/* ---- device memory ---- */

static mapping_status cuda_buffer_alloc(void *dev, size_t bytes, void **mem)
{
    cuda_device *d = dev;
    uintptr_t pooled;
    if (mapping__cuda_suballoc_take(&d->device_pool, bytes, &pooled)) { /* no driver call */
        *mem = (void *)pooled;
        return MAPPING_OK;
    }
    cu_deviceptr p = 0;
    mapping_status st;
    IN_CONTEXT(d, st = mapping__cuda_check(d->cu->cuMemAlloc_v2(&p, bytes), "cuMemAlloc_v2"));
    if (st == MAPPING_OK)
        *mem = (void *)(uintptr_t)p;
    return st;
}

static void cuda_buffer_free(void *dev, void *mem)
{
    cuda_device *d = dev;
    if (mapping__cuda_suballoc_give(&d->device_pool, (uintptr_t)mem))
        return;
    mapping_status st;
    IN_CONTEXT(d, {
        st = mapping__cuda_check(d->cu->cuMemFree_v2(cuda_ptr(mem)), "cuMemFree_v2");
        mapping__cuda_staging_trim(d); /* a free already: trimming here adds no new wait */
    });
    (void)st;
}

static mapping_status cuda_buffer_native(void *dev, void *mem, void **native)
{
    (void)dev;
    *native = mem; /* the CUdeviceptr as (void *)(uintptr_t) */
    return MAPPING_OK;
}

static mapping_status cuda_buffer_alloc_unified(void *dev, size_t bytes, void **mem, void **host)
{
    cuda_device *d = dev;
    if (!d->managed)
        return mapping__fail(MAPPING_ERR_UNSUPPORTED, "cuda: device %d has no managed memory", d->ordinal);
    cu_deviceptr p = 0;
    mapping_status st;
    IN_CONTEXT(d, st = mapping__cuda_check(d->cu->cuMemAllocManaged(&p, bytes, CU_MEM_ATTACH_GLOBAL_), "cuMemAllocManaged"));
    if (st == MAPPING_OK)
        *mem = *host = (void *)(uintptr_t)p; /* one address for CPU and device */
    return st;
}

static mapping_status prefetch(cuda_device *d, cu_stream s, cu_deviceptr p, size_t bytes, bool to_device)
{
    const cuda_driver *cu = d->cu;
    if (cu->cuMemPrefetchAsync_v2) {
        cu_mem_location to = {to_device ? CU_MEM_LOCATION_TYPE_DEVICE_ : CU_MEM_LOCATION_TYPE_HOST_,
                              to_device ? d->device : 0};
        return mapping__cuda_check(cu->cuMemPrefetchAsync_v2(p, bytes, to, 0, s), "cuMemPrefetchAsync_v2");
    }
    if (cu->cuMemPrefetchAsync)
        return mapping__cuda_check(cu->cuMemPrefetchAsync(p, bytes, to_device ? d->device : CU_DEVICE_CPU_, s),
                          "cuMemPrefetchAsync");
    return MAPPING_OK; /* a hint the driver cannot take */
}

static mapping_status cuda_unified_prefetch(void *dev, void *stream, void *mem, size_t offset, size_t bytes,
                                            bool to_device)
{
    cuda_device *d = dev;
    /* Without concurrent managed access the driver refuses prefetches and
     * migrates on launch anyway: the hint has nothing to do. */
    if (!d->concurrent_managed)
        return MAPPING_OK;
    mapping_status st;
    IN_CONTEXT(d, {
        st = prefetch(d, stream ? stream : LEGACY_STREAM, cuda_ptr(mem) + offset, bytes, to_device);
        if (st == MAPPING_OK && !stream)
            st = mapping__cuda_check(d->cu->cuStreamSynchronize(LEGACY_STREAM), "cuStreamSynchronize");
    });
    return st;
}

/* ---- host memory ---- */

/* mapping_allocate_cpu promises page alignment, which cuMemHostAlloc does
 * not document. So the block is one page larger than asked and the pointer
 * handed out is the first page boundary in it: no second allocation, and no
 * free (which would wait for every stream) when a block is not aligned. The
 * cookie keeps what cuMemHostAlloc returned. */
typedef struct cuda_host_block {
    void *base; /* NULL: from the host pool */
} cuda_host_block;

static mapping_status cuda_host_alloc(void *dev, size_t bytes, void **ptr, void **cookie)
{
    cuda_device *d = dev;
    size_t page = mapping_os_page_size();
    if (bytes > SIZE_MAX - page)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "cuda: %zu bytes of host memory is too many", bytes);
    cuda_host_block *b = mapping_os_calloc(1, sizeof *b);
    if (!b)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "cuda: out of memory");
    uintptr_t pooled;
    if (page == CUDA_POOL_UNIT && mapping__cuda_suballoc_take(&d->host_pool, bytes, &pooled)) { /* no driver call */
        *ptr = (void *)pooled;
        *cookie = b;
        return MAPPING_OK;
    }
    mapping_status st;
    IN_CONTEXT(d, st = mapping__cuda_check(d->cu->cuMemHostAlloc(&b->base, bytes + page, CU_MEMHOSTALLOC_PORTABLE_),
                                  "cuMemHostAlloc"));
    if (st == MAPPING_ERR_OUT_OF_DEVICE_MEMORY)
        st = MAPPING_ERR_OUT_OF_HOST_MEMORY;
    if (st != MAPPING_OK) {
        free(b);
        return st;
    }
    *ptr = (void *)(((uintptr_t)b->base + page - 1) / page * page);
    *cookie = b;
    return MAPPING_OK;
}

static void cuda_host_free(void *dev, void *ptr, void *cookie)
{
    cuda_device *d = dev;
    cuda_host_block *b = cookie;
    if (!b->base) {
        mapping__cuda_suballoc_give(&d->host_pool, (uintptr_t)ptr);
        free(b);
        return;
    }
    mapping_status st;
    IN_CONTEXT(d, {
        st = mapping__cuda_check(d->cu->cuMemFreeHost(b->base), "cuMemFreeHost");
        mapping__cuda_staging_trim(d); /* a free already: trimming here adds no new wait */
    });
    (void)st;
    free(b);
}

static mapping_status cuda_host_register(void *dev, void *ptr, size_t bytes, void **cookie)
{
    cuda_device *d = dev;
    mapping_status st;
    IN_CONTEXT(d, st = mapping__cuda_check(d->cu->cuMemHostRegister_v2(ptr, bytes, CU_MEMHOSTREGISTER_PORTABLE_),
                                  "cuMemHostRegister_v2"));
    if (st == MAPPING_ERR_OUT_OF_DEVICE_MEMORY) /* page-locking is host memory (a locked-memory limit) */
        st = mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY,
                           "cuda: cuMemHostRegister_v2 of %zu bytes failed: CUDA_ERROR_OUT_OF_MEMORY (2): no more host "
                           "memory may be page-locked (ulimit -l, or the system's memory)",
                           bytes);
    if (st == MAPPING_OK)
        *cookie = ptr;
    return st;
}

static void cuda_host_unregister(void *dev, void *ptr, void *cookie)
{
    (void)cookie;
    cuda_device *d = dev;
    mapping_status st;
    IN_CONTEXT(d, st = mapping__cuda_check(d->cu->cuMemHostUnregister(ptr), "cuMemHostUnregister"));
    (void)st;
}

/* ---- streams ---- */

static mapping_status cuda_stream_create(void *dev, void **stream)
{
    cuda_device *d = dev;
    cu_stream s = NULL;
    mapping_status st;
    IN_CONTEXT(d, st = mapping__cuda_check(d->cu->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING_), "cuStreamCreate"));
    if (st == MAPPING_OK)
        *stream = s;
    return st;
}

static void cuda_stream_destroy(void *dev, void *stream)
{
    cuda_device *d = dev;
    if (cuda_stream_is_special(stream)) /* the blocking stream: not ours to destroy */
        return;
    mapping_status st;
    /* No page-locked free here (the staging arena is trimmed where memory
     * is freed anyway): cuMemFreeHost waits for every stream, the caller's
     * too, and a stream's destruction must not. */
    IN_CONTEXT(d, st = mapping__cuda_check(d->cu->cuStreamDestroy_v2(stream), "cuStreamDestroy_v2"));
    (void)st;
}

static mapping_status cuda_stream_synchronize(void *dev, void *stream)
{
    cuda_device *d = dev;
    mapping_status st;
    /* No allocation or free here: the arena is trimmed where memory is
     * freed anyway (cuda_staging.c). A capturing stream is not synchronized:
     * that would invalidate its capture. */
    IN_CONTEXT(d, st = mapping__cuda_capturing(d, stream)
                           ? mapping__cuda_capture_refusal("a synchronize of a stream being captured, which would "
                                                           "invalidate the capture")
                           : mapping__cuda_check(d->cu->cuStreamSynchronize(stream), "cuStreamSynchronize"));
    return st;
}

static mapping_status cuda_stream_native(void *dev, void *stream, void **native)
{
    (void)dev;
    *native = stream; /* the CUstream */
    return MAPPING_OK;
}

/* The legacy default stream by its special handle: as a stream (not NULL),
 * every op takes its asynchronous path on it, and it is ordered exactly like
 * the calls with stream == NULL (the NULL-stream contract). No state. */
static void *cuda_stream_blocking(void *dev)
{
    (void)dev;
    return (void *)CU_STREAM_LEGACY_;
}

/* ---- transfers ---- */

/* After a legacy-stream call that may return early: wait for it. */
static mapping_status finish_blocking(cuda_device *d, mapping_status st)
{
    return st == MAPPING_OK ? mapping__cuda_check(d->cu->cuStreamSynchronize(LEGACY_STREAM), "cuStreamSynchronize") : st;
}

/* A blocking copy of pageable memory of at least this size goes through the
 * staging arena, packed or unpacked by the copy threads (os/copy_pool.c),
 * where there are any: cuMemcpyHtoD / DtoH stage it with one thread. */
static const size_t BLOCKING_STAGED_MIN = (size_t)4 << 20;

static bool stage_blocking(size_t bytes)
{
    return bytes >= BLOCKING_STAGED_MIN && mapping_os_copy_threads() > 0;
}

/* Page-locked host memory of another library (torch.Tensor.pin_memory,
 * cudaHostAlloc, a registration): asked of the driver (and cached) only
 * where the copy would otherwise be staged. */
static bool locked_elsewhere(cuda_device *d, cu_stream stream, const void *host, size_t bytes)
{
    return (stream || stage_blocking(bytes)) && mapping__cuda_host_locked(d, host, bytes);
}

/* A write with the context current; `locked`: the source is page-locked. */
static mapping_status write_in_context(cuda_device *d, cu_stream stream, const void *src, bool locked,
                                       cu_deviceptr dst, size_t bytes)
{
    const cuda_driver *cu = d->cu;
    locked = locked || locked_elsewhere(d, stream, src, bytes);
    if (!stream && locked) /* synchronous: the fast path the latency figure measures */
        return mapping__cuda_check(cu->cuMemcpyHtoD_v2(dst, src, bytes), "cuMemcpyHtoD_v2");
    if (!stream && stage_blocking(bytes))
        return finish_blocking(d, mapping__cuda_staged_write(d, LEGACY_STREAM, src, dst, bytes));
    if (!stream)
        return finish_blocking(d, mapping__cuda_check(cu->cuMemcpyHtoD_v2(dst, src, bytes), "cuMemcpyHtoD_v2"));
    if (locked)
        return mapping__cuda_check(cu->cuMemcpyHtoDAsync_v2(dst, src, bytes, stream), "cuMemcpyHtoDAsync_v2");
    return mapping__cuda_staged_write(d, stream, src, dst, bytes);
}

static mapping_status cuda_write(void *dev, void *stream, const void *src, const mapping_host_ref *pinned,
                                 void *dst_mem, size_t dst_offset, size_t bytes)
{
    cuda_device *d = dev;
    mapping_status st;
    IN_CONTEXT(d, st = write_in_context(d, stream, src, pinned != NULL, cuda_ptr(dst_mem) + dst_offset, bytes));
    return st;
}

/* A read with the context current; `locked`: the destination is page-locked. */
static mapping_status read_in_context(cuda_device *d, cu_stream stream, cu_deviceptr src, void *dst, bool locked,
                                      size_t bytes)
{
    const cuda_driver *cu = d->cu;
    locked = locked || locked_elsewhere(d, stream, dst, bytes);
    if (!stream && !locked && stage_blocking(bytes))
        return finish_blocking(d, mapping__cuda_staged_read(d, LEGACY_STREAM, src, dst, bytes));
    if (!stream) /* returns once the copy has completed, pageable or not */
        return mapping__cuda_check(cu->cuMemcpyDtoH_v2(dst, src, bytes), "cuMemcpyDtoH_v2");
    if (locked)
        return mapping__cuda_check(cu->cuMemcpyDtoHAsync_v2(dst, src, bytes, stream), "cuMemcpyDtoHAsync_v2");
    return mapping__cuda_staged_read(d, stream, src, dst, bytes);
}

static mapping_status cuda_read(void *dev, void *stream, void *src_mem, size_t src_offset, void *dst,
                                const mapping_host_ref *pinned, size_t bytes)
{
    cuda_device *d = dev;
    mapping_status st;
    IN_CONTEXT(d, st = read_in_context(d, stream, cuda_ptr(src_mem) + src_offset, dst, pinned != NULL, bytes));
    return st;
}

static mapping_status cuda_copy(void *dev, void *stream, void *src_mem, size_t src_offset, void *dst_mem,
                                size_t dst_offset, size_t bytes)
{
    cuda_device *d = dev;
    const cuda_driver *cu = d->cu;
    cu_deviceptr src = cuda_ptr(src_mem) + src_offset, dst = cuda_ptr(dst_mem) + dst_offset;
    mapping_status st;
    if (!stream)
        IN_CONTEXT(d, st = finish_blocking(d, mapping__cuda_check(cu->cuMemcpyDtoD_v2(dst, src, bytes), "cuMemcpyDtoD_v2")));
    else
        IN_CONTEXT(d, st = mapping__cuda_check(cu->cuMemcpyDtoDAsync_v2(dst, src, bytes, stream), "cuMemcpyDtoDAsync_v2"));
    return st;
}

static mapping_status cuda_fill(void *dev, void *stream, void *mem, size_t offset, size_t bytes, unsigned char value)
{
    cuda_device *d = dev;
    const cuda_driver *cu = d->cu;
    cu_deviceptr dst = cuda_ptr(mem) + offset;
    mapping_status st;
    if (!stream)
        IN_CONTEXT(d, st = finish_blocking(d, mapping__cuda_check(cu->cuMemsetD8_v2(dst, value, bytes), "cuMemsetD8_v2")));
    else
        IN_CONTEXT(d, st = mapping__cuda_check(cu->cuMemsetD8Async(dst, value, bytes, stream), "cuMemsetD8Async"));
    return st;
}

static mapping_status cuda_launch_host(void *dev, void *stream, void (*fn)(void *), void *user)
{
    cuda_device *d = dev;
    mapping_status st;
    IN_CONTEXT(d, st = mapping__cuda_check(d->cu->cuLaunchHostFunc(stream, fn, user), "cuLaunchHostFunc"));
    return st;
}

/* The native queue is the legacy default stream: waiting for it also waits
 * for earlier work of every blocking stream of the context. */
static mapping_status cuda_device_synchronize(void *dev)
{
    cuda_device *d = dev;
    mapping_status st;
    IN_CONTEXT(d, st = mapping__cuda_capturing(d, CU_STREAM_LEGACY_)
                           ? mapping__cuda_capture_refusal("a wait for the legacy stream, which would invalidate the "
                                                           "capture of a stream that synchronizes with it")
                           : mapping__cuda_check(d->cu->cuStreamSynchronize(LEGACY_STREAM), "cuStreamSynchronize"));
    return st;
}

const mapping_backend mapping_backend_cuda = {
    .name = "cuda",
    .load = cuda_load,
    .device_info = cuda_device_info,
    .device_open = cuda_device_open,
    .device_close = cuda_device_close,
    .device_native = cuda_device_native,
    .device_link = cuda_device_link,
    .buffer_alloc = cuda_buffer_alloc,
    .buffer_free = cuda_buffer_free,
    .buffer_native = cuda_buffer_native,
    .buffer_alloc_unified = cuda_buffer_alloc_unified,
    .unified_prefetch = cuda_unified_prefetch,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .host_register = cuda_host_register,
    .host_unregister = cuda_host_unregister,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_synchronize = cuda_stream_synchronize,
    .stream_native = cuda_stream_native,
    .stream_blocking = cuda_stream_blocking,
    .write = cuda_write,
    .read = cuda_read,
    .copy = cuda_copy,
    .fill = cuda_fill,
    .scatter = mapping__cuda_scatter,
    .gather = mapping__cuda_gather,
    .diff_blocks = mapping__cuda_diff_blocks,
    .launch_host = cuda_launch_host,
    .event_record = mapping__cuda_event_record,
    .event_wait = mapping__cuda_event_wait,
    .event_synchronize = mapping__cuda_event_synchronize,
    .event_query = mapping__cuda_event_query,
    .event_elapsed = mapping__cuda_event_elapsed,
    .event_destroy = mapping__cuda_event_destroy,
    .peer_copy = mapping__cuda_peer_copy,
    .device_synchronize = cuda_device_synchronize,
    .buffer_import = mapping__cuda_buffer_import,
    .buffer_unimport = mapping__cuda_buffer_unimport,
    .stream_import = mapping__cuda_stream_import,
    .stream_unimport = mapping__cuda_stream_unimport,
    .stream_import_default = true,
    .stream_capture_status = mapping__cuda_stream_capture_status,
    .host_locked = mapping__cuda_host_locked_op,
    .copy_table = mapping__cuda_copy_table,
    .graph_retain = mapping__cuda_graph_retain,
};
