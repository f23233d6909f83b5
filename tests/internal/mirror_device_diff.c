/*
 * MAPPING_MIRROR_DEVICE_DIFF: a sync to the CPU reads back only the blocks
 * the device changed. Checked against a model of both sides, with the diff
 * forced on, off and left to the link model, blocking and on a stream, with
 * views and with discards (acquire_gpu with WRITE alone), which are what
 * could leave the device-side shadow wrong.
 */
#include <string.h>
#include "testing/test_hooks.h"
#include "harness.h"

enum { BLOCK = MAPPING_DIFF_BLOCK_BYTES };

static uint64_t rng_state;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static size_t below(size_t n)
{
    return (size_t)(rnd() % n);
}

static uint64_t d2h(mapping_device *dev)
{
    return test_stats(dev).d2h_bytes;
}

TEST(device_diff_reads_back_only_the_changed_blocks)
{
    mapping_device *dev = test_device();
    const size_t n = 256 * BLOCK;
    uint64_t moved[2] = {0, 0};
    for (int forced = 1; forced <= 2; forced++) { /* on, then off */
        mapping__test_device_diff_mode(forced);
        mapping_mirror *m;
        CHECK_OK(mapping_mirror_create(dev, n, MAPPING_MIRROR_DEVICE_DIFF, &m));
        unsigned char *cpu = mapping_mirror_cpu(m), *model = malloc(n);
        for (size_t i = 0; i < n; i++)
            cpu[i] = model[i] = (unsigned char)(i * 7 + 1);
        CHECK_OK(mapping_mirror_mark_cpu_modified(m, 0, n));
        CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
        bool can = mapping__test_device_can_diff(dev);
        CHECK(mapping__test_mirror_diff_known(m) == (forced == 1 && can ? n : 0));
        mapping_buffer *buf;
        CHECK_OK(mapping_mirror_acquire_gpu(NULL, m, MAPPING_READ | MAPPING_WRITE, &buf));
        for (size_t k = 0; k < 20; k++) { /* 20 runs: packed into one transfer, gaps not merged */
            size_t at = (3 + 12 * k) * BLOCK + 17;
            CHECK_OK(mapping_fill_gpu(NULL, buf, mapping_mirror_gpu_offset(m) + at, 100, (unsigned char)(0xa0 + k)));
            memset(model + at, 0xa0 + (int)k, 100);
        }
        CHECK_OK(mapping_mirror_release_gpu(NULL, m));
        uint64_t before = d2h(dev);
        CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m));
        moved[forced - 1] = d2h(dev) - before;
        CHECK_BYTES(cpu, model, n);
        CHECK(mapping_mirror_stale_bytes(m, MAPPING_CPU) == 0);
        test_check_mirror_sides_equal(m);
        if (forced == 1 && can) /* the 20 blocks and the flags */
            CHECK(moved[0] >= 20 * BLOCK && moved[0] <= 20 * BLOCK + n / BLOCK + 4096);
        else
            CHECK(moved[forced - 1] >= n);
        free(model);
        mapping_mirror_destroy(m);
    }
    mapping__test_device_diff_mode(-1);
}

TEST(device_diff_with_no_change_reads_nothing_and_a_second_change_is_seen)
{
    mapping_device *dev = test_device();
    if (!mapping__test_device_can_diff(dev)) {
        printf("SKIP: this back end has no compare kernel (mirrors read back in full)\n");
        return;
    }
    mapping__test_device_diff_mode(1);
    const size_t n = 16 * BLOCK;
    mapping_mirror *m = test_synced_mirror(dev, n, MAPPING_MIRROR_DEVICE_DIFF, 5);
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 0, n)); /* the shadow learns the content on upload */
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    CHECK_OK(mapping_mirror_mark_gpu_modified(m, 0, n)); /* "the device wrote", but nothing changed */
    uint64_t before = d2h(dev);
    CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m));
    CHECK(d2h(dev) - before == n / BLOCK); /* the flags only */
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_CPU) == 0);
    mapping_buffer *buf;
    CHECK_OK(mapping_mirror_acquire_gpu(NULL, m, MAPPING_READ | MAPPING_WRITE, &buf));
    CHECK_OK(mapping_fill_gpu(NULL, buf, 5 * BLOCK + BLOCK - 1, 2, 0xee)); /* straddles blocks 5 and 6 */
    CHECK_OK(mapping_mirror_release_gpu(NULL, m));
    before = d2h(dev);
    CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m));
    CHECK(d2h(dev) - before == 2 * BLOCK + n / BLOCK);
    unsigned char *cpu = mapping_mirror_cpu(m);
    CHECK(cpu[6 * BLOCK - 1] == 0xee && cpu[6 * BLOCK] == 0xee);
    test_check_mirror_sides_equal(m);
    mapping_mirror_destroy(m);
    mapping__test_device_diff_mode(-1);
}

/* One round of the model test: CPU writes (marked) on random views, a sync
 * to the GPU, device writes on a random view (read-write, or a discard after
 * unsynced CPU writes), a sync back; the CPU must then hold the model. */
