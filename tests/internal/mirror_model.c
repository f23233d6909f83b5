/*
 * Model-based random tests of mirrors: random sequences of CPU writes, device
 * writes (mapping_fill_gpu / mapping_copy_gpu, then a mark or an acquire),
 * blocking and stream syncs, views and acquires, checked after every step
 * against a plain byte-array model. A step runs 1..3 (or 1..8) operations back to back
 * (so queued copies meet later operations), then the check waits for the
 * streams and compares every byte.
 *
 * Seeds are printed; MAPPING_TEST_SEED=<n> replays one.
 */
#include "testing/test_hooks.h"
#include "harness.h"

/* 3 seeds x 800 steps: well under 5 s on host and on a slow OpenCL CPU device. */
enum { N = 8192, STEPS = 800, SEEDS = 3, MAX_VIEWS = 4 };

typedef struct model {
    unsigned char value[N];    /* current content of each byte */
    unsigned char stale[2][N]; /* 0 CPU, 1 GPU */
    unsigned char mod[2][N];
} model;

typedef struct world {
    mapping_device *dev;
    mapping_stream *streams[2];
    mapping_mirror *handles[1 + MAX_VIEWS]; /* [0] is the root */
    int             nhandles;
    mapping_buffer *scratch; /* device source for copy_gpu, content scratch_host */
    unsigned char   scratch_host[N];
    model           m;
    unsigned long long rng;
    unsigned        seed;
    int             step;
} world;

static unsigned long long rnd(world *w)
{
    return test_xorshift64(&w->rng);
}

#define FAIL_AT(w, ...)                                                                            \
    do {                                                                                            \
        fprintf(stderr, "seed %u, step %d: ", (w)->seed, (w)->step);                                \
        test_fail(__FILE__, __LINE__, __VA_ARGS__);                                                 \
    } while (0)

#define EXPECT(w, expr, expected)                                                                   \
    do {                                                                                            \
        mapping_status s_ = (expr);                                                                 \
        if (s_ != (expected))                                                                       \
            FAIL_AT(w, "%s returned %s, expected %s (%s)", #expr, mapping_status_name(s_),         \
                    mapping_status_name(expected), mapping_last_error_message());                   \
    } while (0)

/* ---- the model: the library's rules on plain arrays ---- */

static int model_conflict(const model *m, int x, size_t lo, size_t hi)
{
    for (size_t i = lo; i < hi; i++)
        if (m->mod[1 - x][i])
            return 1;
    return 0;
}

static void model_mark(model *m, int x, size_t lo, size_t hi, int discard)
{
    for (size_t i = lo; i < hi; i++) {
        if (discard)
            m->mod[1 - x][i] = 0;
        m->stale[1 - x][i] = 1;
        m->mod[x][i] = 1;
        m->stale[x][i] = 0;
    }
}

static void model_sync(model *m, int t, size_t lo, size_t hi)
{
    for (size_t i = lo; i < hi; i++)
        if (m->stale[t][i]) {
            m->stale[t][i] = 0;
            m->mod[1 - t][i] = 0;
        }
}

static size_t model_stale(const model *m, int side, size_t lo, size_t hi)
{
    size_t n = 0;
    for (size_t i = lo; i < hi; i++)
        n += m->stale[side][i];
    return n;
}

/* ---- the check after every step ---- */

static void check_set(world *w, const mapping_range_set *s, const unsigned char *flags, const char *what)
{
    if (!mapping__rs_valid(s))
        FAIL_AT(w, "%s: range set invariants broken", what);
    mapping_rs_cursor c;
    mapping_range r;
    bool ok = mapping__rs_seek(s, 0, &c, &r);
    for (size_t i = 0; i < N; i++) {
        while (ok && r.hi <= i)
            ok = mapping__rs_next(&c, &r);
        int in = ok && r.lo <= i;
        if (in != flags[i])
            FAIL_AT(w, "%s: byte %zu is %d, model says %d", what, i, in, flags[i]);
    }
}

