/*
 * Large copies of pageable memory on a stream go through the staging arena
 * in pieces (src/backend/cuda/cuda_staging.c), checked with the strict fake
 * driver (tests/fake/fake_libcuda.c; SKIP on any other driver): a 64 MiB
 * write and read on a stream
 *   - never DMA more than 8 MiB (writes) or 1 MiB (reads; 4 MiB where copy
 *     threads share the unpacking, MAPPING_COPY_THREADS > 0) from one block
 *     of page-locked memory (a copy staged whole made one 64 MiB DMA after
 *     one 64 MiB memcpy);
 *   - allocate no page-locked memory beyond the arena's growth cap of a few
 *     pieces (staged whole, the copy grew the arena by 64 MiB and more);
 *   - land every byte, also when the stream is held by a host function when
 *     the copy is queued (then the call still returns at once: host
 *     functions pack and unpack in stream order).
 */
#include <dlfcn.h>
#include <stdbool.h>
#include <time.h>
#include "harness.h"
#include "testing/test_hooks.h"

enum { BIG = 64 << 20, MAX_PIECE = 8 << 20, MAX_GROWTH = 32 << 20 };

/* The largest read piece: 4 MiB with copy threads (the count mapping_open
 * set from $MAPPING_COPY_THREADS), else 1 MiB. */
static long long max_read_piece(void)
{
    return mapping__test_copy_threads() > 0 ? 4 << 20 : 1 << 20;
}

typedef struct fake_gauges {
    long long (*count)(const char *name);
    void (*reset)(void);
} fake_gauges;

static fake_gauges fake(void)
{
    const char *path = getenv("MAPPING_CUDA_LIBRARY");
    void *lib = path && *path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    fake_gauges f = {0};
    if (lib) {
        *(void **)&f.count = dlsym(lib, "fake_cuda_count");
        *(void **)&f.reset = dlsym(lib, "fake_cuda_reset_gauges");
    }
    if (!f.count || !f.reset || f.count("largest_pinned_async_copy") < 0)
        test_skip("the loaded libcuda is not tests/fake/fake_libcuda.c with the staging gauges");
    return f;
}

static volatile int gate_open;
static void gate(void *arg)
{
    (void)arg;
    struct timespec ms = {0, 1000000L};
    while (!__atomic_load_n(&gate_open, __ATOMIC_SEQ_CST))
        nanosleep(&ms, NULL);
}

static void check_gauges(const fake_gauges *f, const char *what, long long max_piece)
{
    long long dma = f->count("largest_pinned_async_copy"), alloc = f->count("largest_host_alloc");
    printf("%s: largest page-locked DMA %lld bytes, largest cuMemHostAlloc %lld bytes\n", what, dma, alloc);
    CHECK(dma > 0 && dma <= max_piece);
    CHECK(alloc <= MAX_GROWTH);
}

