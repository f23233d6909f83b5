/*
 * Delta halos: an exchange sends, per neighbour, only the 64-byte granules of
 * its boundary rows that differ from what it sent last time (a copy, the
 * shadow, is kept per side), as one message:
 *
 *     uint32 count, uint32 data bytes, count x (uint32 offset, uint32 bytes), the bytes
 *
 * The receiver writes the ranges into its halo rows on the host, marks them
 * modified there, and the exchange syncs only them to the device. Both sides
 * agree on the ranges by construction: the receiver's halo holds exactly what
 * the sender's shadow holds, since every exchange that failed anywhere drops
 * the shadows (the next one sends everything).
 */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "mpi/mpi_internal.h"

enum { GRANULE = 64, MAX_RANGES = 64, HEADER = 8, RANGE = 8 };

/* Appends granule [off, off + len) to the ranges; past MAX_RANGES the last
 * range grows over the gap (unchanged bytes sent: still correct). */
static void add_range(uint32_t *r, int *count, size_t off, size_t len)
{
    int c = *count;
    if (c > 0 && r[2 * c - 2] + r[2 * c - 1] == off) {
        r[2 * c - 1] += (uint32_t)len;
    } else if (c == MAX_RANGES) {
        r[2 * c - 1] = (uint32_t)(off + len - r[2 * c - 2]);
    } else {
        r[2 * c] = (uint32_t)off;
        r[2 * c + 1] = (uint32_t)len;
        *count = c + 1;
    }
}

void mapping_mpi__delta_pack(mapping_mpi_darray *a, int s, const unsigned char *rows, size_t n)
{
    mapping_mpi__delta *d = &a->delta;
    uint32_t r[2 * MAX_RANGES];
    int count = 0;
    for (size_t off = 0; rows && off < n; off += GRANULE) {
        size_t len = n - off < GRANULE ? n - off : GRANULE;
        if (!d->shadow_valid[s] || memcmp(rows + off, d->shadow[s] + off, len) != 0)
            add_range(r, &count, off, len);
    }
    unsigned char *out = d->pack[s], *data = out + HEADER + (size_t)count * RANGE;
    uint32_t total = 0;
    for (int i = 0; i < count; i++) {
        memcpy(data + total, rows + r[2 * i], r[2 * i + 1]);
        memcpy(d->shadow[s] + r[2 * i], rows + r[2 * i], r[2 * i + 1]);
        total += r[2 * i + 1];
    }
    uint32_t head[2] = {(uint32_t)count, total};
    memcpy(out, head, sizeof head);
    memcpy(out + HEADER, r, (size_t)count * RANGE);
    d->send_bytes[s] = (int)(HEADER + (size_t)count * RANGE + total);
    d->shadow_valid[s] = rows != NULL;
    if (rows)
        a->stats.delta_bytes_saved += n - total;
}

mapping_status mapping_mpi__delta_unpack(mapping_mpi_darray *a, int s, mapping_mirror *halo, int received)
{
    const unsigned char *in = a->delta.unpack[s];
    size_t n = a->halo * a->row_bytes;
    uint32_t head[2] = {0, 0}, r[2 * MAX_RANGES];
    if (received >= HEADER)
        memcpy(head, in, sizeof head);
    size_t expect = HEADER + (size_t)head[0] * RANGE + head[1];
    if (received < HEADER || head[0] > MAX_RANGES || head[1] > n || expect != (size_t)received)
        return mapping_mpi__fail(MAPPING_ERR_INTERNAL, "mapping_mpi_halo_exchange: a delta message of %d bytes from "
                                 "rank %d does not parse", received, s == 0 ? a->up : a->down);
    memcpy(r, in + HEADER, (size_t)head[0] * RANGE);
    const unsigned char *data = in + HEADER + (size_t)head[0] * RANGE;
    unsigned char *cpu = mapping_mirror_cpu(halo);
    for (uint32_t i = 0; i < head[0]; i++) {
        size_t off = r[2 * i], len = r[2 * i + 1];
        if (off > n || len > n - off)
            return mapping_mpi__fail(MAPPING_ERR_INTERNAL, "mapping_mpi_halo_exchange: a delta range [%zu, +%zu) "
                                     "lies past the halo's %zu bytes", off, len, n);
        memcpy(cpu + off, data, len);
        data += len;
        mapping_status st = mapping_mirror_mark_cpu_modified(halo, off, len);
        if (st != MAPPING_OK)
            return mapping_mpi__fail_mapping(st, "mapping_mpi_halo_exchange: marking a delta range");
    }
    return MAPPING_OK;
}

