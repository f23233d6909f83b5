/*
 * Copies through mapped device memory (batch_mapped.c) when the back end's
 * unmap fails twice, so the library's one retry does not save it. The
 * copies made while the span was mapped are in the buffer's memory: they
 * count as done, and the flush reports the unmap's failure. What was not
 * reached stays queued (run by run) or stale (a mirror's sync), and lands
 * once unmap works again.
 *
 * The failing unmap is a copy of the device's back-end table whose unmap
 * ends the mapping for real on the first try of each pair and then reports
 * a failure for both tries: no mapping is left open (PoCL would keep the
 * buffer's memory past its release, which LeakSanitizer reports), and the
 * library sees exactly two failures in a row.
 */
#include <stdbool.h>
#include "testing/test_hooks.h"
#include "harness.h"

/* 20 copies: a mirror's sync of 16 ranges or more goes through its batch;
 * gaps of 160 bytes: no two ranges merge into one copy. */
enum { COPIES = 20, LEN = 40, STRIDE = 200, BYTES = COPIES * STRIDE };

static const mapping_backend *real_backend;
static int unmap_calls;

static mapping_status unmap_fails_twice(void *dev, void *mem, void *host)
{
    if (unmap_calls++ % 2 == 0)
        real_backend->unmap(dev, mem, host); /* the first try ends the mapping; both report failure */
    return mapping__fail(MAPPING_ERR_DRIVER, "unmap: failure injected by a test");
}

typedef struct unmap_scene {
    mapping_device *dev;
    mapping_backend failing;
    bool            map_copies_was;
} unmap_scene;

static void scene_begin(unmap_scene *s)
{
    s->dev = test_device();
    if (!s->dev->map_copies)
        test_skip("back end %s does not copy through mapped memory", test_backend());
    real_backend = s->dev->be;
    s->failing = *real_backend;
    s->failing.unmap = unmap_fails_twice;
    unmap_calls = 0;
}

static void unmap_fails(unmap_scene *s, bool fails)
{
    s->dev->be = fails ? &s->failing : real_backend;
}

static void fill_pattern(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(seed * 31u + i * 7u + 1u);
}

/* The copies' places in buf (from byte base on) hold what the host sent
 * (want), or are untouched (0). */
static bool landed(mapping_buffer *buf, size_t base, const unsigned char *want, bool expect)
{
    unsigned char got[BYTES];
    CHECK_OK(mapping_sync_to_cpu_range(NULL, buf, base, got, BYTES));
    for (size_t i = 0; i < COPIES; i++)
        for (size_t k = 0; k < LEN; k++)
            if (got[i * STRIDE + k] != (expect ? want[i * STRIDE + k] : 0))
                return false;
    return true;
}

/* In order, two buffers: run by run. The first run's copies are done when
 * its unmap fails; the second run is not started and stays queued. */
TEST(a_mapped_run_whose_unmap_fails_twice_counts_its_copies_done_and_keeps_the_next_run_queued)
{
    unmap_scene s;
    scene_begin(&s);
    mapping_buffer *buf[2];
    unsigned char src[2][BYTES];
    for (int j = 0; j < 2; j++) {
        CHECK_OK(mapping_allocate_gpu(s.dev, BYTES, &buf[j]));
        CHECK_OK(mapping_fill_gpu(NULL, buf[j], 0, BYTES, 0));
        fill_pattern(src[j], BYTES, (unsigned)j + 1);
    }
    if ((uintptr_t)buf[1] < (uintptr_t)buf[0]) { /* plan order: the lower handle first */
        mapping_buffer *t = buf[0];
        buf[0] = buf[1];
        buf[1] = t;
    }
    mapping_batch *b;
    CHECK_OK(mapping_batch_create(s.dev, &b));
    for (int j = 0; j < 2; j++)
        for (size_t i = 0; i < COPIES; i++)
            CHECK_OK(mapping_batch_add_to_gpu(b, src[j] + i * STRIDE, buf[j], i * STRIDE, LEN));
    unmap_fails(&s, true);
    mapping_status st = mapping_batch_flush(NULL, b);
    unmap_fails(&s, false);
    CHECK(st == MAPPING_ERR_DRIVER);
    CHECK(unmap_calls == 2); /* the first try and the retry, of the first run only */
    CHECK(strstr(mapping_last_error_message(), "unmap") != NULL);
    CHECK(mapping_batch_count(b) == COPIES); /* the second run's copies */
    CHECK(landed(buf[0], 0, src[0], true));
    CHECK(landed(buf[1], 0, src[1], false));
    CHECK_OK(mapping_batch_flush(NULL, b));
    CHECK(mapping_batch_count(b) == 0);
    CHECK(landed(buf[1], 0, src[1], true));
    mapping_batch_destroy(b);
    mapping_free_gpu(buf[0]);
    mapping_free_gpu(buf[1]);
}

