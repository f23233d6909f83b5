/*
 * A mirror's many-range syncs against a byte model. Each seeded round marks
 * 16..80 ranges (sometimes fewer) as modified, on the CPU side, the GPU
 * side, or both (then disjoint), marked in ascending order or shuffled,
 * touching, a few bytes apart or far apart, mostly 1..512 bytes, sometimes
 * 64 KiB and more; then syncs, blocking or on a stream. From 16 ranges a
 * sync goes through a batch: ranges in order and all small take the
 * one-pass path straight from the mirror's range list, a large one the
 * general flush. After each round both sides must hold the model's bytes
 * and nothing may be stale.
 *
 * Seeds are printed; MAPPING_TEST_SEED=<n> runs that one round alone.
 */
#include "harness.h"

enum { N = 192 << 10, MAX_RANGES = 80, ROUNDS = 150, LARGE = 64 << 10 };

typedef struct range {
    size_t off, len;
    int    gpu; /* the side that modified it */
} range;

typedef struct mworld {
    mapping_device *dev;
    mapping_stream *stream;
    mapping_mirror *m;
    unsigned char   model[N], got[N], fresh[N];
    range           ranges[MAX_RANGES];
    size_t          n;
    unsigned long long rng;
    unsigned        seed;
    int             batched_rounds, large_rounds;
} mworld;

static unsigned long long rnd(mworld *w)
{
    return test_xorshift64(&w->rng);
}

static size_t below(mworld *w, size_t n)
{
    return (size_t)(rnd(w) % n);
}

#define FAIL_AT(w, ...)                                                                                      \
    do {                                                                                                     \
        fprintf(stderr, "seed %u (%zu ranges): ", (w)->seed, (w)->n);                                        \
        test_fail(__FILE__, __LINE__, __VA_ARGS__);                                                          \
    } while (0)

/* Ascending, disjoint ranges (touching or not); then maybe shuffled. */
static void generate(mworld *w, int sides, int *large)
{
    int large_round = below(w, 6) == 0;
    size_t want = below(w, 5) == 0 ? 1 + below(w, 15) : 16 + below(w, MAX_RANGES - 15);
    size_t at = below(w, 4096);
    *large = 0;
    w->n = 0;
    while (w->n < want) {
        size_t len = below(w, 8) == 0 ? 1 + below(w, 4) : 1 + below(w, 512);
        if (large_round && !*large && below(w, 20) == 0) {
            len = LARGE + below(w, 8192);
            *large = 1;
        }
        if (at + len > N)
            break;
        int gpu = sides == 2 ? (int)below(w, 2) : sides;
        w->ranges[w->n++] = (range){at, len, gpu};
        unsigned gap = (unsigned)below(w, 4);
        at += len + (gap == 0 ? 0 : gap == 1 ? 1 + below(w, 8) : gap == 2 ? 64 + below(w, 200) : below(w, 3000));
    }
    if (below(w, 2))
        for (size_t i = w->n; i > 1; i--) {
            size_t j = below(w, i);
            range t = w->ranges[i - 1];
            w->ranges[i - 1] = w->ranges[j];
            w->ranges[j] = t;
        }
}

static void check_sides(mworld *w)
{
    if (mapping_mirror_stale_bytes(w->m, MAPPING_CPU) || mapping_mirror_stale_bytes(w->m, MAPPING_GPU))
        FAIL_AT(w, "bytes are stale after both syncs: %zu on the CPU, %zu on the GPU",
                mapping_mirror_stale_bytes(w->m, MAPPING_CPU), mapping_mirror_stale_bytes(w->m, MAPPING_GPU));
    const unsigned char *cpu = mapping_mirror_cpu(w->m);
    CHECK_OK(mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(w->m), mapping_mirror_gpu_offset(w->m), w->got, N));
    for (size_t i = 0; i < N; i++) {
        if (cpu[i] != w->model[i])
            FAIL_AT(w, "CPU byte %zu is 0x%02x, the model says 0x%02x", i, cpu[i], w->model[i]);
        if (w->got[i] != w->model[i])
            FAIL_AT(w, "GPU byte %zu is 0x%02x, the model says 0x%02x", i, w->got[i], w->model[i]);
    }
}

