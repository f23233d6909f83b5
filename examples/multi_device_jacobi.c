/*
 * The 2-D heat equation of examples/mpi_jacobi.c on several devices of one
 * process instead of several ranks: the grid is cut into row blocks, one per
 * device, each with one halo row above and below in its own device memory.
 * Every step copies the halos straight from the neighbouring devices with
 * mapping_copy_peer (on the receiving device's stream), then runs the kernel
 * on every device at once. The result must equal the serial reference
 * exactly.
 *
 *     MAPPING_BACKEND=host MAPPING_HOST_DEVICES=4 example_multi_device_jacobi [rows cols steps]
 *     MAPPING_BACKEND=opencl POCL_DEVICES="pthread pthread" example_multi_device_jacobi
 *     MAPPING_BACKEND=cuda example_multi_device_jacobi
 *
 * Each back end runs its own kernel: a host function on host, an OpenCL
 * kernel built from source on opencl, the PTX of kernels/jacobi.cu on cuda
 * (kernels/jacobi_cuda.h); any other back end is skipped (exit 77).
 * With one device, two objects of device 0 stand in for two devices.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "jacobi_kernel.h"
#include "kernels/jacobi_cuda.h"

enum { MAX_DEVICES = 4 };

typedef struct block {
    mapping_device *dev;
    mapping_stream *stream;
    mapping_buffer *grid[2]; /* (owned + 2) rows each: halo, owned rows, halo */
    jacobi_cl       kernel;   /* on opencl */
    jacobi_cu       cu_kernel; /* on cuda */
    step_args       args;
} block;

