/*
 * Hardening (issue 10): link values and environment variables are checked
 * strictly, errors name the function called, a batch of large copies only,
 * re-entry into a pipeline from its own step, a host function that waits
 * for its own stream, and a step's own error message.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include "harness.h"

static const mapping_link bad_links[] = {
    {INFINITY, 1e9}, {NAN, 1e9},    {1e-6, INFINITY}, {1e-6, NAN},  {1e12, 1e9}, {2.0, 1e9},  {-1e-6, 1e9},
    {1e-6, 1e-300},  {1e-6, 1e16},  {1e-6, -1e9},     {-INFINITY, 0}, {0, -INFINITY}, {1e-6, 999},
};
enum { BAD_LINKS = sizeof bad_links / sizeof bad_links[0] };

TEST(link_values_outside_their_range_are_refused)
{
    mapping_device *dev = test_device();
    mapping_link good = {5e-6, 25e9}, now;
    CHECK_OK(mapping_device_set_link(dev, &good));
    for (int i = 0; i < BAD_LINKS; i++) {
        mapping_device_desc desc = {.backend = test_backend(), .link_bandwidth = bad_links[i].bandwidth,
                                    .link_latency = bad_links[i].latency};
        mapping_device *d = NULL;
        CHECK_REFUSED(mapping_open(&desc, &d), MAPPING_ERR_INVALID_ARGUMENT);
        CHECK(d == NULL);
        CHECK_REFUSED(mapping_device_set_link(dev, &bad_links[i]), MAPPING_ERR_INVALID_ARGUMENT);
        CHECK_OK(mapping_device_link(dev, &now)); /* unchanged */
        CHECK(now.latency == good.latency && now.bandwidth == good.bandwidth);
    }
    /* The bounds themselves, and 0 (default / measure again), are fine. */
    const mapping_link fine[] = {{0, 0}, {1.0, 1e3}, {0, 1e15}, {1e-9, 0}};
    for (size_t i = 0; i < sizeof fine / sizeof fine[0]; i++)
        CHECK_OK(mapping_device_set_link(dev, &fine[i]));
    printf("%d bad link values refused by mapping_open and mapping_device_set_link\n", BAD_LINKS);
}

/* mapping_open(NULL) under `name`=`value`: the status, with the variable
 * restored afterwards. */
static mapping_status open_with_env(const char *name, const char *value, mapping_device **out)
{
    const char *old = getenv(name);
    char *saved = old ? strdup(old) : NULL;
    setenv(name, value, 1);
    mapping_clear_last_error();
    mapping_status st = mapping_open(NULL, out);
    if (saved) {
        setenv(name, saved, 1);
        free(saved);
    } else {
        unsetenv(name);
    }
    return st;
}

static void check_env_refused(const char *name, const char *value, mapping_status expected)
{
    mapping_device *d = NULL;
    mapping_status st = open_with_env(name, value, &d);
    if (st != expected || d != NULL || !strstr(mapping_last_error_message(), name))
        test_fail(__FILE__, __LINE__, "mapping_open with %s=\"%s\" gave %s (expected %s), message \"%s\"", name, value,
                  mapping_status_name(st), mapping_status_name(expected), mapping_last_error_message());
    mapping_close(d);
}

