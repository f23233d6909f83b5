/*
 * libmapping_mpi under `mpirun -np 4`: one test per run, named on the
 * command line (tests/CMakeLists.txt registers each as mpi.<name>, label
 * mpi). A failing check prints the rank and aborts the whole job (non-zero
 * exit); mpirun --timeout and the CTest timeout bound any wait.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mapping_mpi.h"

static int rank, size;

#define CHECK(cond)                                                                                          \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            fprintf(stderr, "rank %d: %s:%d: CHECK(%s) failed\n  mapping: %s\n  mapping_mpi: %s\n", rank,    \
                    __FILE__, __LINE__, #cond, mapping_last_error_message(), mapping_mpi_last_error_message()); \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                                    \
        }                                                                                                    \
    } while (0)
#define CHECK_OK(call) CHECK((call) == MAPPING_OK)

/* The call failed on this rank with `expected`, a message says why, and it
 * failed on every rank. */
static void check_failed_everywhere(mapping_status st, mapping_status expected, const char *words)
{
    if (st != expected)
        fprintf(stderr, "rank %d: got %s, expected %s: %s\n", rank, mapping_status_name(st),
                mapping_status_name(expected), mapping_mpi_last_error_message());
    CHECK(st == expected);
    CHECK(mapping_mpi_last_error_message()[0] != '\0');
    if (words)
        CHECK(strstr(mapping_mpi_last_error_message(), words) != NULL);
    int failed = st != MAPPING_OK, everywhere = 0;
    MPI_Allreduce(&failed, &everywhere, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    CHECK(everywhere == 1);
}

static mapping_device *host_device(void)
{
    mapping_device *dev = NULL;
    CHECK_OK(mapping_open(&(mapping_device_desc){.backend = "host"}, &dev));
    return dev;
}

static unsigned char cell(size_t row, size_t byte)
{
    return (unsigned char)(row * 31 + byte * 7 + 1);
}

/* The global array of the test: byte b of row r is cell(r, b). */
static unsigned char *global_pattern(size_t rows, size_t row_bytes)
{
    unsigned char *g = malloc(rows * row_bytes);
    for (size_t r = 0; r < rows; r++)
        for (size_t b = 0; b < row_bytes; b++)
            g[r * row_bytes + b] = cell(r, b);
    return g;
}

static void round_trip(size_t rows, size_t cols, size_t element_bytes, size_t halo)
{
    mapping_device *dev = host_device();
    mapping_mpi_darray *a;
    mapping_mpi_darray_desc desc = {.rows = rows, .cols = cols, .element_bytes = element_bytes, .halo = halo, .dev = dev};
    CHECK_OK(mapping_mpi_darray_create(MPI_COMM_WORLD, &desc, &a));
    mapping_mpi_darray_info info;
    CHECK_OK(mapping_mpi_darray_get_info(a, &info));
    CHECK(info.rank == rank && info.size == size && info.rows == rows && info.cols == (cols ? cols : 1));
    /* The blocks tile the rows in rank order. */
    unsigned long long mine[2] = {info.first_row, info.owned_rows}, all[64];
    MPI_Allgather(mine, 2, MPI_UNSIGNED_LONG_LONG, all, 2, MPI_UNSIGNED_LONG_LONG, MPI_COMM_WORLD);
    size_t next = 0;
    for (int r = 0; r < size; r++) {
        CHECK(all[2 * r] == next && all[2 * r + 1] >= rows / (size_t)size);
        next += all[2 * r + 1];
    }
    CHECK(next == rows);

    unsigned char *g = rank == 0 ? global_pattern(rows, info.row_bytes) : NULL;
    CHECK_OK(mapping_mpi_scatter(a, g, 0));
    /* Through the device and back: sync, destroy the host copy, gather. */
    mapping_mirror *owned = mapping_mpi_darray_owned(a);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, owned));
    CHECK_OK(mapping_mirror_mark_gpu_modified(owned, 0, mapping_mirror_size(owned)));
    memset(mapping_mirror_cpu(owned), 0xee, mapping_mirror_size(owned));
    unsigned char *back = rank == 0 ? calloc(rows, info.row_bytes) : NULL;
    CHECK_OK(mapping_mpi_gather(NULL, a, back, 0));
    if (rank == 0) {
        CHECK(memcmp(back, g, rows * info.row_bytes) == 0);
        free(back);
        free(g);
    }
    mapping_mpi_darray_destroy(a);
    mapping_close(dev);
}

