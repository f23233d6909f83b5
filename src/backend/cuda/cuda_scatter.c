/*
 * Scatter and gather: many small device-to-device copies between a staging
 * buffer and a buffer, in one step. Three ways, chosen per device
 * (MAPPING_CUDA_SCATTER, default auto):
 *   batch:  cuMemcpyBatchAsync (CUDA 12.8+) from the host copy of the table;
 *   kernel: the library's kernel (cuda_kernels.cu, shipped as PTX, loaded
 *           once per device) reading the table from the staging buffer;
 *   copies: one cuMemcpyDtoDAsync per entry, the fallback that always works.
 * auto = batch when the driver has it, else the kernel, else copies.
 * With stream == NULL the work runs on the device's internal stream, ordered
 * after the legacy stream's work with an event (a blocking call sees what
 * the device's native queue wrote), and is waited for (batch copies refuse
 * the legacy stream). The kernel is loaded at open, never inside a flush.
 * On CU_STREAM_LEGACY
 * (the blocking stream: a blocking flush's steps, waited for once by the
 * caller) batch copies are refused as well, so there it is the kernel, else
 * copies.
 */
#include <stdlib.h>
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_kernels_ptx.h"
#include "os/os.h"
#include "os/status.h"

/* The kernel's shape (cuda_kernels.cu): a warp per entry, 8 warps a block;
 * entries over KERNEL_SPLIT bytes cut into pieces of that size, piece y on
 * the blocks with blockIdx.y == y (at most 65535 pieces: a larger split for
 * a larger entry). */
enum { KERNEL_THREADS = 256, KERNEL_WARPS = KERNEL_THREADS / 32, KERNEL_MAX_BLOCKS = 65535 };
enum { KERNEL_COPY, KERNEL_DIFF, KERNEL_TABLE }; /* the module's functions, for load_function */
static const uint64_t KERNEL_SPLIT = 16 << 10;

static mapping_status by_kernel(cuda_device *d, cu_stream s, cu_deviceptr staging, size_t table_offset,
                                const mapping_scatter_entry *table, size_t count, cu_deviceptr buffer, unsigned gather);

/* The module from the embedded PTX, with the JIT's error log
 * (cuModuleLoadDataEx) where the driver has it. A refusal fails the open:
 * the message has the driver's error and the JIT's log (an old driver
 * cannot JIT a newer PTX ISA; a GPU older than the PTX's target). */
static mapping_status load_module(cuda_device *d)
{
    const cuda_driver *cu = d->cu;
    char log[2048] = "";
    int options[] = {CU_JIT_ERROR_LOG_BUFFER_, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES_};
    void *values[] = {log, (void *)(uintptr_t)(sizeof log - 1)};
    const char *call = cu->cuModuleLoadDataEx ? "cuModuleLoadDataEx" : "cuModuleLoadData";
    cu_result r = cu->cuModuleLoadDataEx ? cu->cuModuleLoadDataEx(&d->module, cuda_kernels_ptx, 2, options, values)
                                         : cu->cuModuleLoadData(&d->module, cuda_kernels_ptx);
    if (r == CU_SUCCESS)
        return MAPPING_OK;
    d->module = NULL;
    log[sizeof log - 1] = '\0';
    return mapping__fail(r == CU_ERROR_OUT_OF_MEMORY ? MAPPING_ERR_OUT_OF_DEVICE_MEMORY : MAPPING_ERR_DRIVER,
                         "mapping_open: cuda: the driver cannot load the library's kernels (scatter/gather and the "
                         "mirrors' diff, PTX ISA 6.3 for sm_75): %s failed: %s (%d); JIT log: %s "
                         "(MAPPING_CUDA_SCATTER=copies opens the device without them)",
                         call, mapping__cuda_error_name(r), r, log[0] ? log : "(empty)");
}

/* A function of the module loaded now, not at its first launch: cuFuncLoad
 * (CUDA 12.4), else a launch over nothing, waited for (without it, lazy
 * loading would load it inside a flush or sync, which may synchronize the
 * context behind a stream the caller holds). */
