/*
 * Scatter and gather with one OpenCL C kernel launch (and, in the same
 * program, the device-side diff of mirrors: mapping__opencl_diff_blocks). Each table entry gets
 * `lanes` consecutive work-items (a power of two, chosen per launch from the
 * table; 1 for small entries) and work-groups hold many entries. The first
 * version gave every entry a work-group of 64 work-items, each re-reading the
 * entry: on PoCL's CPU device a flush of 10,000 64-byte copies spent ~5 ms
 * in the kernel. Now the same kernel takes ~50 us.
 *
 * How an entry's lanes share its bytes depends on the device: on a GPU they
 * interleave (lane i copies 16-byte blocks i, i + lanes, ...: neighbouring
 * work-items touch neighbouring memory); on a CPU device, which runs the
 * work-items of a work-group one after another on one core, each lane copies
 * one contiguous slice (an interleaved walk would stride through the entry
 * `lanes` times), and lanes only pay off when an entry is large enough to
 * spread over several work-groups, hence over several cores. When every entry
 * of a launch on a CPU device is small (one lane each), the slice kernels
 * take it instead: one work-item (and work-group) per contiguous slice of at
 * least SLICE_MIN entries, a few slices per compute unit, each a plain loop
 * over its entries. PoCL then runs a few work-group calls rather than one
 * per 64 entries, and no work-item is scheduled per entry.
 *
 * The kernels read the table from the staging buffer (at table_offset),
 * where the batch layer has already written it on the same stream. Built
 * once per device: at open when an earlier process kept the program binary
 * (opencl_program_cache.c; ~1-2 ms on PoCL), else on first use from source
 * (20-100 ms on PoCL), and then kept. The program and kernel objects are
 * kept with the device.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "backend/opencl/opencl_internal.h"
#include "os/status.h"
#ifdef MAPPING_OPENCL_HEADERS

/* Entries are three little-endian 64-bit fields (mapping_scatter_entry).
 * The batch layer's tables are 8-aligned and are read as ulongs; a table at
 * any other offset (the back-end contract allows it) is read byte by byte. */