static void test_scatter_gather_round_trip(void)
{
    round_trip(103, 7, sizeof(double), 1); /* 2-D, rows not a multiple of the ranks */
    round_trip(1001, 0, sizeof(int), 3);   /* 1-D */
}

/* Exchanges once with the owned rows modified on the device and checks the
 * halo values on both sides, and the bytes the device moved. */
static void exchange_once(size_t rows, size_t cols, size_t halo, mapping_stream *stream, mapping_mpi_darray *a,
                          mapping_device *dev)
{
    mapping_mpi_darray_info info;
    CHECK_OK(mapping_mpi_darray_get_info(a, &info));
    mapping_mirror *block = mapping_mpi_darray_mirror(a), *owned = mapping_mpi_darray_owned(a);
    size_t rb = info.row_bytes, hb = halo * rb;
    /* "A kernel" writes every owned byte on the device: rank + 1. */
    CHECK_OK(mapping_fill_gpu(stream, mapping_mirror_gpu(block), info.owned_offset, info.owned_rows * rb,
                              (unsigned char)(rank + 1)));
    CHECK_OK(mapping_mirror_mark_gpu_modified(owned, 0, mapping_mirror_size(owned)));

    /* The accessors: the array's own device; no CUDA-aware path off CUDA. */
    CHECK(mapping_mpi_darray_device(a) == dev);
    CHECK(mapping_mpi_darray_device(NULL) == NULL);
    if (strcmp(mapping_backend_name(dev), "cuda") != 0)
        CHECK(mapping_mpi_cuda_aware(a) == 0);
    CHECK(mapping_mpi_cuda_aware(NULL) == 0);

    mapping_stats before, after;
    CHECK_OK(mapping_device_stats(dev, &before));
    CHECK_OK(mapping_mpi_halo_exchange(stream, a));
    if (stream)
        CHECK_OK(mapping_stream_synchronize(stream));
    CHECK_OK(mapping_device_stats(dev, &after));
    int neighbours = (rank > 0) + (rank + 1 < size);
    /* Exactly the halo bytes: the boundary rows out (once, where the two
     * strips overlap in a block no taller than two halos), the halos in. */
    size_t owned_bytes = info.owned_rows * rb, out = (size_t)neighbours * hb;
    if (out > owned_bytes)
        out = owned_bytes;
    CHECK(after.d2h_bytes - before.d2h_bytes == out);
    CHECK(after.h2d_bytes - before.h2d_bytes == (uint64_t)neighbours * hb);

    /* The halos on the device hold the neighbours' values. */
    size_t local = info.owned_rows + 2 * halo;
    unsigned char *dev_copy = malloc(local * rb);
    CHECK_OK(mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(block), 0, dev_copy, local * rb));
    for (size_t b = 0; b < hb; b++) {
        if (rank > 0)
            CHECK(dev_copy[b] == (unsigned char)rank);
        if (rank + 1 < size)
            CHECK(dev_copy[info.owned_offset + info.owned_rows * rb + b] == (unsigned char)(rank + 2));
    }
    CHECK(mapping_mirror_stale_bytes(block, MAPPING_CPU) == owned_bytes - out);
    free(dev_copy);
    (void)rows;
    (void)cols;

    /* A second exchange with nothing modified moves nothing to the host, and
     * the halos again (they are overwritten by the neighbours). */
    CHECK_OK(mapping_device_stats(dev, &before));
    CHECK_OK(mapping_mpi_halo_exchange(stream, a));
    if (stream)
        CHECK_OK(mapping_stream_synchronize(stream));
    CHECK_OK(mapping_device_stats(dev, &after));
    CHECK(after.d2h_bytes == before.d2h_bytes);
    CHECK(after.h2d_bytes - before.h2d_bytes == (uint64_t)neighbours * hb);
}

