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

// Device-side diff of mirrors (mapping_backend.diff_blocks): one 128-thread
// block per 4096-byte block of `mem`, compared with the same block of
// `shadow` in 16-byte words where both are 16-byte aligned (neighbouring
// threads read neighbouring words), else bytes; __syncthreads_or makes the
// block's verdict, a changed block is copied into the shadow the same way,
// and thread 0 writes its flag. Blocks beyond `blocks` only return.
extern "C" __global__ void mapping_diff_blocks(const unsigned char *mem, unsigned char *shadow, unsigned char *flags,
                                               unsigned long long blocks)
{
    unsigned long long b = (unsigned long long)blockIdx.y * gridDim.x + blockIdx.x;
    if (b >= blocks)
        return;
    const unsigned char *a = mem + b * 4096;
    unsigned char *s = shadow + b * 4096;
    bool aligned = (((unsigned long long)a | (unsigned long long)s) & 15) == 0;
    unsigned changed = 0;
    if (aligned) {
        const uint4 *x = reinterpret_cast<const uint4 *>(a);
        const uint4 *y = reinterpret_cast<const uint4 *>(s);
        for (unsigned i = threadIdx.x; i < 256; i += blockDim.x) {
            uint4 p = x[i], q = y[i];
            changed |= (p.x ^ q.x) | (p.y ^ q.y) | (p.z ^ q.z) | (p.w ^ q.w);
        }
    } else {
        for (unsigned i = threadIdx.x; i < 4096; i += blockDim.x)
            changed |= a[i] ^ s[i];
    }
    int any = __syncthreads_or(changed != 0);
    if (any) {
        if (aligned) {
            const uint4 *x = reinterpret_cast<const uint4 *>(a);
            uint4 *y = reinterpret_cast<uint4 *>(s);
            for (unsigned i = threadIdx.x; i < 256; i += blockDim.x)
                y[i] = x[i];
        } else {
            for (unsigned i = threadIdx.x; i < 4096; i += blockDim.x)
                s[i] = a[i];
        }
    }
    if (threadIdx.x == 0)
        flags[b] = any ? 1 : 0;
}

// Graph-replayable copies (mirror syncs recorded in a CUDA graph,
// cuda_graph.c): the table lives in page-locked, mapped host memory and is
// written by the host (a host node of the graph) before this kernel runs, so
// each replay copies what the table says then. table[0] is the count of
// entries (at most `capacity` are read), table[1] is reserved, and entries of
// {offset, bytes} follow; entry e copies host[offset, +bytes) to
// device[offset, ..) (to_host == 0) or back. `host` is the device's address
// of page-locked host memory (cuMemHostGetDevicePointer): the copy is
// zero-copy over the link. A warp per entry, grid-striding; the host cuts
// large ranges into pieces so that the warps share the work. A count of 0
// (nothing stale) reads one word per block and returns.
struct range_entry {
    unsigned long long offset;
    unsigned long long bytes;
};

extern "C" __global__ void mapping_copy_table(const unsigned long long *table, unsigned long long capacity,
                                              unsigned char *host, unsigned char *device, unsigned int to_host)
{
    __shared__ unsigned long long count;
    if (threadIdx.x == 0) {
        unsigned long long n = *(volatile const unsigned long long *)table;
        count = n < capacity ? n : capacity;
    }
    __syncthreads();
    unsigned lane = threadIdx.x % 32;
    unsigned long long warp = ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    unsigned long long warps = (unsigned long long)gridDim.x * blockDim.x / 32;
    const range_entry *entries = reinterpret_cast<const range_entry *>(table + 2);
    for (unsigned long long e = warp; e < count; e += warps) {
        range_entry t = entries[e];
        unsigned char *dst = to_host ? host + t.offset : device + t.offset;
        const unsigned char *src = to_host ? device + t.offset : host + t.offset;
        copy_piece(dst, src, t.bytes, lane);
    }
}
