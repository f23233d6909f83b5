/*
 * Hardening (issue 10), with injected faults: a log callback that re-enters
 * the batch being flushed is refused (MAPPING_ERR_BUSY) and the flush's own
 * failure report stands; a mirror sync that fails part-way writes nothing
 * but source data into the target's stale bytes, leaves them all stale, and
 * the next sync completes them (the header's promise).
 */
#include <stdio.h>
#include "testing/test_hooks.h"
#include "harness.h"

typedef struct batch_reentry {
    mapping_batch *b;
    mapping_buffer *buf;
    unsigned char *host;
    mapping_status flush, add, destroy;
    int calls;
} batch_reentry;

static void reentering_log(int level, const char *message, void *user)
{
    (void)level, (void)message;
    batch_reentry *r = user;
    if (r->calls++)
        return;
    r->flush = mapping_batch_flush(NULL, r->b);
    r->add = mapping_batch_add_to_gpu(r->b, r->host, r->buf, 0, 64);
    mapping_clear_last_error();
    mapping_batch_destroy(r->b);
    r->destroy = mapping_last_error();
}

TEST(a_log_callback_cannot_reenter_the_batch_being_flushed)
{
    mapping_device *dev = test_device();
    enum { COPIES = 32, SIZE = 64 };
    static unsigned char host[COPIES * SIZE];
    test_pattern(host, sizeof host, 9);
    batch_reentry r = {.host = host};
    CHECK_OK(mapping_allocate_gpu(dev, COPIES * SIZE * 2, &r.buf));
    CHECK_OK(mapping_batch_create(dev, &r.b));
    for (int i = 0; i < COPIES; i++)
        CHECK_OK(mapping_batch_add_to_gpu(r.b, host + i * SIZE, r.buf, (size_t)i * SIZE * 2, SIZE));
    mapping_set_log(reentering_log, &r);
    mapping__inject_fault(dev, 0); /* the flush's first back-end operation fails */
    mapping_status st = mapping_batch_flush(NULL, r.b);
    mapping__inject_fault(dev, -1);
    mapping_set_log(NULL, NULL);
    CHECK(st != MAPPING_OK);
    CHECK(r.calls >= 1);
    CHECK_STATUS(r.flush, MAPPING_ERR_BUSY);
    CHECK_STATUS(r.add, MAPPING_ERR_BUSY);
    CHECK_STATUS(r.destroy, MAPPING_ERR_BUSY);
    CHECK(strstr(mapping_last_error_message(), "mapping_batch_flush: copy") != NULL);
    /* The batch survived with every copy queued, and a retry does them all. */
    CHECK(mapping_batch_count(r.b) == COPIES);
    CHECK_OK(mapping_batch_flush(NULL, r.b));
    static unsigned char back[COPIES * SIZE * 2];
    CHECK_OK(mapping_sync_to_cpu(r.buf, back));
    for (int i = 0; i < COPIES; i++)
        CHECK_BYTES(back + (size_t)i * SIZE * 2, host + i * SIZE, SIZE);
    mapping_batch_destroy(r.b);
    mapping_free_gpu(r.buf);
}

/* Syncs a mirror whose GPU side has many stale ranges with the n-th back-end
 * operation failing, for n = 0, 1, ... until a sync succeeds. */
TEST(a_failed_mirror_sync_writes_only_source_data_into_stale_bytes)
{
    mapping_device *dev = test_device();
    enum { SIZE = 64 << 10, RANGES = 40, STEP = 1024, LEN = 100, OLD = 0x5A };
    mapping_link link = {2e-6, 10e9}; /* >= 1 us per transfer: the batched path */
    CHECK_OK(mapping_device_set_link(dev, &link));
    unsigned char *expect = malloc(SIZE), *gpu = malloc(SIZE);
    CHECK(expect && gpu);
    int faults = 0;
    for (int n = 0; n < 64; n++) {
        mapping_mirror *m = test_synced_mirror(dev, SIZE, 0, 4);
        unsigned char *cpu = mapping_mirror_cpu(m);
        /* The device side holds OLD everywhere, valid; then the CPU writes ranges. */
        CHECK_OK(mapping_fill_gpu(NULL, mapping_mirror_gpu(m), 0, SIZE, OLD));
        memset(cpu, OLD, SIZE);
        for (int i = 0; i < RANGES; i++) {
            test_pattern(cpu + i * STEP, LEN, 100 + i);
            CHECK_OK(mapping_mirror_mark_cpu_modified(m, (size_t)i * STEP, LEN));
        }
        memcpy(expect, cpu, SIZE);
        size_t stale = mapping_mirror_stale_bytes(m, MAPPING_GPU);
        CHECK(stale == RANGES * LEN);
        mapping__inject_fault(dev, n);
        mapping_status st = mapping_mirror_sync_to_gpu(NULL, m);
        mapping__inject_fault(dev, -1);
        CHECK_OK(mapping_sync_to_cpu(mapping_mirror_gpu(m), gpu));
        if (st == MAPPING_OK) {
            CHECK_BYTES(gpu, expect, SIZE);
            mapping_mirror_destroy(m);
            break;
        }
        faults++;
        /* Every stale byte is still stale; each GPU byte is its old value or
         * the source's, and bytes outside the ranges are untouched. */
        CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == stale);
        CHECK_BYTES(cpu, expect, SIZE); /* the source */
        for (size_t i = 0; i < SIZE; i++)
            if (gpu[i] != OLD && gpu[i] != expect[i])
                test_fail(__FILE__, __LINE__, "fault %d: GPU byte %zu is 0x%02x, neither old nor source", n, i, gpu[i]);
        for (size_t i = 0; i < SIZE; i++)
            if (i % STEP >= LEN)
                CHECK(gpu[i] == OLD);
        CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m)); /* the retry completes it */
        CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 0);
        CHECK_OK(mapping_sync_to_cpu(mapping_mirror_gpu(m), gpu));
        CHECK_BYTES(gpu, expect, SIZE);
        mapping_mirror_destroy(m);
    }
    CHECK(faults > 0);
    printf("%d failed syncs checked\n", faults);
    free(expect);
    free(gpu);
}

