/*
 * A stable LSD radix sort of ranges by lo (hi rides along): the mirror's
 * mark log sorts its marks with it, and a batch's plan its copies (lo the
 * copy's packed key, hi its index).
 *
 * Only the bits in which the keys differ are sorted (marks at 64-byte slots
 * share their low six bits; a buffer's offsets leave the high ones zero), in
 * as few passes of at most 11 bits (8 for a small array) as that takes, each
 * pass as narrow as the passes allow: fewer buckets, whose write fronts stay
 * in the L1 cache.
 */
#include <string.h>
#include "core/core.h"

mapping_range *mapping__radix_sort(mapping_range *v, mapping_range *tmp, size_t n)
{
    enum { MAX_BITS = 11 };
    size_t any = 0, all = ~(size_t)0;
    for (size_t i = 0; i < n; i++) {
        any |= v[i].lo;
        all &= v[i].lo;
    }
    size_t differ = any ^ all;
    if (!differ)
        return v; /* all equal */
    unsigned from = (unsigned)__builtin_ctzll(differ), to = 64 - (unsigned)__builtin_clzll(differ);
    /* Small arrays: fewer buckets, so clearing and summing them stays small. */
    const unsigned max_bits = n < 4096 ? 8 : MAX_BITS;
    unsigned passes = (to - from + max_bits - 1) / max_bits, bits = (to - from + passes - 1) / passes;
    const size_t buckets = (size_t)1 << bits, mask = buckets - 1;
    size_t count[1 << MAX_BITS];
    for (unsigned shift = from; shift < to; shift += bits) {
        memset(count, 0, buckets * sizeof *count);
        for (size_t i = 0; i < n; i++)
            count[(v[i].lo >> shift) & mask]++;
        size_t at = 0;
        for (size_t b = 0; b < buckets; b++) {
            size_t here = count[b];
            count[b] = at;
            at += here;
        }
        for (size_t i = 0; i < n; i++)
            tmp[count[(v[i].lo >> shift) & mask]++] = v[i];
        mapping_range *t = v;
        v = tmp;
        tmp = t;
    }
    return v;
}
