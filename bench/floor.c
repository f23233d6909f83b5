/*
 * The floor of a scattered transfer, a baseline measured in the same run:
 * the least any scattered copy of `bytes` needs on that device. One
 * contiguous blocking copy of the same bytes from page-locked memory
 * (mapping_allocate_cpu), and, where the device runs kernels (OpenCL), one
 * trivial kernel launch and finish on the device's own queue (a scatter on
 * the device needs at least that). On the host back end there is no kernel:
 * a device-side scatter there is a loop on the CPU, so the floor is the copy
 * (over the modelled link, if any) plus that loop: the packed bytes copied
 * to their places in the destination buffer (or, device to host, gathered
 * from them first), one memcpy per range, when bench_floor_scatter gave the
 * ranges (issue 13: "one modelled transfer of the packed bytes + the host
 * scatter").
 *
 * The CLI does not link OpenCL: the kernel part dlopens it, as
 * opencl_raw.c does.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "bench.h"
#include "floor.h"

#if defined(__has_include)
#if __has_include(<CL/cl.h>)
#define FLOOR_HAVE_CL 1
#define CL_TARGET_OPENCL_VERSION 120
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#include <CL/cl.h>
#endif
#endif

struct bench_floor {
    mapping_device *dev;
    mapping_buffer *buf;
    void           *host;
    size_t          bytes;
    int             kernel; /* a kernel launch is part of the floor */
    int             host_backend; /* the scatter loop is part of the floor */
    unsigned char  *dst;    /* bench_floor_scatter: the destination's memory, the ranges */
    const size_t   *offsets;
    size_t          count, range_bytes;
#ifdef FLOOR_HAVE_CL
    cl_int (*enqueue)(cl_command_queue, cl_kernel, cl_uint, const size_t *, const size_t *, const size_t *, cl_uint,
                      const cl_event *, cl_event *);
    cl_int (*finish)(cl_command_queue);
    cl_int (*release_kernel)(cl_kernel);
    cl_int (*release_program)(cl_program);
    cl_int (*release_queue)(cl_command_queue);
    cl_command_queue queue;
    cl_program       program;
    cl_kernel        k;
#endif
};

#ifdef FLOOR_HAVE_CL
static const char floor_source[] = "__kernel void mapping_floor(__global uchar *p)\n"
                                   "{\n"
                                   "    if (get_global_id(0) == 0xffffffffu)\n"
                                   "        p[0] = 0;\n"
                                   "}\n";