static void sync_side(mworld *w, int to_gpu, mapping_stream *s)
{
    mapping_stats before = test_stats(w->dev);
    CHECK_OK((to_gpu ? mapping_mirror_sync_to_gpu : mapping_mirror_sync_to_cpu)(s, w->m));
    if (s)
        CHECK_OK(mapping_stream_synchronize(s));
    mapping_stats after = test_stats(w->dev);
    if (to_gpu ? after.h2d_copies == before.h2d_copies : after.d2h_copies == before.d2h_copies)
        FAIL_AT(w, "a sync %s of modified ranges moved nothing", to_gpu ? "to the GPU" : "to the CPU");
}

static void run_round(mworld *w, unsigned seed)
{
    w->seed = seed;
    w->rng = 0xD1B54A32D192ED03ull ^ ((unsigned long long)seed * 0x9E3779B97F4A7C15ull);
    rnd(w);
    int sides = (int)below(w, 3), large; /* 0: CPU, 1: GPU, 2: both */
    generate(w, sides, &large);
    mapping_stream *s = below(w, 3) == 0 ? w->stream : NULL;
    test_pattern(w->fresh, N, seed);
    unsigned char *cpu = mapping_mirror_cpu(w->m);
    mapping_buffer *gpu = mapping_mirror_gpu(w->m);
    size_t base = mapping_mirror_gpu_offset(w->m);
    int cpu_marks = 0, gpu_marks = 0;
    for (size_t i = 0; i < w->n; i++) {
        const range *r = &w->ranges[i];
        if (r->gpu) {
            unsigned char v = (unsigned char)rnd(w);
            CHECK_OK(mapping_fill_gpu(NULL, gpu, base + r->off, r->len, v));
            memset(w->model + r->off, v, r->len);
            CHECK_OK(mapping_mirror_mark_gpu_modified(w->m, r->off, r->len));
            gpu_marks++;
        } else {
            memcpy(cpu + r->off, w->fresh + r->off, r->len);
            memcpy(w->model + r->off, w->fresh + r->off, r->len);
            CHECK_OK(mapping_mirror_mark_cpu_modified(w->m, r->off, r->len));
            cpu_marks++;
        }
    }
    int gpu_first = (int)below(w, 2);
    for (int k = 0; k < 2; k++) {
        int to_gpu = k == gpu_first;
        if (to_gpu ? cpu_marks : gpu_marks)
            sync_side(w, to_gpu, s);
    }
    check_sides(w);
    w->batched_rounds += (cpu_marks >= 16 || gpu_marks >= 16) && !large;
    w->large_rounds += (cpu_marks >= 16 || gpu_marks >= 16) && large;
}

TEST(mirror_many_range_syncs_match_a_byte_model)
{
    static mworld W; /* large: off the stack */
    mworld *w = &W;
    w->dev = test_device();
    CHECK_OK(mapping_stream_create(w->dev, &w->stream));
    w->m = test_synced_mirror(w->dev, N, 0, 7);
    memcpy(w->model, mapping_mirror_cpu(w->m), N);
    const char *env = getenv("MAPPING_TEST_SEED");
    if (env) {
        unsigned seed = (unsigned)strtoul(env, NULL, 10);
        printf("seed %u\n", seed);
        run_round(w, seed);
    } else {
        for (unsigned seed = 1; seed <= ROUNDS; seed++)
            run_round(w, seed);
        printf("%d rounds, %d with 16 or more small ranges on a side, %d with a large one too "
               "(replay one with MAPPING_TEST_SEED=<1..%d>)\n",
               ROUNDS, w->batched_rounds, w->large_rounds, ROUNDS);
        CHECK(w->batched_rounds >= 10 && w->large_rounds >= 1);
    }
    mapping_mirror_destroy(w->m);
    mapping_stream_destroy(w->stream);
}
