/*
 * The halo exchange: the stale owned boundary rows to the host, MPI_Irecv /
 * MPI_Isend with the two neighbours, the received halos marked modified on
 * the host and synced to the device; all on the caller's stream. With a
 * CUDA-aware MPI, device memory goes to MPI directly.
 */
#include <stdint.h>
#include "mpi/mpi_internal.h"

enum { TAG_TO_UP = 0x6d01, TAG_TO_DOWN = 0x6d02 };

/* Where a view's bytes lie in device memory (native address; CUDA-aware path). */
static void *device_address(mapping_mpi_darray *a, mapping_mirror *v)
{
    void *base = NULL;
    if (mapping_buffer_native(mapping_mirror_gpu(a->block), &base) != MAPPING_OK)
        return NULL;
    return (char *)base + mapping_mirror_gpu_offset(v);
}

/* Runs the four transfers; a rank posts them even after a local failure, so
 * its neighbours are never left waiting. */
static mapping_status exchange(mapping_mpi_darray *a, void *send_up, void *send_down, void *recv_up, void *recv_down)
{
    MPI_Request req[4];
    int n = 0, h = (int)a->halo, err = MPI_SUCCESS;
    if (a->up != MPI_PROC_NULL) {
        err = MPI_Irecv(recv_up, h, a->row_type, a->up, TAG_TO_DOWN, a->comm, &req[n++]);
        if (err == MPI_SUCCESS)
            err = MPI_Isend(send_up, h, a->row_type, a->up, TAG_TO_UP, a->comm, &req[n++]);
    }
    if (err == MPI_SUCCESS && a->down != MPI_PROC_NULL) {
        err = MPI_Irecv(recv_down, h, a->row_type, a->down, TAG_TO_UP, a->comm, &req[n++]);
        if (err == MPI_SUCCESS)
            err = MPI_Isend(send_down, h, a->row_type, a->down, TAG_TO_DOWN, a->comm, &req[n++]);
    }
    int wait_err = n ? MPI_Waitall(n, req, MPI_STATUSES_IGNORE) : MPI_SUCCESS;
    if (err != MPI_SUCCESS)
        return mapping_mpi__fail_mpi(err, "mapping_mpi_halo_exchange: MPI_Irecv / MPI_Isend");
    if (wait_err != MPI_SUCCESS)
        return mapping_mpi__fail_mpi(wait_err, "mapping_mpi_halo_exchange: MPI_Waitall");
    return MAPPING_OK;
}

static mapping_status step(mapping_status st, mapping_status result, const char *what)
{
    if (st != MAPPING_OK)
        return st;
    return result == MAPPING_OK ? result : mapping_mpi__fail_mapping(result, what);
}

static mapping_status exchange_through_host(mapping_stream *stream, mapping_mpi_darray *a)
{
    mapping_status st = MAPPING_OK;
    mapping_mirror *send[2] = {a->send_up, a->send_down}, *recv[2] = {a->recv_up, a->recv_down};
    void *ptr;
    /* 1. The owned boundary rows, where stale on the host, after the work on
     * `stream`; then wait for exactly those copies. */
    for (int i = 0; i < 2; i++)
        if (send[i])
            st = step(st, mapping_mirror_sync_to_cpu(stream, send[i]), "mapping_mpi_halo_exchange: sync to the host");
    for (int i = 0; i < 2; i++)
        if (send[i])
            st = step(st, mapping_mirror_acquire_cpu(send[i], MAPPING_READ, &ptr),
                      "mapping_mpi_halo_exchange: waiting for the boundary rows");
    /* 3 (first): the halos are overwritten on the host, which marks them
     * modified there; waits for earlier copies of them to the device. */
    for (int i = 0; i < 2; i++)
        if (recv[i])
            st = step(st, mapping_mirror_acquire_cpu(recv[i], MAPPING_WRITE, &ptr),
                      "mapping_mpi_halo_exchange: marking the halos");
    /* 2. MPI, always (see exchange). */
    mapping_status mst = exchange(a, mapping_mirror_cpu(a->send_up), mapping_mirror_cpu(a->send_down),
                                  mapping_mirror_cpu(a->recv_up), mapping_mirror_cpu(a->recv_down));
    if (st == MAPPING_OK)
        st = mst;
    /* 4. The halos to the device, on `stream`. */
    for (int i = 0; i < 2; i++)
        if (recv[i])
            st = step(st, mapping_mirror_sync_to_gpu(stream, recv[i]), "mapping_mpi_halo_exchange: sync to the device");
    return st;
}

/* CUDA-aware MPI: boundary rows valid on the device, halos discarded there
 * (marked modified on the device), the stream drained up to here, then MPI
 * on device addresses. */
static mapping_status exchange_on_device(mapping_stream *stream, mapping_mpi_darray *a)
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
    mapping_status mst =
        exchange(a, a->send_up ? device_address(a, a->send_up) : NULL,
                 a->send_down ? device_address(a, a->send_down) : NULL,
                 a->recv_up ? device_address(a, a->recv_up) : NULL,
                 a->recv_down ? device_address(a, a->recv_down) : NULL);
    return st == MAPPING_OK ? mst : st;
}

mapping_status mapping_mpi_halo_exchange(mapping_stream *stream, mapping_mpi_darray *a)
{
    if (!a)
        return mapping_mpi__fail(MAPPING_ERR_NULL_ARGUMENT, "mapping_mpi_halo_exchange: the array is NULL");
    if (a->halo == 0)
        return MAPPING_OK;
    return a->cuda_aware ? exchange_on_device(stream, a) : exchange_through_host(stream, a);
}