static const char kernel_source[] =
    "ulong load_u64(__global const uchar *p)\n"
    "{\n"
    "    ulong v = 0;\n"
    "    for (int i = 7; i >= 0; i--)\n"
    "        v = (v << 8) | p[i];\n"
    "    return v;\n"
    "}\n"
    "ulong3 load_entry(__global const uchar *staging, ulong table_offset, ulong entry)\n"
    "{\n"
    "    __global const uchar *e = staging + table_offset + entry * 24;\n"
    "    if ((table_offset & 7) == 0) {\n"
    "        __global const ulong *u = (__global const ulong *)e;\n"
    "        return (ulong3)(u[0], u[1], u[2]);\n"
    "    }\n"
    "    return (ulong3)(load_u64(e), load_u64(e + 8), load_u64(e + 16));\n"
    "}\n"
    "void copy_range(__global uchar *dst, __global const uchar *src, ulong bytes, ulong lane, ulong lanes,\n"
    "                uint sliced)\n"
    "{\n"
    "    ulong n = bytes / 16, begin = lane, end = n, step = lanes;\n"
    "    if (sliced) {\n"
    "        ulong per = (n + lanes - 1) / lanes;\n"
    "        begin = lane * per;\n"
    "        end = min(n, begin + per);\n"
    "        step = 1;\n"
    "    }\n"
    "    if ((((ulong)dst | (ulong)src) & 15) == 0) {\n"
    "        __global uint4 *d = (__global uint4 *)dst;\n"
    "        __global const uint4 *s = (__global const uint4 *)src;\n"
    "        for (ulong i = begin; i < end; i += step)\n"
    "            d[i] = s[i];\n"
    "    } else {\n"
    "        for (ulong i = begin; i < end; i += step)\n"
    "            vstore16(vload16(i, src), i, dst);\n"
    "    }\n"
    "    for (ulong i = n * 16 + lane; i < bytes; i += lanes)\n"
    "        dst[i] = src[i];\n"
    "}\n"
    "__kernel void mapping_scatter(__global const uchar *staging, __global uchar *buffer, ulong table_offset,\n"
    "                              ulong count, uint lane_bits, uint sliced)\n"
    "{\n"
    "    ulong id = get_global_id(0), entry = id >> lane_bits;\n"
    "    if (entry >= count)\n"
    "        return;\n"
    "    ulong3 e = load_entry(staging, table_offset, entry);\n"
    "    copy_range(buffer + e.s1, staging + e.s0, e.s2, id & ((1ul << lane_bits) - 1), 1ul << lane_bits, sliced);\n"
    "}\n"
    "/* CPU devices, entries below a lane's worth: one work-item per contiguous\n"
    " * slice of `per` entries, a plain loop (no per-entry work-item to schedule). */\n"
    "void copy_small(__global uchar *dst, __global const uchar *src, ulong bytes)\n"
    "{\n"
    "    ulong n = bytes / 16;\n"
    "    if ((((ulong)dst | (ulong)src) & 15) == 0) {\n"
    "        __global uint4 *d = (__global uint4 *)dst;\n"
    "        __global const uint4 *s = (__global const uint4 *)src;\n"
    "        for (ulong i = 0; i < n; i++)\n"
    "            d[i] = s[i];\n"
    "    } else {\n"
    "        for (ulong i = 0; i < n; i++)\n"
    "            vstore16(vload16(i, src), i, dst);\n"
    "    }\n"
    "    for (ulong i = n * 16; i < bytes; i++)\n"
    "        dst[i] = src[i];\n"
    "}\n"
    "__kernel void mapping_scatter_slices(__global const uchar *staging, __global uchar *buffer, ulong table_offset,\n"
    "                                     ulong count, ulong per)\n"
    "{\n"
    "    ulong begin = get_global_id(0) * per, end = min(count, begin + per);\n"
    "    for (ulong i = begin; i < end; i++) {\n"
    "        ulong3 e = load_entry(staging, table_offset, i);\n"
    "        copy_small(buffer + e.s1, staging + e.s0, e.s2);\n"
    "    }\n"
    "}\n"
    "__kernel void mapping_gather_slices(__global uchar *staging, __global const uchar *buffer, ulong table_offset,\n"
    "                                    ulong count, ulong per)\n"
    "{\n"
    "    ulong begin = get_global_id(0) * per, end = min(count, begin + per);\n"
    "    for (ulong i = begin; i < end; i++) {\n"
    "        ulong3 e = load_entry(staging, table_offset, i);\n"
    "        copy_small(staging + e.s0, buffer + e.s1, e.s2);\n"
    "    }\n"
    "}\n"
    "__kernel void mapping_gather(__global uchar *staging, __global const uchar *buffer, ulong table_offset,\n"
    "                             ulong count, uint lane_bits, uint sliced)\n"
    "{\n"
    "    ulong id = get_global_id(0), entry = id >> lane_bits;\n"
    "    if (entry >= count)\n"
    "        return;\n"
    "    ulong3 e = load_entry(staging, table_offset, entry);\n"
    "    copy_range(staging + e.s0, buffer + e.s1, e.s2, id & ((1ul << lane_bits) - 1), 1ul << lane_bits, sliced);\n"
    "}\n"
    "/* Device-side diff: one work-item per 4096-byte block compares the buffer\n"
    " * with the shadow, flags the block, and copies it into the shadow if it\n"
    " * changed (mapping_backend.diff_blocks). */\n"
    "__kernel void mapping_diff_blocks(__global const uchar *mem, ulong mem_offset, __global uchar *shadow,\n"
    "                                  ulong shadow_offset, __global uchar *flags, ulong flags_offset, ulong blocks)\n"
    "{\n"
    "    ulong b = get_global_id(0);\n"
    "    if (b >= blocks)\n"
    "        return;\n"
    "    __global const uchar *a = mem + mem_offset + b * 4096;\n"
    "    __global uchar *s = shadow + shadow_offset + b * 4096;\n"
    "    uint changed = 0;\n"
    "    if (((mem_offset | shadow_offset) & 15) == 0) {\n"
    "        __global const uint4 *x = (__global const uint4 *)a;\n"
    "        __global uint4 *y = (__global uint4 *)s;\n"
    "        for (int i = 0; i < 256; i++) {\n"
    "            uint4 d = x[i] ^ y[i];\n"
    "            changed |= d.x | d.y | d.z | d.w;\n"
    "        }\n"
    "        if (changed)\n"
    "            for (int i = 0; i < 256; i++)\n"
    "                y[i] = x[i];\n"
    "    } else {\n"
    "        for (int i = 0; i < 4096; i++)\n"
    "            changed |= a[i] ^ s[i];\n"
    "        if (changed)\n"
    "            for (int i = 0; i < 4096; i++)\n"
    "                s[i] = a[i];\n"
    "    }\n"
    "    flags[flags_offset + b] = changed != 0;\n"
    "}\n"
    "/* The same on a GPU: a work-group per block, work-item l of n comparing\n"
    " * 16-byte words l, l + n, ... (neighbouring work-items read neighbouring\n"
    " * memory), the verdict ORed in local memory. */\n"
    "__kernel void mapping_diff_groups(__global const uchar *mem, ulong mem_offset, __global uchar *shadow,\n"
    "                                  ulong shadow_offset, __global uchar *flags, ulong flags_offset, ulong blocks)\n"
    "{\n"
    "    __local uint any;\n"
    "    ulong b = get_group_id(0);\n"
    "    uint l = get_local_id(0), n = get_local_size(0);\n"
    "    if (l == 0)\n"
    "        any = 0;\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    __global const uchar *a = mem + mem_offset + b * 4096;\n"
    "    __global uchar *s = shadow + shadow_offset + b * 4096;\n"
    "    bool aligned = ((mem_offset | shadow_offset) & 15) == 0;\n"
    "    uint changed = 0;\n"
    "    if (b < blocks) {\n"
    "        if (aligned) {\n"
    "            __global const uint4 *x = (__global const uint4 *)a;\n"
    "            __global const uint4 *y = (__global const uint4 *)s;\n"
    "            for (uint i = l; i < 256; i += n) {\n"
    "                uint4 d = x[i] ^ y[i];\n"
    "                changed |= d.x | d.y | d.z | d.w;\n"
    "            }\n"
    "        } else {\n"
    "            for (uint i = l; i < 4096; i += n)\n"
    "                changed |= a[i] ^ s[i];\n"
    "        }\n"
    "        if (changed)\n"
    "            atomic_or(&any, 1u);\n"
    "    }\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    if (b >= blocks)\n"
    "        return;\n"
    "    if (any) {\n"
    "        if (aligned) {\n"
    "            __global const uint4 *x = (__global const uint4 *)a;\n"
    "            __global uint4 *y = (__global uint4 *)s;\n"
    "            for (uint i = l; i < 256; i += n)\n"
    "                y[i] = x[i];\n"
    "        } else {\n"
    "            for (uint i = l; i < 4096; i += n)\n"
    "                s[i] = a[i];\n"
    "        }\n"
    "    }\n"
    "    if (l == 0)\n"
    "        flags[flags_offset + b] = any != 0;\n"
    "}\n";

