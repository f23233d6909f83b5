/*
 * One wait per blocking batch flush on CUDA: a flush with stream == NULL
 * queues its steps (the write of the staging, the scatter, the gather, the
 * read) on the device's blocking stream, the CU_STREAM_LEGACY handle, and
 * calls cuStreamSynchronize on it once. Counted with the strict fake driver
 * (tests/fake/fake_libcuda.c), which refuses CU_STREAM_LEGACY where the real
 * driver does (batch copies); on a real driver only the bytes are checked.
 * For each flush of 1,000 scattered 64-byte copies (in add order, in reverse
 * order, both directions at once),
 *   - exactly one cuStreamSynchronize, on CU_STREAM_LEGACY;
 *   - no synchronous cuMemcpyHtoD / cuMemcpyDtoH, no cuEventSynchronize;
 *   - the bytes land (compared with the source).
 * (A mirror's sync of many ranges takes the same path, mapping__transfer_ranges,
 * when its link model chooses a batch; that choice depends on measured
 * figures, so it is not counted here.)
 */
#include <dlfcn.h>
#include <stdbool.h>
#include "harness.h"

enum { COPIES = 1000, PIECE = 64, STRIDE = 256, BYTES = COPIES * STRIDE };

typedef long long (*count_fn)(const char *name);

/* The fake's call counter, if the library loaded the fake; else NULL. */
static count_fn fake_count_or_null(void)
{
    const char *path = getenv("MAPPING_CUDA_LIBRARY");
    void *lib = path && *path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    count_fn f = NULL;
    if (lib)
        *(void **)&f = dlsym(lib, "fake_cuda_count");
    return f && f("cuStreamSynchronize_legacy") >= 0 ? f : NULL;
}

/* The fake's call counter; SKIP on any other driver. */
static count_fn fake_count(void)
{
    count_fn f = fake_count_or_null();
    if (!f)
        test_skip("the loaded libcuda is not tests/fake/fake_libcuda.c with per-handle counts");
    return f;
}

static const char *const COUNTED[] = {"cuStreamSynchronize", "cuStreamSynchronize_legacy", "cuMemcpyHtoD",
                                      "cuMemcpyDtoH", "cuEventSynchronize", "cuMemcpyHtoDAsync",
                                      "cuMemcpyDtoHAsync"};
enum { SYNCS, SYNCS_LEGACY, HTOD, DTOH, EVENT_SYNCS, HTOD_ASYNC, DTOH_ASYNC, KINDS };

typedef struct counts {
    long long n[KINDS];
} counts;

static counts take(count_fn f)
{
    counts c;
    for (int k = 0; k < KINDS; k++)
        c.n[k] = f ? f(COUNTED[k]) : 0;
    return c;
}

/* What one blocking call did between `before` and now: one wait, on the
 * legacy handle, and no synchronous transfer. `h2d`/`d2h`: whether it moved
 * bytes that way (then queued, so at least one async copy that way). */
static void check_one_wait(count_fn f, const counts *before, const char *what, bool h2d, bool d2h)
{
    if (!f) /* a real driver: the bytes are checked, the calls cannot be counted */
        return;
    counts now = take(f);
    long long d[KINDS];
    for (int k = 0; k < KINDS; k++)
        d[k] = now.n[k] - before->n[k];
    printf("%s: cuStreamSynchronize %lld (on CU_STREAM_LEGACY %lld), cuMemcpyHtoD %lld, cuMemcpyDtoH %lld, "
             "cuEventSynchronize %lld, cuMemcpyHtoDAsync %lld, cuMemcpyDtoHAsync %lld\n",
             what, d[SYNCS], d[SYNCS_LEGACY], d[HTOD], d[DTOH], d[EVENT_SYNCS], d[HTOD_ASYNC], d[DTOH_ASYNC]);
    CHECK(d[SYNCS] == 1);
    CHECK(d[SYNCS_LEGACY] == 1);
    CHECK(d[HTOD] == 0);
    CHECK(d[DTOH] == 0);
    CHECK(d[EVENT_SYNCS] == 0);
    CHECK(!h2d || d[HTOD_ASYNC] >= 1);
    CHECK(!d2h || d[DTOH_ASYNC] >= 1);
}

