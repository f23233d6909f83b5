/*
 * Pipelines: every chunk goes through the step exactly once, in order, with
 * its own offset and size, and its output lands at the same offset. The step
 * is portable across back ends: copy the chunk's input to its output, then
 * stamp the chunk's first byte with its index.
 */
#include <stdint.h>
#include "harness.h"

typedef struct step_log {
    size_t calls, next_offset;
    int    fail_at; /* chunk index whose step fails; -1 = none */
    size_t first_bytes; /* of chunk 0: every chunk but the last has this size */
    size_t last_bytes;
} step_log;

static mapping_status copy_and_stamp(mapping_stream *stream, const mapping_pipeline_chunk *c, void *user)
{
    step_log *log = user;
    if ((int)c->index == log->fail_at)
        return MAPPING_ERR_INVALID_ARGUMENT;
    CHECK(c->index == log->calls);       /* in order, once each */
    CHECK(c->offset == log->next_offset); /* contiguous */
    CHECK(c->bytes > 0);
    CHECK(c->input_offset + c->bytes <= mapping_buffer_size(c->input));
    CHECK(c->output_offset + c->bytes <= mapping_buffer_size(c->output));
    if (c->index == 0)
        log->first_bytes = c->bytes;
    else
        CHECK(log->last_bytes == log->first_bytes); /* only the last may be shorter */
    log->last_bytes = c->bytes;
    log->calls++;
    log->next_offset += c->bytes;
    mapping_status st = mapping_copy_gpu(stream, c->input, c->input_offset, c->output, c->output_offset, c->bytes);
    if (st == MAPPING_OK)
        st = mapping_fill_gpu(stream, c->output, c->output_offset, 1, (unsigned char)c->index);
    return st;
}

/* What copy_and_stamp produces for chunks of `chunk` bytes. */
static void expected(unsigned char *out, const unsigned char *in, size_t n, size_t chunk)
{
    memcpy(out, in, n);
    for (size_t off = 0, i = 0; off < n; off += chunk, i++)
        out[off] = (unsigned char)i;
}

static void run_case(mapping_device *dev, const mapping_pipeline_desc *desc, size_t n, int locked, int in_place)
{
    mapping_pipeline *p;
    CHECK_OK(mapping_pipeline_create(dev, desc, &p));
    mapping_pipeline_desc used;
    CHECK_OK(mapping_pipeline_get_desc(p, &used));
    unsigned char *in, *out, *want = malloc(n), *orig = malloc(n);
    if (locked) {
        CHECK_OK(mapping_allocate_cpu(dev, n, (void **)&in));
        CHECK_OK(mapping_allocate_cpu(dev, n, (void **)&out));
    } else {
        in = malloc(n);
        out = malloc(n);
    }
    test_pattern(in, n, 30);
    memcpy(orig, in, n);
    memset(out, 0, n);
    step_log log = {0, 0, -1, 0, 0};
    unsigned char *dst = in_place ? in : out;
    CHECK_OK(mapping_pipeline_run(p, in, dst, n, copy_and_stamp, &log));
    CHECK(log.next_offset == n);
    CHECK(log.first_bytes <= used.chunk_bytes);
    CHECK(log.first_bytes % used.element_bytes == 0);
    expected(want, orig, n, log.first_bytes);
    CHECK_BYTES(dst, want, n);
    if (locked) {
        mapping_free_cpu(dev, in);
        mapping_free_cpu(dev, out);
    } else {
        free(in);
        free(out);
    }
    free(want);
    free(orig);
    mapping_pipeline_destroy(p);
}

TEST(pipeline_runs_every_chunk_through_the_step_once_in_order)
{
    mapping_device *dev = test_device();
    mapping_pipeline_desc desc = {.chunk_bytes = 64 << 10, .element_bytes = 4};
    run_case(dev, &desc, (1 << 20) + 12, 0, 0); /* pageable: through staging; a short last chunk */
}

TEST(pipeline_from_page_locked_memory_copies_straight_through)
{
    mapping_device *dev = test_device();
    mapping_pipeline_desc desc = {.chunk_bytes = 64 << 10};
    run_case(dev, &desc, (1 << 20) + 1, 1, 0);
}

TEST(pipeline_can_write_its_output_over_its_input)
{
    mapping_device *dev = test_device();
    mapping_pipeline_desc desc = {.chunk_bytes = 32 << 10, .depth = 2};
    run_case(dev, &desc, 300 << 10, 0, 1);
}

TEST(pipeline_of_depth_one_runs_chunks_one_after_another_with_the_same_result)
{
    mapping_device *dev = test_device();
    mapping_pipeline_desc desc = {.chunk_bytes = 100000, .depth = 1};
    run_case(dev, &desc, 1000000, 0, 0);
}

TEST(pipeline_defaults_come_from_the_measured_link)
{
    mapping_device *dev = test_device();
    mapping_pipeline *p;
    CHECK_OK(mapping_pipeline_create(dev, NULL, &p));
    mapping_pipeline_desc d;
    CHECK_OK(mapping_pipeline_get_desc(p, &d));
    CHECK(d.depth == 3);
    CHECK(d.element_bytes == 1);
    CHECK(d.chunk_bytes >= (256u << 10) && d.chunk_bytes <= (64u << 20));
    CHECK((d.chunk_bytes & (d.chunk_bytes - 1)) == 0);
    mapping_pipeline_destroy(p);
}

TEST(pipeline_stops_at_the_first_failing_step_and_returns_its_status)
{
    mapping_device *dev = test_device();
    mapping_pipeline *p;
    CHECK_OK(mapping_pipeline_create(dev, &(mapping_pipeline_desc){.chunk_bytes = 4096}, &p));
    enum { N = 64 << 10 };
    unsigned char *in = malloc(N), *out = malloc(N);
    test_pattern(in, N, 31);
    step_log log = {0, 0, 5, 0, 0};
    CHECK_STATUS(mapping_pipeline_run(p, in, out, N, copy_and_stamp, &log), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK(log.calls == 5);
    free(in);
    free(out);
    mapping_pipeline_destroy(p);
}

TEST(pipeline_refuses_bad_arguments)
{
    mapping_device *dev = test_device();
    mapping_pipeline *p;
    unsigned char buf[64];
    CHECK_STATUS(mapping_pipeline_create(NULL, NULL, &p), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_STATUS(mapping_pipeline_create(dev, NULL, NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_STATUS(mapping_pipeline_create(dev, &(mapping_pipeline_desc){.depth = 4}, &p), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mapping_pipeline_create(dev, &(mapping_pipeline_desc){.depth = -1}, &p),
                 MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_OK(mapping_pipeline_create(dev, &(mapping_pipeline_desc){.chunk_bytes = 4096, .element_bytes = 8}, &p));
    step_log log = {0, 0, -1, 0, 0};
    CHECK_STATUS(mapping_pipeline_run(NULL, buf, buf, 64, copy_and_stamp, &log), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_STATUS(mapping_pipeline_run(p, NULL, buf, 64, copy_and_stamp, &log), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_STATUS(mapping_pipeline_run(p, buf, buf, 64, NULL, &log), MAPPING_ERR_NULL_ARGUMENT);
    CHECK_STATUS(mapping_pipeline_run(p, buf, buf, 0, copy_and_stamp, &log), MAPPING_ERR_ZERO_SIZE);
    CHECK_STATUS(mapping_pipeline_run(p, buf, buf, 60, copy_and_stamp, &log), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK(log.calls == 0);
    mapping_pipeline_destroy(p);
    mapping_pipeline_destroy(NULL);
}
