/*
 * The device memory budget and eviction (issue 40): the budget API and its
 * ABI (mapping_open_sized), what counts against the budget, the eviction
 * rows of the state table (docs/mirrors.md: evict, materialize), LRU order
 * and hints, what is never evicted, and the statistics. The model over the
 * feature matrix (mirror_matrix_model.c) runs random budgets as well.
 */
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "harness.h"

enum { KIB = 1024, MB = 1 << 20 };

static uint64_t resident_of(mapping_device *dev)
{
    uint64_t budget = 0, resident = 0;
    CHECK_OK(mapping_device_memory_budget(dev, &budget, &resident));
    return resident;
}

/* The device side of m read back raw (m must be resident). */
static void read_device(mapping_mirror *m, void *out)
{
    mapping_buffer *gpu = mapping_mirror_gpu(m);
    CHECK(gpu != NULL);
    CHECK_OK(mapping_sync_to_cpu_range(NULL, gpu, mapping_mirror_gpu_offset(m), out, mapping_mirror_size(m)));
}

TEST(memory_budget_is_set_read_and_checked)
{
    mapping_device *dev = test_device();
    uint64_t budget = 1, resident = 1;
    CHECK_OK(mapping_device_memory_budget(dev, &budget, &resident));
    CHECK(budget == 0);
    CHECK_OK(mapping_device_set_memory_budget(dev, 3 * MB));
    CHECK_OK(mapping_device_memory_budget(dev, &budget, NULL));
    CHECK(budget == 3 * MB);
    CHECK_OK(mapping_device_memory_budget(dev, NULL, NULL));
    CHECK_REFUSED(mapping_device_set_memory_budget(dev, ((uint64_t)1 << 60) + 1), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_REFUSED(mapping_device_set_memory_budget(NULL, 1), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_REFUSED(mapping_device_memory_budget(NULL, &budget, NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_OK(mapping_device_memory_budget(dev, &budget, NULL));
    CHECK(budget == 3 * MB); /* the refused call changed nothing */
    /* Resident bytes: a buffer of the program's and a mirror count; freeing gives them back. */
    uint64_t before = resident_of(dev);
    mapping_buffer *buf;
    mapping_mirror *m;
    CHECK_OK(mapping_allocate_gpu(dev, 100 * KIB, &buf));
    CHECK_OK(mapping_mirror_create(dev, 200 * KIB, 0, &m));
    CHECK(resident_of(dev) == before + 300 * KIB);
    CHECK(test_stats(dev).peak_resident_bytes >= before + 300 * KIB);
    mapping_free_gpu(buf);
    mapping_mirror_destroy(m);
    CHECK(resident_of(dev) == before);
    CHECK_OK(mapping_device_set_memory_budget(dev, 0));
}

TEST(memory_budget_comes_from_the_desc_or_the_environment_parsed_strictly)
{
    test_device(); /* SKIP where the back end is absent */
    mapping_device *dev;
    mapping_device_desc desc = {.backend = test_backend(), .memory_budget = 5 * MB};
    uint64_t budget = 0;
    CHECK_OK(mapping_open(&desc, &dev));
    CHECK_OK(mapping_device_memory_budget(dev, &budget, NULL));
    CHECK(budget == 5 * MB);
    mapping_close(dev);
    desc.memory_budget = 0;
    setenv("MAPPING_MEMORY_BUDGET", "7340032", 1);
    CHECK_OK(mapping_open(&desc, &dev));
    CHECK_OK(mapping_device_memory_budget(dev, &budget, NULL));
    CHECK(budget == 7340032);
    mapping_close(dev);
    desc.memory_budget = 5 * MB; /* the desc wins */
    CHECK_OK(mapping_open(&desc, &dev));
    CHECK_OK(mapping_device_memory_budget(dev, &budget, NULL));
    CHECK(budget == 5 * MB);
    mapping_close(dev);
    static const char *const bad[] = {"7M", "-1", " 5", "0x10", "1e9", "2000000000000000000"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("MAPPING_MEMORY_BUDGET", bad[i], 1);
        desc.memory_budget = 0;
        CHECK_REFUSED(mapping_open(&desc, &dev), MAPPING_ERR_INVALID_ARGUMENT);
        CHECK(strstr(mapping_last_error_message(), "MAPPING_MEMORY_BUDGET") != NULL);
    }
    unsetenv("MAPPING_MEMORY_BUDGET");
    desc.memory_budget = ((uint64_t)1 << 60) + 1;
    CHECK_REFUSED(mapping_open(&desc, &dev), MAPPING_ERR_INVALID_ARGUMENT);
}

/* A program built against the 0.1.0 header passes a 32-byte desc: what
 * follows it in memory is not a budget. */
TEST(open_sized_reads_only_the_callers_desc)
{
    test_device();
    struct {
        mapping_device_desc desc;
        unsigned char       after[64];
    } old;
    memset(&old, 0xAB, sizeof old);
    old.desc.backend = test_backend();
    old.desc.device = 0;
    old.desc.link_bandwidth = 0;
    old.desc.link_latency = 0;
    size_t old_size = offsetof(mapping_device_desc, link_latency) + sizeof(double);
    mapping_device *dev;
    uint64_t budget = 1;
    CHECK_OK(mapping_open_sized(&old.desc, &dev, old_size));
    CHECK_OK(mapping_device_memory_budget(dev, &budget, NULL));
    CHECK(budget == 0);
    mapping_close(dev);
    CHECK_OK((mapping_open)(&old.desc, &dev)); /* the exported function: the 0.1.0 layout */
    CHECK_OK(mapping_device_memory_budget(dev, &budget, NULL));
    CHECK(budget == 0);
    mapping_close(dev);
    /* A newer header's desc: zeros past ours are fine, anything else is refused. */
    struct {
        mapping_device_desc desc;
        uint64_t            later[2];
    } newer = {{.backend = test_backend()}, {0, 0}};
    CHECK_OK(mapping_open_sized(&newer.desc, &dev, sizeof newer));
    mapping_close(dev);
    newer.later[1] = 1;
    CHECK_REFUSED(mapping_open_sized(&newer.desc, &dev, sizeof newer), MAPPING_ERR_UNSUPPORTED);
    CHECK_REFUSED(mapping_open_sized(&newer.desc, &dev, 8), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_OK(mapping_open_sized(NULL, &dev, 0)); /* NULL: all defaults, the size unused */
    mapping_close(dev);
}

/* Row "evict": the device's modifications are written back, exactly those
 * bytes; the CPU is valid everywhere, the GPU stale everywhere; the memory
 * goes back to the budget. Row "materialize": the next sync uploads what it
 * covers. */
TEST(eviction_writes_back_exactly_the_device_modified_bytes)
{
    mapping_device *dev = test_device();
    enum { N = 256 * KIB };
    mapping_mirror *m = test_synced_mirror(dev, N, 0, 3);
    unsigned char *cpu = mapping_mirror_cpu(m), *expect = malloc(N), *dev_side = malloc(N);
    CHECK(expect && dev_side);
    memcpy(expect, cpu, N);
    /* The device writes 3 ranges, 1 + 4000 + 10 bytes; the CPU writes one more. */
    mapping_buffer *gpu = mapping_mirror_gpu(m);
    size_t off = mapping_mirror_gpu_offset(m);
    CHECK_OK(mapping_fill_gpu(NULL, gpu, off + 5, 1, 0x11));
    CHECK_OK(mapping_fill_gpu(NULL, gpu, off + 70000, 4000, 0x22));
    CHECK_OK(mapping_fill_gpu(NULL, gpu, off + N - 10, 10, 0x33));
    CHECK_OK(mapping_mirror_mark_gpu_modified(m, 5, 1));
    CHECK_OK(mapping_mirror_mark_gpu_modified(m, 70000, 4000));
    CHECK_OK(mapping_mirror_mark_gpu_modified(m, N - 10, 10));
    memset(expect + 5, 0x11, 1);
    memset(expect + 70000, 0x22, 4000);
    memset(expect + N - 10, 0x33, 10);
    cpu[100] = 0x44;
    expect[100] = 0x44;
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 100, 1));
    mapping_stats before = test_stats(dev);
    uint64_t resident = resident_of(dev);
    CHECK(mapping_mirror_is_resident(m) == 1);
    CHECK_OK(mapping_mirror_evict(m));
    mapping_stats after = test_stats(dev);
    CHECK(mapping_mirror_is_resident(m) == 0);
    CHECK(mapping_mirror_gpu(m) == NULL);
    CHECK(after.evictions == before.evictions + 1);
    CHECK(after.evict_writeback_bytes - before.evict_writeback_bytes == 1 + 4000 + 10);
    CHECK(after.d2h_payload_bytes - before.d2h_payload_bytes == 1 + 4000 + 10);
    CHECK(after.h2d_bytes == before.h2d_bytes); /* the CPU's byte stays on the CPU */
    CHECK(resident_of(dev) == resident - N);
    CHECK_BYTES(cpu, expect, N);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_CPU) == 0);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == N);
    CHECK_OK(mapping_mirror_evict(m)); /* not resident: nothing to do */
    CHECK(test_stats(dev).evictions == after.evictions);
    /* Materialized again by a sync: the whole mirror goes up; the bytes that
     * were valid there before the eviction count as re-uploaded. */
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    mapping_stats back = test_stats(dev);
    CHECK(mapping_mirror_is_resident(m) == 1);
    CHECK(back.h2d_payload_bytes - after.h2d_payload_bytes == N);
    CHECK(back.evict_reupload_bytes - after.evict_reupload_bytes == N - 1); /* not the CPU's marked byte */
    read_device(m, dev_side);
    CHECK_BYTES(dev_side, expect, N);
    CHECK(resident_of(dev) == resident);
    free(expect);
    free(dev_side);
    mapping_mirror_destroy(m);
}