/* The trivial kernel on the device's context; 0 when ready. */
static int floor_kernel(bench_floor *f)
{
    mapping_native_device nd;
    void *mem = NULL;
    if (mapping_device_native(f->dev, &nd) != MAPPING_OK || mapping_buffer_native(f->buf, &mem) != MAPPING_OK)
        return 1;
    void *lib = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        lib = dlopen("libOpenCL.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return 1;
    __typeof__(&clCreateCommandQueue) create_queue;
    __typeof__(&clCreateProgramWithSource) create_program;
    __typeof__(&clBuildProgram) build;
    __typeof__(&clCreateKernel) create_kernel;
    __typeof__(&clSetKernelArg) set_arg;
    void *sym[10] = {dlsym(lib, "clCreateCommandQueue"), dlsym(lib, "clCreateProgramWithSource"),
                     dlsym(lib, "clBuildProgram"),       dlsym(lib, "clCreateKernel"),
                     dlsym(lib, "clSetKernelArg"),       dlsym(lib, "clEnqueueNDRangeKernel"),
                     dlsym(lib, "clFinish"),             dlsym(lib, "clReleaseKernel"),
                     dlsym(lib, "clReleaseProgram"),     dlsym(lib, "clReleaseCommandQueue")};
    for (int i = 0; i < 10; i++)
        if (!sym[i])
            return 1;
    memcpy(&f->release_kernel, &sym[7], sizeof sym[7]);
    memcpy(&f->release_program, &sym[8], sizeof sym[8]);
    memcpy(&f->release_queue, &sym[9], sizeof sym[9]);
    memcpy(&create_queue, &sym[0], sizeof sym[0]);
    memcpy(&create_program, &sym[1], sizeof sym[1]);
    memcpy(&build, &sym[2], sizeof sym[2]);
    memcpy(&create_kernel, &sym[3], sizeof sym[3]);
    memcpy(&set_arg, &sym[4], sizeof sym[4]);
    memcpy(&f->enqueue, &sym[5], sizeof sym[5]);
    memcpy(&f->finish, &sym[6], sizeof sym[6]);
    cl_int err;
    const char *src = floor_source;
    cl_context context = nd.context;
    cl_device_id device = nd.device;
    f->queue = create_queue(context, device, 0, &err);
    if (err != CL_SUCCESS) {
        f->queue = NULL;
        return 1;
    }
    f->program = create_program(context, 1, &src, NULL, &err);
    if (err != CL_SUCCESS) {
        f->program = NULL;
        return 1;
    }
    if (build(f->program, 1, &device, "", NULL, NULL) != CL_SUCCESS)
        return 1;
    f->k = create_kernel(f->program, "mapping_floor", &err);
    if (err != CL_SUCCESS) {
        f->k = NULL;
        return 1;
    }
    cl_mem m = mem;
    return set_arg(f->k, 0, sizeof m, &m) != CL_SUCCESS;
}
#endif

bench_floor *bench_floor_open(mapping_device *dev, size_t bytes)
{
    bench_floor *f = calloc(1, sizeof *f);
    mapping_device_info info;
    if (!f || mapping_device_get_info(dev, &info) != MAPPING_OK)
        goto fail;
    f->dev = dev;
    f->bytes = bytes;
    if (mapping_allocate_gpu(dev, bytes, &f->buf) != MAPPING_OK || mapping_allocate_cpu(dev, bytes, &f->host))
        goto fail;
    memset(f->host, 3, bytes);
    f->host_backend = !strcmp(info.backend, "host");
    if (!strcmp(info.backend, "opencl")) {
#ifdef FLOOR_HAVE_CL
        if (floor_kernel(f) != 0)
            goto fail;
        f->kernel = 1;
#else
        goto fail;
#endif
    }
    return f;
fail:
    bench_floor_close(f);
    return NULL;
}

int bench_floor_has_kernel(const bench_floor *f)
{
    return f->kernel;
}

void bench_floor_scatter(bench_floor *f, mapping_buffer *dst, const size_t *offsets, size_t count, size_t bytes)
{
    void *mem = NULL;
    if (!f || !f->host_backend || count * bytes > f->bytes || mapping_buffer_native(dst, &mem) != MAPPING_OK)
        return;
    f->dst = mem;
    f->offsets = offsets;
    f->count = count;
    f->range_bytes = bytes;
}

/* The host back end's device-side scatter (or gather) of the packed bytes. */
static void host_scatter(bench_floor *f, int to_gpu)
{
    void *packed = NULL;
    if (!f->dst || mapping_buffer_native(f->buf, &packed) != MAPPING_OK)
        return;
    for (size_t i = 0; i < f->count; i++) {
        unsigned char *p = (unsigned char *)packed + i * f->range_bytes, *d = f->dst + f->offsets[i];
        memcpy(to_gpu ? d : p, to_gpu ? p : d, f->range_bytes);
    }
}

double bench_floor_sample(bench_floor *f, int to_gpu)
{
    double t0 = bench_now();
    if (f->host_backend && !to_gpu)
        host_scatter(f, 0); /* gathered first, then moved */
    mapping_status st = to_gpu ? mapping_sync_to_gpu_range(NULL, f->host, f->buf, 0, f->bytes)
                               : mapping_sync_to_cpu_range(NULL, f->buf, 0, f->host, f->bytes);
    if (st != MAPPING_OK)
        return NAN;
    if (f->host_backend && to_gpu)
        host_scatter(f, 1);
#ifdef FLOOR_HAVE_CL
    if (f->kernel) {
        size_t global = 1;
        if (f->enqueue(f->queue, f->k, 1, NULL, &global, NULL, 0, NULL, NULL) != CL_SUCCESS ||
            f->finish(f->queue) != CL_SUCCESS)
            return NAN;
    }
#endif
    return bench_now() - t0;
}

void bench_floor_close(bench_floor *f)
{
    if (!f)
        return;
#ifdef FLOOR_HAVE_CL
    if (f->k)
        f->release_kernel(f->k);
    if (f->program)
        f->release_program(f->program);
    if (f->queue)
        f->release_queue(f->queue);
#endif
    if (f->host)
        mapping_free_cpu(f->dev, f->host);
    mapping_free_gpu(f->buf);
    free(f); /* libOpenCL stays loaded: the library holds it too */
}

const char *bench_floor_extra(const char *backend)
{
    if (!strcmp(backend, "opencl"))
        return " plus one trivial kernel launch and finish";
    if (!strcmp(backend, "host"))
        return " plus the host scatter of the packed bytes to their places (device to host: the gather before it), "
               "a memcpy per range: a device-side scatter on this back end";
    return "";
}
