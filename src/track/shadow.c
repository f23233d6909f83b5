/* A shadow of tracked memory (shadow.h). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "os/os.h"
#include "track/shadow.h"

/* A large shadow's pages are faulted in when it is made: a collect writes a
 * changed byte into a page of it, and a page fault there (a zero page made
 * private: ~5-8 us on a VM) would cost more than the rest of a 1-byte sync.
 * A small one comes from the heap, whose pages are mostly in use already
 * (a program that wraps and ends many small tracked arrays pays no mmap). */

int mapping_track_shadow_init(mapping_track_shadow *s, const void *content, size_t size)
{
    s->size = size ? size : 1;
    if (s->size < MAPPING_TRACK_SHADOW_LOCK_MIN)
        s->bytes = content ? mapping_os_malloc(s->size) : mapping_os_calloc(1, s->size);
    else
        s->bytes = mapping_os_alloc_pages(s->size);
    if (!s->bytes)
        return -ENOMEM;
    if (content)
        memcpy(s->bytes, content, size);
    return 0;
}

void mapping_track_shadow_free(mapping_track_shadow *s)
{
    if (s->size < MAPPING_TRACK_SHADOW_LOCK_MIN)
        free(s->bytes);
    else
        mapping_os_free_pages(s->bytes, s->size);
    s->bytes = NULL;
    s->size = 0;
}

static uint64_t load64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The first i in [i, hi) where a and b differ, or hi: memcmp (the C
 * library's, vectorised) over 256-byte blocks, then eight bytes at a time
 * in the block that differs. */
static size_t first_change(const unsigned char *a, const unsigned char *b, size_t i, size_t hi)
{
    for (; i + 256 <= hi && memcmp(a + i, b + i, 256) == 0; i += 256)
        ;
    for (; i + 32 <= hi; i += 32)
        if ((load64(a + i) ^ load64(b + i)) | (load64(a + i + 8) ^ load64(b + i + 8)) |
            (load64(a + i + 16) ^ load64(b + i + 16)) | (load64(a + i + 24) ^ load64(b + i + 24)))
            break;
    for (; i + 8 <= hi && load64(a + i) == load64(b + i); i += 8)
        ;
    for (; i < hi && a[i] == b[i]; i++)
        ;
    return i;
}

/* Does the word x have a zero byte? */
static bool has_zero_byte(uint64_t x)
{
    return ((x - 0x0101010101010101u) & ~x & 0x8080808080808080u) != 0;
}

/* The first i in [i, hi) where a and b are equal, or hi. */
static size_t first_same(const unsigned char *a, const unsigned char *b, size_t i, size_t hi)
{
    for (; i + 8 <= hi && !has_zero_byte(load64(a + i) ^ load64(b + i)); i += 8)
        ;
    for (; i < hi && a[i] != b[i]; i++)
        ;
    return i;
}

/* The changed runs of one page [lo, hi), joined across gaps under `gap`
 * bytes (0: none), into v (at most cap); returns how many there are, which
 * is cap + 1 when they do not fit. */
static size_t page_runs(const unsigned char *mem, const unsigned char *sh, size_t lo, size_t hi, size_t gap,
                        size_t (*v)[2], size_t cap)
{
    size_t n = 0;
    for (size_t i = first_change(mem, sh, lo, hi); i < hi; i = first_change(mem, sh, i, hi)) {
        size_t j = first_same(mem, sh, i, hi);
        if (n && i - v[n - 1][1] < gap) {
            v[n - 1][1] = j;
        } else {
            if (n == cap)
                return cap + 1;
            v[n][0] = i;
            v[n++][1] = j;
        }
        i = j;
    }
    return n;
}

void mapping_track_shadow_diff(mapping_track_shadow *s, const unsigned char *mem, size_t lo, size_t hi, size_t page,
                               mapping_track_shadow_fn fn, void *user)
{
    size_t runs[MAPPING_TRACK_SHADOW_RUNS][2];
    hi = hi < s->size ? hi : s->size;
    for (size_t a = lo; a < hi;) {
        size_t b = (a / page + 1) * page;
        b = b < hi ? b : hi;
        size_t n = page_runs(mem, s->bytes, a, b, 0, runs, MAPPING_TRACK_SHADOW_RUNS);
        if (n > MAPPING_TRACK_SHADOW_RUNS) /* a dense update: join what is close */
            n = page_runs(mem, s->bytes, a, b, MAPPING_TRACK_SHADOW_GAP, runs, MAPPING_TRACK_SHADOW_RUNS);
        if (n > MAPPING_TRACK_SHADOW_RUNS) { /* still many: the page's changed span, whole */
            runs[0][0] = first_change(mem, s->bytes, a, b);
            runs[0][1] = b;
            while (runs[0][1] > runs[0][0] && mem[runs[0][1] - 1] == s->bytes[runs[0][1] - 1])
                runs[0][1]--;
            n = 1;
        }
        for (size_t k = 0; k < n; k++) {
            memcpy(s->bytes + runs[k][0], mem + runs[k][0], runs[k][1] - runs[k][0]);
            fn(user, runs[k][0], runs[k][1]);
        }
        a = b;
    }
}

void mapping_track_shadow_take(mapping_track_shadow *s, const unsigned char *mem, size_t lo, size_t hi)
{
    hi = hi < s->size ? hi : s->size;
    if (lo < hi)
        memcpy(s->bytes + lo, mem + lo, hi - lo);
}