/* A view of an evicted mirror: the family's whole buffer comes back, its
 * offsets unchanged, and the view's sync uploads the view's bytes only. */
TEST(evicted_view_materializes_the_family_and_uploads_its_range)
{
    mapping_device *dev = test_device();
    enum { N = 64 * KIB };
    mapping_mirror *m = test_synced_mirror(dev, N, 0, 5), *view;
    CHECK_OK(mapping_mirror_view(m, 4096, 8192, &view));
    size_t view_offset = mapping_mirror_gpu_offset(view);
    CHECK_OK(mapping_mirror_evict(view)); /* a view evicts its family */
    CHECK(!mapping_mirror_is_resident(m) && !mapping_mirror_is_resident(view));
    mapping_stats before = test_stats(dev);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, view));
    mapping_stats after = test_stats(dev);
    CHECK(mapping_mirror_is_resident(m));
    CHECK(after.h2d_payload_bytes - before.h2d_payload_bytes == 8192);
    CHECK(mapping_mirror_gpu_offset(view) == view_offset);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == N - 8192);
    CHECK(mapping_mirror_stale_bytes(view, MAPPING_GPU) == 0);
    unsigned char dev_side[8192];
    CHECK_OK(mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(view), view_offset, dev_side, 8192));
    CHECK_BYTES(dev_side, (unsigned char *)mapping_mirror_cpu(view), 8192);
    mapping_mirror_destroy(view);
    mapping_mirror_destroy(m);
}

