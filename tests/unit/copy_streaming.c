/* mapping_os_copy_streaming against memcpy: every combination of size
 * (around the 16-byte head, the 64-byte body and the tail) and of source and
 * destination misalignment, with guard bytes on both sides of the
 * destination that must stay untouched. */
#include "harness.h"
#include "os/os.h"

enum { GUARD = 64, MAX_BYTES = 1000, SPAN = GUARD + 16 + MAX_BYTES + GUARD };

static void fill_pattern(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(i * 131u + seed * 7u + (i >> 8));
}

static void check_copy(size_t bytes, size_t src_misalign, size_t dst_misalign)
{
    static _Alignas(64) unsigned char src[SPAN], got[SPAN], want[SPAN];
    fill_pattern(src, SPAN, 1);
    fill_pattern(got, SPAN, 2);
    memcpy(want, got, SPAN);
    unsigned char *d_got = got + GUARD + dst_misalign, *d_want = want + GUARD + dst_misalign;
    const unsigned char *s = src + GUARD + src_misalign;
    memcpy(d_want, s, bytes);
    mapping_os_copy_streaming(d_got, s, bytes);
    for (size_t i = 0; i < SPAN; i++)
        if (got[i] != want[i])
            test_fail(__FILE__, __LINE__, "%zu bytes, src +%zu, dst +%zu: byte %zu of the span is %u, memcpy gives %u",
                      bytes, src_misalign, dst_misalign, i, got[i], want[i]);
}

UNIT_TEST(streaming_copy_equals_memcpy_for_any_size_and_alignment)
{
    for (size_t bytes = 0; bytes <= 300; bytes++)
        for (size_t sa = 0; sa < 16; sa += 3)
            for (size_t da = 0; da < 16; da++)
                check_copy(bytes, sa, da);
    /* Larger sizes: many body iterations plus every tail length. */
    for (size_t bytes = MAX_BYTES - 80; bytes <= MAX_BYTES; bytes++)
        check_copy(bytes, bytes % 16, (bytes * 5) % 16);
}

UNIT_TEST(streaming_copy_of_megabytes_equals_memcpy)
{
    /* Above the size where the host back end starts to use it. */
    size_t bytes = ((size_t)3 << 20) + 77;
    unsigned char *src = malloc(bytes + 16), *dst = malloc(bytes + 32);
    CHECK(src && dst);
    fill_pattern(src, bytes + 16, 3);
    memset(dst, 0xA5, bytes + 32);
    mapping_os_copy_streaming(dst + 9, src + 5, bytes);
    CHECK(memcmp(dst + 9, src + 5, bytes) == 0);
    for (size_t i = 0; i < 9; i++)
        CHECK(dst[i] == 0xA5);
    for (size_t i = bytes + 9; i < bytes + 32; i++)
        CHECK(dst[i] == 0xA5);
    free(src);
    free(dst);
}
