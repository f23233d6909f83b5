/*
 * The stale/garbage handle table: every public function that takes a handle,
 * given a value that is not a live object of that kind (freed, freed twice,
 * of another kind, misaligned or inside an object, a small integer, a
 * random value, an object of a closed device), refuses it with
 * MAPPING_ERR_INVALID_HANDLE (void functions record it; getters return 0 or
 * NULL) and never reads it: under ASan a read of freed memory fails the test.
 */
#include <pthread.h>
#include <stdint.h>
#include "harness.h"

enum { KIND_DEVICE, KIND_BUFFER, KIND_STREAM, KIND_EVENT, KIND_MIRROR, KIND_BATCH, KIND_PIPELINE, KIND_MULTIMIRROR, KINDS };
static const char *const kind_names[KINDS] = {"device", "buffer", "stream", "event", "mirror", "batch", "pipeline", "multimirror"};

/* Live objects the calls use for their other arguments. */
static struct {
    mapping_device   *dev;
    mapping_buffer   *buf;
    mapping_stream   *s;
    mapping_event    *ev;
    mapping_mirror   *m;
    mapping_batch    *b;
    mapping_pipeline *p;
    mapping_multimirror *mm;
} live;
static unsigned char host[256];

static void noop(void *user)
{
    (void)user;
}

static mapping_status step_ok(mapping_stream *stream, const mapping_pipeline_chunk *chunk, void *user)
{
    (void)stream, (void)chunk, (void)user;
    return MAPPING_OK;
}

/* Each call passes h where one handle goes, valid values elsewhere. A status
 * call returns its status; a void call returns the error it recorded; a
 * getter returns MAPPING_ERR_INVALID_HANDLE when it gave 0 / NULL / "". */
enum { RET_STATUS, RET_VOID, RET_GETTER };
typedef struct bad_call {
    int         kind, ret;
    const char *name;
    mapping_status (*call)(void *h);
} bad_call;

#define D ((mapping_device *)h)
#define B ((mapping_buffer *)h)
#define S ((mapping_stream *)h)
#define E ((mapping_event *)h)
#define M ((mapping_mirror *)h)
#define BT ((mapping_batch *)h)
#define P ((mapping_pipeline *)h)
#define MM ((mapping_multimirror *)h)
#define STATUS_CALL(id, expr) \
    static mapping_status id(void *h) { (void)h; return (expr); }
#define VOID_CALL(id, expr) \
    static mapping_status id(void *h) { (void)h; expr; return mapping_last_error(); }
#define GETTER_CALL(id, expr) \
    static mapping_status id(void *h) { (void)h; return (expr) ? MAPPING_ERR_INVALID_HANDLE : MAPPING_OK; }

static mapping_device_info info_out;
static mapping_link link_out, link_ok = {1e-6, 1e9};
static mapping_native_device native_out;
static mapping_stats stats_out;
static mapping_buffer *buf_out;
static mapping_stream *stream_out;
static mapping_event *event_out;
static mapping_mirror *mirror_out;
static mapping_batch *batch_out;
static mapping_pipeline *pipeline_out;
static mapping_pipeline_desc desc_out;
static void *ptr_out;
static char json_out[512];
static size_t needed_out;
static double seconds_out;
static mapping_multimirror *multimirror_out;
static mapping_mirror *shards_out[1];

