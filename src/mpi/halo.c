/*
 * The halo exchange: the stale owned boundary rows to the host, MPI_Irecv /
 * MPI_Isend with the two neighbours and, with them, one MPI_Iallreduce that
 * agrees on the local steps' status; the received halos marked modified on
 * the host and synced to the device; all on the caller's stream. With a
 * CUDA-aware MPI, device memory goes to MPI directly. With delta halos
 * (delta.c), only the changed bytes travel, packed.
 */
#include <stdint.h>
#include <stdio.h>
#include "mpi/mpi_internal.h"

enum { TAG_TO_UP = 0x6d01, TAG_TO_DOWN = 0x6d02 };

static const char fn[] = "mapping_mpi_halo_exchange";

/* What one exchange hands to MPI, per side (0 up, 1 down). */
typedef struct transfer {
    void        *send[2], *recv[2];
    int          send_count[2], recv_count[2];
    MPI_Datatype type;
} transfer;

/* Where a view's bytes lie in device memory (native address; CUDA-aware path). */
static void *device_address(mapping_mpi_darray *a, mapping_mirror *v)
{
    void *base = NULL;
    if (mapping_buffer_native(mapping_mirror_gpu(a->block), &base) != MAPPING_OK)
        return NULL;
    return (char *)base + mapping_mirror_gpu_offset(v);
}

static mapping_status step(mapping_status st, mapping_status result, const char *what)
{
    if (st != MAPPING_OK)
        return st;
    return result == MAPPING_OK ? result : mapping_mpi__fail_mapping(result, what);
}

/* Steps before MPI, through the host: the owned boundary rows, where stale
 * on the host, after the work on `stream`, then a wait for exactly those
 * copies; the halos overwritten on the host (marked modified there; waits
 * for earlier copies of them to the device). Delta halos keep the halos'
 * bytes (only the changed ranges are written): a read, which waits too. */
static mapping_status prepare_through_host(mapping_stream *stream, mapping_mpi_darray *a)
{
    mapping_status st = MAPPING_OK;
    mapping_mirror *send[2] = {a->send_up, a->send_down}, *recv[2] = {a->recv_up, a->recv_down};
    void *ptr;
    for (int i = 0; i < 2; i++)
        if (send[i])
            st = step(st, mapping_mirror_sync_to_cpu(stream, send[i]), "mapping_mpi_halo_exchange: sync to the host");
    for (int i = 0; i < 2; i++)
        if (send[i])
            st = step(st, mapping_mirror_acquire_cpu(send[i], MAPPING_READ, &ptr),
                      "mapping_mpi_halo_exchange: waiting for the boundary rows");
    for (int i = 0; i < 2; i++)
        if (recv[i])
            st = step(st, mapping_mirror_acquire_cpu(recv[i], a->delta.on ? MAPPING_READ : MAPPING_WRITE, &ptr),
                      "mapping_mpi_halo_exchange: marking the halos");
    return st;
}

/* CUDA-aware MPI: boundary rows valid on the device, halos discarded there
 * (marked modified on the device), the stream drained up to here. */
static mapping_status prepare_on_device(mapping_stream *stream, mapping_mpi_darray *a)
{
    mapping_status st = MAPPING_OK;
    mapping_mirror *send[2] = {a->send_up, a->send_down}, *recv[2] = {a->recv_up, a->recv_down};
    mapping_buffer *buf;
    for (int i = 0; i < 2; i++)
        if (send[i])
            st = step(st, mapping_mirror_acquire_gpu(stream, send[i], MAPPING_READ, &buf),
                      "mapping_mpi_halo_exchange: boundary rows on the device");
    for (int i = 0; i < 2; i++)
        if (recv[i])
            st = step(st, mapping_mirror_acquire_gpu(stream, recv[i], MAPPING_WRITE, &buf),
                      "mapping_mpi_halo_exchange: marking the halos");
    if (stream)
        st = step(st, mapping_stream_synchronize(stream), "mapping_mpi_halo_exchange: mapping_stream_synchronize");
    return st;
}

/* The buffers and counts: device addresses (CUDA-aware), packed messages
 * (delta; only the header after a local failure), or the host rows. */
static void fill_transfer(mapping_mpi_darray *a, mapping_status st, transfer *t)
{
    mapping_mirror *send[2] = {a->send_up, a->send_down}, *recv[2] = {a->recv_up, a->recv_down};
    int h = (int)a->halo;
    t->type = a->delta.on ? MPI_BYTE : a->row_type;
    for (int s = 0; s < 2; s++) {
        t->send_count[s] = t->recv_count[s] = h;
        if (a->cuda_aware) {
            t->send[s] = send[s] ? device_address(a, send[s]) : NULL;
            t->recv[s] = recv[s] ? device_address(a, recv[s]) : NULL;
        } else if (a->delta.on) {
            if (send[s])
                mapping_mpi__delta_pack(a, s, st == MAPPING_OK ? mapping_mirror_cpu(send[s]) : NULL,
                                        a->halo * a->row_bytes);
            t->send[s] = a->delta.pack[s];
            t->recv[s] = a->delta.unpack[s];
            t->send_count[s] = a->delta.send_bytes[s];
            t->recv_count[s] = (int)a->delta.capacity;
        } else {
            t->send[s] = mapping_mirror_cpu(send[s]);
            t->recv[s] = mapping_mirror_cpu(recv[s]);
        }
    }
}

