/*
 * The back ends' scatter and gather operations (mapping_backend.scatter /
 * .gather), called through the back-end table as the batching layer calls
 * them. On cuda every way of running them is checked: the driver's batch
 * copy, the library's kernel and one copy per entry (MAPPING_CUDA_SCATTER).
 * Back ends without the operations skip.
 */
#include "testing/test_hooks.h"
#include "harness.h"

enum { ENTRIES = 97, AREA = 1 << 16, TABLE_OFFSET = 0, PAYLOAD = 8192 };

/* Entries of many sizes and alignments (1 byte to 1 KiB, odd and 16-byte
 * aligned offsets), disjoint on both sides. */
static void make_table(mapping_scatter_entry *t)
{
    uint64_t staging = PAYLOAD, buffer = 3;
    for (int i = 0; i < ENTRIES; i++) {
        uint64_t bytes = i % 3 == 0 ? 16u * (uint64_t)(i + 1) : (uint64_t)(i * 7 % 300) + 1;
        if (i % 3 == 0) { /* some fully 16-byte aligned entries for the kernel's wide path */
            staging = (staging + 15) & ~(uint64_t)15;
            buffer = (buffer + 15) & ~(uint64_t)15;
        }
        t[i] = (mapping_scatter_entry){staging, buffer, bytes};
        staging += bytes + (uint64_t)(i % 5);
        buffer += bytes + (uint64_t)(i % 4) + 1;
    }
}

static void check_scatter_and_gather(mapping_device *dev, mapping_stream *stream)
{
    const mapping_backend *be = dev->be;
    mapping_scatter_entry table[ENTRIES];
    make_table(table);
    unsigned char *staging_host = malloc(AREA), *expect = calloc(1, AREA), *out = malloc(AREA);
    test_pattern(staging_host, AREA, 50);
    memcpy(staging_host + TABLE_OFFSET, table, sizeof table);
    for (int i = 0; i < ENTRIES; i++)
        memcpy(expect + table[i].buffer_offset, staging_host + table[i].staging_offset, table[i].bytes);

    mapping_buffer *staging, *buffer;
    CHECK_OK(mapping_allocate_gpu(dev, AREA, &staging));
    CHECK_OK(mapping_allocate_gpu(dev, AREA, &buffer));
    CHECK_OK(mapping_sync_to_gpu(staging_host, staging));
    CHECK_OK(mapping_fill_gpu(NULL, buffer, 0, AREA, 0));

    /* scatter: staging -> buffer; bytes outside the entries stay 0 */
    CHECK_OK(be->scatter(dev->state, mapping__stream_state(stream), staging->mem, TABLE_OFFSET, table, ENTRIES,
                         buffer->mem));
    if (stream)
        CHECK_OK(mapping_stream_synchronize(stream));
    CHECK_OK(mapping_sync_to_cpu(buffer, out));
    CHECK_BYTES(out, expect, AREA);

    /* gather: buffer -> a cleared staging area; the same bytes come back */
    CHECK_OK(mapping_fill_gpu(NULL, staging, PAYLOAD, AREA - PAYLOAD, 0));
    CHECK_OK(be->gather(dev->state, mapping__stream_state(stream), buffer->mem, staging->mem, TABLE_OFFSET, table,
                        ENTRIES));
    if (stream)
        CHECK_OK(mapping_stream_synchronize(stream));
    CHECK_OK(mapping_sync_to_cpu(staging, out));
    for (int i = 0; i < ENTRIES; i++)
        CHECK_BYTES(out + table[i].staging_offset, staging_host + table[i].staging_offset, table[i].bytes);

    mapping_free_gpu(staging);
    mapping_free_gpu(buffer);
    free(staging_host);
    free(expect);
    free(out);
}

TEST(backend_scatter_and_gather_move_every_entry_and_nothing_else)
{
    mapping_device *dev = test_device();
    if (!dev->be->scatter || !dev->be->gather)
        test_skip("the %s back end has no scatter/gather operations", mapping_backend_name(dev));
    const char *modes[] = {"auto", "batch", "kernel", "copies"};
    int ways = strcmp(mapping_backend_name(dev), "cuda") == 0 ? 4 : 1;
    for (int m = 0; m < ways; m++) {
        setenv("MAPPING_CUDA_SCATTER", modes[m], 1); /* read when a cuda device opens */
        mapping_device *d;
        CHECK_OK(mapping_open(&(mapping_device_desc){.backend = test_backend()}, &d));
        check_scatter_and_gather(d, NULL);
        mapping_stream *s;
        CHECK_OK(mapping_stream_create(d, &s));
        check_scatter_and_gather(d, s);
        mapping_stream_destroy(s);
        mapping_close(d);
    }
}