/* device */
STATUS_CALL(dev_get_info, mapping_device_get_info(D, &info_out))
STATUS_CALL(dev_link, mapping_device_link(D, &link_out))
STATUS_CALL(dev_set_link, mapping_device_set_link(D, &link_ok))
STATUS_CALL(dev_native, mapping_device_native(D, &native_out))
STATUS_CALL(dev_allocate_gpu, mapping_allocate_gpu(D, 64, &buf_out))
STATUS_CALL(dev_allocate_cpu, mapping_allocate_cpu(D, 64, &ptr_out))
STATUS_CALL(dev_stream_create, mapping_stream_create(D, &stream_out))
STATUS_CALL(dev_stats, mapping_device_stats(D, &stats_out))
STATUS_CALL(dev_stats_json, mapping_device_stats_json(D, json_out, sizeof json_out, &needed_out))
STATUS_CALL(dev_mirror_create, mapping_mirror_create(D, 64, 0, &mirror_out))
STATUS_CALL(dev_mirror_wrap, mapping_mirror_wrap(D, host, 64, 0, &mirror_out))
STATUS_CALL(dev_batch_create, mapping_batch_create(D, &batch_out))
STATUS_CALL(dev_pipeline_create, mapping_pipeline_create(D, NULL, &pipeline_out))
STATUS_CALL(dev_import_gpu, mapping_import_gpu(D, host, 0, 8, NULL, NULL, &buf_out))
STATUS_CALL(dev_import_stream, mapping_import_stream(D, host, &stream_out))
STATUS_CALL(dev_mirror_adopt, mapping_mirror_adopt(D, host, live.buf, 0, 8, 0, &mirror_out))
STATUS_CALL(dev_multimirror_create, mapping_multimirror_create((mapping_device *const *)&h, 1, 64, &multimirror_out))
STATUS_CALL(dev_mirror_sharded, mapping_mirror_create_sharded((mapping_device *const *)&h, 1, host, 64, 8, 0, shards_out))
VOID_CALL(dev_close, mapping_close(D))
VOID_CALL(dev_free_cpu, mapping_free_cpu(D, host))
VOID_CALL(dev_stats_reset, mapping_device_stats_reset(D))
GETTER_CALL(dev_backend_name, mapping_backend_name(D)[0] == '\0')
/* buffer */
VOID_CALL(buf_free, mapping_free_gpu(B))
GETTER_CALL(buf_size, mapping_buffer_size(B) == 0)
GETTER_CALL(buf_device, mapping_buffer_device(B) == NULL)
STATUS_CALL(buf_native, mapping_buffer_native(B, &ptr_out))
STATUS_CALL(buf_sync_to_gpu, mapping_sync_to_gpu(host, B))
STATUS_CALL(buf_sync_to_cpu, mapping_sync_to_cpu(B, host))
STATUS_CALL(buf_sync_to_gpu_range, mapping_sync_to_gpu_range(NULL, host, B, 0, 8))
STATUS_CALL(buf_sync_to_cpu_range, mapping_sync_to_cpu_range(NULL, B, 0, host, 8))
STATUS_CALL(buf_copy_src, mapping_copy_gpu(NULL, B, 0, live.buf, 0, 8))
STATUS_CALL(buf_copy_dst, mapping_copy_gpu(NULL, live.buf, 0, B, 8, 8))
STATUS_CALL(buf_fill, mapping_fill_gpu(NULL, B, 0, 8, 0))
STATUS_CALL(buf_batch_to_gpu, mapping_batch_add_to_gpu(live.b, host, B, 0, 8))
STATUS_CALL(buf_batch_to_cpu, mapping_batch_add_to_cpu(live.b, B, 0, host, 8))
STATUS_CALL(buf_peer_src, mapping_copy_peer(NULL, B, 0, live.buf, 8, 8))
STATUS_CALL(buf_peer_dst, mapping_copy_peer(NULL, live.buf, 0, B, 8, 8))
STATUS_CALL(buf_mirror_adopt, mapping_mirror_adopt(live.dev, host, B, 0, 8, 0, &mirror_out))
/* stream */
VOID_CALL(s_destroy, mapping_stream_destroy(S))
STATUS_CALL(s_synchronize, mapping_stream_synchronize(S))
STATUS_CALL(s_native, mapping_stream_native(S, &ptr_out))
STATUS_CALL(s_launch_host, mapping_launch_host(S, noop, NULL))
STATUS_CALL(s_event_record, mapping_event_record(S, &event_out))
STATUS_CALL(s_wait_event, mapping_stream_wait_event(S, live.ev))
STATUS_CALL(s_sync_to_gpu_range, mapping_sync_to_gpu_range(S, host, live.buf, 0, 8))
STATUS_CALL(s_sync_to_cpu_range, mapping_sync_to_cpu_range(S, live.buf, 0, host, 8))
STATUS_CALL(s_copy, mapping_copy_gpu(S, live.buf, 0, live.buf, 8, 8))
STATUS_CALL(s_fill, mapping_fill_gpu(S, live.buf, 0, 8, 0))
STATUS_CALL(s_mirror_to_gpu, mapping_mirror_sync_to_gpu(S, live.m))
STATUS_CALL(s_mirror_to_cpu, mapping_mirror_sync_to_cpu(S, live.m))
STATUS_CALL(s_acquire_gpu, mapping_mirror_acquire_gpu(S, live.m, MAPPING_READ, &buf_out))
STATUS_CALL(s_release_gpu, mapping_mirror_release_gpu(S, live.m))
STATUS_CALL(s_batch_flush, mapping_batch_flush(S, live.b))
STATUS_CALL(s_peer, mapping_copy_peer(S, live.buf, 0, live.buf, 8, 8))
STATUS_CALL(s_multimirror_to_gpu, mapping_multimirror_sync_to_gpu(S, live.mm, 0))
/* event */
VOID_CALL(ev_destroy, mapping_event_destroy(E))
STATUS_CALL(ev_wait, mapping_stream_wait_event(live.s, E))
STATUS_CALL(ev_synchronize, mapping_event_synchronize(E))
STATUS_CALL(ev_query, mapping_event_query(E))
STATUS_CALL(ev_elapsed_start, mapping_event_elapsed(E, live.ev, &seconds_out))
STATUS_CALL(ev_elapsed_end, mapping_event_elapsed(live.ev, E, &seconds_out))
/* mirror (roots and views alike) */
VOID_CALL(m_destroy, mapping_mirror_destroy(M))
GETTER_CALL(m_size, mapping_mirror_size(M) == 0)
GETTER_CALL(m_cpu, mapping_mirror_cpu(M) == NULL)
GETTER_CALL(m_gpu, mapping_mirror_gpu(M) == NULL)
GETTER_CALL(m_gpu_offset, mapping_mirror_gpu_offset(M) == 0)
GETTER_CALL(m_is_unified, mapping_mirror_is_unified(M) == 0)
GETTER_CALL(m_is_pinned, mapping_mirror_is_pinned(M) == 0)
VOID_CALL(m_stale_bytes, CHECK(mapping_mirror_stale_bytes(M, MAPPING_GPU) == 0))
STATUS_CALL(m_mark_cpu, mapping_mirror_mark_cpu_modified(M, 0, 8))
STATUS_CALL(m_mark_gpu, mapping_mirror_mark_gpu_modified(M, 0, 8))
STATUS_CALL(m_sync_to_gpu, mapping_mirror_sync_to_gpu(NULL, M))
STATUS_CALL(m_sync_to_cpu, mapping_mirror_sync_to_cpu(NULL, M))
STATUS_CALL(m_view, mapping_mirror_view(M, 0, 8, &mirror_out))
STATUS_CALL(m_acquire_cpu, mapping_mirror_acquire_cpu(M, MAPPING_READ, &ptr_out))
STATUS_CALL(m_acquire_gpu, mapping_mirror_acquire_gpu(NULL, M, MAPPING_READ, &buf_out))
STATUS_CALL(m_release_gpu, mapping_mirror_release_gpu(NULL, M))
/* batch */
VOID_CALL(b_destroy, mapping_batch_destroy(BT))
VOID_CALL(b_clear, mapping_batch_clear(BT))
GETTER_CALL(b_count, mapping_batch_count(BT) == 0)
STATUS_CALL(b_to_gpu, mapping_batch_add_to_gpu(BT, host, live.buf, 0, 8))
STATUS_CALL(b_to_cpu, mapping_batch_add_to_cpu(BT, live.buf, 0, host, 8))
STATUS_CALL(b_flush, mapping_batch_flush(NULL, BT))
/* pipeline */
VOID_CALL(p_destroy, mapping_pipeline_destroy(P))
STATUS_CALL(p_get_desc, mapping_pipeline_get_desc(P, &desc_out))
STATUS_CALL(p_run, mapping_pipeline_run(P, host, host, 64, step_ok, NULL))
/* multimirror */
VOID_CALL(mm_destroy, mapping_multimirror_destroy(MM))
GETTER_CALL(mm_size, mapping_multimirror_size(MM) == 0)
GETTER_CALL(mm_cpu, mapping_multimirror_cpu(MM) == NULL)
GETTER_CALL(mm_gpu, mapping_multimirror_gpu(MM, 0) == NULL)
VOID_CALL(mm_stale_bytes, CHECK(mapping_multimirror_stale_bytes(MM, 0) == 0))
STATUS_CALL(mm_mark_cpu, mapping_multimirror_mark_cpu_modified(MM, 0, 8))
STATUS_CALL(mm_mark_gpu, mapping_multimirror_mark_gpu_modified(MM, 0, 0, 8))
STATUS_CALL(mm_sync_to_gpu, mapping_multimirror_sync_to_gpu(NULL, MM, 0))
STATUS_CALL(mm_sync_to_cpu, mapping_multimirror_sync_to_cpu(MM))

