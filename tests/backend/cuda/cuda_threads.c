/*
 * One device used from several threads at once (the cuda back end makes its
 * context current around each call on whatever thread calls). On cuda, a
 * thread's current context is as it was after every library call.
 */
#include <dlfcn.h>
#include <pthread.h>
#include "harness.h"

enum { THREADS = 4, ROUNDS = 20, BYTES = 3000 };

typedef struct worker_arg {
    mapping_device *dev;
    unsigned        seed;
    int             failed;
    const char     *what;
    char            error[256]; /* mapping_last_error_message() on that thread */
    void           *context_after; /* cuda: the thread's current context after the calls */
} worker_arg;

/* cuCtxGetCurrent of the driver the library loaded (cuda only). */
static int (*ctx_get_current)(void **);

static void find_driver(void)
{
    const char *path = getenv("MAPPING_CUDA_LIBRARY");
    void *lib = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!lib && !(path && *path))
        lib = dlopen("libcuda.so", RTLD_NOW | RTLD_NOLOAD);
    if (lib)
        *(void **)&ctx_get_current = dlsym(lib, "cuCtxGetCurrent");
}

#define WORKER_CHECK(a, cond)       \
    do {                            \
        if (!(cond)) {              \
            (a)->failed = 1;        \
            (a)->what = #cond;      \
            snprintf((a)->error, sizeof (a)->error, "%s", mapping_last_error_message()); \
            return NULL;            \
        }                           \
    } while (0)

static void *worker(void *p)
{
    worker_arg *a = p;
    unsigned char in[BYTES], out[BYTES];
    mapping_stream *s = NULL;
    WORKER_CHECK(a, mapping_stream_create(a->dev, &s) == MAPPING_OK);
    for (int r = 0; r < ROUNDS; r++) {
        test_pattern(in, BYTES, a->seed * 1000 + (unsigned)r);
        mapping_buffer *buf = NULL;
        WORKER_CHECK(a, mapping_allocate_gpu(a->dev, BYTES, &buf) == MAPPING_OK);
        WORKER_CHECK(a, mapping_sync_to_gpu(in, buf) == MAPPING_OK);
        WORKER_CHECK(a, mapping_sync_to_cpu_range(s, buf, 0, out, BYTES) == MAPPING_OK);
        WORKER_CHECK(a, mapping_stream_synchronize(s) == MAPPING_OK);
        WORKER_CHECK(a, memcmp(in, out, BYTES) == 0);
        mapping_free_gpu(buf);
    }
    mapping_stream_destroy(s);
    if (ctx_get_current)
        ctx_get_current(&a->context_after);
    return NULL;
}

TEST(threads_leave_their_current_context_as_it_was)
{
    mapping_device *dev = test_device();
    int cuda = strcmp(mapping_backend_name(dev), "cuda") == 0;
    if (cuda)
        find_driver();
    pthread_t threads[THREADS];
    worker_arg args[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i] = (worker_arg){.dev = dev, .seed = (unsigned)i + 1, .context_after = (void *)1};
        CHECK(pthread_create(&threads[i], NULL, worker, &args[i]) == 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(threads[i], NULL);
        if (args[i].failed)
            test_fail(__FILE__, __LINE__, "thread %d: %s failed: %s", i, args[i].what, args[i].error);
        if (cuda && ctx_get_current)
            CHECK(args[i].context_after == NULL); /* nothing was current before; nothing is after */
    }
    if (cuda)
        CHECK(ctx_get_current != NULL); /* the check above ran */
}