static cu_result load_function(cuda_device *d, cu_function f, int kind)
{
    const cuda_driver *cu = d->cu;
    if (cu->cuFuncLoad)
        return cu->cuFuncLoad(f);
    mapping_error_mark before;
    mapping__error_mark(&before);
    /* Valid addresses (the device pool's region, unused yet), read by neither kernel. */
    cu_deviceptr any = d->device_pool_mem;
    unsigned long long none = 0, split = 16;
    unsigned gather = 0;
    void *copy_params[] = {&any, &any, &none, &any, &gather, &split};
    void *diff_params[] = {&any, &any, &any, &none};
    void *table_params[] = {&any, &none, &any, &any, &gather}; /* capacity 0: reads the count only */
    void **params = kind == KERNEL_DIFF ? diff_params : kind == KERNEL_TABLE ? table_params : copy_params;
    cu_result r = cu->cuLaunchKernel(f, 1, 1, 1, kind == KERNEL_DIFF ? 128 : 256, 1, 1, 0, d->internal, params, NULL);
    if (r == CU_SUCCESS)
        r = cu->cuStreamSynchronize(d->internal);
    mapping__error_forget(&before);
    return r;
}

mapping_status mapping__cuda_kernels_load(cuda_device *d)
{
    const cuda_driver *cu = d->cu;
    d->module = NULL;
    d->diff_blocks = NULL;
    d->copy_table = NULL;
    if (!mapping__cuda_driver_has_kernels(cu) || d->scatter_mode == CUDA_SCATTER_COPIES)
        return MAPPING_OK;
    mapping_status st = load_module(d);
    if (st != MAPPING_OK)
        return st;
    const char *call = "cuModuleGetFunction";
    cu_result r = cu->cuModuleGetFunction(&d->copy_entries, d->module, "mapping_copy_entries");
    if (r == CU_SUCCESS) {
        call = cu->cuFuncLoad ? "cuFuncLoad" : "cuLaunchKernel";
        r = load_function(d, d->copy_entries, KERNEL_COPY);
    }
    if (r != CU_SUCCESS) {
        cu->cuModuleUnload(d->module);
        d->module = NULL;
        return mapping__fail(MAPPING_ERR_DRIVER,
                             "mapping_open: cuda: the scatter/gather kernel does not load: %s failed: %s (%d) "
                             "(MAPPING_CUDA_SCATTER=copies opens the device without it)",
                             call, mapping__cuda_error_name(r), r);
    }
    /* The mirrors' diff kernel, from the same module, loaded now as well;
     * without it a diff mirror reads back in full (mapping__cuda_diff_blocks:
     * UNSUPPORTED). */
    cu_function f = NULL;
    if (cu->cuModuleGetFunction(&f, d->module, "mapping_diff_blocks") == CU_SUCCESS &&
        load_function(d, f, KERNEL_DIFF) == CU_SUCCESS)
        d->diff_blocks = f;
    /* The graph-replayable table copy (cuda_graph.c), likewise: without it,
     * mirror syncs are not recorded in graphs (MAPPING_ERR_UNSUPPORTED). */
    f = NULL;
    if (cu->cuModuleGetFunction(&f, d->module, "mapping_copy_table") == CU_SUCCESS &&
        load_function(d, f, KERNEL_TABLE) == CU_SUCCESS)
        d->copy_table = f;
    return MAPPING_OK;
}

/* The diff kernel's shape (cuda_kernels.cu): a 128-thread block per 4 KiB
 * block, the grid two-dimensional past 65535 blocks. */
enum { DIFF_THREADS = 128, DIFF_GRID_X = 65535 };

