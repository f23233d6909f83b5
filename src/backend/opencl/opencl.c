/*
 * The OpenCL back end: devices of every platform the ICD loader reports, in
 * platform order, each opened as its own context with an in-order queue for
 * blocking calls. How the API maps onto OpenCL is in docs/opencl.md.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/opencl/opencl_internal.h"
#include "os/os.h"
#include "os/status.h"

#ifndef MAPPING_OPENCL_HEADERS
static mapping_status opencl_unavailable(char *why, size_t why_size, int *count)
{
    *count = 0;
    snprintf(why, why_size, "built without the OpenCL headers (CL/cl.h; Debian: opencl-headers)");
    return MAPPING_ERR_NO_BACKEND;
}

/* The registry never calls the other operations of a back end that did not load. */
const mapping_backend mapping_backend_opencl = {.name = "opencl", .load = opencl_unavailable};
#else

enum { OPENCL_MAX_DEVICES = 64 };

/* Filled once by opencl_load (the registry calls it once per process). */
static struct {
    cl_platform_id      platform;
    cl_device_id        device;
    mapping_device_info info;
    bool                svm_fine;
} devices[OPENCL_MAX_DEVICES];
static int device_count;

static void info_string(cl_device_id dev, cl_device_info what, char *out, size_t size)
{
    out[0] = '\0';
    if (mapping__opencl_driver.clGetDeviceInfo(dev, what, size, out, NULL) != CL_SUCCESS)
        out[0] = '\0';
    out[size - 1] = '\0';
}

/* Fills the cached description of one device; the caps are what this back
 * end really does on it. */