#define ENTRY(kind, ret, id) {KIND_##kind, RET_##ret, #id, id},
static const bad_call calls[] = {
    ENTRY(DEVICE, STATUS, dev_get_info) ENTRY(DEVICE, STATUS, dev_link) ENTRY(DEVICE, STATUS, dev_set_link)
    ENTRY(DEVICE, STATUS, dev_native) ENTRY(DEVICE, STATUS, dev_allocate_gpu) ENTRY(DEVICE, STATUS, dev_allocate_cpu)
    ENTRY(DEVICE, STATUS, dev_stream_create) ENTRY(DEVICE, STATUS, dev_stats) ENTRY(DEVICE, STATUS, dev_stats_json)
    ENTRY(DEVICE, STATUS, dev_mirror_create) ENTRY(DEVICE, STATUS, dev_mirror_wrap)
    ENTRY(DEVICE, STATUS, dev_batch_create) ENTRY(DEVICE, STATUS, dev_pipeline_create) ENTRY(DEVICE, VOID, dev_close)
    ENTRY(DEVICE, STATUS, dev_import_gpu) ENTRY(DEVICE, STATUS, dev_import_stream) ENTRY(DEVICE, STATUS, dev_mirror_adopt)
    ENTRY(DEVICE, STATUS, dev_multimirror_create) ENTRY(DEVICE, STATUS, dev_mirror_sharded)
    ENTRY(DEVICE, VOID, dev_free_cpu) ENTRY(DEVICE, VOID, dev_stats_reset) ENTRY(DEVICE, GETTER, dev_backend_name)
    ENTRY(BUFFER, VOID, buf_free) ENTRY(BUFFER, GETTER, buf_size) ENTRY(BUFFER, GETTER, buf_device)
    ENTRY(BUFFER, STATUS, buf_native) ENTRY(BUFFER, STATUS, buf_sync_to_gpu) ENTRY(BUFFER, STATUS, buf_sync_to_cpu)
    ENTRY(BUFFER, STATUS, buf_sync_to_gpu_range) ENTRY(BUFFER, STATUS, buf_sync_to_cpu_range)
    ENTRY(BUFFER, STATUS, buf_copy_src) ENTRY(BUFFER, STATUS, buf_copy_dst) ENTRY(BUFFER, STATUS, buf_fill)
    ENTRY(BUFFER, STATUS, buf_batch_to_gpu) ENTRY(BUFFER, STATUS, buf_batch_to_cpu)
    ENTRY(BUFFER, STATUS, buf_peer_src) ENTRY(BUFFER, STATUS, buf_peer_dst) ENTRY(BUFFER, STATUS, buf_mirror_adopt)
    ENTRY(STREAM, VOID, s_destroy) ENTRY(STREAM, STATUS, s_synchronize) ENTRY(STREAM, STATUS, s_native)
    ENTRY(STREAM, STATUS, s_launch_host) ENTRY(STREAM, STATUS, s_event_record) ENTRY(STREAM, STATUS, s_wait_event)
    ENTRY(STREAM, STATUS, s_sync_to_gpu_range) ENTRY(STREAM, STATUS, s_sync_to_cpu_range) ENTRY(STREAM, STATUS, s_copy)
    ENTRY(STREAM, STATUS, s_fill) ENTRY(STREAM, STATUS, s_mirror_to_gpu) ENTRY(STREAM, STATUS, s_mirror_to_cpu)
    ENTRY(STREAM, STATUS, s_acquire_gpu) ENTRY(STREAM, STATUS, s_release_gpu) ENTRY(STREAM, STATUS, s_batch_flush)
    ENTRY(STREAM, STATUS, s_peer) ENTRY(STREAM, STATUS, s_multimirror_to_gpu)
    ENTRY(EVENT, VOID, ev_destroy) ENTRY(EVENT, STATUS, ev_wait) ENTRY(EVENT, STATUS, ev_synchronize)
    ENTRY(EVENT, STATUS, ev_query) ENTRY(EVENT, STATUS, ev_elapsed_start) ENTRY(EVENT, STATUS, ev_elapsed_end)
    ENTRY(MIRROR, VOID, m_destroy) ENTRY(MIRROR, GETTER, m_size) ENTRY(MIRROR, GETTER, m_cpu)
    ENTRY(MIRROR, GETTER, m_gpu) ENTRY(MIRROR, GETTER, m_gpu_offset) ENTRY(MIRROR, GETTER, m_is_unified)
    ENTRY(MIRROR, GETTER, m_is_pinned) ENTRY(MIRROR, VOID, m_stale_bytes) ENTRY(MIRROR, STATUS, m_mark_cpu)
    ENTRY(MIRROR, STATUS, m_mark_gpu) ENTRY(MIRROR, STATUS, m_sync_to_gpu) ENTRY(MIRROR, STATUS, m_sync_to_cpu)
    ENTRY(MIRROR, STATUS, m_view) ENTRY(MIRROR, STATUS, m_acquire_cpu) ENTRY(MIRROR, STATUS, m_acquire_gpu)
    ENTRY(MIRROR, STATUS, m_release_gpu)
    ENTRY(BATCH, VOID, b_destroy) ENTRY(BATCH, VOID, b_clear) ENTRY(BATCH, GETTER, b_count)
    ENTRY(BATCH, STATUS, b_to_gpu) ENTRY(BATCH, STATUS, b_to_cpu) ENTRY(BATCH, STATUS, b_flush)
    ENTRY(PIPELINE, VOID, p_destroy) ENTRY(PIPELINE, STATUS, p_get_desc) ENTRY(PIPELINE, STATUS, p_run)
    ENTRY(MULTIMIRROR, VOID, mm_destroy) ENTRY(MULTIMIRROR, GETTER, mm_size) ENTRY(MULTIMIRROR, GETTER, mm_cpu)
    ENTRY(MULTIMIRROR, GETTER, mm_gpu) ENTRY(MULTIMIRROR, VOID, mm_stale_bytes) ENTRY(MULTIMIRROR, STATUS, mm_mark_cpu)
    ENTRY(MULTIMIRROR, STATUS, mm_mark_gpu) ENTRY(MULTIMIRROR, STATUS, mm_sync_to_gpu)
    ENTRY(MULTIMIRROR, STATUS, mm_sync_to_cpu)
};