mapping_status mapping__cuda_diff_blocks(void *dev, void *stream, void *mem, size_t mem_offset, void *shadow_mem,
                                         size_t shadow_offset, size_t bytes, void *flags_mem, size_t flags_offset)
{
    cuda_device *d = dev;
    if (!d->diff_blocks)
        return mapping__fail(MAPPING_ERR_UNSUPPORTED, "cuda: the diff kernel is not loaded on this device");
    cuda_scope scope;
    mapping_status st = mapping__cuda_enter(d, &scope);
    if (st != MAPPING_OK)
        return st;
    cu_stream s = stream ? stream : d->internal;
    if (!stream)
        st = mapping__cuda_after_legacy(d);
    cu_deviceptr a = cuda_ptr(mem) + mem_offset, b = cuda_ptr(shadow_mem) + shadow_offset,
                 f = cuda_ptr(flags_mem) + flags_offset;
    unsigned long long blocks = bytes / MAPPING_DIFF_BLOCK;
    unsigned gx = blocks < DIFF_GRID_X ? (unsigned)(blocks ? blocks : 1) : DIFF_GRID_X;
    unsigned gy = (unsigned)((blocks + gx - 1) / gx);
    void *params[] = {&a, &b, &f, &blocks};
    if (st == MAPPING_OK && blocks)
        st = mapping__cuda_check(d->cu->cuLaunchKernel(d->diff_blocks, gx, gy ? gy : 1, 1, DIFF_THREADS, 1, 1, 0, s,
                                                        params, NULL),
                                 "cuLaunchKernel");
    if (st == MAPPING_OK && !stream)
        st = mapping__cuda_check(d->cu->cuStreamSynchronize(s), "cuStreamSynchronize");
    mapping__cuda_leave(d, &scope);
    return st;
}

void mapping__cuda_kernels_unload(cuda_device *d)
{
    if (d->module)
        d->cu->cuModuleUnload(d->module);
    d->module = NULL;
}

static mapping_status by_kernel(cuda_device *d, cu_stream s, cu_deviceptr staging, size_t table_offset,
                                const mapping_scatter_entry *table, size_t count, cu_deviceptr buffer, unsigned gather)
{
    cu_deviceptr on_device = staging + table_offset;
    uint64_t largest = 0;
    for (size_t i = 0; i < count; i++) /* the host copy of the table */
        largest = table[i].bytes > largest ? table[i].bytes : largest;
    unsigned long long n = count, split = KERNEL_SPLIT;
    if (largest / split >= KERNEL_MAX_BLOCKS) /* fewer, larger pieces (a multiple of 16 bytes) */
        split = (largest / (KERNEL_MAX_BLOCKS - 1) + 16) / 16 * 16;
    uint64_t pieces = largest ? (largest + split - 1) / split : 1;
    size_t warp_blocks = (count + KERNEL_WARPS - 1) / KERNEL_WARPS;
    unsigned blocks = warp_blocks == 0 ? 1 : warp_blocks < KERNEL_MAX_BLOCKS ? (unsigned)warp_blocks : KERNEL_MAX_BLOCKS;
    void *params[] = {&staging, &on_device, &n, &buffer, &gather, &split};
    return mapping__cuda_check(d->cu->cuLaunchKernel(d->copy_entries, blocks, (unsigned)pieces, 1, KERNEL_THREADS, 1,
                                                     1, 0, s, params, NULL),
                               "cuLaunchKernel");
}

static mapping_status by_batch(cuda_device *d, cu_stream s, cu_deviceptr staging, const mapping_scatter_entry *table,
                               size_t count, cu_deviceptr buffer, bool gather)
{
    const cuda_driver *cu = d->cu;
    /* One allocation for the three arrays (size_t and CUdeviceptr: 8 bytes). */
    cu_deviceptr *dsts = mapping_os_malloc(count * (2 * sizeof *dsts + sizeof(size_t)));
    cu_deviceptr *srcs = dsts ? dsts + count : NULL;
    size_t *sizes = dsts ? (size_t *)(srcs + count) : NULL;
    mapping_status st = MAPPING_OK;
    if (!dsts) {
        st = mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "cuda: out of memory for a batch of %zu copies", count);
        goto out;
    }
    for (size_t i = 0; i < count; i++) {
        cu_deviceptr at_staging = staging + table[i].staging_offset, at_buffer = buffer + table[i].buffer_offset;
        dsts[i] = gather ? at_staging : at_buffer;
        srcs[i] = gather ? at_buffer : at_staging;
        sizes[i] = (size_t)table[i].bytes;
    }
    cu_mem_location here = {CU_MEM_LOCATION_TYPE_DEVICE_, d->device};
    cu_memcpy_attributes attrs = {CU_MEMCPY_SRC_ACCESS_ORDER_STREAM_, here, here, 0};
    size_t attr_index = 0;
    if (cu->cuMemcpyBatchAsync_v2) {
        st = mapping__cuda_check(cu->cuMemcpyBatchAsync_v2(dsts, srcs, sizes, count, &attrs, &attr_index, 1, s),
                        "cuMemcpyBatchAsync_v2");
    } else {
        size_t fail_index = 0;
        st = mapping__cuda_check(cu->cuMemcpyBatchAsync(dsts, srcs, sizes, count, &attrs, &attr_index, 1, &fail_index, s),
                        "cuMemcpyBatchAsync");
    }
