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

#include "jacobi_kernel.h"

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
    jacobi_cl kernel = {NULL, NULL};
    if (strcmp(info.backend, "opencl") == 0)
        ok = jacobi_cl_build(dev, &kernel);
    int all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all_ok) {
        if (rank == 0)
            printf("SKIP: no Jacobi kernel for back end %s here (host and OpenCL have one)\n", info.backend);
        jacobi_cl_release(&kernel);
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
                reference[i * cols + j] = jacobi_initial(i, j, rows);
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
            CHECK(mapping_buffer_native(bu, &pu));
            CHECK(mapping_buffer_native(bv, &pv));
            a->u = pu;
            a->v = pv;
            CHECK(mapping_launch_host(stream, host_step, a));
        } else if (!jacobi_cl_step(&kernel, stream, bu, bv, a)) {
            fprintf(stderr, "rank %d: the OpenCL kernel could not be queued\n", rank);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
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
        jacobi_serial_reference(reference, rows, cols, steps);
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
    jacobi_cl_release(&kernel);
    mapping_mpi_darray_destroy(grid[1]);
    mapping_mpi_darray_destroy(grid[0]);
    MPI_Finalize();
    return result;
}
