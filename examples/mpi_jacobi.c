/*
 * A 2-D heat equation (Jacobi iteration) over MPI with libmapping_mpi: the
 * grid is a distributed array (block rows per rank, one halo row on each
 * side) whose blocks live on each rank's device; every step exchanges the
 * halos and runs the kernel on the device. The result, gathered to rank 0,
 * must equal a serial run of the same arithmetic exactly.
 *
 *     mpirun -np 4 example_mpi_jacobi [rows cols steps]
 *
 * The kernel runs on the back end of $MAPPING_BACKEND: OpenCL (a kernel
 * built from source, on the library's stream) or host (a host function on
 * the stream). Other back ends: SKIP (exit 77).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mapping_mpi.h"

#define CHECK(call)                                                                                       \
    do {                                                                                                  \
        mapping_status st_ = (call);                                                                      \
        if (st_ != MAPPING_OK) {                                                                          \
            fprintf(stderr, "rank %d: %s: %s\n  mapping: %s\n  mapping_mpi: %s\n", rank, #call,           \
                    mapping_status_name(st_), mapping_last_error_message(), mapping_mpi_last_error_message()); \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                                 \
        }                                                                                                 \
    } while (0)

static int rank;

/* The one formula, in one order, for the device kernels and the reference. */
static float initial(size_t i, size_t j, size_t rows)
{
    if (i == 0)
        return 1.0f; /* a hot edge */
    if (i == rows - 1)
        return 0.5f;
    return (float)((i * 7 + j * 13) % 17) / 16.0f;
}

static void serial_reference(float *u, size_t rows, size_t cols, int steps)
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

#ifdef HAVE_CL
#define ENTRY_POINTS(X)                                                                        \
    X(clCreateProgramWithSource) X(clBuildProgram) X(clGetProgramBuildInfo) X(clCreateKernel) \
    X(clSetKernelArg) X(clEnqueueNDRangeKernel) X(clReleaseKernel) X(clReleaseProgram)
static struct {
#define FIELD_(name) __typeof__(&name) name;
    ENTRY_POINTS(FIELD_)
#undef FIELD_
} cl;
static cl_program program;
static cl_kernel  kernel;

static const char *kernel_source =
    "__kernel void jacobi(__global const float *u, __global float *v, uint cols, uint first_row,\n"
    "                     uint rows, uint halo)\n"
    "{\n"
    "    size_t j = get_global_id(0), i = get_global_id(1), g = first_row + i;\n"
    "    if (g == 0 || g + 1 == rows || j == 0 || j + 1 >= cols) return;\n"
    "    size_t k = (i + halo) * cols + j;\n"
    "    v[k] = 0.25f * (((u[k - cols] + u[k + cols]) + u[k - 1]) + u[k + 1]);\n"
    "}\n";

static int opencl_setup(mapping_device *dev)
{
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
    ENTRY_POINTS(RESOLVE_)
#undef RESOLVE_
    mapping_native_device native;
    if (mapping_native_device_handles(dev, &native) != MAPPING_OK)
        return 0;
    cl_int err = CL_SUCCESS;
    cl_device_id device = native.device;
    program = cl.clCreateProgramWithSource(native.context, 1, &kernel_source, NULL, &err);
    if (err != CL_SUCCESS || cl.clBuildProgram(program, 1, &device, "", NULL, NULL) != CL_SUCCESS)
        return 0;
    kernel = cl.clCreateKernel(program, "jacobi", &err);
    return err == CL_SUCCESS;
}

static int opencl_step(mapping_stream *stream, mapping_buffer *u, mapping_buffer *v, const step_args *a)
{
    void *queue, *mu, *mv;
    if (mapping_native_stream(stream, &queue) || mapping_native_buffer(u, &mu) || mapping_native_buffer(v, &mv))
        return 0;
    cl_mem cu = mu, cv = mv;
    cl_uint cols = (cl_uint)a->cols, first = (cl_uint)a->first_row, rows = (cl_uint)a->rows, halo = (cl_uint)a->halo;
    cl_int err = cl.clSetKernelArg(kernel, 0, sizeof cu, &cu);
    err |= cl.clSetKernelArg(kernel, 1, sizeof cv, &cv);
    err |= cl.clSetKernelArg(kernel, 2, sizeof cols, &cols);
    err |= cl.clSetKernelArg(kernel, 3, sizeof first, &first);
    err |= cl.clSetKernelArg(kernel, 4, sizeof rows, &rows);
    err |= cl.clSetKernelArg(kernel, 5, sizeof halo, &halo);
    size_t global[2] = {a->cols, a->owned};
    return err == CL_SUCCESS && cl.clEnqueueNDRangeKernel(queue, kernel, 2, NULL, global, NULL, 0, NULL, NULL) == CL_SUCCESS;
}
#endif

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    size_t rows = argc > 1 ? strtoul(argv[1], NULL, 10) : 96, cols = argc > 2 ? strtoul(argv[2], NULL, 10) : 80;
    int steps = argc > 3 ? atoi(argv[3]) : 60;

    mapping_mpi_darray *grid[2];
    mapping_mpi_darray_desc desc = {.rows = rows, .cols = cols, .element_bytes = sizeof(float), .halo = 1};
    mapping_status st = mapping_mpi_darray_create(MPI_COMM_WORLD, &desc, &grid[0]); /* device by local rank */
    if (st == MAPPING_ERR_NO_BACKEND || st == MAPPING_ERR_NO_DEVICE) { /* on every rank alike */
        if (rank == 0)
            printf("SKIP: %s\n", mapping_mpi_last_error_message());
        MPI_Finalize();
        return 77;
    }
    CHECK(st);
    mapping_device *dev = mapping_mpi_darray_device(grid[0]);
    desc.dev = dev; /* the second grid on the same device (destroyed first) */
    CHECK(mapping_mpi_darray_create(MPI_COMM_WORLD, &desc, &grid[1]));
    mapping_device_info info;
    CHECK(mapping_device_get_info(dev, &info));
    int on_host = strcmp(info.backend, "host") == 0, ok = on_host;