static void model_round(mapping_device *dev, mapping_mirror *m, mapping_stream *s, unsigned char *cpu_model,
                        unsigned char *dev_model, size_t n)
{
    unsigned char *cpu = mapping_mirror_cpu(m);
    mapping_buffer *buf;
    for (int w = (int)below(4); w-- > 0;) {
        size_t lo = below(n), len = 1 + below(n - lo < 3 * BLOCK ? n - lo : 3 * BLOCK);
        unsigned char v = (unsigned char)rnd();
        memset(cpu + lo, v, len);
        memset(cpu_model + lo, v, len);
        CHECK_OK(mapping_mirror_mark_cpu_modified(m, lo, len));
    }
    bool discard = below(3) == 0;
    if (!discard) {
        CHECK_OK(mapping_mirror_sync_to_gpu(below(2) ? s : NULL, m));
        memcpy(dev_model, cpu_model, n);
    }
    size_t vlo = below(n), vlen = 1 + below(n - vlo);
    mapping_mirror *view;
    CHECK_OK(mapping_mirror_view(m, vlo, vlen, &view));
    CHECK_OK(mapping_mirror_acquire_gpu(s, view, discard ? MAPPING_WRITE : MAPPING_READ | MAPPING_WRITE, &buf));
    if (!discard) /* acquire's READ synced the view: nothing was stale after the sync above */
        memcpy(dev_model + vlo, cpu_model + vlo, vlen);
    for (int w = (int)below(5); w-- > 0;) {
        size_t lo = vlo + below(vlen), len = 1 + below(vlo + vlen - lo < 2 * BLOCK ? vlo + vlen - lo : 2 * BLOCK);
        unsigned char v = (unsigned char)rnd();
        CHECK_OK(mapping_fill_gpu(s, buf, mapping_mirror_gpu_offset(m) + lo, len, v));
        memset(dev_model + lo, v, len);
    }
    CHECK_OK(mapping_mirror_release_gpu(s, view));
    mapping_mirror_destroy(view);
    bool on_stream = below(2);
    CHECK_OK(mapping_mirror_sync_to_cpu(on_stream ? s : NULL, m));
    if (on_stream)
        CHECK_OK(mapping_stream_synchronize(s));
    /* The view now holds the device's bytes; outside it the CPU keeps its
     * unsynced writes (a discard) or both sides agree. */
    memcpy(cpu_model + vlo, dev_model + vlo, vlen);
    CHECK_BYTES(cpu, cpu_model, n);
    (void)dev;
}

TEST(device_diff_keeps_the_cpu_side_equal_to_a_model_in_every_mode)
{
    mapping_device *dev = test_device();
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));
    const size_t n = 24 * BLOCK + 100; /* a last block that is only partly the mirror's */
    for (int forced = 0; forced <= 2; forced++) {
        mapping__test_device_diff_mode(forced);
        rng_state = 0x9e3779b97f4a7c15u + (uint64_t)forced;
        unsigned char *cpu_model = calloc(1, n), *dev_model = calloc(1, n);
        mapping_mirror *m;
        CHECK_OK(mapping_mirror_create(dev, n, MAPPING_MIRROR_DEVICE_DIFF, &m));
        CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m)); /* both sides zero: the device's memory starts undefined */
        for (int round = 0; round < 60; round++)
            model_round(dev, m, s, cpu_model, dev_model, n);
        CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
        test_check_mirror_sides_equal(m);
        mapping_mirror_destroy(m);
        free(cpu_model);
        free(dev_model);
    }
    mapping__test_device_diff_mode(-1);
    mapping_stream_destroy(s);
}

TEST(device_diff_on_wrapped_and_adopted_memory)
{
    mapping_device *dev = test_device();
    mapping__test_device_diff_mode(1);
    const size_t n = 8 * BLOCK;
    unsigned char *host = calloc(1, n), *host2 = calloc(1, n);
    mapping_buffer *gpu;
    CHECK_OK(mapping_allocate_gpu(dev, n + 64, &gpu));
    mapping_mirror *w, *a;
    CHECK_OK(mapping_mirror_wrap(dev, host, n, MAPPING_MIRROR_DEVICE_DIFF, &w));
    CHECK_OK(mapping_mirror_adopt(dev, host2, gpu, 64, n, MAPPING_MIRROR_DEVICE_DIFF, &a)); /* an odd base */
    mapping_mirror *both[2] = {w, a};
    for (int k = 0; k < 2; k++) {
        mapping_mirror *m = both[k];
        unsigned char *cpu = mapping_mirror_cpu(m);
        memset(cpu, 0x11, n);
        CHECK_OK(mapping_mirror_mark_cpu_modified(m, 0, n));
        CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
        mapping_buffer *b;
        CHECK_OK(mapping_mirror_acquire_gpu(NULL, m, MAPPING_READ | MAPPING_WRITE, &b));
        CHECK_OK(mapping_fill_gpu(NULL, b, mapping_mirror_gpu_offset(m) + 3 * BLOCK + 5, 10, 0x22));
        CHECK_OK(mapping_mirror_release_gpu(NULL, m));
        CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m));
        CHECK(cpu[3 * BLOCK + 4] == 0x11 && cpu[3 * BLOCK + 5] == 0x22 && cpu[3 * BLOCK + 14] == 0x22 &&
              cpu[3 * BLOCK + 15] == 0x11);
        test_check_mirror_sides_equal(m);
    }
    mapping_mirror_destroy(w);
    mapping_mirror_destroy(a);
    mapping_free_gpu(gpu);
    free(host);
    free(host2);
    mapping__test_device_diff_mode(-1);
}

TEST(device_diff_refuses_a_bad_environment_value)
{
    mapping_device *dev = test_device();
    mapping__test_device_diff_mode(3); /* as MAPPING_DEVICE_DIFF=sometimes */
    mapping_mirror *m = NULL;
    CHECK_REFUSED(mapping_mirror_create(dev, 4096, MAPPING_MIRROR_DEVICE_DIFF, &m), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK(m == NULL && strstr(mapping_last_error_message(), "MAPPING_DEVICE_DIFF") != NULL);
    CHECK_OK(mapping_mirror_create(dev, 4096, 0, &m)); /* without the flag the variable does not matter */
    mapping_mirror_destroy(m);
    mapping__test_device_diff_mode(-1);
    CHECK_REFUSED(mapping_mirror_create(dev, 4096, 1u << 5, &m), MAPPING_ERR_INVALID_ARGUMENT);
}