/* A GPU mark of a family that is not resident has no device bytes behind it. */
TEST(mark_gpu_of_an_evicted_mirror_is_refused_and_acquire_brings_it_back)
{
    mapping_device *dev = test_device();
    mapping_mirror *m = test_synced_mirror(dev, 16 * KIB, 0, 7);
    CHECK_OK(mapping_mirror_evict(m));
    CHECK_REFUSED(mapping_mirror_mark_gpu_modified(m, 0, 16), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK(strstr(mapping_last_error_message(), "not resident") != NULL);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_CPU) == 0); /* nothing changed */
    mapping_buffer *buf = NULL;
    mapping_stats before = test_stats(dev);
    CHECK_OK(mapping_mirror_acquire_gpu(NULL, m, MAPPING_WRITE, &buf)); /* a discard: made, nothing uploaded */
    CHECK(buf != NULL && buf == mapping_mirror_gpu(m));
    CHECK(test_stats(dev).h2d_bytes == before.h2d_bytes);
    CHECK_OK(mapping_fill_gpu(NULL, buf, mapping_mirror_gpu_offset(m), 16 * KIB, 0x5A));
    CHECK_OK(mapping_mirror_release_gpu(NULL, m));
    CHECK_OK(mapping_mirror_mark_gpu_modified(m, 0, 16)); /* resident again */
    CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m));
    const unsigned char *cpu = mapping_mirror_cpu(m);
    for (size_t i = 0; i < 16 * KIB; i++)
        CHECK(cpu[i] == 0x5A);
    mapping_mirror_destroy(m);
}

/* Least recently used first; an allocation of the program's makes room. */
TEST(budget_evicts_the_least_recently_used_mirror_first)
{
    mapping_device *dev = test_device();
    enum { N = 256 * KIB };
    uint64_t base = resident_of(dev);
    CHECK_OK(mapping_device_set_memory_budget(dev, base + 3 * N));
    mapping_mirror *m[3];
    for (int i = 0; i < 3; i++)
        m[i] = test_synced_mirror(dev, N, 0, 10 + (unsigned)i);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m[0])); /* used last: m[1] is the oldest */
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, N, &buf));
    CHECK(mapping_mirror_is_resident(m[0]) && !mapping_mirror_is_resident(m[1]) && mapping_mirror_is_resident(m[2]));
    CHECK(resident_of(dev) <= base + 3 * N);
    /* Using m[1] again evicts the next oldest (m[2]). */
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m[1]));
    CHECK(mapping_mirror_is_resident(m[0]) && mapping_mirror_is_resident(m[1]) && !mapping_mirror_is_resident(m[2]));
    test_check_mirror_sides_equal(m[1]);
    mapping_free_gpu(buf);
    for (int i = 0; i < 3; i++)
        mapping_mirror_destroy(m[i]);
    CHECK_OK(mapping_device_set_memory_budget(dev, 0));
}

/* Hints: KEEP is never evicted by the budget, EVICT_FIRST goes first; an
 * acquired family is held until released. */