static void check_world(world *w)
{
    for (int i = 0; i < 2; i++)
        EXPECT(w, mapping_stream_synchronize(w->streams[i]), MAPPING_OK);
    mapping_mirror *root = w->handles[0];
    for (int side = 0; side < 2; side++) {
        size_t got = mapping_mirror_stale_bytes(root, side + 1), want = model_stale(&w->m, side, 0, N);
        if (got != want)
            FAIL_AT(w, "stale bytes on side %d: %zu, model %zu", side + 1, got, want);
    }
    if (mapping__test_mirror_inflight(root) != 0 ||
        mapping__rs_count(mapping__test_mirror_pending(root, MAPPING_CPU)) ||
        mapping__rs_count(mapping__test_mirror_pending(root, MAPPING_GPU)))
        FAIL_AT(w, "queued copies remain after a full stale_bytes query");
    check_set(w, mapping__test_mirror_stale(root, MAPPING_CPU), w->m.stale[0], "stale CPU");
    check_set(w, mapping__test_mirror_stale(root, MAPPING_GPU), w->m.stale[1], "stale GPU");
    check_set(w, mapping__test_mirror_modified(root, MAPPING_CPU), w->m.mod[0], "modified CPU");
    check_set(w, mapping__test_mirror_modified(root, MAPPING_GPU), w->m.mod[1], "modified GPU");
    static unsigned char gpu[N];
    EXPECT(w, mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(root), 0, gpu, N), MAPPING_OK);
    const unsigned char *cpu = mapping_mirror_cpu(root);
    for (size_t i = 0; i < N; i++) {
        if (w->m.stale[0][i] && w->m.stale[1][i])
            FAIL_AT(w, "model: byte %zu stale on both sides", i);
        if (!w->m.stale[0][i] && cpu[i] != w->m.value[i])
            FAIL_AT(w, "CPU byte %zu is 0x%02x, model 0x%02x", i, cpu[i], w->m.value[i]);
        if (!w->m.stale[1][i] && gpu[i] != w->m.value[i])
            FAIL_AT(w, "GPU byte %zu is 0x%02x, model 0x%02x", i, gpu[i], w->m.value[i]);
    }
}

/* ---- operations ---- */

static mapping_stream *pick_stream(world *w)
{
    int k = (int)(rnd(w) % 3);
    return k == 2 ? NULL : w->streams[k];
}

static void sub_range(world *w, mapping_mirror *h, size_t *lo, size_t *hi)
{
    size_t size = mapping_mirror_size(h);
    size_t a = rnd(w) % size, len = 1 + rnd(w) % (rnd(w) % 4 ? 64 : size);
    *lo = mapping_mirror_gpu_offset(h) + a;
    *hi = *lo + (len > size - a ? size - a : len);
}

static void sync_streams(world *w)
{
    for (int i = 0; i < 2; i++)
        EXPECT(w, mapping_stream_synchronize(w->streams[i]), MAPPING_OK);
}

static void op_cpu_write_and_mark(world *w, mapping_mirror *h)
{
    size_t lo, hi, base = mapping_mirror_gpu_offset(h);
    sub_range(w, h, &lo, &hi);
    if (model_conflict(&w->m, 0, lo, hi)) {
        EXPECT(w, mapping_mirror_mark_cpu_modified(h, lo - base, hi - lo), MAPPING_ERR_CONFLICT);
        return;
    }
    sync_streams(w); /* queued copies may read these host bytes */
    unsigned char *cpu = mapping_mirror_cpu(w->handles[0]);
    for (size_t i = lo; i < hi; i++)
        cpu[i] = w->m.value[i] = (unsigned char)rnd(w);
    EXPECT(w, mapping_mirror_mark_cpu_modified(h, lo - base, hi - lo), MAPPING_OK);
    model_mark(&w->m, 0, lo, hi, 0);
}

static void op_gpu_write_and_mark(world *w, mapping_mirror *h)
{
    size_t lo, hi, base = mapping_mirror_gpu_offset(h);
    sub_range(w, h, &lo, &hi);
    if (model_conflict(&w->m, 1, lo, hi)) {
        EXPECT(w, mapping_mirror_mark_gpu_modified(h, lo - base, hi - lo), MAPPING_ERR_CONFLICT);
        return;
    }
    sync_streams(w);
    mapping_buffer *buf = mapping_mirror_gpu(h);
    if (rnd(w) % 2) {
        unsigned char v = (unsigned char)rnd(w);
        EXPECT(w, mapping_fill_gpu(NULL, buf, lo, hi - lo, v), MAPPING_OK);
        memset(w->m.value + lo, v, hi - lo);
    } else {
        size_t src = rnd(w) % (N - (hi - lo) + 1);
        EXPECT(w, mapping_copy_gpu(NULL, w->scratch, src, buf, lo, hi - lo), MAPPING_OK);
        memcpy(w->m.value + lo, w->scratch_host + src, hi - lo);
    }
    EXPECT(w, mapping_mirror_mark_gpu_modified(h, lo - base, hi - lo), MAPPING_OK);
    model_mark(&w->m, 1, lo, hi, 0);
}