TEST(environment_variables_are_parsed_strictly)
{
    test_device(); /* SKIP where the back end is absent */
    int refused = 0;
    static const char *const bad_devices[] = {"abc", "-1", " 0", "+0", "0x1", "1e3", "0 ", "99999999999", "1.0"};
    for (size_t i = 0; i < sizeof bad_devices / sizeof bad_devices[0]; i++, refused++)
        check_env_refused("MAPPING_DEVICE", bad_devices[i], MAPPING_ERR_INVALID_ARGUMENT);
    mapping_device *d = NULL;
    CHECK_REFUSED(open_with_env("MAPPING_BACKEND", "no-such-back-end", &d), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK(strstr(mapping_last_error_message(), "no-such-back-end") != NULL);
    refused++;
    CHECK_OK(open_with_env("MAPPING_DEVICE", "0", &d));
    mapping_close(d);
    static const char *const bad_map[] = {"yes", "2", "0 ", "off", "true"};
    for (size_t i = 0; i < sizeof bad_map / sizeof bad_map[0]; i++, refused++)
        check_env_refused("MAPPING_BATCH_MAP", bad_map[i], MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_OK(open_with_env("MAPPING_BATCH_MAP", "0", &d));
    mapping_close(d);
    CHECK_OK(open_with_env("MAPPING_BATCH_MAP", "1", &d));
    mapping_close(d);
    static const char *const bad_threads[] = {"-1", "65", "2 ", " 2", "two", "0x2", "1e1", "+1"};
    for (size_t i = 0; i < sizeof bad_threads / sizeof bad_threads[0]; i++, refused++)
        check_env_refused("MAPPING_COPY_THREADS", bad_threads[i], MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_OK(open_with_env("MAPPING_COPY_THREADS", "0", &d));
    mapping_close(d);
    CHECK_OK(open_with_env("MAPPING_COPY_THREADS", "64", &d));
    mapping_close(d);

    if (strcmp(test_backend(), "opencl") == 0) {
        static const char *const bad_share[] = {"yes", "2", "0 ", "off"};
        for (size_t i = 0; i < sizeof bad_share / sizeof bad_share[0]; i++, refused++)
            check_env_refused("MAPPING_OPENCL_SHARED_CONTEXT", bad_share[i], MAPPING_ERR_INVALID_ARGUMENT);
    }
    if (strcmp(test_backend(), "host") == 0) {
        static const char *const bad_links[] = {"garbage", "nan,nan", "25GB/s", "25e9,",     ",5e-6", "25e9,5e-6,1",
                                                "inf",     "1e-300",  "25e9,1e12", " 25e9", "-1",    "0x10",
                                                "25e9;5e-6", "25e9, 5e-6", "1e400", "25e9,nan"};
        for (size_t i = 0; i < sizeof bad_links / sizeof bad_links[0]; i++, refused++)
            check_env_refused("MAPPING_HOST_LINK", bad_links[i], MAPPING_ERR_INVALID_ARGUMENT);
        static const char *const bad_poison[] = {"yes", "2", "1 ", "on"};
        for (size_t i = 0; i < sizeof bad_poison / sizeof bad_poison[0]; i++, refused++)
            check_env_refused("MAPPING_HOST_POISON", bad_poison[i], MAPPING_ERR_INVALID_ARGUMENT);
        /* What is accepted: a model is active, with exactly these numbers. */
        static const char *const good[] = {"25e9,5e-6", "25e9", "1000000000,0.000002"};
        for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
            CHECK_OK(open_with_env("MAPPING_HOST_LINK", good[i], &d));
            mapping_device_info info;
            CHECK_OK(mapping_device_get_info(d, &info));
            CHECK(info.caps & MAPPING_CAP_LINK_MODEL);
            mapping_close(d);
        }
    }
    printf("%d bad environment values refused at mapping_open\n", refused);
}

TEST(errors_name_the_function_called)
{
    mapping_device *dev = test_device();
    mapping_buffer *buf;
    unsigned char host[64];
    CHECK_OK(mapping_allocate_gpu(dev, sizeof host, &buf));
    CHECK_REFUSED(mapping_sync_to_gpu(NULL, buf), MAPPING_ERR_NULL_ARGUMENT);
    CHECK(strncmp(mapping_last_error_message(), "mapping_sync_to_gpu:", 20) == 0);
    CHECK_REFUSED(mapping_sync_to_cpu(buf, NULL), MAPPING_ERR_NULL_ARGUMENT);
    CHECK(strncmp(mapping_last_error_message(), "mapping_sync_to_cpu:", 20) == 0);
    mapping_free_gpu(buf);
}

/* A flush with no staged group has no staging memory: nothing may be
 * computed from it (UBSan: NULL + offset). */
TEST(batch_of_only_large_copies)
{
    mapping_device *dev = test_device();
    enum { BIG = 5 << 20 }; /* above the largest staging threshold (4 MiB) */
    unsigned char *in = malloc(2 * (size_t)BIG), *out = malloc(2 * (size_t)BIG);
    CHECK(in && out);
    test_pattern(in, 2 * (size_t)BIG, 31);
    memset(out, 0, 2 * (size_t)BIG);
    mapping_buffer *buf;
    mapping_batch *b;
    CHECK_OK(mapping_allocate_gpu(dev, 2 * (size_t)BIG, &buf));
    CHECK_OK(mapping_batch_create(dev, &b));
    CHECK_OK(mapping_batch_add_to_gpu(b, in, buf, 0, BIG));
    CHECK_OK(mapping_batch_add_to_gpu(b, in + BIG, buf, BIG, BIG));
    CHECK_OK(mapping_batch_flush(NULL, b));
    CHECK_OK(mapping_batch_add_to_cpu(b, buf, BIG, out + BIG, BIG));
    CHECK_OK(mapping_batch_add_to_cpu(b, buf, 0, out, BIG));
    CHECK_OK(mapping_batch_flush(NULL, b));
    CHECK_BYTES(out, in, 2 * (size_t)BIG);
    mapping_batch_destroy(b);
    mapping_free_gpu(buf);
    free(in);
    free(out);
}

/* ---- re-entry into a pipeline from its own step ---- */

typedef struct reentry {
    mapping_pipeline *p;
    unsigned char    *scratch;
    mapping_status    inner_run, inner_destroy_error;
    int               steps;
} reentry;

static mapping_status copy_step(mapping_stream *stream, const mapping_pipeline_chunk *chunk, void *user)
{
    (void)user;
    return mapping_copy_gpu(stream, chunk->input, chunk->input_offset, chunk->output, chunk->output_offset,
                            chunk->bytes);
}

static mapping_status reentering_step(mapping_stream *stream, const mapping_pipeline_chunk *chunk, void *user)
{
    reentry *r = user;
    if (r->steps++ == 1) {
        r->inner_run = mapping_pipeline_run(r->p, r->scratch, r->scratch, 4096, copy_step, NULL);
        mapping_clear_last_error();
        mapping_pipeline_destroy(r->p);
        r->inner_destroy_error = mapping_last_error();
    }
    return copy_step(stream, chunk, NULL);
}

TEST(pipeline_refuses_reentry_from_its_own_step)
{
    mapping_device *dev = test_device();
    enum { N = 8 * 4096 };
    mapping_pipeline_desc desc = {.chunk_bytes = 4096, .depth = 2};
    static unsigned char in[N], out[N], scratch[4096];
    test_pattern(in, N, 5);
    reentry r = {.scratch = scratch, .inner_run = MAPPING_OK};
    CHECK_OK(mapping_pipeline_create(dev, &desc, &r.p));
    CHECK_OK(mapping_pipeline_run(r.p, in, out, N, reentering_step, &r));
    CHECK_STATUS(r.inner_run, MAPPING_ERR_BUSY);
    CHECK_STATUS(r.inner_destroy_error, MAPPING_ERR_BUSY);
    CHECK_BYTES(out, in, N); /* the outer run was not disturbed */
    /* The pipeline still works, and is destroyed once. */
    memset(out, 0, N);
    CHECK_OK(mapping_pipeline_run(r.p, in, out, N, copy_step, NULL));
    CHECK_BYTES(out, in, N);
    mapping_pipeline_destroy(r.p);
}

static mapping_status failing_step(mapping_stream *stream, const mapping_pipeline_chunk *chunk, void *user)
{
    (void)stream, (void)user;
    return chunk->index == 2 ? MAPPING_ERR_INVALID_ARGUMENT : MAPPING_OK;
}

TEST(pipeline_step_error_carries_a_message)
{
    mapping_device *dev = test_device();
    enum { N = 8 * 4096 };
    static unsigned char in[N];
    mapping_pipeline *p;
    mapping_pipeline_desc desc = {.chunk_bytes = 4096, .depth = 1};
    CHECK_OK(mapping_pipeline_create(dev, &desc, &p));
    CHECK_REFUSED(mapping_pipeline_run(p, in, NULL, N, failing_step, NULL), MAPPING_ERR_INVALID_ARGUMENT);
    const char *msg = mapping_last_error_message();
    if (!strstr(msg, "step") || !strstr(msg, "chunk 2"))
        test_fail(__FILE__, __LINE__, "message \"%s\" does not say that the step failed on chunk 2", msg);
    mapping_pipeline_destroy(p);
}

/* ---- a host function that waits for its own stream ---- */

typedef struct self_wait {
    mapping_stream *s;
    mapping_device *dev;
    mapping_status  sync, destroy, close;
} self_wait;

static void wait_for_own_stream(void *user)
{
    self_wait *w = user;
    w->sync = mapping_stream_synchronize(w->s);
    mapping_clear_last_error();
    mapping_stream_destroy(w->s);
    w->destroy = mapping_last_error();
    mapping_clear_last_error();
    mapping_close(w->dev);
    w->close = mapping_last_error();
}

TEST(host_function_waiting_for_its_own_stream_is_refused)
{
    mapping_device *dev = test_device();
    if (strcmp(test_backend(), "cuda") == 0)
        test_skip("CUDA host functions must not call the library (cuLaunchHostFunc)");
    self_wait w = {.dev = dev, .sync = MAPPING_OK};
    CHECK_OK(mapping_stream_create(dev, &w.s));
    CHECK_OK(mapping_launch_host(w.s, wait_for_own_stream, &w));
    CHECK_OK(mapping_stream_synchronize(w.s));
    CHECK_STATUS(w.sync, MAPPING_ERR_BUSY);
    CHECK_STATUS(w.destroy, MAPPING_ERR_BUSY);
    CHECK_STATUS(w.close, MAPPING_ERR_BUSY);
    /* Nothing was destroyed: the stream and the device still work. */
    unsigned char host[64] = {1}, back[64] = {0};
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, sizeof host, &buf));
    CHECK_OK(mapping_sync_to_gpu_range(w.s, host, buf, 0, sizeof host));
    CHECK_OK(mapping_sync_to_cpu_range(w.s, buf, 0, back, sizeof back));
    CHECK_OK(mapping_stream_synchronize(w.s));
    CHECK_BYTES(back, host, sizeof host);
    mapping_free_gpu(buf);
    mapping_stream_destroy(w.s);
}

