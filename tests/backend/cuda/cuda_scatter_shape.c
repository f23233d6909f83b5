/*
 * The scatter/gather kernel's shape, as the strict fake driver emulates it
 * (tests/fake/fake_libcuda.c; SKIP on any other driver): a table of one
 * 512 KiB entry and many small misaligned ones, scattered and gathered with
 * MAPPING_CUDA_SCATTER=kernel on the back end itself.
 *   - the large entry is cut into pieces (no warp or block copies more than
 *     64 KiB of it: a merged group is spread over many SMs, not one);
 *   - a small entry gets one warp (32 threads), not a 256-thread block;
 *   - every byte lands (the fake copies only the pieces the launch's grid
 *     covers), nothing else is written.
 */
#include <dlfcn.h>
#include <stdint.h>
#include "harness.h"
#include "backend/cuda/cuda_device.h"

extern const mapping_backend mapping_backend_cuda;

enum {
    LARGE = 512 << 10,
    SMALL = 61, /* bytes of each small entry: odd, so most are misaligned */
    SMALLS = 300,
    DATA = LARGE + SMALLS * 64,
    TABLE_AT = DATA, /* 8-byte aligned */
    ENTRIES = 1 + SMALLS,
    STAGING = TABLE_AT + ENTRIES * (int)sizeof(mapping_scatter_entry),
    BUFFER = 2 * DATA,
};

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
    if (!f.count || !f.reset || f.count("copy_entries_largest_piece") < 0)
        test_skip("the loaded libcuda is not tests/fake/fake_libcuda.c with the kernel-shape gauges");
    return f;
}

TEST(cuda_scatter_kernel_splits_large_entries_and_gives_small_ones_a_warp)
{
    mapping_device *dev = test_device();
    if (strcmp(mapping_backend_name(dev), "cuda") != 0)
        test_skip("for the cuda back end; this is %s", mapping_backend_name(dev));
    fake_gauges f = fake();
    const mapping_backend *be = &mapping_backend_cuda;
    char why[256];
    int count = 0;
    CHECK_OK(be->load(why, sizeof why, &count));
    setenv("MAPPING_CUDA_SCATTER", "kernel", 1);
    void *state;
    mapping_status st = be->device_open(0, NULL, &state);
    unsetenv("MAPPING_CUDA_SCATTER");
    CHECK_OK(st);
    void *staging, *buffer, *stream;
    CHECK_OK(be->buffer_alloc(state, STAGING, &staging));
    CHECK_OK(be->buffer_alloc(state, BUFFER, &buffer));
    CHECK_OK(be->stream_create(state, &stream));

    /* The table: the large entry at buffer offset 16, small ones at odd
     * offsets beyond it (staging offsets 64 apart, buffer offsets 67 apart). */
    mapping_scatter_entry table[ENTRIES];
    table[0] = (mapping_scatter_entry){0, 16, LARGE};
    for (int i = 0; i < SMALLS; i++)
        table[1 + i] = (mapping_scatter_entry){LARGE + (uint64_t)i * 64, LARGE + 32 + (uint64_t)i * 67 + 1, SMALL};
    unsigned char *data = malloc(STAGING), *before = malloc(BUFFER), *expect = malloc(BUFFER),
                  *back = malloc(BUFFER);
    CHECK(data && before && expect && back);
    test_pattern(data, DATA, 7);
    memcpy(data + TABLE_AT, table, sizeof table);
    test_pattern(before, BUFFER, 8);
    memcpy(expect, before, BUFFER);
    for (int i = 0; i < ENTRIES; i++)
        memcpy(expect + table[i].buffer_offset, data + table[i].staging_offset, table[i].bytes);
    CHECK_OK(be->write(state, NULL, data, NULL, staging, 0, STAGING));
    CHECK_OK(be->write(state, NULL, before, NULL, buffer, 0, BUFFER));

    /* Scatter. */
    f.reset();
    CHECK_OK(be->scatter(state, stream, staging, TABLE_AT, table, ENTRIES, buffer));
    CHECK_OK(be->stream_synchronize(state, stream));
    long long piece = f.count("copy_entries_largest_piece"), threads = f.count("copy_entries_threads_per_entry");
    printf("scatter: largest piece one warp copies %lld bytes, %lld threads per entry\n", piece, threads);
    CHECK(piece > 0 && piece <= 64 << 10);
    CHECK(threads == 32);
    CHECK_OK(be->read(state, NULL, buffer, 0, back, NULL, BUFFER));
    CHECK_BYTES(back, expect, BUFFER);

    /* Gather the same entries back into a cleared staging area. */
    unsigned char *cleared = calloc(1, STAGING);
    CHECK(cleared);
    memcpy(cleared + TABLE_AT, table, sizeof table);
    CHECK_OK(be->write(state, NULL, cleared, NULL, staging, 0, STAGING));
    f.reset();
    CHECK_OK(be->gather(state, stream, buffer, staging, TABLE_AT, table, ENTRIES));
    CHECK_OK(be->stream_synchronize(state, stream));
    CHECK(f.count("copy_entries_largest_piece") <= 64 << 10);
    unsigned char *gathered = malloc(STAGING), *want = calloc(1, STAGING);
    CHECK(gathered && want);
    memcpy(want + TABLE_AT, table, sizeof table);
    for (int i = 0; i < ENTRIES; i++)
        memcpy(want + table[i].staging_offset, data + table[i].staging_offset, table[i].bytes);
    CHECK_OK(be->read(state, NULL, staging, 0, gathered, NULL, STAGING));
    CHECK_BYTES(gathered, want, STAGING);

    be->stream_destroy(state, stream);
    be->buffer_free(state, staging);
    be->buffer_free(state, buffer);
    be->device_close(state);
    free(data);
    free(before);
    free(expect);
    free(back);
    free(cleared);
    free(gathered);
    free(want);
}