TEST(budget_skips_acquired_and_kept_mirrors_and_takes_evict_first_first)
{
    mapping_device *dev = test_device();
    enum { N = 128 * KIB };
    uint64_t base = resident_of(dev);
    CHECK_OK(mapping_device_set_memory_budget(dev, base + 3 * N));
    mapping_mirror *m[3];
    for (int i = 0; i < 3; i++)
        m[i] = test_synced_mirror(dev, N, 0, 20 + (unsigned)i);
    CHECK_REFUSED(mapping_mirror_set_residency(m[0], (mapping_residency)3), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_REFUSED(mapping_mirror_set_residency(NULL, MAPPING_RESIDENCY_KEEP), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_OK(mapping_mirror_set_residency(m[0], MAPPING_RESIDENCY_KEEP)); /* the oldest, kept */
    CHECK_OK(mapping_mirror_set_residency(m[2], MAPPING_RESIDENCY_EVICT_FIRST)); /* the newest, first */
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, N, &buf));
    CHECK(mapping_mirror_is_resident(m[0]) && mapping_mirror_is_resident(m[1]) && !mapping_mirror_is_resident(m[2]));
    mapping_free_gpu(buf);
    /* m[1] acquired, m[0] kept: a second buffer finds nothing to evict. */
    mapping_buffer *held;
    CHECK_OK(mapping_mirror_acquire_gpu(NULL, m[1], MAPPING_READ, &held));
    CHECK_OK(mapping_allocate_gpu(dev, N, &buf));
    mapping_buffer *more;
    CHECK_REFUSED(mapping_allocate_gpu(dev, N, &more), MAPPING_ERR_OUT_OF_DEVICE_MEMORY);
    CHECK(strstr(mapping_last_error_message(), "memory budget") != NULL);
    CHECK(mapping_mirror_is_resident(m[0]) && mapping_mirror_is_resident(m[1]));
    CHECK_OK(mapping_mirror_release_gpu(NULL, m[1]));
    CHECK_OK(mapping_allocate_gpu(dev, N, &more)); /* released: m[1] goes now */
    CHECK(!mapping_mirror_is_resident(m[1]) && mapping_mirror_is_resident(m[0]));
    /* An explicit eviction takes a kept mirror too. */
    CHECK_OK(mapping_mirror_evict(m[0]));
    CHECK(!mapping_mirror_is_resident(m[0]));
    mapping_free_gpu(more);
    mapping_free_gpu(buf);
    for (int i = 0; i < 3; i++)
        mapping_mirror_destroy(m[i]);
    CHECK_OK(mapping_device_set_memory_budget(dev, 0));
}