/* ---- a host function that waits for an event of its own stream ---- */

typedef struct event_wait {
    mapping_event *before;           /* recorded before the function: complete */
    _Atomic(mapping_event *) after;  /* recorded after it: never complete while it runs */
    mapping_status before_sync, after_sync;
} event_wait;

static void wait_for_events_of_own_stream(void *user)
{
    event_wait *w = user;
    w->before_sync = mapping_event_synchronize(w->before);
    mapping_event *after;
    while (!(after = atomic_load(&w->after)))
        ;
    w->after_sync = mapping_event_synchronize(after); /* hung before */
}

TEST(host_function_waiting_for_a_later_event_of_its_own_stream_is_refused)
{
    mapping_device *dev = test_device();
    if (strcmp(test_backend(), "cuda") == 0)
        test_skip("CUDA host functions must not call the library (cuLaunchHostFunc)");
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));
    event_wait w = {.before_sync = MAPPING_OK, .after_sync = MAPPING_OK};
    atomic_store(&w.after, NULL);
    CHECK_OK(mapping_event_record(s, &w.before));
    CHECK_OK(mapping_launch_host(s, wait_for_events_of_own_stream, &w));
    mapping_event *after;
    CHECK_OK(mapping_event_record(s, &after));
    atomic_store(&w.after, after);
    CHECK_OK(mapping_stream_synchronize(s));
    CHECK_OK(w.before_sync);
    CHECK_STATUS(w.after_sync, MAPPING_ERR_BUSY);
    CHECK_OK(mapping_event_synchronize(after)); /* from outside: it completes */
    mapping_event_destroy(w.before);
    mapping_event_destroy(after);
    mapping_stream_destroy(s);
}

