// The cuda back end's own kernel: scatter and gather for batched copies.
// Shipped as PTX in cuda_kernels_ptx.h (regenerate with
// scripts/regenerate_ptx.sh; see docs/cuda.md), so neither building nor
// running the library needs the CUDA toolkit.
//
// One entry per block (grid-striding over the table); the threads of a block
// copy the entry's bytes with the widest accesses its alignment allows.

struct entry {
    unsigned long long staging_offset; // mapping_scatter_entry, backend.h
    unsigned long long buffer_offset;
    unsigned long long bytes;
};

template <typename T>
__device__ void copy_words(unsigned char *dst, const unsigned char *src, unsigned long long bytes)
{
    T *d = reinterpret_cast<T *>(dst);
    const T *s = reinterpret_cast<const T *>(src);
    unsigned long long n = bytes / sizeof(T);
    for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x)
        d[i] = s[i];
}

// gather == 0: staging[staging_offset..] -> buffer[buffer_offset..] (scatter)
// gather != 0: buffer[buffer_offset..] -> staging[staging_offset..]
extern "C" __global__ void mapping_copy_entries(unsigned char *staging, const entry *table,
                                                unsigned long long count, unsigned char *buffer,
                                                unsigned int gather)
{
    for (unsigned long long e = blockIdx.x; e < count; e += gridDim.x) {
        entry t = table[e];
        unsigned char *dst = gather ? staging + t.staging_offset : buffer + t.buffer_offset;
        const unsigned char *src = gather ? buffer + t.buffer_offset : staging + t.staging_offset;
        unsigned long long align = (unsigned long long)dst | (unsigned long long)src | t.bytes;
        if (align % 16 == 0)
            copy_words<uint4>(dst, src, t.bytes);
        else if (align % 4 == 0)
            copy_words<unsigned int>(dst, src, t.bytes);
        else
            copy_words<unsigned char>(dst, src, t.bytes);
    }
}