static mapping_device *open_cuda(void)
{
    mapping_device *dev = test_device();
    if (strcmp(mapping_backend_name(dev), "cuda") != 0)
        test_skip("for the cuda back end; this is %s", mapping_backend_name(dev));
    return dev;
}

/* Slot i of the buffer: offset i * STRIDE (+ PIECE for the second half). */
static size_t slot(int i, int half)
{
    return (size_t)i * STRIDE + (size_t)half * PIECE;
}

/* On a real driver (tests/gpu/run.sh) the same flushes run and their bytes
 * are checked; only the counts need the fake. */
TEST(cuda_blocking_flush_waits_once_on_the_legacy_stream)
{
    mapping_device *dev = open_cuda();
    count_fn f = fake_count_or_null();
    if (!f)
        printf("not the fake driver: the flushes' bytes are checked, their driver calls are not counted\n");
    unsigned char *host = malloc(BYTES), *back = malloc(BYTES), *expect = malloc(BYTES), *all = malloc(BYTES);
    CHECK(host && back && expect && all); /* pageable: the flush stages them */
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, BYTES, &buf));
    memset(expect, 0x5a, BYTES);
    CHECK_OK(mapping_sync_to_gpu(expect, buf));
    mapping_batch *b;
    CHECK_OK(mapping_batch_create(dev, &b));

    /* 1. To the device, in add order (the one-pass flush). */
    test_pattern(host, BYTES, 1);
    for (int i = 0; i < COPIES; i++) {
        CHECK_OK(mapping_batch_add_to_gpu(b, host + slot(i, 0), buf, slot(i, 0), PIECE));
        memcpy(expect + slot(i, 0), host + slot(i, 0), PIECE);
    }
    counts before = take(f);
    CHECK_OK(mapping_batch_flush(NULL, b));
    check_one_wait(f, &before, "1,000 copies to the device", true, false);
    CHECK(mapping_batch_count(b) == 0);

    /* 2. Back to the CPU, in reverse order (the planned flush). */
    memset(back, 0, BYTES);
    for (int i = COPIES - 1; i >= 0; i--)
        CHECK_OK(mapping_batch_add_to_cpu(b, buf, slot(i, 0), back + slot(i, 0), PIECE));
    before = take(f);
    CHECK_OK(mapping_batch_flush(NULL, b));
    check_one_wait(f, &before, "1,000 copies to the CPU, added in reverse", false, true);
    for (int i = 0; i < COPIES; i++)
        CHECK_BYTES(back + slot(i, 0), host + slot(i, 0), PIECE);

    /* 3. Both ways in one flush: new bytes to the second halves, the first
     * halves back. */
    test_pattern(host, BYTES, 2);
    memset(back, 0, BYTES);
    for (int i = 0; i < COPIES; i++) {
        CHECK_OK(mapping_batch_add_to_gpu(b, host + slot(i, 1), buf, slot(i, 1), PIECE));
        memcpy(expect + slot(i, 1), host + slot(i, 1), PIECE);
    }
    for (int i = 0; i < COPIES; i++)
        CHECK_OK(mapping_batch_add_to_cpu(b, buf, slot(i, 0), back + slot(i, 0), PIECE));
    before = take(f);
    CHECK_OK(mapping_batch_flush(NULL, b));
    check_one_wait(f, &before, "1,000 copies each way", true, true);
    for (int i = 0; i < COPIES; i++)
        CHECK_BYTES(back + slot(i, 0), expect + slot(i, 0), PIECE);

    /* Every byte of the buffer: the copies' bytes where they went, the rest
     * untouched. */
    CHECK_OK(mapping_sync_to_cpu(buf, all));
    CHECK_BYTES(all, expect, BYTES);

    mapping_batch_destroy(b);
    mapping_free_gpu(buf);
    free(host);
    free(back);
    free(expect);
    free(all);
}