/* Work-items per work-group at most (the kernel's limit may be lower). */
enum { OPENCL_GROUP = 64 };
/* CPU devices: entries per work-item of the slice kernels at least. */
enum { SLICE_MIN = 256 };

/* How many work-items an entry gets: one per lane_bytes of the largest
 * entry, rounded up to a power of two, at most max_lanes; and fewer when the
 * launch would then exceed max_items work-items (a few large entries among
 * many small ones must not give every small one max_lanes idle work-items). */
typedef struct opencl_lane_policy {
    uint64_t lane_bytes;
    size_t   max_lanes, max_items;
} opencl_lane_policy;
static const opencl_lane_policy gpu_lanes = {256, 1024, (size_t)1 << 22};
static const opencl_lane_policy cpu_lanes = {4096, 1024, (size_t)1 << 16};

static mapping_status build_failure(opencl_device *d, cl_int err)
{
    char log[512] = "";
    mapping__opencl_driver.clGetProgramBuildInfo(d->program, d->device, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL);
    log[sizeof log - 1] = '\0';
    for (char *c = log; *c; c++)
        if (*c == '\n')
            *c = ' ';
    /* The format of mapping__fail_driver, with the build log after it. */
    return mapping__fail(MAPPING_ERR_DRIVER, "opencl: clBuildProgram failed: %s (%d); scatter/gather kernel log: %s",
                         mapping__opencl_error_name(err), err, log);
}

