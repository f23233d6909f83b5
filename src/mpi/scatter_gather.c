/* Scatter from a root rank to the owned rows, and gather back to it. */
#include "mpi/mpi_internal.h"

/* Every rank checks root and (on root) the array pointer; all agree, so a
 * bad root or a NULL array on root fails every rank instead of hanging. A
 * failure deferred from the last call on a rank fails them all too. */
static mapping_status check_root(mapping_mpi_darray *a, const void *global, int root, const char *fn)
{
    mapping_status st = mapping_mpi__usable(a, fn);
    if (st != MAPPING_OK)
        return st;
    if (root < 0 || root >= a->size)
        st = mapping_mpi__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: root %d is not a rank of the array's %d", fn, root,
                               a->size);
    else if (a->rank == root && !global)
        st = mapping_mpi__fail(MAPPING_ERR_NULL_ARGUMENT, "%s: the global array is NULL on root %d", fn, root);
    st = mapping_mpi__local(a, st);
    int *v = mapping_mpi__scratch(4 * sizeof *v); /* root, -root; their maxima */
    if (!v)
        return mapping_mpi__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory", fn);
    v[0] = root;
    v[1] = -root;
    MPI_Request req;
    int err = MPI_Iallreduce(v, v + 2, 2, MPI_INT, MPI_MAX, a->comm, &req);
    if (err == MPI_SUCCESS)
        err = mapping_mpi__wait(a, 1, &req, MPI_STATUSES_IGNORE);
    int lo = -v[3], hi = v[2];
    mapping_mpi__done(err, v);
    if (err != MPI_SUCCESS)
        return mapping_mpi__waited(err, "MPI_Iallreduce");
    if (lo != hi && st == MAPPING_OK)
        st = mapping_mpi__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: root differs across ranks (from %d to %d)", fn, lo,
                               hi);
    return mapping_mpi__agree(a, a->comm, st, fn);
}

/* Waits for a scatter's or gather's request; a local failure before it is
 * kept for the next call on every rank. */
static mapping_status collective_done(mapping_mpi_darray *a, mapping_status st, int err, MPI_Request *req,
                                      const char *what)
{
    if (err == MPI_SUCCESS)
        err = mapping_mpi__wait(a, 1, req, MPI_STATUSES_IGNORE);
    if (err != MPI_SUCCESS)
        return mapping_mpi__waited(err, what);
    return mapping_mpi__defer(a, st);
}

mapping_status mapping_mpi_scatter(mapping_mpi_darray *a, const void *global, int root)
{
    static const char fn[] = "mapping_mpi_scatter";
    if (!a)
        return mapping_mpi__fail(MAPPING_ERR_NULL_ARGUMENT, "%s: the array is NULL", fn);
    mapping_status st = check_root(a, global, root, fn);
    if (st != MAPPING_OK)
        return st;
    void *owned = NULL;
    /* Overwritten on the host: marked modified there (a discard, after queued copies). */
    st = mapping_mirror_acquire_cpu(a->owned, MAPPING_WRITE, &owned);
    if (st != MAPPING_OK)
        mapping_mpi__fail_mapping(st, "mapping_mpi_scatter: mapping_mirror_acquire_cpu");
    MPI_Request req;
    int err = MPI_Iscatterv(global, a->counts, a->displs, a->row_type, mapping_mirror_cpu(a->owned),
                            (int)a->owned_rows, a->row_type, root, a->comm, &req);
    return collective_done(a, st, err, &req, "mapping_mpi_scatter: MPI_Iscatterv");
}

mapping_status mapping_mpi_gather(mapping_stream *stream, mapping_mpi_darray *a, void *global, int root)
{
    static const char fn[] = "mapping_mpi_gather";
    if (!a)
        return mapping_mpi__fail(MAPPING_ERR_NULL_ARGUMENT, "%s: the array is NULL", fn);
    mapping_status st = check_root(a, global, root, fn);
    if (st != MAPPING_OK)
        return st;
    void *owned = NULL;
    st = mapping_mirror_sync_to_cpu(stream, a->owned);
    if (st == MAPPING_OK)
        st = mapping_mirror_acquire_cpu(a->owned, MAPPING_READ, &owned);
    if (st != MAPPING_OK)
        mapping_mpi__fail_mapping(st, "mapping_mpi_gather: sync to the host");
    MPI_Request req;
    int err = MPI_Igatherv(mapping_mirror_cpu(a->owned), (int)a->owned_rows, a->row_type, global, a->counts,
                           a->displs, a->row_type, root, a->comm, &req);
    return collective_done(a, st, err, &req, "mapping_mpi_gather: MPI_Igatherv");
}
