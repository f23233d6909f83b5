/* Scatter from a root rank to the owned rows, and gather back to it. */
#include "mpi/mpi_internal.h"

/* Every rank checks root and (on root) the array pointer; all agree, so a
 * bad root or a NULL array on root fails every rank instead of hanging. */
static mapping_status check_root(mapping_mpi_darray *a, const void *global, int root, const char *fn)
{
    mapping_status st = MAPPING_OK;
    if (root < 0 || root >= a->size)
        st = mapping_mpi__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: root %d is not a rank of the array's %d", fn, root,
                               a->size);
    else if (a->rank == root && !global)
        st = mapping_mpi__fail(MAPPING_ERR_NULL_ARGUMENT, "%s: the global array is NULL on root %d", fn, root);
    int mine[2] = {root, -root}, all[2] = {0, 0};
    if (MPI_Allreduce(mine, all, 2, MPI_INT, MPI_MAX, a->comm) == MPI_SUCCESS && all[0] != -all[1] &&
        st == MAPPING_OK)
        st = mapping_mpi__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: root differs across ranks (from %d to %d)", fn,
                               -all[1], all[0]);
    return mapping_mpi__agree(a->comm, st, fn);
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
    int err = MPI_Scatterv(global, a->counts, a->displs, a->row_type, mapping_mirror_cpu(a->owned),
                           (int)a->owned_rows, a->row_type, root, a->comm);
    if (st == MAPPING_OK && err != MPI_SUCCESS)
        st = mapping_mpi__fail_mpi(err, "mapping_mpi_scatter: MPI_Scatterv");
    return st;
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
    int err = MPI_Gatherv(mapping_mirror_cpu(a->owned), (int)a->owned_rows, a->row_type, global, a->counts,
                          a->displs, a->row_type, root, a->comm);
    if (st == MAPPING_OK && err != MPI_SUCCESS)
        st = mapping_mpi__fail_mpi(err, "mapping_mpi_gather: MPI_Gatherv");
    return st;
}