/* Out of order: every span is mapped first, every copy made, then each
 * span unmapped. All copies are done; the flush reports the failure. */
TEST(a_mapped_flush_in_add_order_whose_unmaps_fail_twice_reports_it_with_every_copy_done)
{
    unmap_scene s;
    scene_begin(&s);
    mapping_buffer *buf;
    unsigned char src[BYTES], back[BYTES], want_back[BYTES];
    CHECK_OK(mapping_allocate_gpu(s.dev, BYTES, &buf));
    fill_pattern(want_back, BYTES, 9);
    CHECK_OK(mapping_sync_to_gpu(want_back, buf));
    fill_pattern(src, BYTES, 3);
    memset(back, 0, sizeof back);
    mapping_batch *b;
    CHECK_OK(mapping_batch_create(s.dev, &b));
    for (size_t i = COPIES / 2; i-- > 0;) { /* backwards: not in order, so the add-order flush */
        CHECK_OK(mapping_batch_add_to_cpu(b, buf, (COPIES / 2 + i) * STRIDE, back + (COPIES / 2 + i) * STRIDE, LEN));
        CHECK_OK(mapping_batch_add_to_gpu(b, src + i * STRIDE, buf, i * STRIDE, LEN));
    }
    unmap_fails(&s, true);
    mapping_status st = mapping_batch_flush(NULL, b);
    unmap_fails(&s, false);
    CHECK(st == MAPPING_ERR_DRIVER);
    CHECK(unmap_calls == 2); /* one span (one buffer), tried twice */
    CHECK(mapping_batch_count(b) == 0); /* all done: they were made while mapped */
    unsigned char got[BYTES];
    CHECK_OK(mapping_sync_to_cpu_range(NULL, buf, 0, got, BYTES));
    for (size_t i = 0; i < COPIES / 2; i++) {
        CHECK(memcmp(got + i * STRIDE, src + i * STRIDE, LEN) == 0);
        size_t d = (COPIES / 2 + i) * STRIDE;
        CHECK(memcmp(back + d, want_back + d, LEN) == 0);
    }
    mapping_batch_destroy(b);
    mapping_free_gpu(buf);
}

/* A mirror's sync of a few marked ranges: it fails, nothing becomes valid
 * (the ranges stay stale), and the next sync sends them. */
TEST(a_mirror_sync_whose_unmap_fails_twice_fails_and_keeps_the_ranges_stale)
{
    unmap_scene s;
    scene_begin(&s);
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_create(s.dev, BYTES, 0, &m));
    unsigned char *cpu = mapping_mirror_cpu(m);
    memset(cpu, 0, BYTES);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 0);
    unsigned char want[BYTES];
    fill_pattern(want, BYTES, 5);
    for (size_t i = 0; i < COPIES; i++) {
        memcpy(cpu + i * STRIDE, want + i * STRIDE, LEN);
        CHECK_OK(mapping_mirror_mark_cpu_modified(m, i * STRIDE, LEN));
    }
    unmap_fails(&s, true);
    mapping_status st = mapping_mirror_sync_to_gpu(NULL, m);
    unmap_fails(&s, false);
    CHECK(st == MAPPING_ERR_DRIVER);
    CHECK(unmap_calls == 2);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == COPIES * LEN);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 0);
    CHECK(landed(mapping_mirror_gpu(m), mapping_mirror_gpu_offset(m), want, true));
    mapping_mirror_destroy(m);
}
