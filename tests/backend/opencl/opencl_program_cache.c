/*
 * OpenCL: the scatter/gather program binary kept between device opens in the
 * cache directory ($MAPPING_CACHE_DIR): written after a source build, used
 * by the next open, ignored and rewritten when corrupt, never written when
 * the cache is "off". Every case checks the scatter's data too.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "harness.h"

#ifdef MAPPING_WITH_OPENCL
#include "backend/opencl/opencl_api.h"
#endif
#ifdef MAPPING_OPENCL_HEADERS

/* The one opencl-*.bin of dir into path; how many there are. */
static int cache_files(const char *dir, char *path, size_t len)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (!strncmp(e->d_name, "opencl-", 7) && strstr(e->d_name, ".bin") && !strstr(e->d_name, ".tmp")) {
            snprintf(path, len, "%s/%s", dir, e->d_name);
            n++;
        }
    if (d)
        closedir(d);
    return n;
}

/* Opens an OpenCL device, scatters 64 copies through a batch, checks them. */
static void scatter_and_check(void)
{
    mapping_device *dev = NULL;
    /* On a CPU device a blocking flush copies through mapped memory and
     * needs no kernel: this one must scatter with the kernel. */
    setenv("MAPPING_BATCH_MAP", "0", 1);
    mapping_status st = mapping_open(&(mapping_device_desc){.backend = "opencl"}, &dev);
    if (st == MAPPING_ERR_NO_BACKEND || st == MAPPING_ERR_NO_DEVICE)
        test_skip("OpenCL is not available here: %s", mapping_last_error_message());
    CHECK_OK(st);
    enum { N = 64, COPY = 40 };
    unsigned char src[N * COPY], back[N * COPY];
    test_pattern(src, sizeof src, 9);
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, N * COPY * 3, &buf));
    mapping_batch *b;
    CHECK_OK(mapping_batch_create(dev, &b));
    for (size_t i = 0; i < N; i++)
        CHECK_OK(mapping_batch_sync_to_gpu(b, src + i * COPY, buf, i * COPY * 3, COPY));
    CHECK_OK(mapping_batch_flush(NULL, b));
    for (size_t i = 0; i < N; i++)
        CHECK_OK(mapping_sync_to_cpu_range(NULL, buf, i * COPY * 3, back + i * COPY, COPY));
    CHECK(memcmp(src, back, sizeof src) == 0);
    mapping_batch_destroy(b);
    mapping_free_gpu(buf);
    mapping_close(dev);
}

static void program_cache_body(void)
{
    char dir[] = "/tmp/mapping-cache-test-XXXXXX", path[4200], again[4200];
    CHECK(mkdtemp(dir) != NULL);
    char sub[4200];
    snprintf(sub, sizeof sub, "%s/made/by/the/library", dir);
    setenv("MAPPING_CACHE_DIR", sub, 1);
    scatter_and_check(); /* a source build, then kept */
    CHECK(cache_files(sub, path, sizeof path) == 1);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    CHECK(size > 64);
    scatter_and_check(); /* from the binary */
    CHECK(cache_files(sub, again, sizeof again) == 1 && !strcmp(path, again));

    /* Corrupt: a byte in the middle flipped. The next open ignores it, builds
     * from source and rewrites a good file. */
    f = fopen(path, "r+b");
    CHECK(f != NULL);
    fseek(f, size / 2, SEEK_SET);
    int c = fgetc(f);
    fseek(f, size / 2, SEEK_SET);
    fputc(c ^ 0xff, f);
    fclose(f);
    scatter_and_check();
    f = fopen(path, "rb");
    CHECK(f != NULL);
    fseek(f, size / 2, SEEK_SET);
    CHECK(fgetc(f) == c); /* rewritten (the same build gives the same bytes there) */
    fclose(f);
    /* Truncated to a few bytes: the same. */
    f = fopen(path, "wb");
    CHECK(f != NULL);
    fputs("mapc", f);
    fclose(f);
    scatter_and_check();
    CHECK(cache_files(sub, again, sizeof again) == 1);
    f = fopen(path, "rb");
    CHECK(f != NULL);
    fseek(f, 0, SEEK_END);
    CHECK(ftell(f) == size);
    fclose(f);
    remove(path);

    /* Off: nothing is written. */
    setenv("MAPPING_CACHE_DIR", "off", 1);
    scatter_and_check();
    CHECK(cache_files(sub, path, sizeof path) == 0);
    unsetenv("MAPPING_CACHE_DIR");
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}
#endif

UNIT_TEST(opencl_program_binaries_are_kept_used_and_rebuilt_when_corrupt)
{
#ifdef MAPPING_OPENCL_HEADERS
    program_cache_body();
#else
    test_skip("the OpenCL back end is not compiled into this build (or without its headers)");
#endif
}