out:
    free(dsts);
    return st;
}

static mapping_status by_copies(cuda_device *d, cu_stream s, cu_deviceptr staging,
                                const mapping_scatter_entry *table, size_t count, cu_deviceptr buffer, bool gather)
{
    mapping_status st = MAPPING_OK;
    for (size_t i = 0; i < count && st == MAPPING_OK; i++) {
        cu_deviceptr at_staging = staging + table[i].staging_offset, at_buffer = buffer + table[i].buffer_offset;
        st = mapping__cuda_check(d->cu->cuMemcpyDtoDAsync_v2(gather ? at_staging : at_buffer, gather ? at_buffer : at_staging,
                                                    (size_t)table[i].bytes, s),
                        "cuMemcpyDtoDAsync_v2");
    }
    return st;
}

static mapping_status run(cuda_device *d, cu_stream stream, cu_deviceptr staging, size_t table_offset,
                          const mapping_scatter_entry *table, size_t count, cu_deviceptr buffer, bool gather)
{
    cu_stream s = stream ? stream : d->internal;
    if (!stream) {
        mapping_status st = mapping__cuda_after_legacy(d);
        if (st != MAPPING_OK)
            return st;
    }
    bool batch = mapping__cuda_driver_has_batch_copy(d->cu);
    /* The kernel reads the table as 8-byte words. */
    bool kernel = d->module && table_offset % 8 == 0;
    cuda_scatter_mode mode = d->scatter_mode;
    /* auto: the kernel (on an H200, 10,000 64-byte copies in 0.31 ms
     * against 0.40 ms with cuMemcpyBatchAsync; a 1,000-range mirror sync in
     * 47 us against 68: docs/cuda.md), else the driver's batch copy. */
    if (mode == CUDA_SCATTER_AUTO)
        mode = kernel || !batch ? CUDA_SCATTER_KERNEL : CUDA_SCATTER_BATCH;
    /* Batch copies refuse the legacy stream, and are no graph node (CUDA 13
     * can instantiate a captured graph without them): on a capturing
     * stream, the kernel, which is. */
    if (mode == CUDA_SCATTER_BATCH && (!batch || s == CU_STREAM_LEGACY_ || mapping__cuda_capturing(d, s)))
        mode = CUDA_SCATTER_KERNEL;
    if (mode == CUDA_SCATTER_KERNEL && !kernel)
        mode = CUDA_SCATTER_COPIES;
    mapping_status st = mode == CUDA_SCATTER_BATCH    ? by_batch(d, s, staging, table, count, buffer, gather)
                        : mode == CUDA_SCATTER_KERNEL ? by_kernel(d, s, staging, table_offset, table, count, buffer, gather)
                                                      : by_copies(d, s, staging, table, count, buffer, gather);
    if (st == MAPPING_OK && !stream)
        st = mapping__cuda_check(d->cu->cuStreamSynchronize(s), "cuStreamSynchronize");
    return st;
}

mapping_status mapping__cuda_scatter(void *dev, void *stream, void *staging_mem, size_t table_offset,
                            const mapping_scatter_entry *table, size_t count, void *dst_mem)
{
    cuda_device *d = dev;
    cuda_scope scope;
    mapping_status st = mapping__cuda_enter(d, &scope);
    if (st != MAPPING_OK)
        return st;
    st = run(d, stream, cuda_ptr(staging_mem), table_offset, table, count, cuda_ptr(dst_mem), false);
    mapping__cuda_leave(d, &scope);
    return st;
}

mapping_status mapping__cuda_gather(void *dev, void *stream, void *src_mem, void *staging_mem, size_t table_offset,
                           const mapping_scatter_entry *table, size_t count)
{
    cuda_device *d = dev;
    cuda_scope scope;
    mapping_status st = mapping__cuda_enter(d, &scope);
    if (st != MAPPING_OK)
        return st;
    st = run(d, stream, cuda_ptr(staging_mem), table_offset, table, count, cuda_ptr(src_mem), true);
    mapping__cuda_leave(d, &scope);
    return st;
}
