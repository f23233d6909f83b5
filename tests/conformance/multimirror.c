/* Mirrors with several device sides: a model-based random test, the bytes a
 * sync moves after scattered modifications, conflicts, and bad input. CTest
 * runs these with two host devices and two PoCL devices (tests/CMakeLists.txt). */
#include <time.h>
#include "harness.h"

/* The devices of the test: device 0 and another object of it, plus device 1
 * when the back end has two. Returns how many; closes nothing. */
static int open_devices(mapping_device **devs, mapping_device **extra)
{
    devs[0] = test_device();
    devs[1] = test_device2();
    *extra = NULL;
    mapping_device_info infos[4];
    int count = 0;
    CHECK_OK(mapping_list_devices(test_backend(), infos, 4, &count));
    if (count < 2)
        return 2;
    CHECK_OK(mapping_open(&(mapping_device_desc){.backend = test_backend(), .device = 1}, extra));
    devs[2] = *extra;
    return 3;
}

/* Reads a side's bytes: the CPU array, or the replica straight from the
 * device (not through the multimirror). */
static void read_side(mapping_multimirror *m, int side, unsigned char *out)
{
    size_t n = mapping_multimirror_size(m);
    if (side < 0)
        memcpy(out, mapping_multimirror_cpu(m), n);
    else
        CHECK_OK(mapping_sync_to_cpu(mapping_multimirror_gpu(m, side), out));
}

/* Writes the range on a side as its owner would (CPU store, or a device
 * write that bypasses the multimirror). */
static void write_side(mapping_multimirror *m, int side, size_t off, const unsigned char *data, size_t n)
{
    if (side < 0)
        memcpy((unsigned char *)mapping_multimirror_cpu(m) + off, data, n);
    else
        CHECK_OK(mapping_sync_to_gpu_range(NULL, data, mapping_multimirror_gpu(m, side), off, n));
}

TEST(multimirror_model_random)
{
    mapping_device *devs[3], *extra;
    int k = open_devices(devs, &extra);
    enum { N = 4096, STEPS = 600, MAX_SIDES = 4 };
    mapping_multimirror *m;
    CHECK_OK(mapping_multimirror_create(devs, k, N, &m));
    /* The model: the latest content, and per side (0 = CPU, 1 + j) whether
     * each byte is valid and whether it holds unseen modifications. */
    static unsigned char truth[N], valid[MAX_SIDES][N], modified[MAX_SIDES][N], got[N], data[N];
    memset(truth, 0, N);
    memset(valid, 0, sizeof valid);
    memset(modified, 0, sizeof modified);
    memset(valid[0], 1, N);
    unsigned seed = 12345;
#define RAND() (seed = seed * 1103515245u + 12345u, (seed >> 8) & 0xffffff)
    int conflicts = 0, marks = 0, syncs = 0;
    for (int step = 0; step < STEPS; step++) {
        int op = (int)(RAND() % 3), side = (int)(RAND() % (unsigned)(k + 1)); /* 0 = CPU */
        size_t off = RAND() % N, len = 1 + RAND() % (N / 8);
        if (off + len > N)
            len = N - off;
        if (op < 2) { /* mark */
            int conflict = 0;
            for (size_t b = off; b < off + len && !conflict; b++)
                if (!valid[side][b])
                    for (int s = 0; s <= k; s++)
                        conflict |= s != side && modified[s][b];
            if (conflict) {
                mapping_status st = side ? mapping_multimirror_mark_gpu_modified(m, side - 1, off, len)
                                         : mapping_multimirror_mark_cpu_modified(m, off, len);
                CHECK_STATUS(st, MAPPING_ERR_CONFLICT);
                conflicts++;
            } else {
                test_pattern(data, len, (unsigned)step);
                write_side(m, side - 1, off, data, len);
                CHECK_OK(side ? mapping_multimirror_mark_gpu_modified(m, side - 1, off, len)
                              : mapping_multimirror_mark_cpu_modified(m, off, len));
                memcpy(truth + off, data, len);
                for (int s = 0; s <= k; s++)
                    for (size_t b = off; b < off + len; b++) {
                        valid[s][b] = s == side;
                        modified[s][b] = s == side;
                    }
                marks++;
            }
        } else { /* sync */
            if (side)
                CHECK_OK(mapping_multimirror_sync_to_gpu(NULL, m, side - 1));
            else
                CHECK_OK(mapping_multimirror_sync_to_cpu(m));
            memset(valid[side], 1, N);
            syncs++;
        }
        /* Every side: the stale count, and valid bytes hold the truth. */
        for (int s = 0; s <= k; s++) {
            size_t stale = 0;
            for (size_t b = 0; b < N; b++)
                stale += !valid[s][b];
            CHECK(mapping_multimirror_stale_bytes(m, s - 1) == stale);
            read_side(m, s - 1, got);
            for (size_t b = 0; b < N; b++)
                if (valid[s][b] && got[b] != truth[b])
                    test_fail(__FILE__, __LINE__, "step %d: side %d byte %zu is 0x%02x, expected 0x%02x", step, s, b,
                              got[b], truth[b]);
        }
    }
    CHECK(conflicts > 0 && marks > 0 && syncs > 0); /* the walk covered every kind of step */
    mapping_multimirror_destroy(m);
    mapping_close(extra);
}

