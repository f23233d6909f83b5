/*
 * A large blocking flush whose host-to-device copies go in pieces
 * (batch_direct.c h2d_chunks: on a CPU OpenCL device the device scatters
 * one piece while the CPU packs the next), with device-to-host copies after
 * them, and each back-end call it makes failing in turn
 * (mapping__inject_fault_any). After each failed flush:
 * - every copy is done (its destination holds its bytes) or untouched;
 * - a copy no longer queued is done: none is lost;
 * - when the message says which copies completed is unknown, all of them
 *   stay queued (a queued copy may be done: doing it twice is harmless);
 * and the retry lands every byte. Elsewhere (no blocking stream, or staging
 * that is written and read) the flush is the one-pass one: the same checks
 * hold. The first test switches off copies through mapped device memory
 * (mapping__can_map), the second takes them (batch_mapped.c).
 */
#include <stdbool.h>
#include "testing/test_hooks.h"
#include "harness.h"

enum {
    N = 4400,          /* per direction: two pieces or more of host-to-device copies */
    LEN = 24,          /* bytes per copy; slots are 2 * LEN apart: disjoint */
    BUF = N * 2 * LEN, /* device bytes per buffer, and host bytes of the device-to-host side */
    MAX_FAULTS = 400
};

typedef struct pieces_scene {
    mapping_device *dev;
    mapping_buffer *to, *from;        /* to: host-to-device destination; from: device-to-host source */
    unsigned char  *h2d_src, *d2h_dst; /* host sides */
    unsigned char  *from_content, *got;
} pieces_scene;

static size_t slot(size_t i)
{
    return i * 2 * LEN;
}

static void reset(pieces_scene *s)
{
    CHECK_OK(mapping_fill_gpu(NULL, s->to, 0, BUF, 0x11));
    memset(s->d2h_dst, 0x22, BUF);
}

/* Adds every copy, in plan order: the buffer with the lower handle first
 * (host to device always comes first). */
static void add_all(pieces_scene *s, mapping_batch *b)
{
    for (size_t i = 0; i < N; i++)
        CHECK_OK(mapping_batch_add_to_gpu(b, s->h2d_src + slot(i), s->to, slot(i), LEN));
    for (size_t i = 0; i < N; i++)
        CHECK_OK(mapping_batch_add_to_cpu(b, s->from, slot(i), s->d2h_dst + slot(i), LEN));
}

/* Every copy is done or untouched; one no longer queued in b (when b is
 * given) is done. Returns how many are done. */
static size_t check_copies(pieces_scene *s, const mapping_batch *b)
{
    static bool queued[2 * N];
    memset(queued, 0, sizeof queued);
    for (size_t q = 0; b && q < b->count; q++) {
        const batch_copy *c = &b->copies[q];
        queued[(c->to_gpu ? 0 : N) + c->offset / (2 * LEN)] = true;
    }
    size_t done = 0;
    CHECK_OK(mapping_sync_to_cpu(s->to, s->got));
    for (size_t i = 0; i < 2 * N; i++) {
        bool h2d = i < N;
        const unsigned char *at = h2d ? s->got + slot(i) : s->d2h_dst + slot(i - N);
        const unsigned char *want = h2d ? s->h2d_src + slot(i) : s->from_content + slot(i - N);
        bool moved = !memcmp(at, want, LEN), untouched = true;
        for (size_t k = 0; k < LEN; k++)
            untouched &= at[k] == (h2d ? 0x11 : 0x22);
        if (!moved && !untouched)
            CHECK(!"a copy is neither done nor untouched");
        if (!moved && !queued[i])
            CHECK(!"a copy not done is no longer queued: it is lost");
        done += moved;
    }
    return done;
}