/* The fake takes the special stream handles where a CUstream goes, as the
 * real driver does: CU_STREAM_LEGACY (0x1) and CU_STREAM_PER_THREAD (0x2)
 * are ordered with stream 0, cannot be destroyed, and any other handle that
 * is not a live stream is refused (CUDA_ERROR_INVALID_HANDLE, 400). An
 * imported CU_STREAM_PER_THREAD works as a library stream (batch copies take
 * it; only the legacy stream is refused). */
TEST(cuda_special_stream_handles_are_default_streams)
{
    setenv("MAPPING_CUDA_SCATTER", "batch", 1); /* auto scatters by the kernel; the batch copy's stream rule is tested */
    mapping_device *dev = open_cuda();
    count_fn f = fake_count();
    const char *path = getenv("MAPPING_CUDA_LIBRARY");
    void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    int (*push)(void *), (*pop)(void **), (*sync)(void *), (*destroy)(void *);
    int (*memset_async)(unsigned long long, unsigned char, size_t, void *);
    *(void **)&push = dlsym(lib, "cuCtxPushCurrent_v2");
    *(void **)&pop = dlsym(lib, "cuCtxPopCurrent_v2");
    *(void **)&sync = dlsym(lib, "cuStreamSynchronize");
    *(void **)&destroy = dlsym(lib, "cuStreamDestroy_v2");
    *(void **)&memset_async = dlsym(lib, "cuMemsetD8Async");
    CHECK(push && pop && sync && destroy && memset_async);
    void *const legacy = (void *)(uintptr_t)0x1, *const per_thread = (void *)(uintptr_t)0x2;
    void *const bogus = (void *)(uintptr_t)0x40;

    enum { N = 4096 };
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, N, &buf));
    void *native = NULL;
    CHECK_OK(mapping_buffer_native(buf, &native));
    mapping_native_device nd;
    CHECK_OK(mapping_device_native(dev, &nd));
    CHECK(push(nd.context) == 0);
    unsigned long long p = (unsigned long long)(uintptr_t)native;
    CHECK(memset_async(p, 1, N, legacy) == 0);
    CHECK(memset_async(p, 2, N / 2, NULL) == 0);
    CHECK(memset_async(p, 3, N / 4, per_thread) == 0);
    CHECK(memset_async(p, 4, N, bogus) == 400); /* refused: nothing queued */
    CHECK(sync(per_thread) == 0);
    CHECK(sync(legacy) == 0);
    CHECK(sync(bogus) == 400);
    CHECK(destroy(legacy) == 400);
    CHECK(destroy(per_thread) == 400);
    CHECK(destroy(NULL) == 400);
    void *popped;
    CHECK(pop(&popped) == 0);
    unsigned char back[N];
    CHECK_OK(mapping_sync_to_cpu(buf, back));
    for (size_t i = 0; i < N; i++)
        CHECK(back[i] == (i < N / 4 ? 3 : i < N / 2 ? 2 : 1));

    /* The per-thread stream imported: a flush on it uses batch copies where
     * the driver has them (MAPPING_CUDA_SCATTER=batch), and the bytes land. */
    mapping_stream *s;
    CHECK_OK(mapping_import_stream(dev, per_thread, &s));
    unsigned char host[N];
    test_pattern(host, N, 9);
    mapping_batch *b;
    CHECK_OK(mapping_batch_create(dev, &b));
    for (size_t i = 0; i < N; i += 128)
        CHECK_OK(mapping_batch_add_to_gpu(b, host + i, buf, i, 64));
    long long batches = f("cuMemcpyBatchAsync") + f("cuMemcpyBatchAsync_v2");
    CHECK_OK(mapping_batch_flush(s, b));
    CHECK_OK(mapping_stream_synchronize(s));
    CHECK(f("cuMemcpyBatchAsync") + f("cuMemcpyBatchAsync_v2") > batches);
    CHECK_OK(mapping_sync_to_cpu(buf, back));
    for (size_t i = 0; i < N; i += 128)
        CHECK_BYTES(back + i, host + i, 64);
    mapping_batch_destroy(b);
    mapping_stream_destroy(s); /* imported: never destroyed in the driver */
    mapping_free_gpu(buf);
}