#ifdef HAVE_CL
    if (strcmp(info.backend, "opencl") == 0)
        ok = opencl_setup(dev);
#endif
    int all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all_ok) {
        if (rank == 0)
            printf("SKIP: no Jacobi kernel for back end %s here (host and OpenCL have one)\n", info.backend);
        mapping_mpi_darray_destroy(grid[1]);
        mapping_mpi_darray_destroy(grid[0]);
        MPI_Finalize();
        return 77;
    }
    mapping_mpi_darray_info where;
    CHECK(mapping_mpi_darray_get_info(grid[0], &where));
    if (rank == 0)
        printf("Jacobi %zu x %zu, %d steps, %d ranks, back end %s\n", rows, cols, steps, where.size, info.backend);
    printf("rank %d: rows %zu..%zu on %s device %d (%s)\n", rank, where.first_row,
           where.first_row + where.owned_rows - 1, info.backend, info.index, info.name);

    float *global = NULL, *reference = NULL;
    if (rank == 0) {
        global = malloc(rows * cols * sizeof *global);
        reference = malloc(rows * cols * sizeof *reference);
        for (size_t i = 0; i < rows; i++)
            for (size_t j = 0; j < cols; j++)
                reference[i * cols + j] = initial(i, j, rows);
        memcpy(global, reference, rows * cols * sizeof *global);
    }
    CHECK(mapping_mpi_scatter(grid[0], global, 0));
    CHECK(mapping_mpi_scatter(grid[1], global, 0)); /* the fixed boundary, in both */

    mapping_stream *stream;
    CHECK(mapping_stream_create(dev, &stream));
    step_args ring[2];
    double t0 = MPI_Wtime();
    for (int s = 0; s < steps; s++) {
        mapping_mpi_darray *u = grid[s % 2], *v = grid[(s + 1) % 2];
        mapping_buffer *bu, *bv;
        CHECK(mapping_mpi_halo_exchange(stream, u));
        CHECK(mapping_mirror_acquire_gpu(stream, mapping_mpi_darray_mirror(u), MAPPING_READ, &bu));
        CHECK(mapping_mirror_acquire_gpu(stream, mapping_mpi_darray_owned(v), MAPPING_READ | MAPPING_WRITE, &bv));
        step_args *a = &ring[s % 2];
        *a = (step_args){.cols = cols, .first_row = where.first_row, .rows = rows, .owned = where.owned_rows,
                         .halo = where.halo};
        if (on_host) {
            void *pu, *pv;
            CHECK(mapping_native_buffer(bu, &pu));
            CHECK(mapping_native_buffer(bv, &pv));
            a->u = pu;
            a->v = pv;
            CHECK(mapping_launch_host(stream, host_step, a));
        }
#ifdef HAVE_CL
        else if (!opencl_step(stream, bu, bv, a)) {
            fprintf(stderr, "rank %d: the OpenCL kernel could not be queued\n", rank);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
#endif
        CHECK(mapping_mirror_release_gpu(stream, mapping_mpi_darray_owned(v)));
    }
    CHECK(mapping_mpi_gather(stream, grid[steps % 2], global, 0));
    double seconds = MPI_Wtime() - t0;
    mapping_stats stats;
    CHECK(mapping_device_stats(dev, &stats));
    printf("rank %d: moved %llu bytes to the host, %llu to the device\n", rank,
           (unsigned long long)stats.d2h_bytes, (unsigned long long)stats.h2d_bytes);

    int result = 0;
    if (rank == 0) {
        serial_reference(reference, rows, cols, steps);
        size_t differ = 0;
        for (size_t k = 0; k < rows * cols; k++)
            differ += memcmp(&global[k], &reference[k], sizeof(float)) != 0;
        printf("%.3f s; result %s the serial reference (%zu of %zu cells differ); centre %.6f\n", seconds,
               differ ? "DIFFERS FROM" : "equals", differ, rows * cols, global[rows / 2 * cols + cols / 2]);
        result = differ ? 1 : 0;
        free(global);
        free(reference);
    }
    MPI_Bcast(&result, 1, MPI_INT, 0, MPI_COMM_WORLD);
    mapping_stream_destroy(stream);
#ifdef HAVE_CL
    if (kernel) {
        cl.clReleaseKernel(kernel);
        cl.clReleaseProgram(program);
    }
#endif
    mapping_mpi_darray_destroy(grid[1]);
    mapping_mpi_darray_destroy(grid[0]);
    MPI_Finalize();
    return result;
}