TEST(acquired_mirror_refuses_an_explicit_eviction)
{
    mapping_device *dev = test_device();
    mapping_mirror *m = test_synced_mirror(dev, 8 * KIB, 0, 30);
    mapping_buffer *buf;
    CHECK_OK(mapping_mirror_acquire_gpu(NULL, m, MAPPING_READ | MAPPING_WRITE, &buf));
    CHECK_REFUSED(mapping_mirror_evict(m), MAPPING_ERR_BUSY);
    CHECK(mapping_mirror_is_resident(m));
    CHECK_OK(mapping_mirror_release_gpu(NULL, m));
    CHECK_OK(mapping_mirror_evict(m));
    CHECK(!mapping_mirror_is_resident(m));
    CHECK_REFUSED(mapping_mirror_evict(NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK(mapping_mirror_is_resident(NULL) == 0);
    mapping_mirror_destroy(m);
}

/* Plain buffers are never evicted: alone over the budget, the allocation
 * fails naming the budget and what holds it. */
TEST(plain_buffers_are_never_evicted_and_an_allocation_over_them_fails_clearly)
{
    mapping_device *dev = test_device();
    uint64_t base = resident_of(dev);
    CHECK_OK(mapping_device_set_memory_budget(dev, base + 1 * MB));
    mapping_buffer *a, *b;
    CHECK_OK(mapping_allocate_gpu(dev, 768 * KIB, &a));
    CHECK_REFUSED(mapping_allocate_gpu(dev, 512 * KIB, &b), MAPPING_ERR_OUT_OF_DEVICE_MEMORY);
    const char *msg = mapping_last_error_message();
    CHECK(strstr(msg, "memory budget") && strstr(msg, "mapping_allocate_gpu") && strstr(msg, "786432"));
    CHECK_REFUSED(mapping_allocate_gpu(dev, 2 * MB, &b), MAPPING_ERR_OUT_OF_DEVICE_MEMORY);
    CHECK(strstr(mapping_last_error_message(), "whole memory budget") != NULL);
    CHECK(resident_of(dev) == base + 768 * KIB);
    mapping_free_gpu(a);
    CHECK_OK(mapping_device_set_memory_budget(dev, 0));
}

/* A mirror larger than the budget: creating it fails, nothing is lost;
 * lowering the budget under an evicted mirror makes its materialization
 * fail with the CPU side intact. */
TEST(budget_smaller_than_one_mirror_fails_clearly_with_nothing_lost)
{
    mapping_device *dev = test_device();
    uint64_t base = resident_of(dev);
    CHECK_OK(mapping_device_set_memory_budget(dev, base + 64 * KIB));
    mapping_mirror *m = NULL;
    CHECK_REFUSED(mapping_mirror_create(dev, 128 * KIB, 0, &m), MAPPING_ERR_OUT_OF_DEVICE_MEMORY);
    CHECK(m == NULL && resident_of(dev) == base);
    CHECK_OK(mapping_device_set_memory_budget(dev, 0));
    m = test_synced_mirror(dev, 128 * KIB, 0, 40);
    unsigned char *cpu = mapping_mirror_cpu(m), *copy = malloc(128 * KIB);
    CHECK(copy != NULL);
    /* Made without a budget: it takes part from its first call after one is set. */
    CHECK_OK(mapping_device_set_memory_budget(dev, 1 * MB));
    CHECK_OK(mapping_fill_gpu(NULL, mapping_mirror_gpu(m), mapping_mirror_gpu_offset(m) + 1000, 50, 0x77));
    CHECK_OK(mapping_mirror_mark_gpu_modified(m, 1000, 50));
    CHECK_OK(mapping_device_set_memory_budget(dev, base + 64 * KIB)); /* evicts it now */
    CHECK(!mapping_mirror_is_resident(m));
    memcpy(copy, cpu, 128 * KIB);
    for (int i = 0; i < 50; i++)
        CHECK(cpu[1000 + i] == 0x77);
    CHECK_REFUSED(mapping_mirror_sync_to_gpu(NULL, m), MAPPING_ERR_OUT_OF_DEVICE_MEMORY);
    mapping_buffer *buf;
    CHECK_REFUSED(mapping_mirror_acquire_gpu(NULL, m, MAPPING_READ, &buf), MAPPING_ERR_OUT_OF_DEVICE_MEMORY);
    CHECK(!mapping_mirror_is_resident(m) && mapping_mirror_stale_bytes(m, MAPPING_CPU) == 0);
    CHECK_BYTES(cpu, copy, 128 * KIB);
    CHECK_OK(mapping_device_set_memory_budget(dev, 0));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    test_check_mirror_sides_equal(m);
    free(copy);
    mapping_mirror_destroy(m);
}

/* An eviction is ordered after the work queued on the mirror. */
TEST(eviction_waits_for_work_queued_on_the_mirror)
{
    mapping_device *dev = test_device();
    enum { N = 64 * KIB };
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));
    mapping_mirror *m = test_synced_mirror(dev, N, 0, 50);
    test_gate gate = TEST_GATE_INIT;
    mapping_buffer *buf;
    CHECK_OK(mapping_mirror_acquire_gpu(s, m, MAPPING_READ | MAPPING_WRITE, &buf));
    CHECK_OK(mapping_launch_host(s, test_gate_wait, &gate));
    CHECK_OK(mapping_fill_gpu(s, buf, mapping_mirror_gpu_offset(m), N, 0x3C));
    CHECK_OK(mapping_mirror_release_gpu(s, m));
    /* Queued work: the budget does not take it... */
    uint64_t base = resident_of(dev);
    CHECK_OK(mapping_device_set_memory_budget(dev, base - N / 2));
    CHECK(mapping_mirror_is_resident(m));
    /* ...an explicit eviction waits for it, and writes the fill back. */
    test_gate_open(&gate);
    CHECK_OK(mapping_mirror_evict(m));
    const unsigned char *cpu = mapping_mirror_cpu(m);
    for (size_t i = 0; i < N; i++)
        CHECK(cpu[i] == 0x3C);
    CHECK_OK(mapping_device_set_memory_budget(dev, 0));
    mapping_mirror_destroy(m);
    mapping_stream_destroy(s);
}

/* Unified and adopted mirrors are never evicted (one allocation serves both
 * sides; the device memory is the caller's). */
TEST(unified_and_adopted_mirrors_are_never_evicted)
{
    mapping_device *dev = test_device();
    mapping_mirror *u;
    CHECK_OK(mapping_mirror_create(dev, 8 * KIB, MAPPING_MIRROR_UNIFIED, &u));
    if (mapping_mirror_is_unified(u)) {
        CHECK_REFUSED(mapping_mirror_evict(u), MAPPING_ERR_UNSUPPORTED);
        CHECK_REFUSED(mapping_mirror_set_residency(u, MAPPING_RESIDENCY_EVICT_FIRST), MAPPING_ERR_UNSUPPORTED);
        CHECK(mapping_mirror_is_resident(u));
    }
    mapping_mirror_destroy(u);
    unsigned char host[4096] = {0};
    mapping_buffer *buf;
    mapping_mirror *a;
    CHECK_OK(mapping_allocate_gpu(dev, sizeof host, &buf));
    CHECK_OK(mapping_mirror_adopt(dev, host, buf, 0, sizeof host, 0, &a));
    CHECK_REFUSED(mapping_mirror_evict(a), MAPPING_ERR_UNSUPPORTED);
    CHECK(mapping_mirror_is_resident(a));
    mapping_mirror_destroy(a);
    mapping_free_gpu(buf);
}

/* Tracked mirrors go on tracking on the CPU side while evicted; a diff
 * mirror's shadow goes with its device side. */