int main(int argc, char **argv)
{
    size_t rows = argc > 1 ? strtoul(argv[1], NULL, 10) : 96, cols = argc > 2 ? strtoul(argv[2], NULL, 10) : 80;
    int steps = argc > 3 ? atoi(argv[3]) : 60;
    const size_t rb = cols * sizeof(float);

    mapping_device *first;
    if (mapping_open(NULL, &first) != MAPPING_OK) {
        printf("SKIP: no device: %s\n", mapping_last_error_message());
        return 77;
    }
    mapping_device_info info;
    CHECK(mapping_device_get_info(first, &info));
    int count = 0;
    CHECK(mapping_list_devices(info.backend, NULL, 0, &count));
    int k = count < 2 ? 2 : count > MAX_DEVICES ? MAX_DEVICES : count;
    int on_host = strcmp(info.backend, "host") == 0, on_cl = strcmp(info.backend, "opencl") == 0,
        on_cuda = strcmp(info.backend, "cuda") == 0;

    block b[MAX_DEVICES];
    memset(b, 0, sizeof b);
    b[0].dev = first;
    for (int d = 1; d < k; d++) {
        mapping_device_desc desc = {.backend = info.backend, .device = count < 2 ? 0 : d};
        CHECK(mapping_open(&desc, &b[d].dev));
    }
    int ok = on_host || on_cl || on_cuda;
    for (int d = 0; d < k && ok && !on_host; d++)
        ok = on_cl ? jacobi_cl_build(b[d].dev, &b[d].kernel) : jacobi_cu_build(b[d].dev, &b[d].cu_kernel);
    if (!ok) {
        printf("SKIP: no Jacobi kernel for back end %s here (host, OpenCL and CUDA have one)\n", info.backend);
        for (int d = 0; d < k; d++) {
            jacobi_cl_release(&b[d].kernel);
            jacobi_cu_release(&b[d].cu_kernel);
            mapping_close(b[d].dev);
        }
        return 77;
    }
    printf("Jacobi %zu x %zu, %d steps, on %d %s device%s%s\n", rows, cols, steps, k, info.backend,
           k > 1 ? "s" : "", count < 2 ? " (two objects of device 0)" : "");

    float *global = malloc(rows * rb), *reference = malloc(rows * rb);
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++)
            reference[i * cols + j] = jacobi_initial(i, j, rows);

    /* Blocks as in the MPI example: the first rows % k devices one row more. */
    size_t base = rows / (size_t)k, extra = rows % (size_t)k, next = 0;
    for (int d = 0; d < k; d++) {
        size_t owned = base + ((size_t)d < extra);
        b[d].args = (step_args){.cols = cols, .first_row = next, .rows = rows, .owned = owned, .halo = 1};
        next += owned;
        CHECK(mapping_stream_create(b[d].dev, &b[d].stream));
        /* Both grids start with the block and the rows around it (the fixed
         * boundary stays in both). */
        size_t from = b[d].args.first_row ? b[d].args.first_row - 1 : 0;
        size_t to = b[d].args.first_row + owned + 1 < rows ? b[d].args.first_row + owned + 1 : rows;
        size_t at = (from + 1 - b[d].args.first_row) * rb;
        for (int g = 0; g < 2; g++) {
            CHECK(mapping_allocate_gpu(b[d].dev, (owned + 2) * rb, &b[d].grid[g]));
            CHECK(mapping_sync_to_gpu_range(NULL, reference + from * cols, b[d].grid[g], at, (to - from) * rb));
        }
    }

    for (int s = 0; s < steps; s++) {
        int in = s % 2, out = 1 - in;
        /* Halos from the neighbours' owned rows, on the receiving device's
         * stream. Every stream finished the previous step (see below), so
         * the neighbours' rows are written. */
        for (int d = 0; d < k; d++) {
            if (d > 0) /* the row above: the last owned row of d - 1 */
                CHECK(mapping_copy_peer(b[d].stream, b[d - 1].grid[in], b[d - 1].args.owned * rb, b[d].grid[in], 0,
                                        rb));
            if (d + 1 < k) /* the row below: the first owned row of d + 1 */
                CHECK(mapping_copy_peer(b[d].stream, b[d + 1].grid[in], rb, b[d].grid[in],
                                        (b[d].args.owned + 1) * rb, rb));
        }
        for (int d = 0; d < k; d++) { /* the kernels, on every device at once */
            step_args *a = &b[d].args;
            if (on_host) {
                void *pu, *pv;
                CHECK(mapping_buffer_native(b[d].grid[in], &pu));
                CHECK(mapping_buffer_native(b[d].grid[out], &pv));
                a->u = pu;
                a->v = pv;
                CHECK(mapping_launch_host(b[d].stream, host_step, a));
            } else if (on_cl ? !jacobi_cl_step(&b[d].kernel, b[d].stream, b[d].grid[in], b[d].grid[out], a)
                             : !jacobi_cu_step(&b[d].cu_kernel, b[d].stream, b[d].grid[in], b[d].grid[out], a)) {
                fprintf(stderr, "device %d: the %s kernel could not be queued\n", d, info.backend);
                return 1;
            }
        }
        /* A peer copy's source must not be written until it is read, and the
         * next step reads what this one wrote: wait for every device. */
        for (int d = 0; d < k; d++)
            CHECK(mapping_stream_synchronize(b[d].stream));
    }

    uint64_t peer_bytes = 0;
    for (int d = 0; d < k; d++) {
        CHECK(mapping_sync_to_cpu_range(NULL, b[d].grid[steps % 2], rb, global + b[d].args.first_row * cols,
                                        b[d].args.owned * rb));
        mapping_stats st;
        CHECK(mapping_device_stats(b[d].dev, &st));
        peer_bytes += st.peer_bytes;
    }
    jacobi_serial_reference(reference, rows, cols, steps);
    size_t differ = 0;
    for (size_t i = 0; i < rows * cols; i++)
        differ += memcmp(&global[i], &reference[i], sizeof(float)) != 0;
    printf("peer copies moved %llu bytes (%d halo rows of %zu bytes per step); result %s the serial reference "
           "(%zu of %zu cells differ)\n",
           (unsigned long long)peer_bytes, 2 * (k - 1), rb, differ ? "DIFFERS FROM" : "equals", differ, rows * cols);
    int bytes_ok = peer_bytes == (uint64_t)steps * 2 * (uint64_t)(k - 1) * rb;

    for (int d = 0; d < k; d++) {
        mapping_stream_destroy(b[d].stream);
        mapping_free_gpu(b[d].grid[0]);
        mapping_free_gpu(b[d].grid[1]);
        jacobi_cl_release(&b[d].kernel);
        jacobi_cu_release(&b[d].cu_kernel);
        mapping_close(b[d].dev);
    }
    free(global);
    free(reference);
    return differ == 0 && bytes_ok ? 0 : 1;
}