static void describe(int index, cl_platform_id platform, cl_device_id dev)
{
    mapping_device_info *info = &devices[index].info;
    memset(info, 0, sizeof *info);
    strcpy(info->backend, "opencl");
    info->index = index;
    cl_device_type type = 0;
    mapping__opencl_driver.clGetDeviceInfo(dev, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    strcpy(info->kind, type & CL_DEVICE_TYPE_GPU ? "gpu" : type & CL_DEVICE_TYPE_CPU ? "cpu" : "accelerator");
    info_string(dev, CL_DEVICE_NAME, info->name, sizeof info->name);
    info_string(dev, CL_DEVICE_VENDOR, info->vendor, sizeof info->vendor);
    char platform_version[512] = "", driver[64] = "";
    if (mapping__opencl_driver.clGetPlatformInfo(platform, CL_PLATFORM_VERSION, sizeof platform_version, platform_version, NULL))
        platform_version[0] = '\0';
    platform_version[sizeof platform_version - 1] = '\0';
    platform_version[strcspn(platform_version, ",")] = '\0'; /* PoCL appends its build options */
    info_string(dev, CL_DRIVER_VERSION, driver, sizeof driver);
    snprintf(info->driver, sizeof info->driver, "%.72s; driver %.40s", platform_version, driver);
    cl_ulong memory = 0;
    mapping__opencl_driver.clGetDeviceInfo(dev, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof memory, &memory, NULL);
    info->memory_bytes = memory;

    /* SVM is an OpenCL 2.0 query: a 1.x device answers with an error, i.e. none. */
    cl_device_svm_capabilities svm = 0;
    if (mapping__opencl_driver.clGetDeviceInfo(dev, CL_DEVICE_SVM_CAPABILITIES, sizeof svm, &svm, NULL) != CL_SUCCESS)
        svm = 0;
    devices[index].svm_fine = (svm & CL_DEVICE_SVM_FINE_GRAIN_BUFFER) && mapping__opencl_driver.clSVMAlloc && mapping__opencl_driver.clSVMFree;
    cl_bool compiler = CL_FALSE;
    mapping__opencl_driver.clGetDeviceInfo(dev, CL_DEVICE_COMPILER_AVAILABLE, sizeof compiler, &compiler, NULL);

    info->caps = MAPPING_CAP_PINNED_HOST | MAPPING_CAP_ASYNC_COPY | MAPPING_CAP_TIMING;
    if (devices[index].svm_fine)
        info->caps |= MAPPING_CAP_UNIFIED | MAPPING_CAP_CONCURRENT_UNIFIED;
    if (compiler)
        info->caps |= MAPPING_CAP_DEVICE_KERNELS;
    if (type & CL_DEVICE_TYPE_CPU)
        info->caps |= MAPPING_CAP_CPU_MEMORY;
}

static mapping_status opencl_load(char *why, size_t why_size, int *count)
{
    *count = 0;
    mapping_status st = mapping__opencl_api_load(why, why_size);
    if (st != MAPPING_OK)
        return st;
    cl_uint nplatforms = 0;
    cl_int err = mapping__opencl_driver.clGetPlatformIDs(0, NULL, &nplatforms);
    if (err == -1001 /* CL_PLATFORM_NOT_FOUND_KHR */ || (err == CL_SUCCESS && nplatforms == 0)) {
        snprintf(why, why_size, "the OpenCL loader found no platform (no ICD in /etc/OpenCL/vendors?)");
        return MAPPING_ERR_NO_DEVICE;
    }
    if (err != CL_SUCCESS) {
        snprintf(why, why_size, "clGetPlatformIDs failed: %s (%d)", mapping__opencl_error_name(err), err);
        return MAPPING_ERR_DRIVER;
    }
    cl_platform_id platforms[16];
    if (nplatforms > 16)
        nplatforms = 16;
    if ((err = mapping__opencl_driver.clGetPlatformIDs(nplatforms, platforms, NULL)) != CL_SUCCESS) {
        snprintf(why, why_size, "clGetPlatformIDs failed: %s (%d)", mapping__opencl_error_name(err), err);
        return MAPPING_ERR_DRIVER;
    }
    for (cl_uint p = 0; p < nplatforms && device_count < OPENCL_MAX_DEVICES; p++) {
        cl_device_id ids[OPENCL_MAX_DEVICES];
        cl_uint n = 0;
        /* A platform without devices answers CL_DEVICE_NOT_FOUND: skip it. */
        if (mapping__opencl_driver.clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, OPENCL_MAX_DEVICES, ids, &n) != CL_SUCCESS)
            continue;
        for (cl_uint i = 0; i < n && i < OPENCL_MAX_DEVICES && device_count < OPENCL_MAX_DEVICES; i++) {
            devices[device_count].platform = platforms[p];
            devices[device_count].device = ids[i];
            describe(device_count, platforms[p], ids[i]);
            device_count++;
        }
    }
    if (device_count == 0) {
        snprintf(why, why_size, "%u OpenCL platform(s), but none has a device", nplatforms);
        return MAPPING_ERR_NO_DEVICE;
    }
    *count = device_count;
    return MAPPING_OK;
}

static mapping_status opencl_device_info(int index, mapping_device_info *info)
{
    if (index < 0 || index >= device_count)
        return mapping__fail(MAPPING_ERR_NO_DEVICE, "opencl: there is no device %d", index);
    *info = devices[index].info;
    return MAPPING_OK;
}

static void opencl_device_close(void *dev)
{
    opencl_device *d = dev;
    mapping__opencl_kernels_release(d);
    mapping__opencl_blocking_stream_fini(d);
    if (d->queue) {
        mapping__opencl_driver.clFinish(d->queue);
        mapping__opencl_driver.clReleaseCommandQueue(d->queue);
    }
    if (d->context && d->context_adopted)
        mapping__opencl_driver.clReleaseContext(d->context);
    else if (d->context)
        mapping__opencl_context_release(d->context);
    pthread_mutex_destroy(&d->kernel_lock);
    free(d);
}

/* $MAPPING_OPENCL_DIFF: the shape of the mirrors' diff kernel. 0 auto (a
 * work-item per block on CPU devices, a work-group per block elsewhere),
 * 1 items, 2 groups, -1 another value. */
static int diff_shape_from_env(void)
{
    const char *v = getenv("MAPPING_OPENCL_DIFF");
    return !v || !*v || !strcmp(v, "auto") ? 0 : !strcmp(v, "items") ? 1 : !strcmp(v, "groups") ? 2 : -1;
}