TEST(multimirror_sync_moves_only_the_modified_ranges)
{
    mapping_device *devs[3], *extra;
    open_devices(devs, &extra);
    mapping_device *a = extra ? devs[2] : devs[0], *b = devs[1];
    mapping_device *pair[2] = {a, b};
    const size_t n = 4u << 20;
    mapping_multimirror *m;
    CHECK_OK(mapping_multimirror_create(pair, 2, n, &m));
    test_pattern(mapping_multimirror_cpu(m), n, 7);
    CHECK_OK(mapping_multimirror_mark_cpu_modified(m, 0, n));
    CHECK_OK(mapping_multimirror_sync_to_gpu(NULL, m, 0));
    CHECK_OK(mapping_multimirror_sync_to_gpu(NULL, m, 1));
    CHECK(mapping_multimirror_stale_bytes(m, 0) == 0 && mapping_multimirror_stale_bytes(m, 1) == 0);

    /* Device 0 modifies 1000 scattered ranges. */
    unsigned char data[256];
    size_t modified = 0;
    for (size_t r = 0; r < 1000; r++) {
        size_t off = r * (n / 1000) + (r * 37) % 1000, len = 1 + (r * 53) % 200;
        test_pattern(data, len, (unsigned)r);
        CHECK_OK(mapping_sync_to_gpu_range(NULL, data, mapping_multimirror_gpu(m, 0), off, len));
        CHECK_OK(mapping_multimirror_mark_gpu_modified(m, 0, off, len));
        modified += len;
    }
    CHECK(mapping_multimirror_stale_bytes(m, 1) == modified);
    CHECK(mapping_multimirror_stale_bytes(m, -1) == modified);
    mapping_stats before = test_stats(b);
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(b, &s));
    CHECK_OK(mapping_multimirror_sync_to_gpu(s, m, 1));
    CHECK_OK(mapping_stream_synchronize(s));
    mapping_stream_destroy(s);
    mapping_stats after = test_stats(b);
    /* Only device 0 holds those bytes: a peer copy of exactly them. */
    CHECK(after.peer_bytes - before.peer_bytes == modified);
    CHECK(after.h2d_bytes == before.h2d_bytes);
    CHECK(mapping_multimirror_stale_bytes(m, 1) == 0);
    /* The host follows, from a device, exactly the modified bytes. */
    mapping_stats a0 = test_stats(a), b0 = test_stats(b);
    CHECK_OK(mapping_multimirror_sync_to_cpu(m));
    mapping_stats a1 = test_stats(a), b1 = test_stats(b);
    CHECK((a1.d2h_bytes - a0.d2h_bytes) + (b1.d2h_bytes - b0.d2h_bytes) == modified);
    unsigned char *x = malloc(n), *y = malloc(n);
    CHECK_OK(mapping_sync_to_cpu(mapping_multimirror_gpu(m, 0), x));
    CHECK_OK(mapping_sync_to_cpu(mapping_multimirror_gpu(m, 1), y));
    CHECK_BYTES(y, x, n);
    CHECK_BYTES(mapping_multimirror_cpu(m), x, n);
    free(x);
    free(y);
    mapping_multimirror_destroy(m);
    mapping_close(extra);
}