/* With kernel_lock held. cache_only: only from a kept binary (at open),
 * else nothing (MAPPING_OK, not built). */
static mapping_status build_kernels_from(opencl_device *d, bool cache_only)
{
    if (d->kernels_built)
        return MAPPING_OK;
    const char *source = kernel_source, *options = "";
    cl_int err = CL_SUCCESS;
    /* A binary kept by an earlier process first; a source build otherwise
     * (or when the cached program lacks a kernel), which is then kept. */
    bool cached = (d->program = mapping__opencl_program_from_cache(d, source, options)) != NULL;
    if (cache_only && !cached)
        return MAPPING_OK;
    for (;;) {
        if (!cached) {
            d->program = mapping__opencl_driver.clCreateProgramWithSource(d->context, 1, &source, NULL, &err);
            if (err != CL_SUCCESS) {
                d->program = NULL;
                return mapping__opencl_fail("clCreateProgramWithSource", err);
            }
            if ((err = mapping__opencl_driver.clBuildProgram(d->program, 1, &d->device, options, NULL, NULL)) != CL_SUCCESS) {
                mapping_status st = build_failure(d, err);
                mapping__opencl_kernels_release(d);
                return st;
            }
        }
        d->scatter = mapping__opencl_driver.clCreateKernel(d->program, "mapping_scatter", &err);
        if (err == CL_SUCCESS)
            d->gather = mapping__opencl_driver.clCreateKernel(d->program, "mapping_gather", &err);
        if (err == CL_SUCCESS)
            d->scatter_slices = mapping__opencl_driver.clCreateKernel(d->program, "mapping_scatter_slices", &err);
        if (err == CL_SUCCESS)
            d->gather_slices = mapping__opencl_driver.clCreateKernel(d->program, "mapping_gather_slices", &err);
        if (err == CL_SUCCESS)
            d->diff = mapping__opencl_driver.clCreateKernel(d->program, "mapping_diff_blocks", &err);
        if (err == CL_SUCCESS)
            d->diff_groups = mapping__opencl_driver.clCreateKernel(d->program, "mapping_diff_groups", &err);
        if (err == CL_SUCCESS)
            break;
        mapping__opencl_kernels_release(d);
        if (!cached)
            return mapping__opencl_fail("clCreateKernel", err);
        if (cache_only)
            return MAPPING_OK;
        cached = false;
    }
    if (!cached)
        mapping__opencl_program_to_cache(d, d->program, source, options);
    size_t max[2] = {OPENCL_GROUP, OPENCL_GROUP};
    for (int i = 0; i < 2; i++)
        if (mapping__opencl_driver.clGetKernelWorkGroupInfo(i ? d->gather : d->scatter, d->device, CL_KERNEL_WORK_GROUP_SIZE,
                                         sizeof max[i], &max[i], NULL) != CL_SUCCESS)
            max[i] = 1;
    size_t group = max[0] < max[1] ? max[0] : max[1];
    d->group_size = 1; /* a power of two, like the lanes per entry: an entry's lanes never straddle groups needlessly */
    while (d->group_size * 2 <= group && d->group_size * 2 <= OPENCL_GROUP)
        d->group_size *= 2;
    cl_uint units = 1;
    if (mapping__opencl_driver.clGetDeviceInfo(d->device, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof units, &units, NULL) != CL_SUCCESS ||
        units == 0)
        units = 1;
    d->compute_units = units;
    d->kernels_built = true;
    return MAPPING_OK;
}

static mapping_status build_kernels(opencl_device *d)
{
    return build_kernels_from(d, false);
}

void mapping__opencl_kernels_prepare(opencl_device *d)
{
    pthread_mutex_lock(&d->kernel_lock);
    build_kernels_from(d, true);
    pthread_mutex_unlock(&d->kernel_lock);
}