TEST(cuda_large_pageable_stream_copies_go_in_pieces_through_a_capped_arena)
{
    mapping_device *dev = test_device();
    if (strcmp(mapping_backend_name(dev), "cuda") != 0)
        test_skip("for the cuda back end; this is %s", mapping_backend_name(dev));
    fake_gauges f = fake();
    unsigned char *src = malloc(BIG), *back = malloc(BIG);
    CHECK(src && back);
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, BIG, &buf));
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));

    /* 1. The stream is idle: the caller packs and unpacks. */
    test_pattern(src, BIG, 11);
    f.reset();
    CHECK_OK(mapping_sync_to_gpu_range(s, src, buf, 0, BIG));
    CHECK_OK(mapping_stream_synchronize(s));
    check_gauges(&f, "write, idle stream", MAX_PIECE);
    memset(back, 0, BIG);
    f.reset();
    CHECK_OK(mapping_sync_to_cpu_range(s, buf, 0, back, BIG));
    CHECK_OK(mapping_stream_synchronize(s));
    check_gauges(&f, "read, idle stream", max_read_piece());
    CHECK_BYTES(back, src, BIG);

    /* 2. The stream is held: each call returns while it is held (a wait
     * would never end), host functions pack and unpack. One copy at a time:
     * a second one would grow the arena, and an allocation waits for every
     * stream (the fake aborts as a GPU would hang). */
    test_pattern(src, BIG, 12);
    gate_open = 0;
    CHECK_OK(mapping_launch_host(s, gate, NULL));
    f.reset();
    CHECK_OK(mapping_sync_to_gpu_range(s, src, buf, 0, BIG));
    __atomic_store_n(&gate_open, 1, __ATOMIC_SEQ_CST);
    CHECK_OK(mapping_stream_synchronize(s));
    check_gauges(&f, "write behind a held stream", MAX_PIECE);
    gate_open = 0;
    CHECK_OK(mapping_launch_host(s, gate, NULL));
    memset(back, 0, BIG);
    f.reset();
    CHECK_OK(mapping_sync_to_cpu_range(s, buf, 0, back, BIG));
    __atomic_store_n(&gate_open, 1, __ATOMIC_SEQ_CST);
    CHECK_OK(mapping_stream_synchronize(s));
    check_gauges(&f, "read behind a held stream", max_read_piece());
    CHECK_BYTES(back, src, BIG);

    /* 3. Sizes that are not whole pieces, at an odd offset. */
    size_t odd = (size_t)(9 << 20) + 12345;
    test_pattern(src, odd, 13);
    CHECK_OK(mapping_sync_to_gpu_range(s, src, buf, 7, odd));
    memset(back, 0, odd);
    CHECK_OK(mapping_sync_to_cpu_range(s, buf, 7, back, odd));
    CHECK_OK(mapping_stream_synchronize(s));
    CHECK_BYTES(back, src, odd);
    for (size_t around = (size_t)max_read_piece() - 130; around <= (size_t)max_read_piece() + 130;
         around += 65) { /* a read piece, +- */
        test_pattern(src, around, (unsigned)around);
        CHECK_OK(mapping_sync_to_gpu_range(s, src, buf, 3, around));
        memset(back, 0, around);
        CHECK_OK(mapping_sync_to_cpu_range(s, buf, 3, back, around));
        CHECK_OK(mapping_stream_synchronize(s));
        CHECK_BYTES(back, src, around);
    }

    mapping_stream_destroy(s);
    mapping_free_gpu(buf);
    free(src);
    free(back);
}

/* Blocking copies of pageable memory: with copy threads, 4 MiB and more go
 * through the arena in pieces too (the threads pack and unpack them); with
 * none, straight to cuMemcpyHtoD / DtoH (the driver stages them). Either
 * way every byte lands, and a blocking copy below 4 MiB takes the driver's
 * path. */
TEST(cuda_blocking_pageable_copies_go_through_the_arena_only_with_copy_threads)
{
    mapping_device *dev = test_device();
    if (strcmp(mapping_backend_name(dev), "cuda") != 0)
        test_skip("for the cuda back end; this is %s", mapping_backend_name(dev));
    fake_gauges f = fake();
    bool threads = max_read_piece() > (1 << 20);
    size_t sizes[] = {BIG, (size_t)(4 << 20), (size_t)(4 << 20) - 1, (size_t)(9 << 20) + 4097};
    unsigned char *src = malloc(BIG), *back = malloc(BIG);
    CHECK(src && back);
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, BIG + 64, &buf));
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        bool staged = threads && n >= (4 << 20);
        test_pattern(src, n, (unsigned)(i + 21));
        f.reset();
        CHECK_OK(mapping_sync_to_gpu_range(NULL, src, buf, 5, n));
        long long dma = f.count("largest_pinned_async_copy");
        if (staged ? !(dma > 0 && dma <= MAX_PIECE) : dma != 0)
            test_fail(__FILE__, __LINE__, "blocking write of %zu bytes (copy threads: %s): largest page-locked DMA %lld",
                      n, threads ? "yes" : "no", dma);
        memset(back, 0, n);
        f.reset();
        CHECK_OK(mapping_sync_to_cpu_range(NULL, buf, 5, back, n));
        dma = f.count("largest_pinned_async_copy");
        if (staged ? !(dma > 0 && dma <= max_read_piece()) : dma != 0)
            test_fail(__FILE__, __LINE__, "blocking read of %zu bytes (copy threads: %s): largest page-locked DMA %lld",
                      n, threads ? "yes" : "no", dma);
        CHECK_BYTES(back, src, n);
        CHECK(f.count("largest_host_alloc") <= MAX_GROWTH);
    }
    mapping_free_gpu(buf);
    free(src);
    free(back);
}