typedef struct mirror_reentry {
    mapping_mirror *m;
    mapping_status sync, mark, destroy;
    int calls;
} mirror_reentry;

static void mirror_reentering_log(int level, const char *message, void *user)
{
    (void)level, (void)message;
    mirror_reentry *r = user;
    if (r->calls++)
        return;
    r->sync = mapping_mirror_sync_to_gpu(NULL, r->m);
    r->mark = mapping_mirror_mark_cpu_modified(r->m, 0, 8);
    mapping_clear_last_error();
    mapping_mirror_destroy(r->m);
    r->destroy = mapping_last_error();
}

TEST(a_log_callback_cannot_reenter_the_mirror_being_synced)
{
    mapping_device *dev = test_device();
    enum { SIZE = 4096 };
    mirror_reentry r = {0};
    CHECK_OK(mapping_mirror_create(dev, SIZE, 0, &r.m));
    test_pattern(mapping_mirror_cpu(r.m), SIZE, 12);
    mapping_set_log(mirror_reentering_log, &r);
    mapping__inject_fault(dev, 0);
    mapping_status st = mapping_mirror_sync_to_gpu(NULL, r.m);
    mapping__inject_fault(dev, -1);
    mapping_set_log(NULL, NULL);
    CHECK(st != MAPPING_OK && r.calls >= 1);
    CHECK_STATUS(r.sync, MAPPING_ERR_BUSY);
    CHECK_STATUS(r.mark, MAPPING_ERR_BUSY);
    CHECK_STATUS(r.destroy, MAPPING_ERR_BUSY);
    CHECK(mapping_mirror_stale_bytes(r.m, MAPPING_GPU) == SIZE); /* the failed sync changed nothing */
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, r.m));
    test_check_mirror_sides_equal(r.m);
    mapping_mirror_destroy(r.m);
}

/* A call that returns MAPPING_OK records no error, even when a fault inside
 * it was recovered from (a unified allocation falling back to an ordinary
 * mirror, an event that could not be recorded or queried): the n-th back-end
 * call (n < 30), or the (n - 30)-th allocation, of a scripted piece of work
 * fails, and every call of the script that still succeeds must leave
 * mapping_last_error() clear. */
#define EXPECT_CLEAN_IF_OK(call)                                                                                  \
    do {                                                                                                          \
        mapping_clear_last_error();                                                                               \
        mapping_status st_ = (call);                                                                              \
        if (st_ == MAPPING_OK && mapping_last_error() != MAPPING_OK)                                              \
            test_fail(__FILE__, __LINE__, "fault %d: %s returned OK but recorded %s: %s", n, #call,               \
                      mapping_status_name(mapping_last_error()), mapping_last_error_message());                   \
        ok &= st_ == MAPPING_OK;                                                                                  \
    } while (0)

TEST(a_call_that_succeeds_after_a_recovered_fault_records_no_error)
{
    mapping_device *dev = test_device();
    enum { SIZE = 1 << 16 };
    static unsigned char host[SIZE];
    int faults = 0;
    for (int n = 0; n < 60; n++) {
        mapping_stream *s = NULL;
        mapping_mirror *m = NULL;
        mapping_batch *b = NULL;
        mapping_buffer *buf = NULL;
        CHECK_OK(mapping_stream_create(dev, &s));
        CHECK_OK(mapping_batch_create(dev, &b));
        CHECK_OK(mapping_allocate_gpu(dev, SIZE, &buf));
        bool ok = true;
        bool alloc = n >= 30; /* runs 30..59: the (n - 30)-th allocation fails instead */
        if (alloc)
            mapping_os_inject_alloc_fault(n - 30);
        else
            mapping__inject_fault_any(dev, n);
        EXPECT_CLEAN_IF_OK(mapping_mirror_create(dev, SIZE, MAPPING_MIRROR_UNIFIED, &m));
        if (ok) {
            EXPECT_CLEAN_IF_OK(mapping_mirror_mark_cpu_modified(m, 0, 64));
            EXPECT_CLEAN_IF_OK(mapping_mirror_sync_to_gpu(s, m));
            EXPECT_CLEAN_IF_OK(mapping_mirror_mark_cpu_modified(m, 4096, 64));
            EXPECT_CLEAN_IF_OK(mapping_mirror_sync_to_gpu(s, m));
        }
        for (int i = 0; i < 8; i++)
            EXPECT_CLEAN_IF_OK(mapping_batch_add_to_gpu(b, host + 64 * i, buf, 128 * (size_t)i, 64));
        EXPECT_CLEAN_IF_OK(mapping_batch_flush(s, b));
        EXPECT_CLEAN_IF_OK(mapping_batch_flush(s, b));
        mapping__inject_fault_any(dev, -1);
        mapping_os_inject_alloc_fault(-1);
        (void)mapping_stream_synchronize(s);
        faults++;
        mapping_mirror_destroy(m);
        mapping_batch_destroy(b);
        mapping_free_gpu(buf);
        mapping_stream_destroy(s);
    }
    printf("%d scripted runs, each with one failed back-end call or allocation\n", faults);
}
