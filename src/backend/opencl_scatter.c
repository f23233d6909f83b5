/*
 * Scatter and gather with one OpenCL C kernel launch: one work-group per
 * table entry, its work-items striding over the entry's bytes (16 at a time
 * when both ends are 16-byte aligned). The kernels read the table from the
 * staging buffer (at table_offset), where the batch layer has already
 * written it on the same stream. Built once per device, on first use.
 */
#include <stdio.h>
#include <string.h>
#include "backend/opencl_internal.h"
#include "core/error.h"
#ifdef MAPPING_OPENCL_HEADERS

/* Entries are three little-endian 64-bit fields (mapping_scatter_entry);
 * they are read byte by byte because table_offset need not be 8-aligned. */
static const char kernel_source[] =
    "ulong load_u64(__global const uchar *p)\n"
    "{\n"
    "    ulong v = 0;\n"
    "    for (int i = 7; i >= 0; i--)\n"
    "        v = (v << 8) | p[i];\n"
    "    return v;\n"
    "}\n"
    "void copy_entry(__global uchar *dst, __global const uchar *src, ulong bytes)\n"
    "{\n"
    "    ulong lane = get_local_id(0), lanes = get_local_size(0), head = 0;\n"
    "    if ((((ulong)dst | (ulong)src) & 15) == 0) {\n"
    "        __global uint4 *d = (__global uint4 *)dst;\n"
    "        __global const uint4 *s = (__global const uint4 *)src;\n"
    "        ulong n = bytes / 16;\n"
    "        for (ulong i = lane; i < n; i += lanes)\n"
    "            d[i] = s[i];\n"
    "        head = n * 16;\n"
    "    }\n"
    "    for (ulong i = head + lane; i < bytes; i += lanes)\n"
    "        dst[i] = src[i];\n"
    "}\n"
    "__kernel void mapping_scatter(__global uchar *staging, ulong table_offset, __global uchar *dst)\n"
    "{\n"
    "    __global const uchar *e = staging + table_offset + get_group_id(0) * 24;\n"
    "    copy_entry(dst + load_u64(e + 8), staging + load_u64(e), load_u64(e + 16));\n"
    "}\n"
    "__kernel void mapping_gather(__global const uchar *src, __global uchar *staging, ulong table_offset)\n"
    "{\n"
    "    __global const uchar *e = staging + table_offset + get_group_id(0) * 24;\n"
    "    copy_entry(staging + load_u64(e), src + load_u64(e + 8), load_u64(e + 16));\n"
    "}\n";

enum { OCL_LANES = 64 };

static mapping_status build_failure(ocl_device *d, cl_int err)
{
    char log[512] = "";
    ocl.clGetProgramBuildInfo(d->program, d->device, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL);
    log[sizeof log - 1] = '\0';
    for (char *c = log; *c; c++)
        if (*c == '\n')
            *c = ' ';
    /* The format of mapping__fail_driver, with the build log after it. */
    return mapping__fail(MAPPING_ERR_DRIVER, "opencl: clBuildProgram failed: %s (%d); scatter/gather kernel log: %s",
                         ocl_error_name(err), err, log);
}

/* With kernel_lock held. */
static mapping_status build_kernels(ocl_device *d)
{
    if (d->kernels_built)
        return MAPPING_OK;
    const char *source = kernel_source;
    cl_int err = CL_SUCCESS;
    d->program = ocl.clCreateProgramWithSource(d->context, 1, &source, NULL, &err);
    if (err != CL_SUCCESS) {
        d->program = NULL;
        return ocl_fail("clCreateProgramWithSource", err);
    }
    if ((err = ocl.clBuildProgram(d->program, 1, &d->device, "", NULL, NULL)) != CL_SUCCESS) {
        mapping_status st = build_failure(d, err);
        ocl_kernels_release(d);
        return st;
    }
    d->scatter = ocl.clCreateKernel(d->program, "mapping_scatter", &err);
    if (err == CL_SUCCESS)
        d->gather = ocl.clCreateKernel(d->program, "mapping_gather", &err);
    if (err != CL_SUCCESS) {
        ocl_kernels_release(d);
        return ocl_fail("clCreateKernel", err);
    }
    size_t max = OCL_LANES;
    if (ocl.clGetKernelWorkGroupInfo(d->scatter, d->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof max, &max, NULL) !=
        CL_SUCCESS)
        max = 1;
    d->lanes = max < OCL_LANES ? (max ? max : 1) : OCL_LANES;
    d->kernels_built = true;
    return MAPPING_OK;
}

void ocl_kernels_release(ocl_device *d)
{
    if (d->scatter)
        ocl.clReleaseKernel(d->scatter);
    if (d->gather)
        ocl.clReleaseKernel(d->gather);
    if (d->program)
        ocl.clReleaseProgram(d->program);
    d->scatter = d->gather = NULL;
    d->program = NULL;
    d->kernels_built = false;
}

/* Sets the three arguments and launches count work-groups. */
static mapping_status launch(ocl_device *d, void *stream, bool scatter, cl_mem first, cl_mem second,
                             size_t table_offset, size_t count)
{
    if (count == 0)
        return MAPPING_OK;
    pthread_mutex_lock(&d->kernel_lock);
    mapping_status st = build_kernels(d);
    cl_event ev = NULL;
    cl_int err = CL_SUCCESS;
    if (st == MAPPING_OK) {
        cl_kernel k = scatter ? d->scatter : d->gather;
        cl_ulong offset = table_offset;
        /* scatter(staging, table_offset, dst); gather(src, staging, table_offset) */
        if (scatter)
            err = ocl.clSetKernelArg(k, 0, sizeof first, &first) | ocl.clSetKernelArg(k, 1, sizeof offset, &offset) |
                  ocl.clSetKernelArg(k, 2, sizeof second, &second);
        else
            err = ocl.clSetKernelArg(k, 0, sizeof first, &first) | ocl.clSetKernelArg(k, 1, sizeof second, &second) |
                  ocl.clSetKernelArg(k, 2, sizeof offset, &offset);
        if (err != CL_SUCCESS) {
            st = mapping__fail(MAPPING_ERR_DRIVER, "opencl: clSetKernelArg of the %s kernel failed",
                               scatter ? "scatter" : "gather");
        } else {
            size_t local = d->lanes, global = count * d->lanes;
            err = ocl.clEnqueueNDRangeKernel(ocl_queue_of(d, stream), k, 1, NULL, &global, &local, 0, NULL,
                                             stream ? NULL : &ev);
            if (err != CL_SUCCESS)
                st = ocl_fail("clEnqueueNDRangeKernel", err);
        }
    }
    pthread_mutex_unlock(&d->kernel_lock);
    if (st == MAPPING_OK && !stream)
        st = ocl_finish_blocking("clEnqueueNDRangeKernel", CL_SUCCESS, ev);
    return st;
}

mapping_status ocl_scatter(void *dev, void *stream, void *staging_mem, size_t table_offset,
                           const mapping_scatter_entry *table, size_t count, void *dst_mem)
{
    (void)table;
    return launch(dev, stream, true, ((ocl_buffer *)staging_mem)->mem, ((ocl_buffer *)dst_mem)->mem, table_offset,
                  count);
}

mapping_status ocl_gather(void *dev, void *stream, void *src_mem, void *staging_mem, size_t table_offset,
                          const mapping_scatter_entry *table, size_t count)
{
    (void)table;
    return launch(dev, stream, false, ((ocl_buffer *)src_mem)->mem, ((ocl_buffer *)staging_mem)->mem, table_offset,
                  count);
}
#endif /* MAPPING_OPENCL_HEADERS */