/* The bad values for one kind, and where each came from (for messages). */
enum { MAX_BAD = 48 };
typedef struct bad_values {
    void       *value[MAX_BAD];
    const char *what[MAX_BAD];
    int         n;
} bad_values;

static void add_bad(bad_values *v, void *value, const char *what)
{
    CHECK(v->n < MAX_BAD);
    v->value[v->n] = value;
    v->what[v->n] = what;
    v->n++;
}

static uint64_t xorshift(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* One object of each kind on dev: the slots of kinds[] */
static void make_objects(mapping_device *dev, void *objects[KINDS])
{
    mapping_buffer *buf;
    mapping_stream *s;
    mapping_event *ev;
    mapping_mirror *m;
    mapping_batch *b;
    mapping_pipeline *p;
    mapping_multimirror *mm;
    mapping_pipeline_desc desc = {.chunk_bytes = 4096, .depth = 1};
    CHECK_OK(mapping_allocate_gpu(dev, 64, &buf));
    CHECK_OK(mapping_stream_create(dev, &s));
    CHECK_OK(mapping_event_record(s, &ev));
    CHECK_OK(mapping_mirror_create(dev, 64, 0, &m));
    CHECK_OK(mapping_batch_create(dev, &b));
    CHECK_OK(mapping_pipeline_create(dev, &desc, &p));
    CHECK_OK(mapping_multimirror_create(&dev, 1, 64, &mm));
    void *made[KINDS] = {dev, buf, s, ev, m, b, p, mm};
    memcpy(objects, made, sizeof made);
}

static void destroy_objects(void *objects[KINDS])
{
    mapping_multimirror_destroy(objects[KIND_MULTIMIRROR]);
    mapping_pipeline_destroy(objects[KIND_PIPELINE]);
    mapping_batch_destroy(objects[KIND_BATCH]);
    mapping_mirror_destroy(objects[KIND_MIRROR]);
    mapping_event_destroy(objects[KIND_EVENT]);
    mapping_stream_destroy(objects[KIND_STREAM]);
    mapping_free_gpu(objects[KIND_BUFFER]);
}

/* Destroys h (of kind) again: a double free is refused and recorded. */
static void destroy_again(int kind, void *h)
{
    mapping_clear_last_error();
    switch (kind) {
    case KIND_DEVICE: mapping_close(h); break;
    case KIND_BUFFER: mapping_free_gpu(h); break;
    case KIND_STREAM: mapping_stream_destroy(h); break;
    case KIND_EVENT: mapping_event_destroy(h); break;
    case KIND_MIRROR: mapping_mirror_destroy(h); break;
    case KIND_BATCH: mapping_batch_destroy(h); break;
    case KIND_PIPELINE: mapping_pipeline_destroy(h); break;
    case KIND_MULTIMIRROR: mapping_multimirror_destroy(h); break;
    }
    if (mapping_last_error() != MAPPING_ERR_INVALID_HANDLE)
        test_fail(__FILE__, __LINE__, "destroying a freed %s %p again recorded %s, not ERR_INVALID_HANDLE",
                  kind_names[kind], h, mapping_status_name(mapping_last_error()));
}

TEST(stale_and_garbage_handles_are_refused_by_every_function)
{
    mapping_device *dev = test_device();
    void *objects[KINDS];
    make_objects(dev, objects);
    live.dev = dev;
    live.buf = objects[KIND_BUFFER];
    live.s = objects[KIND_STREAM];
    live.ev = objects[KIND_EVENT];
    live.m = objects[KIND_MIRROR];
    live.b = objects[KIND_BATCH];
    live.p = objects[KIND_PIPELINE];
    live.mm = objects[KIND_MULTIMIRROR];
    mapping_mirror *live_view;
    CHECK_OK(mapping_mirror_view(live.m, 8, 32, &live_view));

    /* Freed objects: one of each kind (a device and, through its close, the
     * buffer, stream and event it still held), a freed view, and objects of a
     * closed device that were never destroyed (mirror, batch, pipeline). */
    mapping_device_desc desc = {.backend = test_backend()};
    void *freed[KINDS], *orphans[KINDS], *closed_dev_objects[KINDS];
    mapping_device *gone;
    CHECK_OK(mapping_open(&desc, &gone));
    make_objects(gone, freed);
    destroy_objects(freed);
    mapping_mirror *root, *view;
    CHECK_OK(mapping_mirror_create(dev, 64, 0, &root));
    CHECK_OK(mapping_mirror_view(root, 0, 16, &view));
    mapping_mirror_destroy(view);
    mapping_mirror_destroy(root);
    make_objects(gone, closed_dev_objects);
    mapping_close(gone);
    mapping_device *gone2;
    CHECK_OK(mapping_open(&desc, &gone2));
    make_objects(gone2, orphans);
    mapping_close(gone2); /* frees its buffer, stream and event; the rest are orphans */

    int double_frees = 0;
    for (int k = 0; k < KINDS; k++) {
        destroy_again(k, freed[k]);
        double_frees++;
    }
    destroy_again(KIND_MIRROR, view);
    destroy_again(KIND_MIRROR, root);
    double_frees += 2;

    uint64_t seed = 0x9e3779b97f4a7c15ull;
    int tried = 0;
    for (int k = 0; k < KINDS; k++) {
        bad_values v = {0};
        add_bad(&v, freed[k], "freed");
        add_bad(&v, closed_dev_objects[k], k == KIND_DEVICE ? "closed device" : "of a closed device");
        if (k == KIND_MIRROR) {
            add_bad(&v, root, "freed mirror root");
            add_bad(&v, view, "freed mirror view");
        }
        for (int o = 0; o < KINDS; o++)
            if (o != k)
                add_bad(&v, objects[o], kind_names[o]);
        if (k != KIND_MIRROR)
            add_bad(&v, live_view, "mirror view");
        add_bad(&v, host, "host memory");
        add_bad(&v, (void *)&live, "static data");
        add_bad(&v, (char *)objects[k] + 1, "misaligned (+1)");
        add_bad(&v, (char *)objects[k] + 3, "misaligned (+3)");
        add_bad(&v, (char *)objects[k] + 8, "inside the object (+8)");
        add_bad(&v, (char *)objects[k] - 8, "before the object (-8)");
        static const uintptr_t small[] = {1, 2, 3, 4, 8, 16, 64, 255, 4096};
        for (size_t i = 0; i < sizeof small / sizeof small[0]; i++)
            add_bad(&v, (void *)small[i], "small integer");
        for (int i = 0; i < 8; i++)
            add_bad(&v, (void *)(uintptr_t)xorshift(&seed), "random");
        add_bad(&v, (void *)(uintptr_t)(xorshift(&seed) & ~(uint64_t)0xf), "random, aligned");
        add_bad(&v, (void *)UINTPTR_MAX, "all ones");
        add_bad(&v, (void *)(UINTPTR_MAX - 15), "near the top");
        add_bad(&v, (void *)((uintptr_t)1 << 63), "top bit");

        for (size_t c = 0; c < sizeof calls / sizeof calls[0]; c++) {
            if (calls[c].kind != k)
                continue;
            for (int i = 0; i < v.n; i++) {
                mapping_clear_last_error();
                mapping_status st = calls[c].call(v.value[i]);
                tried++;
                if (st != MAPPING_ERR_INVALID_HANDLE)
                    test_fail(__FILE__, __LINE__, "%s(%s %p: %s) gave %s, not ERR_INVALID_HANDLE; last error: %s",
                              calls[c].name, kind_names[k], v.value[i], v.what[i], mapping_status_name(st),
                              mapping_last_error_message());
                if (calls[c].ret != RET_GETTER &&
                    (mapping_last_error() != MAPPING_ERR_INVALID_HANDLE || !mapping_last_error_message()[0]))
                    test_fail(__FILE__, __LINE__, "%s(%s %p: %s) recorded %s with message \"%s\"", calls[c].name,
                              kind_names[k], v.value[i], v.what[i], mapping_status_name(mapping_last_error()),
                              mapping_last_error_message());
            }
        }
    }

    /* The live objects still work, and nothing was changed by the refusals. */
    CHECK(mapping_buffer_size(live.buf) == 64);
    CHECK(mapping_mirror_size(live_view) == 32);
    CHECK(mapping_batch_count(live.b) == 0);
    CHECK_OK(mapping_sync_to_gpu(host, live.buf));
    CHECK_OK(mapping_event_synchronize(live.ev));
    CHECK_OK(mapping_mirror_sync_to_gpu(live.s, live.m));
    CHECK_OK(mapping_stream_synchronize(live.s));
    printf("%d calls with a bad handle refused (%zu functions), %d double frees refused\n", tried,
           sizeof calls / sizeof calls[0], double_frees);

    /* Orphans of a closed device: destroying them frees what is theirs (no
     * leak under ASan) and records the error. */
    for (int k = KIND_MIRROR; k <= KIND_MULTIMIRROR; k++) {
        mapping_clear_last_error();
        if (k == KIND_MIRROR)
            mapping_mirror_destroy(orphans[k]);
        else if (k == KIND_MULTIMIRROR)
            mapping_multimirror_destroy(orphans[k]);
        else if (k == KIND_BATCH)
            mapping_batch_destroy(orphans[k]);
        else
            mapping_pipeline_destroy(orphans[k]);
        CHECK(mapping_last_error() == MAPPING_ERR_INVALID_HANDLE);
    }
    mapping_mirror_destroy(live_view);
    destroy_objects(objects);
}

/* The registry under concurrency: threads create and free buffers (growing
 * and churning the set) while others validate live handles and refuse
 * freed ones; under TSan this checks the lock-free lookups. */
enum { CHURN_THREADS = 4, CHURN_ROUNDS = 300, CHURN_BATCH = 24 };

typedef struct churn {
    mapping_device *dev;
    mapping_buffer *stable;
    int             failures;
} churn;

static void *churn_thread(void *arg)
{
    churn *c = arg;
    unsigned char host[64] = {0};
    mapping_buffer *bufs[CHURN_BATCH];
    for (int r = 0; r < CHURN_ROUNDS; r++) {
        for (int i = 0; i < CHURN_BATCH; i++)
            if (mapping_allocate_gpu(c->dev, 64, &bufs[i]) != MAPPING_OK)
                c->failures++;
        for (int i = 0; i < CHURN_BATCH; i++)
            if (mapping_sync_to_gpu_range(NULL, host, bufs[i], 0, 64) != MAPPING_OK ||
                mapping_buffer_size(c->stable) != 64)
                c->failures++;
        for (int i = 0; i < CHURN_BATCH; i++)
            mapping_free_gpu(bufs[i]);
        /* (A freed address may be reused by another thread at once: made-up
         * values are what is sure to be refused here.) */
        if (mapping_buffer_size((mapping_buffer *)(uintptr_t)(16 * (r + 1))) != 0 ||
            mapping_sync_to_gpu(host, (mapping_buffer *)(uintptr_t)(4096 + r)) != MAPPING_ERR_INVALID_HANDLE)
            c->failures++;
    }
    return NULL;
}

TEST(handles_are_checked_correctly_while_other_threads_create_and_free)
{
    mapping_device *dev = test_device();
    churn c[CHURN_THREADS];
    pthread_t threads[CHURN_THREADS];
    mapping_buffer *stable;
    CHECK_OK(mapping_allocate_gpu(dev, 64, &stable));
    for (int i = 0; i < CHURN_THREADS; i++) {
        c[i] = (churn){dev, stable, 0};
        CHECK(pthread_create(&threads[i], NULL, churn_thread, &c[i]) == 0);
    }
    int failures = 0;
    for (int i = 0; i < CHURN_THREADS; i++) {
        pthread_join(threads[i], NULL);
        failures += c[i].failures;
    }
    CHECK(failures == 0);
    mapping_free_gpu(stable);
}

typedef struct destroyer {
    mapping_batch  *b;
    mapping_mirror *m;
} destroyer;

static void *destroy_both(void *arg)
{
    destroyer *d = arg;
    mapping_batch_destroy(d->b);
    mapping_mirror_destroy(d->m);
    return NULL;
}

/* A loop of adds (or marks) checks its batch (or mirror) once and then
 * remembers it, per thread, until any handle is removed. So the call right
 * after many good ones, on a handle destroyed in between (on this thread or
 * another), is refused, and never reads the freed object (ASan). A new
 * object at the same address is live again. */
TEST(a_batch_or_mirror_destroyed_after_a_loop_of_adds_or_marks_is_refused_at_the_next_call)
{
    mapping_device *dev = test_device();
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, 4096, &buf));
    for (int other_thread = 0; other_thread < 2; other_thread++) {
        mapping_batch *b;
        mapping_mirror *m;
        CHECK_OK(mapping_batch_create(dev, &b));
        CHECK_OK(mapping_mirror_create(dev, 4096, 0, &m));
        for (size_t i = 0; i < 64; i++) {
            CHECK_OK(mapping_batch_add_to_gpu(b, host, buf, i * 64, 64));
            CHECK_OK(mapping_mirror_mark_cpu_modified(m, i * 64, 64));
        }
        if (other_thread) {
            destroyer d = {b, m};
            pthread_t t;
            CHECK(pthread_create(&t, NULL, destroy_both, &d) == 0);
            pthread_join(t, NULL);
        } else {
            mapping_batch_destroy(b);
            mapping_mirror_destroy(m);
        }
        CHECK_STATUS(mapping_batch_add_to_gpu(b, host, buf, 0, 64), MAPPING_ERR_INVALID_HANDLE);
        CHECK_STATUS(mapping_batch_add_to_cpu(b, buf, 0, host, 64), MAPPING_ERR_INVALID_HANDLE);
        CHECK_STATUS(mapping_mirror_mark_cpu_modified(m, 0, 64), MAPPING_ERR_INVALID_HANDLE);
        CHECK_STATUS(mapping_mirror_mark_gpu_modified(m, 0, 64), MAPPING_ERR_INVALID_HANDLE);
        /* A new batch may sit at the old address: it is a live one. */
        mapping_batch *again;
        CHECK_OK(mapping_batch_create(dev, &again));
        CHECK_OK(mapping_batch_add_to_gpu(again, host, buf, 0, 64));
        CHECK(mapping_batch_count(again) == 1);
        if (again != b)
            CHECK_STATUS(mapping_batch_add_to_gpu(b, host, buf, 0, 64), MAPPING_ERR_INVALID_HANDLE);
        CHECK_OK(mapping_batch_flush(NULL, again));
        mapping_batch_destroy(again);
    }
    mapping_free_gpu(buf);
}