static mapping_status opencl_device_open(int index, const mapping_device_desc *desc, void **out)
{
    (void)desc;
    const char *share = getenv("MAPPING_OPENCL_SHARED_CONTEXT"); /* read again by opencl_peer.c */
    if (share && *share && strcmp(share, "0") && strcmp(share, "1"))
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                             "mapping_open: MAPPING_OPENCL_SHARED_CONTEXT=\"%s\" is not 0 or 1", share);
    int diff_shape;
    if ((diff_shape = diff_shape_from_env()) < 0)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "mapping_open: MAPPING_OPENCL_DIFF=\"%s\" is not auto, items "
                             "or groups", getenv("MAPPING_OPENCL_DIFF"));
    opencl_device *d = mapping_os_calloc(1, sizeof *d);
    if (!d)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "opencl: out of memory");
    pthread_mutex_init(&d->kernel_lock, NULL);
    d->platform = devices[index].platform;
    d->device = devices[index].device;
    d->svm_fine = devices[index].svm_fine;
    d->sliced_lanes = !strcmp(devices[index].info.kind, "cpu");
    d->diff_by_groups = diff_shape ? diff_shape == 2 : !d->sliced_lanes;
    cl_int err = CL_SUCCESS;
    d->context = mapping__opencl_context_acquire(d->platform, d->device, &err); /* shared by the platform's devices */
    if (err != CL_SUCCESS) {
        d->context = NULL;
        opencl_device_close(d);
        return mapping__opencl_fail("clCreateContext", err);
    }
    /* No profiling here: blocking calls are not timed by events, and an
     * expert's queue for plain transfers would not pay for timestamps. */
    d->queue = mapping__opencl_driver.clCreateCommandQueue(d->context, d->device, 0, &err);
    if (err != CL_SUCCESS) {
        d->queue = NULL;
        opencl_device_close(d);
        return mapping__opencl_fail("clCreateCommandQueue", err);
    }
    mapping__opencl_blocking_stream_init(d);
    mapping__opencl_kernels_prepare(d); /* from a kept binary only: no first-use build */
    *out = d;
    return MAPPING_OK;
}

/* Opens on the caller's context and device (and queue, or a new one),
 * retaining them; the device must be one this back end lists. */
static mapping_status opencl_device_adopt(const mapping_native_device *native, int *index, void **out)
{
    if (!mapping__opencl_can_import())
        return mapping__fail(MAPPING_ERR_UNSUPPORTED, "opencl: the OpenCL library lacks clRetainContext and friends");
    cl_context context = native->context;
    cl_device_id device = native->device;
    cl_command_queue queue = native->queue;
    int found = -1;
    for (int i = 0; i < device_count && found < 0; i++)
        if (devices[i].device == device)
            found = i;
    if (found < 0)
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT,
                             "opencl: cl_device_id %p is not one of the %d devices the OpenCL platforms list",
                             (void *)device, device_count);
    cl_uint n = 0;
    cl_int err = mapping__opencl_driver.clGetContextInfo(context, CL_CONTEXT_NUM_DEVICES, sizeof n, &n, NULL);
    if (err != CL_SUCCESS)
        return mapping__opencl_fail("clGetContextInfo(CL_CONTEXT_NUM_DEVICES)", err);
    cl_device_id in_context[OPENCL_MAX_DEVICES];
    if (n == 0 || n > OPENCL_MAX_DEVICES ||
        (err = mapping__opencl_driver.clGetContextInfo(context, CL_CONTEXT_DEVICES, n * sizeof *in_context, in_context, NULL)))
        return err ? mapping__opencl_fail("clGetContextInfo(CL_CONTEXT_DEVICES)", err)
                   : mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "opencl: the context has %u devices", n);
    bool member = false;
    for (cl_uint i = 0; i < n; i++)
        member |= in_context[i] == device;
    if (!member)
        return mapping__fail(MAPPING_ERR_DEVICE_MISMATCH, "opencl: cl_device_id %p is not a device of cl_context %p",
                             (void *)device, (void *)context);
    mapping_status st;
    if (queue && (st = mapping__opencl_check_queue(queue, context, device)) != MAPPING_OK)
        return st;
    opencl_device *d = mapping_os_calloc(1, sizeof *d);
    if (!d)
        return mapping__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "opencl: out of memory");
    pthread_mutex_init(&d->kernel_lock, NULL);
    d->platform = devices[found].platform;
    d->device = device;
    d->svm_fine = devices[found].svm_fine;
    d->sliced_lanes = !strcmp(devices[found].info.kind, "cpu");
    d->diff_by_groups = diff_shape_from_env() == 2 || (diff_shape_from_env() == 0 && !d->sliced_lanes);
    mapping__opencl_driver.clRetainContext(context);
    d->context = context;
    d->context_adopted = true;
    if (queue) {
        mapping__opencl_driver.clRetainCommandQueue(queue);
        d->queue = queue;
    } else {
        d->queue = mapping__opencl_driver.clCreateCommandQueue(context, device, 0, &err);
        if (err != CL_SUCCESS) {
            d->queue = NULL;
            opencl_device_close(d);
            return mapping__opencl_fail("clCreateCommandQueue", err);
        }
    }
    mapping__opencl_blocking_stream_init(d);
    *index = found;
    *out = d;
    return MAPPING_OK;
}

