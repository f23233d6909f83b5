/*
 * Batches and mirrors of one device used from several threads at once, one
 * batch or mirror per thread (the header allows it): blocking flushes (on a
 * back end with a blocking stream, all threads queue on that one stream and
 * wait on it), flushes on each thread's own stream, and many-range mirror
 * syncs. Also run under TSan.
 */
#include <pthread.h>
#include "harness.h"

enum { THREADS = 4, ROUNDS = 100, COPIES = 48, SMALL = 40, BUF = COPIES * 2 * SMALL, MIRROR = 16 << 10, RANGES = 20 };

typedef struct bworker {
    mapping_device *dev;
    unsigned        seed;
    int             failures;
    char            what[160];
} bworker;

#define WFAIL(w, ...)                                                                                        \
    do {                                                                                                     \
        if (!(w)->failures++)                                                                                \
            snprintf((w)->what, sizeof (w)->what, __VA_ARGS__);                                              \
        goto out;                                                                                            \
    } while (0)

static void *batch_work(void *arg)
{
    bworker *w = arg;
    unsigned char src[BUF], back[BUF], expect[BUF];
    mapping_buffer *buf = NULL;
    mapping_stream *own = NULL;
    mapping_batch *batch = NULL;
    mapping_mirror *m = NULL;
    if (mapping_allocate_gpu(w->dev, BUF, &buf) || mapping_stream_create(w->dev, &own) ||
        mapping_batch_create(w->dev, &batch) || mapping_fill_gpu(NULL, buf, 0, BUF, 0) ||
        mapping_mirror_create(w->dev, MIRROR, 0, &m) || mapping_mirror_sync_to_gpu(NULL, m))
        WFAIL(w, "set-up: %s", mapping_last_error_message());
    memset(expect, 0, sizeof expect);
    for (int r = 0; r < ROUNDS; r++) {
        test_pattern(src, BUF, w->seed * 100 + (unsigned)r);
        /* Every other slot, in plan order, then each read back: the one-pass flush. */
        for (size_t i = 0; i < COPIES; i++) {
            size_t off = (2 * i + (size_t)(r & 1)) * SMALL;
            if (mapping_batch_add_to_gpu(batch, src + off, buf, off, SMALL))
                WFAIL(w, "round %d: add: %s", r, mapping_last_error_message());
            memcpy(expect + off, src + off, SMALL);
        }
        for (size_t i = 0; i < COPIES; i++) {
            size_t off = (2 * i + (size_t)(r & 1)) * SMALL;
            if (mapping_batch_add_to_cpu(batch, buf, off, back + off, SMALL))
                WFAIL(w, "round %d: add: %s", r, mapping_last_error_message());
        }
        mapping_stream *s = r % 3 == 2 ? own : NULL;
        if (mapping_batch_flush(s, batch) || (s && mapping_stream_synchronize(s)))
            WFAIL(w, "round %d: flush: %s", r, mapping_last_error_message());
        for (size_t i = 0; i < COPIES; i++) {
            size_t off = (2 * i + (size_t)(r & 1)) * SMALL;
            if (memcmp(back + off, src + off, SMALL))
                WFAIL(w, "round %d: copy %zu read back other bytes", r, i);
        }
        /* Many ranges of the thread's mirror, to the device and back. */
        unsigned char *cpu = mapping_mirror_cpu(m);
        for (size_t k = 0; k < RANGES; k++) {
            size_t off = k * (MIRROR / RANGES) + (size_t)r;
            cpu[off] = (unsigned char)(w->seed + (unsigned)r + k);
            if (mapping_mirror_mark_cpu_modified(m, off, 1 + k))
                WFAIL(w, "round %d: mark: %s", r, mapping_last_error_message());
        }
        if (mapping_mirror_sync_to_gpu(s, m) || (s && mapping_stream_synchronize(s)))
            WFAIL(w, "round %d: mirror sync: %s", r, mapping_last_error_message());
        if (mapping_fill_gpu(NULL, mapping_mirror_gpu(m), (size_t)r * 7, 3, (unsigned char)r) ||
            mapping_mirror_mark_gpu_modified(m, (size_t)r * 7, 3) || mapping_mirror_sync_to_cpu(NULL, m))
            WFAIL(w, "round %d: mirror sync back: %s", r, mapping_last_error_message());
        if (cpu[(size_t)r * 7] != (unsigned char)r)
            WFAIL(w, "round %d: the mirror's CPU side missed the device's bytes", r);
    }
    if (mapping_sync_to_cpu(buf, back) || memcmp(back, expect, BUF))
        WFAIL(w, "the buffer does not hold the last bytes copied: %s", mapping_last_error_message());
out:
    mapping_mirror_destroy(m);
    mapping_batch_destroy(batch);
    mapping_stream_destroy(own);
    mapping_free_gpu(buf);
    return NULL;
}

TEST(batches_and_mirrors_of_one_device_flush_from_several_threads_at_once)
{
    mapping_device *dev = test_device();
    pthread_t threads[THREADS];
    static bworker workers[THREADS];
    for (int i = 0; i < THREADS; i++) {
        workers[i] = (bworker){dev, (unsigned)i + 1, 0, ""};
        CHECK(pthread_create(&threads[i], NULL, batch_work, &workers[i]) == 0);
    }
    for (int i = 0; i < THREADS; i++)
        CHECK(pthread_join(threads[i], NULL) == 0);
    for (int i = 0; i < THREADS; i++)
        if (workers[i].failures)
            test_fail(__FILE__, __LINE__, "thread %d: %s", i, workers[i].what);
}