/* Objects a mirror, multimirror or pipeline owns and hands out (its GPU
 * side, its replicas, its CPU array, a pipeline's chunk buffers and stream)
 * are refused by the public free / destroy functions: the owner would use
 * them after the free. Nothing is freed; the owner keeps working. */
#define REFUSED_NOT_OWNED(call)                                                                                        \
    do {                                                                                                               \
        mapping_clear_last_error();                                                                                    \
        call;                                                                                                          \
        CHECK(mapping_last_error() == MAPPING_ERR_NOT_OWNED);                                                          \
    } while (0)

static mapping_stream *owned_stream;
static mapping_buffer *owned_input, *owned_output;
static mapping_device *owned_dev;
static int step_calls;

static mapping_status keep_and_copy(mapping_stream *s, const mapping_pipeline_chunk *c, void *user)
{
    (void)user;
    owned_stream = s;
    owned_input = c->input;
    owned_output = c->output;
    if (step_calls++ == 1) {
        mapping_clear_last_error();
        mapping_close(owned_dev); /* from the step: refused, the run goes on */
        if (mapping_last_error() != MAPPING_ERR_BUSY)
            return MAPPING_ERR_INTERNAL;
        mapping_clear_last_error();
        mapping_stream_destroy(s);
        if (mapping_last_error() != MAPPING_ERR_NOT_OWNED)
            return MAPPING_ERR_INTERNAL;
    }
    return mapping_copy_gpu(s, c->input, c->input_offset, c->output, c->output_offset, c->bytes);
}