TEST(multimirror_conflicts)
{
    mapping_device *devs[2] = {test_device(), test_device2()};
    mapping_multimirror *m;
    CHECK_OK(mapping_multimirror_create(devs, 2, 1024, &m));
    CHECK_OK(mapping_multimirror_sync_to_gpu(NULL, m, 0));
    CHECK_OK(mapping_multimirror_sync_to_gpu(NULL, m, 1));
    mapping_stats before = test_stats(devs[1]);
    CHECK_OK(mapping_multimirror_mark_gpu_modified(m, 0, 100, 50));
    /* Device 1 has not seen device 0's write: marking over it is a conflict. */
    CHECK_REFUSED(mapping_multimirror_mark_gpu_modified(m, 1, 120, 10), MAPPING_ERR_CONFLICT);
    CHECK(test_stats(devs[1]).conflicts == before.conflicts + 1);
    CHECK_REFUSED(mapping_multimirror_mark_cpu_modified(m, 140, 20), MAPPING_ERR_CONFLICT);
    CHECK_OK(mapping_multimirror_mark_gpu_modified(m, 1, 150, 10)); /* next to it: fine */
    CHECK_OK(mapping_multimirror_mark_gpu_modified(m, 0, 100, 50)); /* its own range again: fine */
    CHECK_OK(mapping_multimirror_sync_to_gpu(NULL, m, 1));
    CHECK_OK(mapping_multimirror_mark_gpu_modified(m, 1, 120, 10)); /* seen now */
    CHECK(mapping_multimirror_stale_bytes(m, 0) == 20);
    mapping_multimirror_destroy(m);
}

