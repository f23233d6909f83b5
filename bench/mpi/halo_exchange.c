/*
 * mapping_mpi_bench: the time of one halo exchange of a distributed array
 * against what a careful programmer writes by hand for the same exchange, in
 * the same run, on the host back end with its link model (every transfer
 * between host and device memory costs latency + bytes / bandwidth):
 *
 *   library:  mapping_mpi_halo_exchange on a stream, then synchronize
 *   by hand:  two mapping_sync_to_cpu_range of the boundary rows into
 *             page-locked memory, synchronize, MPI_Sendrecv up then down,
 *             two mapping_sync_to_gpu_range of the halos, synchronize
 *
 * Before each exchange the owned rows are marked modified on the device (as
 * a kernel would), so the library has real work to do. Samples alternate;
 * each sample is the slowest rank's time; the figures are medians.
 *
 *     mpirun -np 4 mapping_mpi_bench [--quick] [rows cols halo]
 *     (MAPPING_HOST_LINK="bandwidth,latency"; default 25e9,5e-6)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mapping_mpi.h"

static int rank, size;

#define CHECK(call)                                                                                     \
    do {                                                                                                \
        mapping_status st_ = (call);                                                                    \
        if (st_ != MAPPING_OK) {                                                                        \
            fprintf(stderr, "rank %d: %s: %s / %s\n", rank, #call, mapping_last_error_message(),       \
                    mapping_mpi_last_error_message());                                                  \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                               \
        }                                                                                               \
    } while (0)

static int compare(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, compare);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The slowest rank's seconds. */
static double slowest(double seconds)
{
    double all = 0;
    MPI_Allreduce(&seconds, &all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return all;
}

typedef struct by_hand {
    mapping_buffer *buf;
    void           *send_up, *send_down, *recv_up, *recv_down; /* page-locked */
    size_t          halo_bytes, owned_offset, owned_bytes;
    int             up, down;
} by_hand;

static void exchange_by_hand(mapping_stream *s, by_hand *h)
{
    size_t first = h->owned_offset, last = h->owned_offset + h->owned_bytes - h->halo_bytes;
    if (h->up != MPI_PROC_NULL)
        CHECK(mapping_sync_to_cpu_range(s, h->buf, first, h->send_up, h->halo_bytes));
    if (h->down != MPI_PROC_NULL)
        CHECK(mapping_sync_to_cpu_range(s, h->buf, last, h->send_down, h->halo_bytes));
    CHECK(mapping_stream_synchronize(s));
    int n = (int)h->halo_bytes;
    MPI_Sendrecv(h->send_up, n, MPI_BYTE, h->up, 1, h->recv_down, n, MPI_BYTE, h->down, 1, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
    MPI_Sendrecv(h->send_down, n, MPI_BYTE, h->down, 2, h->recv_up, n, MPI_BYTE, h->up, 2, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
    if (h->up != MPI_PROC_NULL)
        CHECK(mapping_sync_to_gpu_range(s, h->recv_up, h->buf, 0, h->halo_bytes));
    if (h->down != MPI_PROC_NULL)
        CHECK(mapping_sync_to_gpu_range(s, h->recv_down, h->buf, h->owned_offset + h->owned_bytes, h->halo_bytes));
    CHECK(mapping_stream_synchronize(s));
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int quick = argc > 1 && strcmp(argv[1], "--quick") == 0, a0 = quick ? 2 : 1;
    size_t rows = argc > a0 ? strtoul(argv[a0], NULL, 10) : 4096;
    size_t cols = argc > a0 + 1 ? strtoul(argv[a0 + 1], NULL, 10) : 4096;
    size_t halo = argc > a0 + 2 ? strtoul(argv[a0 + 2], NULL, 10) : 2;
    int runs = quick ? 5 : 41;

    double bandwidth = 25e9, latency = 5e-6;
    const char *env = getenv("MAPPING_HOST_LINK");
    if (env)
        sscanf(env, "%lf,%lf", &bandwidth, &latency);
    mapping_device *dev;
    mapping_device_desc dd = {.backend = "host", .link_bandwidth = bandwidth, .link_latency = latency};
    CHECK(mapping_open(&dd, &dev));
    mapping_mpi_darray *a;
    mapping_mpi_darray_desc desc = {.rows = rows, .cols = cols, .element_bytes = sizeof(float), .halo = halo, .dev = dev};
    CHECK(mapping_mpi_darray_create(MPI_COMM_WORLD, &desc, &a));
    mapping_mpi_darray_info info;
    CHECK(mapping_mpi_darray_get_info(a, &info));
    mapping_mirror *owned = mapping_mpi_darray_owned(a);
    mapping_stream *s;
    CHECK(mapping_stream_create(dev, &s));

    by_hand h = {.halo_bytes = halo * info.row_bytes, .owned_offset = info.owned_offset,
                 .owned_bytes = info.owned_rows * info.row_bytes, .up = rank > 0 ? rank - 1 : MPI_PROC_NULL,
                 .down = rank + 1 < size ? rank + 1 : MPI_PROC_NULL};
    CHECK(mapping_allocate_gpu(dev, (info.owned_rows + 2 * halo) * info.row_bytes, &h.buf));
    CHECK(mapping_fill_gpu(NULL, h.buf, 0, mapping_buffer_size(h.buf), 0));
    void **bufs[] = {&h.send_up, &h.send_down, &h.recv_up, &h.recv_down};
    for (int i = 0; i < 4; i++)
        CHECK(mapping_allocate_cpu(dev, h.halo_bytes, bufs[i]));
    CHECK(mapping_mirror_sync_to_gpu(NULL, mapping_mpi_darray_mirror(a)));

    double t_lib[64], t_hand[64];
    uint64_t moved = 0;
    for (int r = -1; r < runs; r++) { /* run -1 warms up */
        CHECK(mapping_mirror_mark_gpu_modified(owned, 0, mapping_mirror_size(owned)));
        mapping_stats before, after;
        CHECK(mapping_device_stats(dev, &before));
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        CHECK(mapping_mpi_halo_exchange(s, a));
        CHECK(mapping_stream_synchronize(s));
        double lib = slowest(MPI_Wtime() - t0);
        CHECK(mapping_device_stats(dev, &after));
        moved = (after.d2h_bytes - before.d2h_bytes) + (after.h2d_bytes - before.h2d_bytes);

        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        exchange_by_hand(s, &h);
        double hand = slowest(MPI_Wtime() - t0);
        if (r >= 0) {
            t_lib[r] = lib;
            t_hand[r] = hand;
        }
    }
    double lib = median(t_lib, runs), hand = median(t_hand, runs);
    int neighbours = (h.up != MPI_PROC_NULL) + (h.down != MPI_PROC_NULL);
    if (rank == 0) {
        printf("halo exchange, %d ranks, %zu x %zu floats, halo %zu rows (%zu bytes per side), host link %.3g B/s + %.3g s\n",
               size, rows, cols, halo, h.halo_bytes, bandwidth, latency);
        printf("median of %d, slowest rank: library %.1f us, by hand (MPI_Sendrecv + device copies) %.1f us, "
               "ratio %.3f\n", runs, lib * 1e6, hand * 1e6, lib / hand);
    }
    printf("rank %d: the library moved %llu bytes between host and device per exchange; the halos are %zu\n", rank,
           (unsigned long long)moved, 2 * (size_t)neighbours * h.halo_bytes);
    for (int i = 0; i < 4; i++)
        mapping_free_cpu(dev, *bufs[i]);
    mapping_free_gpu(h.buf);
    mapping_stream_destroy(s);
    mapping_mpi_darray_destroy(a);
    mapping_close(dev);
    MPI_Finalize();
    return 0;
}