TEST(evicted_tracked_and_diff_mirrors_keep_their_contract)
{
    mapping_device *dev = test_device();
    enum { N = 64 * KIB };
    unsigned flags = MAPPING_MIRROR_DEVICE_DIFF;
    if (mapping_write_tracking(NULL) != MAPPING_TRACK_NONE)
        flags |= MAPPING_MIRROR_TRACK_WRITES;
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_create(dev, N, flags, &m));
    unsigned char *cpu = mapping_mirror_cpu(m);
    memset(cpu, 1, N);
    if (!(flags & MAPPING_MIRROR_TRACK_WRITES))
        CHECK_OK(mapping_mirror_mark_cpu_modified(m, 0, N));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    uint64_t with_shadow = resident_of(dev);
    mapping_buffer *buf;
    CHECK_OK(mapping_mirror_acquire_gpu(NULL, m, MAPPING_READ | MAPPING_WRITE, &buf));
    CHECK_OK(mapping_fill_gpu(NULL, buf, mapping_mirror_gpu_offset(m) + 8192, 10, 9));
    CHECK_OK(mapping_mirror_release_gpu(NULL, m));
    CHECK_OK(mapping_mirror_evict(m));
    CHECK(resident_of(dev) < with_shadow - N + 1); /* the device side and any shadow went */
    CHECK(cpu[8192] == 9 && cpu[8191] == 1);
    /* A CPU write while evicted (tracked: no mark) reaches the device. */
    cpu[20000] = 42;
    if (!(flags & MAPPING_MIRROR_TRACK_WRITES))
        CHECK_OK(mapping_mirror_mark_cpu_modified(m, 20000, 1));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    test_check_mirror_sides_equal(m);
    mapping_mirror_destroy(m);
}

/* Threads: families used on other threads are never evicted mid-call; an
 * allocation on one thread evicts idle families of another. The data of
 * every family stays right. */
typedef struct budget_worker {
    mapping_device    *dev;
    pthread_barrier_t *all_made;
    int                id, rounds;
    int                failed;
    char               why[200]; /* the failing call, its status and message */
} budget_worker;

static void *budget_thread(void *arg)
{
    budget_worker *w = arg;
    enum { N = 96 * KIB };
    mapping_mirror *m[2];
    for (int i = 0; i < 2; i++)
        if (mapping_mirror_create(w->dev, N, 0, &m[i]) != MAPPING_OK)
            w->failed = 1;
    pthread_barrier_wait(w->all_made); /* then all 8 want room at once */
    if (w->failed) {
        for (int i = 0; i < 2; i++)
            mapping_mirror_destroy(m[i]);
        return NULL;
    }
    for (int r = 0; r < w->rounds && !w->failed; r++) {
        mapping_mirror *x = m[r % 2];
        unsigned char *cpu = mapping_mirror_cpu(x);
        mapping_buffer *buf;
        unsigned char v = (unsigned char)(w->id * 31 + r);
        const char *call = "acquire_gpu";
        mapping_status st = mapping_mirror_acquire_gpu(NULL, x, MAPPING_READ | MAPPING_WRITE, &buf);
        if (st == MAPPING_OK) {
            call = "fill_gpu";
            st = mapping_fill_gpu(NULL, buf, mapping_mirror_gpu_offset(x) + (size_t)r * 97 % (N - 64), 64, v);
            mapping_status rel = mapping_mirror_release_gpu(NULL, x);
            if (st == MAPPING_OK && rel != MAPPING_OK)
                call = "release_gpu", st = rel;
        }
        if (st == MAPPING_OK)
            call = "sync_to_cpu", st = mapping_mirror_sync_to_cpu(NULL, x);
        if (st != MAPPING_OK) {
            snprintf(w->why, sizeof w->why, "round %d: %s: %s: %s", r, call, mapping_status_string(st),
                     mapping_last_error_message());
            w->failed = 2;
            break;
        }
        for (int k = 0; k < 64; k++)
            if (cpu[(size_t)r * 97 % (N - 64) + (size_t)k] != v)
                w->failed = 3;
    }
    for (int i = 0; i < 2; i++)
        mapping_mirror_destroy(m[i]);
    return NULL;
}

TEST(budget_evictions_across_threads_keep_every_familys_data)
{
    mapping_device *dev = test_device();
    uint64_t base = resident_of(dev);
    CHECK_OK(mapping_device_set_memory_budget(dev, base + 5 * 96 * KIB)); /* 4 threads x 2 mirrors: 8 wanted */
    budget_worker w[4];
    pthread_t t[4];
    pthread_barrier_t all_made;
    CHECK(pthread_barrier_init(&all_made, NULL, 4) == 0);
    mapping_stats before = test_stats(dev);
    for (int i = 0; i < 4; i++) {
        w[i] = (budget_worker){dev, &all_made, i, 60, 0, {0}};
        CHECK(pthread_create(&t[i], NULL, budget_thread, &w[i]) == 0);
    }
    for (int i = 0; i < 4; i++) {
        CHECK(pthread_join(t[i], NULL) == 0);
        if (w[i].failed)
            test_fail(__FILE__, __LINE__, "thread %d failed (%d): %s", i, w[i].failed, w[i].why);
    }
    pthread_barrier_destroy(&all_made);
    CHECK(test_stats(dev).evictions > before.evictions);
    CHECK(test_stats(dev).peak_resident_bytes <= base + 5 * 96 * KIB);
    CHECK(resident_of(dev) == base);
    CHECK_OK(mapping_device_set_memory_budget(dev, 0));
}