static void op_gpu_acquire_write(world *w, mapping_mirror *h)
{
    mapping_stream *s = pick_stream(w);
    size_t base = mapping_mirror_gpu_offset(h), size = mapping_mirror_size(h), lo = base, hi = base + size;
    int discard = rnd(w) % 3 == 0;
    mapping_buffer *buf;
    EXPECT(w, mapping_mirror_acquire_gpu(s, h, discard ? MAPPING_WRITE : MAPPING_READ | MAPPING_WRITE, &buf),
           MAPPING_OK);
    if (discard) {
        model_mark(&w->m, 1, base, base + size, 1);
    } else {
        model_sync(&w->m, 1, base, base + size);
        model_mark(&w->m, 1, base, base + size, 0);
        sub_range(w, h, &lo, &hi); /* read-write: change only part of it */
    }
    if (rnd(w) % 2) {
        unsigned char v = (unsigned char)rnd(w);
        EXPECT(w, mapping_fill_gpu(s, buf, lo, hi - lo, v), MAPPING_OK);
        memset(w->m.value + lo, v, hi - lo);
    } else {
        size_t src = rnd(w) % (N - (hi - lo) + 1);
        EXPECT(w, mapping_copy_gpu(s, w->scratch, src, buf, lo, hi - lo), MAPPING_OK);
        memcpy(w->m.value + lo, w->scratch_host + src, hi - lo);
    }
    EXPECT(w, mapping_mirror_release_gpu(s, h), MAPPING_OK);
}

static void op_cpu_acquire_write(world *w, mapping_mirror *h)
{
    size_t base = mapping_mirror_gpu_offset(h), size = mapping_mirror_size(h), lo = base, hi = base + size;
    int discard = rnd(w) % 3 == 0;
    unsigned char *p;
    EXPECT(w, mapping_mirror_acquire_cpu(h, discard ? MAPPING_WRITE : MAPPING_READ | MAPPING_WRITE, (void **)&p),
           MAPPING_OK);
    if (discard) {
        model_mark(&w->m, 0, base, base + size, 1);
    } else {
        model_sync(&w->m, 0, base, base + size);
        model_mark(&w->m, 0, base, base + size, 0);
        sub_range(w, h, &lo, &hi);
    }
    for (size_t i = lo; i < hi; i++)
        p[i - base] = w->m.value[i] = (unsigned char)rnd(w);
}

static void op_cpu_acquire_read(world *w, mapping_mirror *h)
{
    size_t base = mapping_mirror_gpu_offset(h), size = mapping_mirror_size(h);
    unsigned char *p;
    EXPECT(w, mapping_mirror_acquire_cpu(h, MAPPING_READ, (void **)&p), MAPPING_OK);
    model_sync(&w->m, 0, base, base + size);
    for (size_t i = 0; i < size; i++)
        if (p[i] != w->m.value[base + i])
            FAIL_AT(w, "acquired CPU byte %zu is 0x%02x, model 0x%02x", base + i, p[i], w->m.value[base + i]);
}

static void op_sync(world *w, mapping_mirror *h)
{
    mapping_stream *s = pick_stream(w);
    size_t base = mapping_mirror_gpu_offset(h), size = mapping_mirror_size(h);
    if (rnd(w) % 2) {
        EXPECT(w, mapping_mirror_sync_to_gpu(s, h), MAPPING_OK);
        model_sync(&w->m, 1, base, base + size);
    } else {
        EXPECT(w, mapping_mirror_sync_to_cpu(s, h), MAPPING_OK);
        model_sync(&w->m, 0, base, base + size);
    }
}

static void op_stale_query(world *w, mapping_mirror *h)
{
    size_t base = mapping_mirror_gpu_offset(h), size = mapping_mirror_size(h);
    int side = (int)(rnd(w) % 2);
    size_t got = mapping_mirror_stale_bytes(h, side + 1), want = model_stale(&w->m, side, base, base + size);
    if (got != want)
        FAIL_AT(w, "view [%zu,+%zu) stale on side %d: %zu, model %zu", base, size, side + 1, got, want);
}

