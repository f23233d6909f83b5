/*
 * The Jacobi step shared by examples/mpi_jacobi.c (ranks) and
 * examples/multi_device_jacobi.c (devices of one process): the initial grid,
 * the serial reference, and the kernel on the host back end (a host function
 * on the stream) and on OpenCL (built from source, loaded at run time like
 * the library does). One formula, in one order, everywhere, so every result
 * equals the serial reference exactly.
 */
#ifndef MAPPING_EXAMPLE_JACOBI_KERNEL_H
#define MAPPING_EXAMPLE_JACOBI_KERNEL_H

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include "mapping.h"

/* The one formula, in one order, for the device kernels and the reference. */
static float jacobi_initial(size_t i, size_t j, size_t rows)
{
    if (i == 0)
        return 1.0f; /* a hot edge */
    if (i == rows - 1)
        return 0.5f;
    return (float)((i * 7 + j * 13) % 17) / 16.0f;
}

static void jacobi_serial_reference(float *u, size_t rows, size_t cols, int steps)
{
    float *v = malloc(rows * cols * sizeof *v);
    memcpy(v, u, rows * cols * sizeof *v);
    for (int s = 0; s < steps; s++) {
        for (size_t i = 1; i + 1 < rows; i++)
            for (size_t j = 1; j + 1 < cols; j++) {
                size_t k = i * cols + j;
                v[k] = 0.25f * (((u[k - cols] + u[k + cols]) + u[k - 1]) + u[k + 1]);
            }
        memcpy(u, v, rows * cols * sizeof *u); /* keeps the boundary: v holds it too */
    }
    free(v);
}

/* ---- the kernel on the host back end: a host function on the stream ---- */

typedef struct step_args {
    const float *u;
    float       *v;
    size_t       cols, first_row, rows, owned, halo;
} step_args;

static void host_step(void *arg)
{
    const step_args *a = arg;
    for (size_t i = 0; i < a->owned; i++) {
        size_t g = a->first_row + i;
        if (g == 0 || g + 1 == a->rows)
            continue;
        for (size_t j = 1; j + 1 < a->cols; j++) {
            size_t k = (i + a->halo) * a->cols + j;
            a->v[k] = 0.25f * (((a->u[k - a->cols] + a->u[k + a->cols]) + a->u[k - 1]) + a->u[k + 1]);
        }
    }
}

/* ---- the kernel on OpenCL, loaded at run time like the library does ---- */

#if defined(__has_include)
#if __has_include(<CL/cl.h>)
#define HAVE_CL 1
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#endif
#endif

/* One built kernel per device (a program is built for one device). */
typedef struct jacobi_cl {
    void *program, *kernel; /* cl_program, cl_kernel */
} jacobi_cl;

#ifndef HAVE_CL
static int  jacobi_cl_build(mapping_device *dev, jacobi_cl *k) { (void)dev; (void)k; return 0; }
static int  jacobi_cl_step(jacobi_cl *k, mapping_stream *s, mapping_buffer *u, mapping_buffer *v, const step_args *a)
{
    (void)k; (void)s; (void)u; (void)v; (void)a;
    return 0;
}
static void jacobi_cl_release(jacobi_cl *k) { (void)k; }
#else
#define JACOBI_CL_ENTRY_POINTS(X)                                                              \
    X(clCreateProgramWithSource) X(clBuildProgram) X(clGetProgramBuildInfo) X(clCreateKernel) \
    X(clSetKernelArg) X(clEnqueueNDRangeKernel) X(clReleaseKernel) X(clReleaseProgram)
static struct {
#define FIELD_(name) __typeof__(&name) name;
    JACOBI_CL_ENTRY_POINTS(FIELD_)
#undef FIELD_
} cl;

static const char *jacobi_cl_source =
    "__kernel void jacobi(__global const float *u, __global float *v, uint cols, uint first_row,\n"
    "                     uint rows, uint halo)\n"
    "{\n"
    "    size_t j = get_global_id(0), i = get_global_id(1), g = first_row + i;\n"
    "    if (g == 0 || g + 1 == rows || j == 0 || j + 1 >= cols) return;\n"
    "    size_t k = (i + halo) * cols + j;\n"
    "    v[k] = 0.25f * (((u[k - cols] + u[k + cols]) + u[k - 1]) + u[k + 1]);\n"
    "}\n";

/* Builds the kernel for dev's OpenCL device; 0 when that cannot be done. */
static int jacobi_cl_build(mapping_device *dev, jacobi_cl *k)
{
    if (!cl.clCreateKernel) {
        const char *path = getenv("MAPPING_OPENCL_LIBRARY");
        void *lib = dlopen(path && *path ? path : "libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!lib)
            return 0;
#define RESOLVE_(name)                      \
    {                                       \
        void *sym = dlsym(lib, #name);      \
        if (!sym)                           \
            return 0;                       \
        memcpy(&cl.name, &sym, sizeof sym); \
    }
        JACOBI_CL_ENTRY_POINTS(RESOLVE_)
#undef RESOLVE_
    }
    mapping_native_device native;
    if (mapping_device_native(dev, &native) != MAPPING_OK)
        return 0;
    cl_int err = CL_SUCCESS;
    cl_device_id device = native.device;
    cl_program program = cl.clCreateProgramWithSource(native.context, 1, &jacobi_cl_source, NULL, &err);
    if (err != CL_SUCCESS)
        return 0;
    k->program = program;
    if (cl.clBuildProgram(program, 1, &device, "", NULL, NULL) != CL_SUCCESS)
        return 0;
    k->kernel = cl.clCreateKernel(program, "jacobi", &err);
    return err == CL_SUCCESS;
}

/* Queues one step of the block on the stream. */
static int jacobi_cl_step(jacobi_cl *k, mapping_stream *stream, mapping_buffer *u, mapping_buffer *v,
                          const step_args *a)
{
    void *queue, *mu, *mv;
    if (mapping_stream_native(stream, &queue) || mapping_buffer_native(u, &mu) || mapping_buffer_native(v, &mv))
        return 0;
    cl_mem cu = mu, cv = mv;
    cl_kernel kernel = k->kernel;
    cl_uint cols = (cl_uint)a->cols, first = (cl_uint)a->first_row, rows = (cl_uint)a->rows, halo = (cl_uint)a->halo;
    cl_int err = cl.clSetKernelArg(kernel, 0, sizeof cu, &cu);
    err |= cl.clSetKernelArg(kernel, 1, sizeof cv, &cv);
    err |= cl.clSetKernelArg(kernel, 2, sizeof cols, &cols);
    err |= cl.clSetKernelArg(kernel, 3, sizeof first, &first);
    err |= cl.clSetKernelArg(kernel, 4, sizeof rows, &rows);
    err |= cl.clSetKernelArg(kernel, 5, sizeof halo, &halo);
    size_t global[2] = {a->cols, a->owned};
    return err == CL_SUCCESS &&
           cl.clEnqueueNDRangeKernel(queue, kernel, 2, NULL, global, NULL, 0, NULL, NULL) == CL_SUCCESS;
}

static void jacobi_cl_release(jacobi_cl *k)
{
    if (k->kernel)
        cl.clReleaseKernel(k->kernel);
    if (k->program)
        cl.clReleaseProgram(k->program);
}
#endif

#endif
