// The cuda back end's own kernel: scatter and gather for batched copies.
// Shipped as PTX in cuda_kernels_ptx.h (regenerate with
// scripts/regenerate_ptx.sh; see docs/cuda.md), so neither building nor
// running the library needs the CUDA toolkit.
//
// Shape: one warp per entry (grid-striding over the table), so a table of
// small entries keeps every lane busy (a 256-thread block per 64-byte entry
// left 7 of its 8 warps idle); an entry larger than `split` bytes is cut
// into pieces of `split` bytes, piece y going to the warps of blocks with
// blockIdx.y == y, so a large merged group is copied by many SMs, not one.
// Each warp copies with the widest accesses the relative alignment of source
// and destination allows (16, 8 or 4 bytes after a short head of single
// bytes), byte by byte only where they are misaligned with each other.

struct entry {
    unsigned long long staging_offset; // mapping_scatter_entry, backend.h
    unsigned long long buffer_offset;
    unsigned long long bytes;
};

// dst and src aligned to sizeof(T): words by the warp's lanes, then the tail.
template <typename T>
__device__ void copy_words(unsigned char *dst, const unsigned char *src, unsigned long long n, unsigned lane)
{
    T *d = reinterpret_cast<T *>(dst);
    const T *s = reinterpret_cast<const T *>(src);
    unsigned long long words = n / sizeof(T);
    for (unsigned long long i = lane; i < words; i += 32)
        d[i] = s[i];
    for (unsigned long long i = words * sizeof(T) + lane; i < n; i += 32)
        dst[i] = src[i];
}

__device__ void copy_piece(unsigned char *dst, const unsigned char *src, unsigned long long n, unsigned lane)
{
    unsigned long long rel = (unsigned long long)dst ^ (unsigned long long)src;
    unsigned a = rel % 16 == 0 ? 16 : rel % 8 == 0 ? 8 : rel % 4 == 0 ? 4 : 1;
    if (a == 1) {
        for (unsigned long long i = lane; i < n; i += 32)
            dst[i] = src[i];
        return;
    }
    unsigned long long head = (a - (unsigned long long)dst % a) % a;
    if (head > n)
        head = n;
    if (lane < head)
        dst[lane] = src[lane];
    dst += head;
    src += head;
    n -= head;
    if (a == 16)
        copy_words<uint4>(dst, src, n, lane);
    else if (a == 8)
        copy_words<unsigned long long>(dst, src, n, lane);
    else
        copy_words<unsigned int>(dst, src, n, lane);
}

// gather == 0: staging[staging_offset..] -> buffer[buffer_offset..] (scatter)
// gather != 0: buffer[buffer_offset..] -> staging[staging_offset..]
// split: bytes per piece (a multiple of 16); gridDim.y pieces cover the
// largest entry.
extern "C" __global__ void mapping_copy_entries(unsigned char *staging, const entry *table,
                                                unsigned long long count, unsigned char *buffer,
                                                unsigned int gather, unsigned long long split)
{
    unsigned lane = threadIdx.x % 32;
    unsigned long long warp = ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    unsigned long long warps = (unsigned long long)gridDim.x * blockDim.x / 32;
    unsigned long long lo = (unsigned long long)blockIdx.y * split;
    for (unsigned long long e = warp; e < count; e += warps) {
        entry t = table[e];
        if (lo >= t.bytes)
            continue;
        unsigned long long n = t.bytes - lo < split ? t.bytes - lo : split;
        unsigned char *dst = (gather ? staging + t.staging_offset : buffer + t.buffer_offset) + lo;
        const unsigned char *src = (gather ? buffer + t.buffer_offset : staging + t.staging_offset) + lo;
        copy_piece(dst, src, n, lane);
    }
}