static mapping_status opencl_device_native(void *dev, mapping_native_device *out)
{
    opencl_device *d = dev;
    out->context = d->context;
    out->device = d->device;
    out->platform = d->platform;
    out->queue = d->queue;
    return MAPPING_OK;
}

const mapping_backend mapping_backend_opencl = {
    .name = "opencl",
    .load = opencl_load,
    .device_info = opencl_device_info,
    .device_open = opencl_device_open,
    .device_close = opencl_device_close,
    .device_native = opencl_device_native,
    .buffer_alloc = mapping__opencl_buffer_alloc,
    .buffer_free = mapping__opencl_buffer_free,
    .buffer_native = mapping__opencl_buffer_native,
    .buffer_alloc_unified = mapping__opencl_buffer_alloc_unified,
    .unified_prefetch = NULL, /* fine-grain SVM needs no migration hint; see docs/opencl.md */
    .host_alloc = mapping__opencl_host_alloc,
    .host_free = mapping__opencl_host_free,
    .host_register = NULL, /* CL_MEM_USE_HOST_PTR may copy: not a way to page-lock in place */
    .host_unregister = NULL,
    .stream_create = mapping__opencl_stream_create,
    .stream_destroy = mapping__opencl_stream_destroy,
    .stream_synchronize = mapping__opencl_stream_synchronize,
    .stream_native = mapping__opencl_stream_native,
    .stream_blocking = mapping__opencl_stream_blocking,
    .write = mapping__opencl_write,
    .read = mapping__opencl_read,
    .copy = mapping__opencl_copy,
    .fill = mapping__opencl_fill,
    .scatter = mapping__opencl_scatter,
    .diff_blocks = mapping__opencl_diff_blocks,
    .gather = mapping__opencl_gather,
    .map = mapping__opencl_map,
    .unmap = mapping__opencl_unmap,
    .launch_host = mapping__opencl_launch_host,
    .event_record = mapping__opencl_event_record,
    .event_wait = mapping__opencl_event_wait,
    .event_synchronize = mapping__opencl_event_synchronize,
    .event_query = mapping__opencl_event_query,
    .event_elapsed = mapping__opencl_event_elapsed,
    .event_destroy = mapping__opencl_event_destroy,
    .peer_copy = mapping__opencl_peer_copy,
    .device_adopt = opencl_device_adopt,
    .device_synchronize = mapping__opencl_device_synchronize,
    .buffer_import = mapping__opencl_buffer_import,
    .buffer_unimport = mapping__opencl_buffer_unimport,
    .stream_import = mapping__opencl_stream_import,
    .stream_unimport = mapping__opencl_stream_unimport,
};
#endif /* MAPPING_OPENCL_HEADERS */
