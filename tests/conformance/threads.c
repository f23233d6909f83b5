/* One device used from several threads at once (also run under TSan). */
#include <pthread.h>
#include "harness.h"

typedef struct worker {
    mapping_device *dev;
    mapping_stream *shared_stream;
    unsigned        seed;
    int             failures;
} worker;

static void *work(void *arg)
{
    worker *w = arg;
    enum { N = 1 << 14, ROUNDS = 40 };
    unsigned char *in = malloc(N), *out = malloc(N);
    void *pinned = NULL;
    mapping_buffer *buf = NULL;
    mapping_stream *own = NULL;
    if (mapping_allocate_gpu(w->dev, N, &buf) || mapping_allocate_cpu(w->dev, N, &pinned) ||
        mapping_stream_create(w->dev, &own)) {
        w->failures++;
        goto out;
    }
    for (int r = 0; r < ROUNDS; r++) {
        test_pattern(in, N, w->seed * 1000 + (unsigned)r);
        mapping_stream *s = r % 3 == 0 ? NULL : r % 3 == 1 ? own : w->shared_stream;
        memcpy(pinned, in, N);
        if (mapping_sync_to_gpu_range(s, r % 2 ? pinned : in, buf, 0, N) ||
            mapping_sync_to_cpu_range(s, buf, 0, out, N) || (s && mapping_stream_synchronize(s))) {
            w->failures++;
            break;
        }
        if (memcmp(in, out, N) != 0)
            w->failures++;
    }
out:
    mapping_stream_destroy(own);
    mapping_free_cpu(w->dev, pinned);
    mapping_free_gpu(buf);
    free(in);
    free(out);
    return NULL;
}

TEST(one_device_serves_several_threads_at_once)
{
    mapping_device *dev = test_device();
    mapping_stream *shared;
    CHECK_OK(mapping_stream_create(dev, &shared));
    enum { THREADS = 4 };
    pthread_t threads[THREADS];
    worker workers[THREADS];
    for (int i = 0; i < THREADS; i++) {
        workers[i] = (worker){dev, shared, (unsigned)i + 1, 0};
        CHECK(pthread_create(&threads[i], NULL, work, &workers[i]) == 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(threads[i], NULL);
        CHECK(workers[i].failures == 0);
    }
    mapping_stats st;
    CHECK_OK(mapping_device_stats(dev, &st));
    CHECK(st.h2d_copies == THREADS * 40 && st.d2h_copies == THREADS * 40);
    mapping_stream_destroy(shared);
}