static void test_halo_exchange_moves_exactly_the_halo_bytes(void)
{
    const size_t shapes[][3] = {{64, 33, 2}, {1000, 0, 5}, {16, 4, 4}}; /* rows, cols, halo */
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        mapping_device *dev = host_device();
        mapping_stream *stream;
        CHECK_OK(mapping_stream_create(dev, &stream));
        mapping_mpi_darray *a;
        mapping_mpi_darray_desc desc = {.rows = shapes[i][0], .cols = shapes[i][1], .element_bytes = 4,
                                        .halo = shapes[i][2], .dev = dev};
        CHECK_OK(mapping_mpi_darray_create(MPI_COMM_WORLD, &desc, &a));
        CHECK_OK(mapping_mirror_sync_to_gpu(NULL, mapping_mpi_darray_mirror(a)));
        exchange_once(shapes[i][0], shapes[i][1], shapes[i][2], stream, a, dev);
        exchange_once(shapes[i][0], shapes[i][1], shapes[i][2], NULL, a, dev); /* blocking */
        mapping_stream_destroy(stream);
        mapping_mpi_darray_destroy(a);
        mapping_close(dev);
    }
}

static void test_bad_input_fails_on_every_rank(void)
{
    mapping_device *dev = host_device();
    mapping_mpi_darray *a = (mapping_mpi_darray *)1;
    mapping_mpi_darray_desc desc = {.rows = 100 + (size_t)rank, .cols = 8, .element_bytes = 4, .halo = 1, .dev = dev};
    check_failed_everywhere(mapping_mpi_darray_create(MPI_COMM_WORLD, &desc, &a), MAPPING_ERR_INVALID_ARGUMENT,
                            "rows differs across ranks");
    CHECK(a == NULL);
    desc.rows = 64;
    desc.element_bytes = rank == 2 ? 8 : 4;
    check_failed_everywhere(mapping_mpi_darray_create(MPI_COMM_WORLD, &desc, &a), MAPPING_ERR_INVALID_ARGUMENT,
                            "element_bytes differs");
    desc.element_bytes = 4;
    desc.rows = 4 * (size_t)size + 1;
    desc.halo = 5; /* blocks of 4 or 5 rows */
    check_failed_everywhere(mapping_mpi_darray_create(MPI_COMM_WORLD, &desc, &a), MAPPING_ERR_INVALID_ARGUMENT,
                            "wider than the smallest block");
    desc.halo = 1;
    desc.rows = (size_t)size - 1;
    check_failed_everywhere(mapping_mpi_darray_create(MPI_COMM_WORLD, &desc, &a), MAPPING_ERR_INVALID_ARGUMENT,
                            "would own none");
    desc.rows = 64;
    check_failed_everywhere(mapping_mpi_darray_create(MPI_COMM_SELF, &desc, &a), MAPPING_ERR_INVALID_ARGUMENT,
                            "one rank");
    /* Bad on one rank only: that rank says what, the others that it failed. */
    mapping_status st = mapping_mpi_darray_create(MPI_COMM_WORLD, rank == 1 ? NULL : &desc, &a);
    check_failed_everywhere(st, rank == 1 ? MAPPING_ERR_NULL_ARGUMENT : MAPPING_ERR_NULL_ARGUMENT,
                            rank == 1 ? "desc is NULL" : "failed on rank 1");
    desc.element_bytes = 0;
    check_failed_everywhere(mapping_mpi_darray_create(MPI_COMM_WORLD, &desc, &a), MAPPING_ERR_ZERO_SIZE, "is 0");

    /* Scatter and gather: a bad or mismatched root, a NULL array on root. */
    desc.element_bytes = 4;
    CHECK_OK(mapping_mpi_darray_create(MPI_COMM_WORLD, &desc, &a));
    unsigned char *g = calloc(64, 32);
    check_failed_everywhere(mapping_mpi_scatter(a, g, size), MAPPING_ERR_INVALID_ARGUMENT, "not a rank");
    check_failed_everywhere(mapping_mpi_scatter(a, g, rank == size - 1 ? 1 : 0), MAPPING_ERR_INVALID_ARGUMENT, NULL);
    check_failed_everywhere(mapping_mpi_gather(NULL, a, rank == 0 ? NULL : g, 0),
                            rank == 0 ? MAPPING_ERR_NULL_ARGUMENT : MAPPING_ERR_NULL_ARGUMENT, NULL);
    CHECK(mapping_mpi_halo_exchange(NULL, NULL) == MAPPING_ERR_NULL_ARGUMENT);
    /* A stream of another device on rank 0: every rank fails the exchange
     * with rank 0's status (agreed), and none hangs. */
    mapping_device *other = host_device();
    mapping_stream *wrong;
    CHECK_OK(mapping_stream_create(other, &wrong));
    check_failed_everywhere(mapping_mpi_halo_exchange(rank == 0 ? wrong : NULL, a), MAPPING_ERR_DEVICE_MISMATCH,
                            rank == 0 ? NULL : "failed on rank 0");
    CHECK_OK(mapping_mpi_halo_exchange(NULL, a)); /* and the next one works */
    mapping_stream_destroy(wrong);
    mapping_close(other);
    free(g);
    mapping_mpi_darray_destroy(a);
    mapping_close(dev);
}