TEST(multimirror_refuses_bad_input)
{
    mapping_device *devs[2] = {test_device(), test_device2()}, *same[2] = {test_device(), test_device()};
    mapping_multimirror *m = NULL;
    CHECK_REFUSED(mapping_multimirror_create(NULL, 2, 64, &m), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_multimirror_create(devs, 2, 64, NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_multimirror_create(devs, 0, 64, &m), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_REFUSED(mapping_multimirror_create(devs, MAPPING_MULTIMIRROR_MAX_DEVICES + 1, 64, &m),
                  MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_REFUSED(mapping_multimirror_create(devs, 2, 0, &m), MAPPING_ERR_ZERO_SIZE);
    CHECK_REFUSED(mapping_multimirror_create(same, 2, 64, &m), MAPPING_ERR_INVALID_ARGUMENT);
    mapping_device *with_null[2] = {test_device(), NULL};
    CHECK_REFUSED(mapping_multimirror_create(with_null, 2, 64, &m), MAPPING_ERR_NULL_ARGUMENT);
    CHECK(m == NULL);
    CHECK_OK(mapping_multimirror_create(devs, 2, 64, &m));
    CHECK_REFUSED(mapping_multimirror_mark_gpu_modified(m, 2, 0, 8), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_REFUSED(mapping_multimirror_mark_gpu_modified(m, -1, 0, 8), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_REFUSED(mapping_multimirror_mark_cpu_modified(m, 60, 8), MAPPING_ERR_OUT_OF_RANGE);
    CHECK_REFUSED(mapping_multimirror_mark_cpu_modified(m, 0, 0), MAPPING_ERR_ZERO_SIZE);
    CHECK_REFUSED(mapping_multimirror_mark_cpu_modified(NULL, 0, 8), MAPPING_ERR_NULL_ARGUMENT);
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(devs[0], &s));
    CHECK_REFUSED(mapping_multimirror_sync_to_gpu(s, m, 1), MAPPING_ERR_DEVICE_MISMATCH);
    CHECK_REFUSED(mapping_multimirror_sync_to_gpu(s, m, 5), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_REFUSED(mapping_multimirror_sync_to_cpu(NULL), MAPPING_ERR_NULL_ARGUMENT);
    mapping_clear_last_error();
    CHECK(mapping_multimirror_stale_bytes(m, 7) == 0 && mapping_last_error() == MAPPING_ERR_INVALID_ARGUMENT);
    CHECK(mapping_multimirror_gpu(m, 2) == NULL && mapping_multimirror_gpu(m, 1) != NULL);
    CHECK(mapping_multimirror_size(NULL) == 0 && mapping_multimirror_cpu(NULL) == NULL);
    mapping_stream_destroy(s);
    mapping_multimirror_destroy(m);
    mapping_multimirror_destroy(NULL);
}

TEST(sharded_mirror_places_consecutive_slices_on_the_devices)
{
    mapping_device *devs[3], *extra;
    int k = open_devices(devs, &extra);
    enum { GRANULE = 8, N = 125 * GRANULE };
    unsigned char *host = malloc(N), *back = malloc(N);
    test_pattern(host, N, 5);
    mapping_mirror *shards[3] = {NULL, NULL, NULL};
    CHECK_OK(mapping_mirror_create_sharded(devs, k, host, N, GRANULE, 0, shards));
    size_t at = 0;
    for (int i = 0; i < k; i++) {
        size_t want = (125 / (size_t)k + ((size_t)i < 125 % (size_t)k)) * GRANULE;
        CHECK(mapping_mirror_size(shards[i]) == want);
        CHECK(mapping_mirror_cpu(shards[i]) == host + at);
        CHECK(mapping_buffer_device(mapping_mirror_gpu(shards[i])) == devs[i]);
        /* Each device works on its shard: sync, the device's own change, back. */
        CHECK_OK(mapping_mirror_sync_to_gpu(NULL, shards[i]));
        CHECK_OK(mapping_fill_gpu(NULL, mapping_mirror_gpu(shards[i]), mapping_mirror_gpu_offset(shards[i]), GRANULE,
                                  (unsigned char)(0xa0 + i)));
        CHECK_OK(mapping_mirror_mark_gpu_modified(shards[i], 0, GRANULE));
        at += want;
    }
    CHECK(at == N);
    memcpy(back, host, N);
    for (int i = 0; i < k; i++) {
        CHECK_OK(mapping_mirror_sync_to_cpu(NULL, shards[i]));
        unsigned char *p = mapping_mirror_cpu(shards[i]);
        for (size_t b = 0; b < GRANULE; b++) {
            CHECK(p[b] == (unsigned char)(0xa0 + i));
            back[(size_t)(p - host) + b] = (unsigned char)(0xa0 + i);
        }
    }
    CHECK_BYTES(host, back, N); /* nothing else changed */
    for (int i = 0; i < k; i++)
        mapping_mirror_destroy(shards[i]);

    mapping_mirror *none[3] = {NULL, NULL, NULL};
    CHECK_REFUSED(mapping_mirror_create_sharded(devs, k, host, N - 1, GRANULE, 0, none), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_REFUSED(mapping_mirror_create_sharded(devs, k, host, N, 0, 0, none), MAPPING_ERR_ZERO_SIZE);
    CHECK_REFUSED(mapping_mirror_create_sharded(devs, 0, host, N, GRANULE, 0, none), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_REFUSED(mapping_mirror_create_sharded(devs, k, host, 2 * GRANULE, GRANULE * 2, 0, none),
                  MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_REFUSED(mapping_mirror_create_sharded(devs, k, NULL, N, GRANULE, 0, none), MAPPING_ERR_NULL_ARGUMENT);
    mapping_device *bad[2] = {devs[0], NULL};
    CHECK_REFUSED(mapping_mirror_create_sharded(bad, 2, host, N, GRANULE, 0, none), MAPPING_ERR_NULL_ARGUMENT);
    CHECK(none[0] == NULL && none[1] == NULL);
    free(host);
    free(back);
    mapping_close(extra);
}

static void *open_gate_later(void *gate)
{
    struct timespec pause = {0, 30 * 1000 * 1000};
    nanosleep(&pause, NULL);
    test_gate_open(gate);
    return NULL;
}

TEST(multimirror_state_follows_stream_completion)
{
    mapping_device *devs[2] = {test_device(), test_device2()};
    mapping_multimirror *m;
    CHECK_OK(mapping_multimirror_create(devs, 2, 1 << 16, &m));
    test_pattern(mapping_multimirror_cpu(m), 1 << 16, 9);
    CHECK_OK(mapping_multimirror_mark_cpu_modified(m, 0, 1 << 16));
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(devs[0], &s));
    test_gate gate = TEST_GATE_INIT;
    CHECK_OK(mapping_launch_host(s, test_gate_wait, &gate));
    CHECK_OK(mapping_multimirror_sync_to_gpu(s, m, 0)); /* queued behind the gate */
    pthread_t opener;
    CHECK(pthread_create(&opener, NULL, open_gate_later, &gate) == 0);
    /* The count waits for the queued copies: when it answers, the stream
     * has passed the gate and the replica holds the data. */
    CHECK(mapping_multimirror_stale_bytes(m, 0) == 0);
    CHECK(test_gate_passed(&gate) == 1);
    unsigned char *back = malloc(1 << 16);
    CHECK_OK(mapping_sync_to_cpu(mapping_multimirror_gpu(m, 0), back));
    CHECK_BYTES(back, mapping_multimirror_cpu(m), 1 << 16);
    pthread_join(opener, NULL);
    /* Device 1 may now be filled from device 0 (which holds the bytes). */
    CHECK_OK(mapping_multimirror_sync_to_gpu(NULL, m, 1));
    CHECK_OK(mapping_sync_to_cpu(mapping_multimirror_gpu(m, 1), back));
    CHECK_BYTES(back, mapping_multimirror_cpu(m), 1 << 16);
    free(back);
    mapping_stream_destroy(s);
    mapping_multimirror_destroy(m);
}
