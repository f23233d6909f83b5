/*
 * Wrapped CPU memory that the library may read but not write (a PROT_READ
 * mapping, constant data): an upload from it works; a sync that would copy
 * into it fails with INVALID_ARGUMENT, copies nothing, and leaves the CPU
 * side stale, instead of faulting inside the copy.
 */
#include <sys/mman.h>
#include <unistd.h>
#include "harness.h"

typedef struct ro_pages {
    unsigned char *p;
    size_t         bytes;
} ro_pages;

/* `pages` pages holding test_pattern(seed), made read-only. */
static ro_pages read_only_pages(size_t pages, unsigned seed)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    ro_pages r = {mmap(NULL, pages * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0), pages * page};
    CHECK(r.p != MAP_FAILED);
    test_pattern(r.p, r.bytes, seed);
    CHECK(mprotect(r.p, r.bytes, PROT_READ) == 0);
    return r;
}

/* The device side of m, read back. */
static unsigned char *device_side(mapping_mirror *m, size_t bytes)
{
    unsigned char *out = malloc(bytes);
    CHECK(out);
    CHECK_OK(mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(m), mapping_mirror_gpu_offset(m), out, bytes));
    return out;
}

/* Writes new bytes into `ranges` ranges of the device side and marks them
 * modified there. */
static void device_writes(mapping_mirror *m, size_t bytes, int ranges, unsigned seed)
{
    unsigned char *fresh = malloc(bytes);
    CHECK(fresh);
    test_pattern(fresh, bytes, seed);
    size_t step = bytes / (size_t)ranges;
    for (int i = 0; i < ranges; i++) {
        size_t at = (size_t)i * step;
        CHECK_OK(mapping_sync_to_gpu_range(NULL, fresh + at, mapping_mirror_gpu(m), mapping_mirror_gpu_offset(m) + at,
                                           step / 2));
        CHECK_OK(mapping_mirror_mark_gpu_modified(m, at, step / 2));
    }
    free(fresh);
}

static void check_refused_download(mapping_mirror *m, const ro_pages *r, const unsigned char *before,
                                   mapping_stream *stream)
{
    uint64_t stale = mapping_mirror_stale_bytes(m, MAPPING_CPU);
    CHECK(stale > 0);
    CHECK_REFUSED(mapping_mirror_sync_to_cpu(stream, m), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK(strstr(mapping_last_error_message(), "not writable") != NULL);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_CPU) == stale); /* still stale: nothing became valid */
    CHECK_BYTES(r->p, before, r->bytes);                         /* and nothing was written */
    char perms[5];
    CHECK(strcmp(test_page_perms(r->p, perms), "r--p") == 0);
}

static void wrap_read_only(int ranges, int on_stream)
{
    mapping_device *dev = test_device();
    ro_pages r = read_only_pages(8, 41);
    unsigned char *before = malloc(r.bytes);
    CHECK(before);
    memcpy(before, r.p, r.bytes);
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_wrap(dev, r.p, r.bytes, 0, &m));
    /* Reading it is allowed: the upload works. */
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    unsigned char *dev_side = device_side(m, r.bytes);
    CHECK_BYTES(dev_side, before, r.bytes);
    free(dev_side);

    device_writes(m, r.bytes, ranges, 42);
    mapping_stream *s = NULL;
    if (on_stream)
        CHECK_OK(mapping_stream_create(dev, &s));
    check_refused_download(m, &r, before, s);
    if (s)
        CHECK_OK(mapping_stream_synchronize(s));

    /* Made writable, the same sync works (a refusal is not remembered). */
    CHECK(mprotect(r.p, r.bytes, PROT_READ | PROT_WRITE) == 0);
    CHECK_OK(mapping_mirror_sync_to_cpu(s, m));
    if (s)
        CHECK_OK(mapping_stream_synchronize(s));
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_CPU) == 0);
    test_check_mirror_sides_equal(m);
    if (s)
        mapping_stream_destroy(s);
    mapping_mirror_destroy(m);
    munmap(r.p, r.bytes);
    free(before);
}

TEST(wrap_of_read_only_memory_uploads_and_refuses_a_sync_into_it)
{
    wrap_read_only(1, 0);
}

TEST(wrap_of_read_only_memory_refuses_a_many_range_sync_into_it)
{
    wrap_read_only(32, 0); /* through the batch path */
}

TEST(wrap_of_read_only_memory_refuses_an_async_sync_into_it)
{
    wrap_read_only(3, 1);
}

TEST(adopt_of_read_only_memory_with_a_valid_device_side_refuses_the_sync_into_it)
{
    mapping_device *dev = test_device();
    ro_pages r = read_only_pages(4, 43);
    unsigned char *before = malloc(r.bytes);
    CHECK(before);
    memcpy(before, r.p, r.bytes);
    mapping_buffer *gpu;
    CHECK_OK(mapping_allocate_gpu(dev, r.bytes, &gpu));
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_adopt(dev, r.p, gpu, 0, r.bytes, MAPPING_MIRROR_GPU_VALID, &m));
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_CPU) == r.bytes);
    check_refused_download(m, &r, before, NULL);
    void *ptr = NULL;
    CHECK_REFUSED(mapping_mirror_acquire_cpu(m, MAPPING_READ, &ptr), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_BYTES(r.p, before, r.bytes);
    mapping_mirror_destroy(m);
    mapping_free_gpu(gpu);
    munmap(r.p, r.bytes);
    free(before);
}

TEST(wrap_of_memory_unmapped_since_refuses_a_sync_into_it)
{
    mapping_device *dev = test_device();
    size_t page = (size_t)sysconf(_SC_PAGESIZE), bytes = 4 * page;
    unsigned char *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_wrap(dev, p, bytes, 0, &m));
    CHECK_OK(mapping_mirror_mark_gpu_modified(m, 0, bytes));
    CHECK(munmap(p + 2 * page, page) == 0); /* a hole in the middle */
    CHECK_REFUSED(mapping_mirror_sync_to_cpu(NULL, m), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK(strstr(mapping_last_error_message(), "not mapped") != NULL);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_CPU) == bytes);
    mapping_mirror_destroy(m);
    munmap(p, bytes);
}