/* Delta halos: after a first full exchange, only the changed granules of
 * the boundary rows travel; the halos still hold the neighbours' rows. */
static void delta_exchange(mapping_mpi_darray *a, size_t row_bytes, size_t changed, unsigned char value)
{
    mapping_mirror *block = mapping_mpi_darray_mirror(a);
    mapping_mpi_darray_info info;
    CHECK_OK(mapping_mpi_darray_get_info(a, &info));
    unsigned char *cpu = mapping_mirror_cpu(block);
    size_t first = info.owned_offset, last = first + (info.owned_rows - 1) * row_bytes;
    memset(cpu + first, value, changed); /* the first and last owned rows' first bytes */
    memset(cpu + last, value, changed);
    CHECK_OK(mapping_mirror_mark_cpu_modified(block, first, changed));
    CHECK_OK(mapping_mirror_mark_cpu_modified(block, last, changed));
    mapping_mpi_darray_stats before, after;
    CHECK_OK(mapping_mpi_darray_get_stats(a, &before));
    CHECK_OK(mapping_mpi_halo_exchange(NULL, a));
    CHECK_OK(mapping_mpi_darray_get_stats(a, &after));
    int neighbours = (rank > 0) + (rank + 1 < size);
    uint64_t sent = after.mpi_bytes_sent - before.mpi_bytes_sent, granules = (changed + 63) / 64 * 64;
    CHECK(after.exchanges == before.exchanges + 1);
    CHECK(sent == (uint64_t)neighbours * (8 + 8 + granules)); /* header, one range, its granules */
    CHECK_OK(mapping_mirror_sync_to_cpu(NULL, block));
    if (rank > 0) /* the halo above: the upper neighbour's last owned row */
        CHECK(cpu[0] == value && cpu[changed - 1] == value);
    if (rank + 1 < size)
        CHECK(cpu[last + row_bytes] == value);
}

/* Stops every wait once it has been called this many times. */
static int progress_calls;
static int stop_after(void *user)
{
    return ++progress_calls > *(int *)user;
}