/* Posts the four transfers (receive then send, up then down); slot[s]: the
 * receive's index in req (-1 at an edge). Counts what was posted. */
static int post(mapping_mpi_darray *a, const transfer *t, MPI_Request *req, int *n, int slot[2])
{
    int nb[2] = {a->up, a->down}, tag_in[2] = {TAG_TO_DOWN, TAG_TO_UP}, tag_out[2] = {TAG_TO_UP, TAG_TO_DOWN};
    int err = MPI_SUCCESS;
    for (int s = 0; s < 2; s++) {
        slot[s] = -1;
        if (nb[s] == MPI_PROC_NULL || err != MPI_SUCCESS)
            continue;
        slot[s] = *n;
        err = MPI_Irecv(t->recv[s], t->recv_count[s], t->type, nb[s], tag_in[s], a->comm, &req[(*n)++]);
        if (err == MPI_SUCCESS)
            err = MPI_Isend(t->send[s], t->send_count[s], t->type, nb[s], tag_out[s], a->comm, &req[(*n)++]);
    }
    return err;
}

/* After MPI: statistics, the delta messages unpacked, and the halos to the
 * device on `stream` (through the host). */
static mapping_status finish(mapping_stream *stream, mapping_mpi_darray *a, const transfer *t, MPI_Status *statuses,
                             const int slot[2])
{
    mapping_mirror *recv[2] = {a->recv_up, a->recv_down};
    size_t element = a->delta.on ? 1 : a->row_bytes;
    mapping_status st = MAPPING_OK;
    a->stats.exchanges++;
    for (int s = 0; s < 2; s++) {
        if (slot[s] < 0)
            continue;
        int got = t->recv_count[s];
        if (a->delta.on)
            MPI_Get_count(&statuses[slot[s]], MPI_BYTE, &got);
        a->stats.mpi_bytes_sent += (uint64_t)t->send_count[s] * element;
        a->stats.mpi_bytes_received += (uint64_t)got * element;
        if (a->cuda_aware || st != MAPPING_OK)
            continue;
        if (a->delta.on)
            st = mapping_mpi__delta_unpack(a, s, recv[s], got);
        st = step(st, mapping_mirror_sync_to_gpu(stream, recv[s]), "mapping_mpi_halo_exchange: sync to the device");
    }
    return st;
}

/* The agreement's outcome: the local failure (its message kept), another
 * rank's, or success. A failed exchange leaves the delta copies unknown. */
static mapping_status agreed(mapping_mpi_darray *a, mapping_status local, const char *message, int value, int rank)
{
    if (local == MAPPING_OK && value == MAPPING_OK)
        return MAPPING_OK;
    a->delta.shadow_valid[0] = a->delta.shadow_valid[1] = false;
    if (local != MAPPING_OK)
        return mapping_mpi__fail(local, "%s", message);
    return mapping_mpi__fail((mapping_status)value, "%s: failed on rank %d (%s); see that rank's message", fn, rank,
                             mapping_status_name((mapping_status)value));
}

mapping_status mapping_mpi_halo_exchange(mapping_stream *stream, mapping_mpi_darray *a)
{
    if (!a)
        return mapping_mpi__fail(MAPPING_ERR_NULL_ARGUMENT, "%s: the array is NULL", fn);
    mapping_status st = mapping_mpi__usable(a, fn);
    if (st != MAPPING_OK || a->halo == 0)
        return st;
    st = mapping_mpi__local(a, MAPPING_OK); /* a failure deferred from the last call */
    if (st == MAPPING_OK)
        st = a->cuda_aware ? prepare_on_device(stream, a) : prepare_through_host(stream, a);
    transfer t;
    fill_transfer(a, st, &t);
    MPI_Request req[5] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    int n = 0, slot[2];
    int err = post(a, &t, req, &n, slot); /* always: the neighbours never wait forever */
    if (err != MPI_SUCCESS && st == MAPPING_OK)
        st = mapping_mpi__fail_mpi(err, "mapping_mpi_halo_exchange: MPI_Irecv / MPI_Isend");
    char message[512] = "";
    if (st != MAPPING_OK)
        snprintf(message, sizeof message, "%s", mapping_mpi_last_error_message());
    int *agree = a->agree; /* in the array: MPI may write it after a wait given up (the array is then leaked) */
    agree[0] = (int)st;
    agree[1] = a->rank;
    err = MPI_Iallreduce(agree, agree + 2, 1, MPI_2INT, MPI_MINLOC, a->comm, &req[n]);
    MPI_Status statuses[5];
    if (err == MPI_SUCCESS)
        err = mapping_mpi__wait(a, n + 1, req, statuses);
    if (err != MPI_SUCCESS)
        return mapping_mpi__waited(err, "mapping_mpi_halo_exchange: MPI_Waitall");
    if ((st = agreed(a, st, message, agree[2], agree[3])) != MAPPING_OK)
        return st;
    return mapping_mpi__defer(a, finish(stream, a, &t, statuses, slot));
}