void mapping__opencl_kernels_release(opencl_device *d)
{
    if (d->scatter)
        mapping__opencl_driver.clReleaseKernel(d->scatter);
    if (d->gather)
        mapping__opencl_driver.clReleaseKernel(d->gather);
    if (d->scatter_slices)
        mapping__opencl_driver.clReleaseKernel(d->scatter_slices);
    if (d->gather_slices)
        mapping__opencl_driver.clReleaseKernel(d->gather_slices);
    if (d->diff)
        mapping__opencl_driver.clReleaseKernel(d->diff);
    if (d->diff_groups)
        mapping__opencl_driver.clReleaseKernel(d->diff_groups);
    d->scatter_slices = d->gather_slices = d->diff = d->diff_groups = NULL;
    if (d->program)
        mapping__opencl_driver.clReleaseProgram(d->program);
    d->scatter = d->gather = NULL;
    d->program = NULL;
    d->kernels_built = false;
}

/* log2 of the work-items per entry (see opencl_lane_policy). */
static cl_uint lane_bits_for(const opencl_device *d, const mapping_scatter_entry *table, size_t count)
{
    const opencl_lane_policy *p = d->sliced_lanes ? &cpu_lanes : &gpu_lanes;
    uint64_t largest = 0;
    for (size_t i = 0; i < count; i++)
        if (table[i].bytes > largest)
            largest = table[i].bytes;
    size_t max_items = count > p->max_items ? count : p->max_items;
    cl_uint bits = 0;
    while ((p->lane_bytes << bits) < largest && ((size_t)2 << bits) <= p->max_lanes &&
           count <= max_items >> (bits + 1))
        bits++;
    return bits;
}

/* Enqueues k over `global` work-items in work-groups of `local` (with
 * kernel_lock held: the arguments were just set). Blocking (stream NULL):
 * *ev is the event mapping__opencl_finish_blocking then waits for. */
static mapping_status enqueue_kernel(opencl_device *d, void *stream, cl_kernel k, size_t global, size_t local,
                                     cl_event *ev)
{
    cl_int err = mapping__opencl_driver.clEnqueueNDRangeKernel(opencl_queue_of(d, stream), k, 1, NULL, &global, &local,
                                                               0, NULL, stream ? NULL : ev);
    return err == CL_SUCCESS ? MAPPING_OK : mapping__opencl_fail("clEnqueueNDRangeKernel", err);
}

/* Sets the arguments and launches count << lane_bits work-items (rounded up
 * to whole work-groups; the extra ones return at once). */
static mapping_status launch(opencl_device *d, void *stream, bool scatter, cl_mem staging, cl_mem buffer,
                             size_t table_offset, const mapping_scatter_entry *table, size_t count)
{
    if (count == 0)
        return MAPPING_OK;
    cl_uint lane_bits = lane_bits_for(d, table, count), sliced = d->sliced_lanes;
    if (count > (SIZE_MAX >> lane_bits) - OPENCL_GROUP)
        return mapping__fail(MAPPING_ERR_OUT_OF_RANGE, "opencl: %zu %s entries are too many for one launch", count,
                             scatter ? "scatter" : "gather");
    pthread_mutex_lock(&d->kernel_lock);
    mapping_status st = build_kernels(d);
    cl_event ev = NULL;
    cl_int err = CL_SUCCESS;
    if (st == MAPPING_OK) {
        /* The lane kernels: (staging, buffer, table_offset, count, lane_bits, sliced);
         * the slice kernels: (staging, buffer, table_offset, count, per). */
        bool slices = sliced && lane_bits == 0;
        cl_kernel k = slices ? (scatter ? d->scatter_slices : d->gather_slices) : scatter ? d->scatter : d->gather;
        cl_ulong offset = table_offset, entries = count;
        size_t items = 0;
        err = mapping__opencl_driver.clSetKernelArg(k, 0, sizeof staging, &staging) | mapping__opencl_driver.clSetKernelArg(k, 1, sizeof buffer, &buffer) |
              mapping__opencl_driver.clSetKernelArg(k, 2, sizeof offset, &offset) | mapping__opencl_driver.clSetKernelArg(k, 3, sizeof entries, &entries);
        if (slices) {
            /* A few slices per compute unit (for balance), each of at least
             * SLICE_MIN entries (so the loop, not the launch, dominates). */
            size_t want = (size_t)d->compute_units * 4, by_size = (count + SLICE_MIN - 1) / SLICE_MIN;
            items = want < by_size ? want : by_size;
            cl_ulong per = (count + items - 1) / items;
            items = (size_t)((count + per - 1) / per);
            err |= mapping__opencl_driver.clSetKernelArg(k, 4, sizeof per, &per);
        } else {
            err |= mapping__opencl_driver.clSetKernelArg(k, 4, sizeof lane_bits, &lane_bits) |
                   mapping__opencl_driver.clSetKernelArg(k, 5, sizeof sliced, &sliced);
        }
        if (err != CL_SUCCESS) {
            st = mapping__fail(MAPPING_ERR_DRIVER, "opencl: clSetKernelArg of the %s kernel failed",
                               scatter ? "scatter" : "gather");
        } else {
            size_t local = slices ? 1 : d->group_size,
                   global = slices ? items : ((count << lane_bits) + local - 1) / local * local;
            st = enqueue_kernel(d, stream, k, global, local, &ev);
        }
    }
    pthread_mutex_unlock(&d->kernel_lock);
    if (st == MAPPING_OK && !stream)
        st = mapping__opencl_finish_blocking("clEnqueueNDRangeKernel", CL_SUCCESS, ev);
    return st;
}