TEST(objects_owned_by_mirrors_and_pipelines_are_refused_by_the_public_free)
{
    mapping_device *dev = test_device();
    size_t n = 4 * 4096;
    mapping_mirror *m;
    CHECK_OK(mapping_mirror_create(dev, n, 0, &m));
    REFUSED_NOT_OWNED(mapping_free_gpu(mapping_mirror_gpu(m)));
    CHECK(strstr(mapping_last_error_message(), "mirror") != NULL);
    REFUSED_NOT_OWNED(mapping_free_cpu(dev, mapping_mirror_cpu(m)));
    memset(mapping_mirror_cpu(m), 0x3c, n);
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, 0, n));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    test_check_mirror_sides_equal(m);
    mapping_mirror_destroy(m);

    static unsigned char wrapped[2 * 4096];
    CHECK_OK(mapping_mirror_wrap(dev, wrapped, sizeof wrapped, 0, &m));
    REFUSED_NOT_OWNED(mapping_free_gpu(mapping_mirror_gpu(m)));
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    mapping_mirror_destroy(m);

    mapping_multimirror *mm;
    CHECK_OK(mapping_multimirror_create(&dev, 1, n, &mm));
    REFUSED_NOT_OWNED(mapping_free_gpu(mapping_multimirror_gpu(mm, 0)));
    REFUSED_NOT_OWNED(mapping_free_cpu(dev, mapping_multimirror_cpu(mm)));
    CHECK_OK(mapping_multimirror_mark_cpu_modified(mm, 0, n));
    CHECK_OK(mapping_multimirror_sync_to_gpu(NULL, mm, 0));
    mapping_multimirror_destroy(mm);

    owned_dev = dev;
    step_calls = 0;
    mapping_pipeline *p;
    mapping_pipeline_desc d = {.chunk_bytes = 4096, .depth = 2};
    CHECK_OK(mapping_pipeline_create(dev, &d, &p));
    unsigned char *in = malloc(8 * 4096), *out = calloc(1, 8 * 4096);
    CHECK(in && out);
    test_pattern(in, 8 * 4096, 5);
    CHECK_OK(mapping_pipeline_run(p, in, out, 8 * 4096, keep_and_copy, NULL));
    CHECK_BYTES(out, in, 8 * 4096);
    REFUSED_NOT_OWNED(mapping_stream_destroy(owned_stream)); /* between runs */
    REFUSED_NOT_OWNED(mapping_free_gpu(owned_input));
    REFUSED_NOT_OWNED(mapping_free_gpu(owned_output));
    memset(out, 0, 8 * 4096);
    step_calls = 5;
    CHECK_OK(mapping_pipeline_run(p, in, out, 8 * 4096, keep_and_copy, NULL));
    CHECK_BYTES(out, in, 8 * 4096);
    mapping_pipeline_destroy(p);
    free(in);
    free(out);

    /* The program's own allocations are still freed. */
    void *mine;
    CHECK_OK(mapping_allocate_cpu(dev, 4096, &mine));
    mapping_clear_last_error();
    mapping_free_cpu(dev, mine);
    if (mapping_last_error() != MAPPING_OK)
        test_fail(__FILE__, __LINE__, "freeing the program's memory failed: %s", mapping_last_error_message());
}