void mapping_mpi__delta_free(mapping_mpi_darray *a)
{
    mapping_mpi__delta *d = &a->delta;
    for (int s = 0; s < 2; s++) {
        free(d->shadow[s]);
        free(d->pack[s]);
        free(d->unpack[s]);
        d->shadow[s] = d->pack[s] = d->unpack[s] = NULL;
        d->shadow_valid[s] = false;
    }
    d->on = false;
}

/* This rank's buffers for delta messages (0, or a failure recorded). */
static mapping_status delta_alloc(mapping_mpi_darray *a)
{
    mapping_mpi__delta *d = &a->delta;
    size_t n = a->halo * a->row_bytes;
    if (n > (size_t)INT_MAX - HEADER - (size_t)MAX_RANGES * RANGE)
        return mapping_mpi__fail(MAPPING_ERR_INVALID_ARGUMENT,
                                 "mapping_mpi_darray_set_delta: a halo of %zu bytes is too large for one message", n);
    d->capacity = HEADER + (size_t)MAX_RANGES * RANGE + n;
    for (int s = 0; s < 2; s++) {
        if (!d->shadow[s])
            d->shadow[s] = malloc(n ? n : 1);
        if (!d->pack[s])
            d->pack[s] = malloc(d->capacity);
        if (!d->unpack[s])
            d->unpack[s] = malloc(d->capacity);
        if (!d->shadow[s] || !d->pack[s] || !d->unpack[s])
            return mapping_mpi__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "mapping_mpi_darray_set_delta: out of memory");
    }
    return MAPPING_OK;
}

mapping_status mapping_mpi_darray_set_delta(mapping_mpi_darray *a, int on)
{
    static const char fn[] = "mapping_mpi_darray_set_delta";
    if (!a)
        return mapping_mpi__fail(MAPPING_ERR_NULL_ARGUMENT, "%s: the array is NULL", fn);
    mapping_status st = mapping_mpi__usable(a, fn);
    if (st != MAPPING_OK)
        return st;
    int *v = mapping_mpi__scratch(6 * sizeof *v); /* on, -on, cuda_aware; their maxima */
    if (!v)
        return mapping_mpi__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory", fn);
    v[0] = on != 0;
    v[1] = -(on != 0);
    v[2] = a->cuda_aware;
    MPI_Request req;
    int err = MPI_Iallreduce(v, v + 3, 3, MPI_INT, MPI_MAX, a->comm, &req);
    if (err == MPI_SUCCESS)
        err = mapping_mpi__wait(a, 1, &req, MPI_STATUSES_IGNORE);
    int differs = v[3] != -v[4], cuda = v[5];
    mapping_mpi__done(err, v);
    if (err != MPI_SUCCESS)
        return mapping_mpi__waited(err, "mapping_mpi_darray_set_delta: MPI_Iallreduce");
    if (differs)
        return mapping_mpi__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: on differs across ranks (this rank: %d)", fn,
                                 on != 0);
    if (on && cuda)
        return mapping_mpi__fail(MAPPING_ERR_UNSUPPORTED, "%s: delta halos go through the host; this array's exchange "
                                 "is CUDA-aware (device memory to MPI) on some rank", fn);
    st = on && a->halo ? delta_alloc(a) : MAPPING_OK;
    if ((st = mapping_mpi__agree(a, a->comm, mapping_mpi__local(a, st), fn)) != MAPPING_OK)
        return st;
    if (!on)
        mapping_mpi__delta_free(a);
    a->delta.on = on && a->halo;
    a->delta.shadow_valid[0] = a->delta.shadow_valid[1] = false;
    return MAPPING_OK;
}