static void op_new_view(world *w, mapping_mirror *h)
{
    size_t size = mapping_mirror_size(h), off = rnd(w) % size, len = 1 + rnd(w) % (size - off);
    mapping_mirror *v;
    EXPECT(w, mapping_mirror_view(h, off, len, &v), MAPPING_OK);
    if (w->nhandles < 1 + MAX_VIEWS) {
        w->handles[w->nhandles++] = v;
    } else { /* replace a random view (never the root) */
        int k = 1 + (int)(rnd(w) % MAX_VIEWS);
        if (w->handles[k] == h)
            k = k == MAX_VIEWS ? 1 : k + 1;
        if (w->handles[k] == h) { /* only possible if MAX_VIEWS == 1 */
            mapping_mirror_destroy(v);
            return;
        }
        mapping_mirror_destroy(w->handles[k]);
        w->handles[k] = v;
    }
}

static void run_seed(unsigned seed, unsigned flags, int max_ops)
{
    static world w; /* large: keep it off the stack */
    memset(&w, 0, sizeof w);
    w.seed = seed;
    w.rng = seed * 2654435761ull + 1;
    printf("seed %u (replay with MAPPING_TEST_SEED=%u)\n", seed, seed);
    fflush(stdout);
    w.dev = test_device();
    /* Half the seeds merge nearly every gap, half never merge. */
    mapping_link link = seed % 2 ? (mapping_link){1e-3, 1e9} : (mapping_link){1e-12, 1e9};
    EXPECT(&w, mapping_device_set_link(w.dev, &link), MAPPING_OK);
    for (int i = 0; i < 2; i++)
        EXPECT(&w, mapping_stream_create(w.dev, &w.streams[i]), MAPPING_OK);
    EXPECT(&w, mapping_mirror_create(w.dev, N, flags, &w.handles[0]), MAPPING_OK);
    w.nhandles = 1;
    EXPECT(&w, mapping_allocate_gpu(w.dev, N, &w.scratch), MAPPING_OK);
    test_pattern(w.scratch_host, N, seed);
    EXPECT(&w, mapping_sync_to_gpu(w.scratch_host, w.scratch), MAPPING_OK);
    memset(w.m.value, 0, N); /* a new mirror is zero-filled */
    memset(w.m.stale[1], 1, N);
    check_world(&w);

    for (w.step = 0; w.step < STEPS; w.step++) {
        int ops = 1 + (int)(rnd(&w) % (unsigned)max_ops);
        for (int k = 0; k < ops; k++) {
            mapping_mirror *h = w.handles[rnd(&w) % (unsigned)w.nhandles];
            switch (rnd(&w) % 10) {
            case 0: op_cpu_write_and_mark(&w, h); break;
            case 1: op_gpu_write_and_mark(&w, h); break;
            case 2: op_gpu_acquire_write(&w, h); break;
            case 3: op_cpu_acquire_write(&w, h); break;
            case 4: op_cpu_acquire_read(&w, h); break;
            case 5: case 6: op_sync(&w, h); break;
            case 7: op_stale_query(&w, h); break;
            case 8: op_new_view(&w, h); break;
            default: op_gpu_write_and_mark(&w, h); break;
            }
        }
        check_world(&w);
    }
    for (int i = w.nhandles - 1; i >= 0; i--)
        mapping_mirror_destroy(w.handles[i]);
    mapping_free_gpu(w.scratch);
    for (int i = 0; i < 2; i++)
        mapping_stream_destroy(w.streams[i]);

}

static void run_seeds(unsigned base, unsigned flags, int max_ops)
{
    const char *env = getenv("MAPPING_TEST_SEED");
    if (env && *env) {
        run_seed((unsigned)strtoul(env, NULL, 0), flags, max_ops);
        return;
    }
    for (unsigned s = 0; s < SEEDS; s++)
        run_seed(base + s, flags, max_ops);
}

TEST(mirror_matches_a_byte_model_over_random_steps)
{
    run_seeds(1000, 0, 3);
}

/* On the host back end copies are nearly instant, so queued copies rarely
 * meet later calls. A modelled link (100 us per copy) keeps them in flight. */
TEST(mirror_matches_a_byte_model_with_slow_copies_in_flight)
{
    if (strcmp(test_backend(), "host") != 0)
        test_skip("the modelled link is a host back end feature");
    setenv("MAPPING_HOST_LINK", "2e9,100e-6", 1);
    run_seeds(3000, 0, 8); /* longer runs between checks: more work in flight */
}

TEST(unified_mirror_matches_a_byte_model_over_random_steps)
{
    run_seeds(2000, MAPPING_MIRROR_UNIFIED, 3);
}