/* An allocation that needs a family evicted which a call on another thread
 * holds waits for that call to end, then evicts it (it failed at once
 * before: a spurious out of memory under contention). Thread B's sync of
 * the family holds it inside the log callback until the main thread has
 * begun its allocation, and a little after. */
typedef struct held_sync {
    pthread_t        thread;
    _Atomic int      in_call, allocating;
    mapping_mirror  *m;
    mapping_status   status;
} held_sync;

static void hold_in_the_sync(int level, const char *message, void *user)
{
    (void)level, (void)message;
    held_sync *h = user;
    if (!pthread_equal(pthread_self(), h->thread) || atomic_load(&h->in_call))
        return;
    atomic_store(&h->in_call, 1);
    while (!atomic_load(&h->allocating))
        sched_yield();
    usleep(2000); /* the allocation is under way meanwhile */
}

static void *sync_held(void *arg)
{
    held_sync *h = arg;
    h->status = mapping_mirror_sync_to_gpu(NULL, h->m);
    atomic_store(&h->in_call, 1); /* no log line came: do not keep the main thread waiting */
    return NULL;
}

TEST(an_allocation_waits_for_a_family_in_a_call_on_another_thread)
{
    mapping_device *dev = test_device();
    enum { N = 256 * KIB };
    uint64_t base = resident_of(dev);
    CHECK_OK(mapping_device_set_memory_budget(dev, base + N));
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_create(dev, N, 0, &m));
    memset(mapping_mirror_cpu(m), 5, N);
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 0, N));
    held_sync h = {.m = m};
    mapping_set_log(hold_in_the_sync, &h);
    CHECK(pthread_create(&h.thread, NULL, sync_held, &h) == 0);
    while (!atomic_load(&h.in_call))
        sched_yield();
    atomic_store(&h.allocating, 1);
    mapping_buffer *buf = NULL;
    mapping_status got = mapping_allocate_gpu(dev, N, &buf); /* needs m's device side */
    CHECK(pthread_join(h.thread, NULL) == 0);
    mapping_set_log(NULL, NULL);
    CHECK_OK(h.status);
    if (got != MAPPING_OK)
        test_fail(__FILE__, __LINE__, "the allocation did not wait for the sync on the other thread: %s",
                  mapping_last_error_message());
    CHECK(!mapping_mirror_is_resident(m)); /* evicted once the sync was over */
    mapping_free_gpu(buf);
    unsigned char *back = malloc(N);
    CHECK(back != NULL);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m)); /* made again: nothing stale to upload */
    read_device(m, back);
    for (size_t i = 0; i < N; i++)
        if (back[i] != 5)
            test_fail(__FILE__, __LINE__, "device byte %zu is %d after the eviction and back", i, back[i]);
    free(back);
    mapping_mirror_destroy(m);
    CHECK_OK(mapping_device_set_memory_budget(dev, 0));
}

/* Multimirrors, per device: replica j evicted writes back what only it
 * holds, refuses marks, comes back at the next sync to it; the budget
 * evicts replicas too. */