/* ---- a host function that syncs a mirror whose copy is queued after it ---- */

typedef struct mirror_wait {
    mapping_mirror *m;
    test_gate       gate;
    mapping_status  sync;
} mirror_wait;

static void sync_mirror_from_host_fn(void *user)
{
    mirror_wait *w = user;
    test_gate_wait(&w->gate); /* until the copy after this function is queued */
    w->sync = mapping_mirror_sync_to_cpu(NULL, w->m); /* hung before: it waited for that copy */
}

TEST(host_function_syncing_a_mirror_whose_copy_is_queued_after_it_is_refused)
{
    mapping_device *dev = test_device();
    if (strcmp(test_backend(), "cuda") == 0)
        test_skip("CUDA host functions must not call the library (cuLaunchHostFunc)");
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));
    mapping_mirror *m = test_synced_mirror(dev, 1 << 16, 0, 5);
    unsigned char *cpu = mapping_mirror_cpu(m);
    CHECK_OK(mapping_mirror_mark_gpu_modified(m, 1000, 1000)); /* the function's sync has work */
    mirror_wait w = {.m = m, .gate = TEST_GATE_INIT, .sync = MAPPING_OK};
    CHECK_OK(mapping_launch_host(s, sync_mirror_from_host_fn, &w));
    memset(cpu, 7, 100);
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 0, 100));
    CHECK_OK(mapping_mirror_sync_to_gpu(s, m)); /* queued after the function */
    test_gate_open(&w.gate);
    CHECK_OK(mapping_stream_synchronize(s));
    CHECK_STATUS(w.sync, MAPPING_ERR_BUSY);
    /* Refused, not half done: from outside, the same sync works. */
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_CPU) == 1000);
    CHECK_OK(mapping_mirror_sync_to_cpu(NULL, m));
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_CPU) == 0 && mapping_mirror_stale_bytes(m, MAPPING_GPU) == 0);
    test_check_mirror_sides_equal(m);
    mapping_mirror_destroy(m);
    mapping_stream_destroy(s);
}