static void fail_anywhere(bool mapped)
{
    pieces_scene s = {.dev = test_device()};
    bool was = s.dev->map_copies;
    if (mapped && !was)
        test_skip("back end %s does not copy through mapped memory", test_backend());
    s.dev->map_copies = mapped;
    s.h2d_src = malloc(BUF);
    s.d2h_dst = malloc(BUF);
    s.from_content = malloc(BUF);
    s.got = malloc(BUF);
    CHECK(s.h2d_src && s.d2h_dst && s.from_content && s.got);
    CHECK_OK(mapping_allocate_gpu(s.dev, BUF, &s.to));
    CHECK_OK(mapping_allocate_gpu(s.dev, BUF, &s.from));
    if ((uintptr_t)s.from < (uintptr_t)s.to) { /* plan order: adds keep the batch in order */
        mapping_buffer *t = s.to;
        s.to = s.from;
        s.from = t;
    }
    test_pattern(s.h2d_src, BUF, 31);
    test_pattern(s.from_content, BUF, 32);
    CHECK_OK(mapping_sync_to_gpu(s.from_content, s.from));
    mapping_batch *b;
    CHECK_OK(mapping_batch_create(s.dev, &b));
    int failures = 0, unknown = 0, partial = 0, recovered = 0;
    for (int fault = 0; fault < MAX_FAULTS; fault++) {
        reset(&s);
        add_all(&s, b);
        mapping_clear_last_error();
        mapping__inject_fault_any(s.dev, fault);
        mapping_status st = mapping_batch_flush(NULL, b);
        bool fired = mapping__fault_remaining(s.dev) < 0;
        mapping__inject_fault_any(s.dev, -1);
        if (st == MAPPING_OK) {
            CHECK(mapping_batch_count(b) == 0);
            CHECK(check_copies(&s, NULL) == 2 * N);
            if (!fired)
                break; /* past the flush's last call */
            recovered++; /* the flush tried the failed call again */
            CHECK(mapping_last_error() == MAPPING_OK); /* and records nothing */
            continue;
        }
        failures++;
        size_t queued = mapping_batch_count(b);
        check_copies(&s, b);
        if (strstr(mapping_last_error_message(), "unknown")) {
            CHECK(queued == 2 * N); /* every copy stays queued; some may be done */
            unknown++;
        } else {
            partial += queued < 2 * N;
        }
        CHECK_OK(mapping_batch_flush(NULL, b)); /* the retry lands the rest */
        CHECK(mapping_batch_count(b) == 0 && check_copies(&s, NULL) == 2 * N);
    }
    CHECK(failures >= 2);
    /* Mapped: the two buffers' maps fail the flush; their unmaps are tried
     * again, and the second try succeeds. Nothing else can fail. */
    CHECK(!mapped || (failures == 2 && recovered == 2));
    /* However many pieces, one transfer each way (what is packed, then what is gathered). */
    reset(&s);
    add_all(&s, b);
    mapping_stats before, after;
    CHECK_OK(mapping_device_stats(s.dev, &before));
    CHECK_OK(mapping_batch_flush(NULL, b));
    CHECK_OK(mapping_device_stats(s.dev, &after));
    CHECK(after.h2d_copies - before.h2d_copies == 1 && after.d2h_copies - before.d2h_copies == 1);
    CHECK(check_copies(&s, NULL) == 2 * N);
    printf("%d faults failed the flush: %d left every copy queued (wait failed), %d left part of them; %d were "
           "recovered\n", failures, unknown, partial, recovered);
    mapping_batch_destroy(b);
    mapping_free_gpu(s.to);
    mapping_free_gpu(s.from);
    free(s.h2d_src);
    free(s.d2h_dst);
    free(s.from_content);
    free(s.got);
    s.dev->map_copies = was;
}

TEST(a_flush_in_pieces_that_fails_anywhere_leaves_exactly_the_copies_not_done_queued)
{
    fail_anywhere(false);
}

/* The same flush where the CPU copies through mapped device memory (host,
 * PoCL): when a map fails nothing is done; a failed unmap is retried. */
TEST(a_mapped_flush_that_fails_anywhere_leaves_exactly_the_copies_not_done_queued)
{
    fail_anywhere(true);
}