TEST(multimirror_replicas_are_evicted_per_device)
{
    mapping_device *d0 = test_device(), *d1 = test_device2();
    enum { N = 64 * KIB };
    uint64_t base1 = resident_of(d1);
    CHECK_OK(mapping_device_set_memory_budget(d1, base1 + N + N / 2));
    mapping_device *devs[2] = {d0, d1};
    mapping_multimirror *m;
    CHECK_OK(mapping_multimirror_create(devs, 2, N, &m));
    unsigned char *cpu = mapping_multimirror_cpu(m);
    CHECK_OK(mapping_multimirror_sync_to_gpu(NULL, m, 1));
    /* Replica 1 writes 100 bytes; replica 0 has them not; the CPU neither. */
    CHECK_OK(mapping_fill_gpu(NULL, mapping_multimirror_gpu(m, 1), 1000, 100, 0x66));
    CHECK_OK(mapping_multimirror_mark_gpu_modified(m, 1, 1000, 100));
    mapping_stats before = test_stats(d1);
    CHECK_OK(mapping_multimirror_evict(m, 1));
    mapping_stats after = test_stats(d1);
    CHECK(mapping_multimirror_is_resident(m, 1) == 0 && mapping_multimirror_is_resident(m, 0) == 1);
    CHECK(mapping_multimirror_gpu(m, 1) == NULL);
    CHECK(after.evictions == before.evictions + 1 && after.evict_writeback_bytes - before.evict_writeback_bytes == 100);
    for (int i = 0; i < 100; i++)
        CHECK(cpu[1000 + i] == 0x66);
    CHECK(mapping_multimirror_stale_bytes(m, -1) == 0 && mapping_multimirror_stale_bytes(m, 1) == N);
    CHECK_REFUSED(mapping_multimirror_mark_gpu_modified(m, 1, 0, 1), MAPPING_ERR_INVALID_ARGUMENT);
    /* Replica 0 marking those bytes still conflicts: replica 1's change is the CPU's now, unseen by replica 0. */
    CHECK_REFUSED(mapping_multimirror_mark_gpu_modified(m, 0, 1000, 100), MAPPING_ERR_CONFLICT);
    CHECK_OK(mapping_multimirror_sync_to_gpu(NULL, m, 1)); /* made again */
    CHECK(mapping_multimirror_is_resident(m, 1) == 1 && mapping_multimirror_stale_bytes(m, 1) == 0);
    unsigned char back[N];
    CHECK_OK(mapping_sync_to_cpu_range(NULL, mapping_multimirror_gpu(m, 1), 0, back, N));
    CHECK_BYTES(back, cpu, N);
    /* The budget: a plain buffer on device 1 takes the replica's room. */
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(d1, N, &buf));
    CHECK(mapping_multimirror_is_resident(m, 1) == 0);
    mapping_free_gpu(buf);
    CHECK_REFUSED(mapping_multimirror_evict(m, 2), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_REFUSED(mapping_multimirror_evict(NULL, 0), MAPPING_ERR_NULL_ARGUMENT);
    CHECK(mapping_multimirror_is_resident(m, 5) == 0 && mapping_multimirror_is_resident(NULL, 0) == 0);
    mapping_multimirror_destroy(m);
    CHECK_OK(mapping_device_set_memory_budget(d1, 0));
}

/* A multimirror made before its devices had a budget joins it at its next
 * call (as a mirror does): the budget may then evict its replica, and the
 * data stays right. */
TEST(multimirror_made_before_a_budget_joins_it_at_its_next_call)
{
    mapping_device *d0 = test_device(), *d1 = test_device2();
    enum { N = 64 * KIB };
    mapping_device *devs[2] = {d0, d1};
    mapping_multimirror *m;
    CHECK_OK(mapping_device_set_memory_budget(d1, 0));
    CHECK_OK(mapping_multimirror_create(devs, 2, N, &m));
    unsigned char *cpu = mapping_multimirror_cpu(m);
    memset(cpu, 0x21, N);
    CHECK_OK(mapping_multimirror_mark_cpu_modified(m, 0, N));
    CHECK_OK(mapping_multimirror_sync_to_gpu(NULL, m, 1));
    CHECK_OK(mapping_fill_gpu(NULL, mapping_multimirror_gpu(m, 1), 4096, 64, 0x42));
    CHECK_OK(mapping_multimirror_mark_gpu_modified(m, 1, 4096, 64));
    uint64_t base1 = resident_of(d1); /* the replica counts already */
    CHECK_OK(mapping_device_set_memory_budget(d1, base1)); /* full */
    CHECK(mapping_multimirror_is_resident(m, 1) == 1); /* a call: it joins, and stays until room is needed */
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(d1, N / 2, &buf)); /* only the replica can make room */
    CHECK(mapping_multimirror_is_resident(m, 1) == 0);
    for (int i = 0; i < 64; i++)
        CHECK(cpu[4096 + i] == 0x42); /* written back */
    mapping_free_gpu(buf);
    CHECK_OK(mapping_multimirror_sync_to_gpu(NULL, m, 1)); /* made again */
    unsigned char back[N];
    CHECK_OK(mapping_sync_to_cpu_range(NULL, mapping_multimirror_gpu(m, 1), 0, back, N));
    CHECK_BYTES(back, cpu, N);
    mapping_multimirror_destroy(m);
    CHECK_OK(mapping_device_set_memory_budget(d1, 0));
}

/* Each eviction is a trace event, with the bytes written back. */
TEST(eviction_is_a_trace_event)
{
    mapping_device *dev = test_device();
    char path[] = "/tmp/mapping-evict-trace-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    mapping_mirror *m = test_synced_mirror(dev, 8 * KIB, 0, 60);
    CHECK_OK(mapping_mirror_mark_gpu_modified(m, 0, 100));
    CHECK_OK(mapping_trace_start(path));
    CHECK_OK(mapping_mirror_evict(m));
    CHECK_OK(mapping_trace_stop());
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    unlink(path);
    text[n] = 0;
    CHECK(strstr(text, "\"mirror eviction\"") != NULL);
    CHECK(strstr(text, "\"bytes_written_back\":100") != NULL);
    mapping_mirror_destroy(m);
}
