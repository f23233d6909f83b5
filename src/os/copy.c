/*
 * A copy with non-temporal (streaming) stores: the destination's cache lines
 * are written straight to memory, neither read first (an ordinary store
 * reads the line from DRAM before overwriting it: read-for-ownership) nor
 * left in the caches. For a large copy into memory the CPU will not read
 * again soon, that is two DRAM passes per byte instead of three, and it
 * keeps the caches for the data that is reused. glibc's memcpy makes the
 * same choice only above ~3/4 of the last-level cache, per call; the caller
 * here knows more (see backend/host/host_queue.c).
 */
#include <string.h>
#include "os/os.h"

#if defined(__SSE2__)
#include <emmintrin.h>

void mapping_os_copy_streaming(void *dst, const void *src, size_t bytes)
{
    unsigned char *d = dst;
    const unsigned char *s = src;
    /* Head: ordinary stores up to the first 16-byte aligned destination. */
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (head > bytes)
        head = bytes;
    memcpy(d, s, head);
    d += head;
    s += head;
    bytes -= head;
    /* Body: 64 bytes (one cache line's worth) per iteration; the source
     * may be unaligned. */
    for (; bytes >= 64; bytes -= 64, d += 64, s += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(const void *)s);
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(s + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(const void *)(s + 48));
        _mm_stream_si128((__m128i *)(void *)d, a);
        _mm_stream_si128((__m128i *)(void *)(d + 16), b);
        _mm_stream_si128((__m128i *)(void *)(d + 32), c);
        _mm_stream_si128((__m128i *)(void *)(d + 48), e);
    }
    for (; bytes >= 16; bytes -= 16, d += 16, s += 16)
        _mm_stream_si128((__m128i *)(void *)d, _mm_loadu_si128((const __m128i *)(const void *)s));
    /* Streaming stores are weakly ordered: the fence makes them visible
     * before anything this thread does next (an event, a lock release). */
    _mm_sfence();
    memcpy(d, s, bytes); /* tail: fewer than 16 bytes */
}

#else

void mapping_os_copy_streaming(void *dst, const void *src, size_t bytes)
{
    memcpy(dst, src, bytes);
}

#endif