mapping_status mapping__opencl_scatter(void *dev, void *stream, void *staging_mem, size_t table_offset,
                           const mapping_scatter_entry *table, size_t count, void *dst_mem)
{
    return launch(dev, stream, true, ((opencl_buffer *)staging_mem)->mem, ((opencl_buffer *)dst_mem)->mem, table_offset,
                  table, count);
}

mapping_status mapping__opencl_gather(void *dev, void *stream, void *src_mem, void *staging_mem, size_t table_offset,
                          const mapping_scatter_entry *table, size_t count)
{
    return launch(dev, stream, false, ((opencl_buffer *)staging_mem)->mem, ((opencl_buffer *)src_mem)->mem, table_offset,
                  table, count);
}

mapping_status mapping__opencl_diff_blocks(void *dev, void *stream, void *mem, size_t mem_offset, void *shadow_mem,
                                           size_t shadow_offset, size_t bytes, void *flags_mem, size_t flags_offset)
{
    opencl_device *d = dev;
    cl_mem m = ((opencl_buffer *)mem)->mem, sh = ((opencl_buffer *)shadow_mem)->mem, fl = ((opencl_buffer *)flags_mem)->mem;
    cl_ulong mo = mem_offset, so = shadow_offset, fo = flags_offset, blocks = bytes / MAPPING_DIFF_BLOCK;
    pthread_mutex_lock(&d->kernel_lock);
    mapping_status st = build_kernels(d);
    cl_event ev = NULL;
    if (st == MAPPING_OK) {
        /* A work-item per block on a CPU device (it runs a work-group's
         * items one after another: a barrier costs more than it saves; on
         * PoCL 11.9 ms against 29 ms for 256 MiB), a work-group per block
         * elsewhere (neighbouring work-items read neighbouring memory). */
        bool groups = d->diff_by_groups;
        cl_kernel k = groups ? d->diff_groups : d->diff;
        cl_int err = mapping__opencl_driver.clSetKernelArg(k, 0, sizeof m, &m) |
                     mapping__opencl_driver.clSetKernelArg(k, 1, sizeof mo, &mo) |
                     mapping__opencl_driver.clSetKernelArg(k, 2, sizeof sh, &sh) |
                     mapping__opencl_driver.clSetKernelArg(k, 3, sizeof so, &so) |
                     mapping__opencl_driver.clSetKernelArg(k, 4, sizeof fl, &fl) |
                     mapping__opencl_driver.clSetKernelArg(k, 5, sizeof fo, &fo) |
                     mapping__opencl_driver.clSetKernelArg(k, 6, sizeof blocks, &blocks);
        if (err != CL_SUCCESS) {
            st = mapping__fail(MAPPING_ERR_DRIVER, "opencl: clSetKernelArg of the diff kernel failed");
        } else {
            size_t local = d->group_size,
                   global = groups ? (size_t)blocks * local : ((size_t)blocks + local - 1) / local * local;
            st = enqueue_kernel(d, stream, k, global, local, &ev);
        }
    }
    pthread_mutex_unlock(&d->kernel_lock);
    if (st == MAPPING_OK && !stream)
        st = mapping__opencl_finish_blocking("clEnqueueNDRangeKernel", CL_SUCCESS, ev);
    return st;
}
#endif /* MAPPING_OPENCL_HEADERS */
