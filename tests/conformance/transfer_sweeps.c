/* Large device-to-host reads, whole and as a forward sweep of pieces (the
 * host back end writes those with streaming stores: host_queue.c), land
 * every byte at any destination alignment, and touch nothing around. */
#include "harness.h"

enum { PIECE = 1 << 20, PIECES = 12, TOTAL = PIECE * PIECES, GUARD = 64 };

static unsigned char pattern(size_t i)
{
    return (unsigned char)(i * 2654435761u >> 13);
}

static void check_landed(const unsigned char *host, size_t at, size_t bytes, size_t span)
{
    for (size_t i = 0; i < span; i++) {
        unsigned char want = i >= at && i < at + bytes ? pattern(i - at) : 0xEE;
        if (host[i] != want)
            test_fail(__FILE__, __LINE__, "host byte %zu is %u, expected %u", i, host[i], want);
    }
}

TEST(large_and_swept_device_to_host_reads_land_every_byte_and_nothing_else)
{
    mapping_device *dev = test_device();
    mapping_buffer *buf;
    size_t span = TOTAL + 2 * GUARD;
    unsigned char *src = malloc(TOTAL), *host = NULL;
    CHECK(src);
    for (size_t i = 0; i < TOTAL; i++)
        src[i] = pattern(i);
    CHECK_OK(mapping_allocate_gpu(dev, TOTAL, &buf));
    CHECK_OK(mapping_allocate_cpu(dev, span, (void **)&host));
    CHECK_OK(mapping_sync_to_gpu_range(NULL, src, buf, 0, TOTAL));
    for (size_t misalign = 0; misalign < 3; misalign++) {
        size_t at = GUARD + misalign * 7;
        /* One read, larger than a cache. */
        memset(host, 0xEE, span);
        CHECK_OK(mapping_sync_to_cpu_range(NULL, buf, 0, host + at, TOTAL - 16));
        check_landed(host, at, TOTAL - 16, span);
        /* A forward sweep of pieces, the last one short. */
        memset(host, 0xEE, span);
        for (size_t off = 0; off < TOTAL - 5; off += PIECE) {
            size_t n = TOTAL - 5 - off < PIECE ? TOTAL - 5 - off : PIECE;
            CHECK_OK(mapping_sync_to_cpu_range(NULL, buf, off, host + at + off, n));
        }
        check_landed(host, at, TOTAL - 5, span);
    }
    mapping_free_cpu(dev, host);
    mapping_free_gpu(buf);
    free(src);
}