/* ---- a pipeline whose output overlaps its input ---- */

static mapping_status keep_step(mapping_stream *s, const mapping_pipeline_chunk *chunk, void *user)
{
    (void)user;
    return mapping_copy_gpu(s, chunk->input, chunk->input_offset, chunk->output, chunk->output_offset,
                            chunk->bytes); /* the output is the input */
}

TEST(pipeline_refuses_a_cpu_dst_that_overlaps_cpu_src_unless_in_place)
{
    mapping_device *dev = test_device();
    enum { N = 64 * 1024 };
    static unsigned char a[2 * N], before[2 * N];
    test_pattern(a, sizeof a, 9);
    memcpy(before, a, sizeof a);
    mapping_pipeline *p;
    mapping_pipeline_desc desc = {.chunk_bytes = 4096, .depth = 2};
    CHECK_OK(mapping_pipeline_create(dev, &desc, &p));
    CHECK_REFUSED(mapping_pipeline_run(p, a, a + 4096, N, keep_step, NULL), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK(strstr(mapping_last_error_message(), "overlaps") != NULL);
    CHECK_REFUSED(mapping_pipeline_run(p, a + 4096, a, N, keep_step, NULL), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_REFUSED(mapping_pipeline_run(p, a, a + N - 1, N, keep_step, NULL), MAPPING_ERR_INVALID_ARGUMENT);
    CHECK_BYTES(a, before, sizeof a); /* nothing was read or written */
    /* In place, and disjoint (touching), are fine: the bytes come back as they were. */
    CHECK_OK(mapping_pipeline_run(p, a, a, N, keep_step, NULL));
    CHECK_OK(mapping_pipeline_run(p, a, a + N, N, keep_step, NULL));
    CHECK_BYTES(a + N, before, N);
    CHECK_BYTES(a, before, N);
    mapping_pipeline_destroy(p);
}