static void test_delta_halos_and_failure_notices(void)
{
    mapping_device *dev = host_device();
    mapping_mpi_darray *a;
    mapping_mpi_darray_desc desc = {.rows = 8 * (size_t)size, .cols = 1024, .element_bytes = 1, .halo = 1, .dev = dev};
    CHECK_OK(mapping_mpi_darray_create(MPI_COMM_WORLD, &desc, &a));
    check_failed_everywhere(mapping_mpi_darray_set_delta(a, rank == 1), MAPPING_ERR_INVALID_ARGUMENT,
                            "on differs across ranks");
    CHECK_OK(mapping_mpi_darray_set_delta(a, 1));
    CHECK_OK(mapping_mpi_halo_exchange(NULL, a)); /* the first: all of it */
    delta_exchange(a, 1024, 100, 0x5a);            /* then 100 bytes: two granules */
    delta_exchange(a, 1024, 1024, 0x6b);           /* all changed: one range of the whole row */
    mapping_mpi_darray_stats st;
    CHECK_OK(mapping_mpi_darray_get_stats(a, &st));
    CHECK(st.delta_bytes_saved > 0);

    /* Rank 1 stops taking part and says so: the others' exchange gives up. */
    MPI_Barrier(MPI_COMM_WORLD); /* (every rank's last exchange has completed here) */
    if (rank == 1) {
        CHECK_OK(mapping_mpi_darray_notify_failure(a, "rank 1 stops"));
    } else {
        CHECK(mapping_mpi_halo_exchange(NULL, a) == MAPPING_ERR_NOT_READY);
        char why[64];
        int from = -1;
        CHECK(mapping_mpi_darray_peer_failed(a, &from, why, sizeof why) == 1 && from == 1);
        CHECK(strcmp(why, "rank 1 stops") == 0);
        CHECK(mapping_mpi_halo_exchange(NULL, a) != MAPPING_OK); /* unusable now */
    }
    mapping_mpi_darray_destroy(a); /* after a notice: no barrier */

    /* The progress function gives up a wait rank 0 never joins. */
    CHECK_OK(mapping_mpi_darray_create(MPI_COMM_WORLD, &desc, &a));
    int limit = 1000;
    progress_calls = 0;
    mapping_mpi_set_progress(stop_after, &limit);
    if (rank != 0)
        CHECK(mapping_mpi_halo_exchange(NULL, a) == MAPPING_ERR_NOT_READY);
    mapping_mpi_set_progress(NULL, NULL);
    CHECK(mapping_mpi_darray_peer_failed(a, NULL, NULL, 0) == 0);
    mapping_mpi_darray_destroy_local(a); /* rank != 0: broken, leaked */
    MPI_Barrier(MPI_COMM_WORLD);
    mapping_close(dev);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    static const struct {
        const char *name;
        void (*fn)(void);
    } tests[] = {
        {"scatter_gather_round_trip", test_scatter_gather_round_trip},
        {"halo_exchange_moves_exactly_the_halo_bytes", test_halo_exchange_moves_exactly_the_halo_bytes},
        {"bad_input_fails_on_every_rank", test_bad_input_fails_on_every_rank},
        {"delta_halos_and_failure_notices", test_delta_halos_and_failure_notices},
    };
    int code = 2;
    if (size < 2 || size > 32) {
        if (rank == 0)
            printf("SKIP: run under mpirun with 2 to 32 ranks (have %d)\n", size);
        code = 77;
    }
    for (size_t i = 0; code == 2 && argc > 1 && i < sizeof tests / sizeof tests[0]; i++)
        if (strcmp(argv[1], tests[i].name) == 0) {
            tests[i].fn();
            MPI_Barrier(MPI_COMM_WORLD);
            if (rank == 0)
                printf("PASS: %s on %d ranks\n", tests[i].name, size);
            code = 0;
        }
    if (code == 2 && rank == 0)
        fprintf(stderr, "usage: mpirun -np 4 mapping_mpi_tests TEST\n");
    MPI_Finalize();
    return code;
}
