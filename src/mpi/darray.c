/*
 * Distributed arrays: creation (validation agreed across ranks, the device
 * by local rank, the block's mirror and its views), destruction, queries.
 */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mpi/mpi_internal.h"

#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h> /* MPIX_CUDA_AWARE_SUPPORT, MPIX_Query_cuda_support */
#endif

/* Does this MPI move device memory of CUDA itself? Compile-time support and,
 * where the MPI can say, the run-time answer. */
static bool mpi_is_cuda_aware(void)
{
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
    return MPIX_Query_cuda_support() == 1;
#else
    return false;
#endif
}

/* The device: desc->dev, else device (local rank modulo count) of the back
 * end mapping_open(NULL) chooses. */
static mapping_status open_device(mapping_mpi_darray *a, const mapping_mpi_darray_desc *desc)
{
    static const char fn[] = "mapping_mpi_darray_create";
    mapping_status st;
    if (desc->dev) {
        a->dev = desc->dev;
    } else {
        MPI_Comm node;
        int local = 0;
        if (MPI_Comm_split_type(a->comm, MPI_COMM_TYPE_SHARED, a->rank, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
            MPI_Comm_rank(node, &local);
            MPI_Comm_free(&node);
        }
        if ((st = mapping_open(NULL, &a->dev)) != MAPPING_OK)
            return mapping_mpi__fail_mapping(st, "mapping_mpi_darray_create: mapping_open");
        a->own_dev = true;
        mapping_device_info info;
        int count = 1;
        if ((st = mapping_device_get_info(a->dev, &info)) != MAPPING_OK ||
            (st = mapping_list_devices(info.backend, NULL, 0, &count)) != MAPPING_OK)
            return mapping_mpi__fail_mapping(st, fn);
        int want = count > 0 ? local % count : 0;
        if (want != info.index) {
            mapping_close(a->dev);
            a->dev = NULL;
            a->own_dev = false;
            mapping_device_desc d = {.backend = info.backend, .device = want};
            if ((st = mapping_open(&d, &a->dev)) != MAPPING_OK)
                return mapping_mpi__fail_mapping(st, "mapping_mpi_darray_create: mapping_open (by local rank)");
            a->own_dev = true;
        }
    }
    mapping_device_info info;
    if ((st = mapping_device_get_info(a->dev, &info)) != MAPPING_OK)
        return mapping_mpi__fail_mapping(st, fn);
    a->device_index = info.index;
    a->cuda_aware = mpi_is_cuda_aware() && strcmp(info.backend, "cuda") == 0;
    return MAPPING_OK;
}

static mapping_status view(mapping_mpi_darray *a, size_t first_local_row, size_t rows, mapping_mirror **out)
{
    mapping_status st = mapping_mirror_view(a->block, first_local_row * a->row_bytes, rows * a->row_bytes, out);
    return st == MAPPING_OK ? st : mapping_mpi__fail_mapping(st, "mapping_mpi_darray_create: mapping_mirror_view");
}

static mapping_status build(mapping_mpi_darray *a, const mapping_mpi_darray_desc *desc)
{
    mapping_status st = open_device(a, desc);
    if (st != MAPPING_OK)
        return st;
    size_t local_rows = a->owned_rows + 2 * a->halo, h = a->halo;
    if ((st = mapping_mirror_create(a->dev, local_rows * a->row_bytes, 0, &a->block)) != MAPPING_OK)
        return mapping_mpi__fail_mapping(st, "mapping_mpi_darray_create: mapping_mirror_create");
    if ((st = view(a, h, a->owned_rows, &a->owned)) != MAPPING_OK)
        return st;
    if (h > 0 && a->up != MPI_PROC_NULL &&
        ((st = view(a, h, h, &a->send_up)) != MAPPING_OK || (st = view(a, 0, h, &a->recv_up)) != MAPPING_OK))
        return st;
    if (h > 0 && a->down != MPI_PROC_NULL &&
        ((st = view(a, a->owned_rows, h, &a->send_down)) != MAPPING_OK ||
         (st = view(a, h + a->owned_rows, h, &a->recv_down)) != MAPPING_OK))
        return st;
    a->counts = malloc((size_t)a->size * sizeof *a->counts);
    a->displs = malloc((size_t)a->size * sizeof *a->displs);
    if (!a->counts || !a->displs)
        return mapping_mpi__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "mapping_mpi_darray_create: out of memory");
    size_t base = a->rows / (size_t)a->size, extra = a->rows % (size_t)a->size, first = 0;
    for (int r = 0; r < a->size; r++) {
        a->counts[r] = (int)(base + ((size_t)r < extra));
        a->displs[r] = (int)first;
        first += (size_t)a->counts[r];
    }
    return MAPPING_OK;
}

static void release(mapping_mpi_darray *a)
{
    mapping_mirror *views[] = {a->recv_down, a->send_down, a->recv_up, a->send_up, a->owned, a->block};
    for (size_t i = 0; i < sizeof views / sizeof views[0]; i++)
        mapping_mirror_destroy(views[i]);
    if (a->own_dev)
        mapping_close(a->dev);
    if (a->row_type != MPI_DATATYPE_NULL)
        MPI_Type_free(&a->row_type);
    if (a->comm != MPI_COMM_NULL)
        MPI_Comm_free(&a->comm);
    if (a->ctl != MPI_COMM_NULL)
        MPI_Comm_free(&a->ctl);
    mapping_mpi__delta_free(a);
    free(a->counts);
    free(a->displs);
    free(a);
}

/* The checks every rank can make alone. */
static mapping_status check_local(const mapping_mpi_darray_desc *desc, mapping_mpi_darray **out)
{
    static const char fn[] = "mapping_mpi_darray_create";
    if (!desc)
        return mapping_mpi__fail(MAPPING_ERR_NULL_ARGUMENT, "%s: desc is NULL", fn);
    if (!out)
        return mapping_mpi__fail(MAPPING_ERR_NULL_ARGUMENT, "%s: out is NULL", fn);
    if (desc->rows == 0 || desc->element_bytes == 0)
        return mapping_mpi__fail(MAPPING_ERR_ZERO_SIZE, "%s: %s is 0", fn, desc->rows == 0 ? "rows" : "element_bytes");
    size_t cols = desc->cols ? desc->cols : 1;
    if (desc->rows > INT_MAX || cols > SIZE_MAX / desc->element_bytes ||
        cols * desc->element_bytes > INT_MAX || desc->halo > INT_MAX)
        return mapping_mpi__fail(MAPPING_ERR_INVALID_ARGUMENT,
                                 "%s: rows (%zu), halo (%zu) and a row's bytes (%zu x %zu) must each fit in an int", fn,
                                 desc->rows, desc->halo, cols, desc->element_bytes);
    return MAPPING_OK;
}

/* Every rank's sizes compared (max of v and of -v give max and min), then
 * the checks that need the communicator's size. The same on every rank. */
static mapping_status check_across(MPI_Comm comm, int size, const mapping_mpi_darray_desc *desc, mapping_status st)
{
    static const char fn[] = "mapping_mpi_darray_create";
    enum { FIELDS = 4 };
    const char *names[FIELDS] = {"rows", "cols", "element_bytes", "halo"};
    int64_t *mine = mapping_mpi__scratch(4 * FIELDS * sizeof *mine), *all = mine + 2 * FIELDS;
    if (!mine)
        return mapping_mpi__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory", fn);
    for (int i = 0; i < FIELDS; i++) /* neutral: never the max, never the min */
        mine[i] = mine[FIELDS + i] = INT64_MIN;
    if (st == MAPPING_OK) {
        int64_t v[FIELDS] = {(int64_t)desc->rows, (int64_t)(desc->cols ? desc->cols : 1),
                             (int64_t)desc->element_bytes, (int64_t)desc->halo};
        for (int i = 0; i < FIELDS; i++) {
            mine[i] = v[i];
            mine[FIELDS + i] = -v[i];
        }
    }
    MPI_Request req;
    int err = MPI_Iallreduce(mine, all, 2 * FIELDS, MPI_INT64_T, MPI_MAX, comm, &req);
    if (err == MPI_SUCCESS)
        err = mapping_mpi__wait(NULL, 1, &req, MPI_STATUSES_IGNORE);
    if (err != MPI_SUCCESS) {
        mapping_mpi__done(err, mine);
        return mapping_mpi__waited(err, "mapping_mpi_darray_create: MPI_Iallreduce");
    }
    int differs = -1; /* INT64_MIN: a rank failed its own checks (the agreement below says so) */
    for (int i = FIELDS - 1; i >= 0; i--)
        if (all[FIELDS + i] != INT64_MIN && all[i] != -all[FIELDS + i])
            differs = i;
    long long lo = differs >= 0 ? -all[FIELDS + differs] : 0, hi = differs >= 0 ? all[differs] : 0;
    long long here = differs >= 0 ? mine[differs] : 0;
    mapping_mpi__done(err, mine);
    if ((st = mapping_mpi__agree(NULL, comm, st, fn)) != MAPPING_OK)
        return st;
    if (differs >= 0)
        return mapping_mpi__fail(MAPPING_ERR_INVALID_ARGUMENT,
                                 "%s: %s differs across ranks (from %lld to %lld; this rank: %lld)", fn, names[differs],
                                 lo, hi, here);
    if (size < 2)
        return mapping_mpi__fail(MAPPING_ERR_INVALID_ARGUMENT,
                                 "%s: the communicator has one rank; a distributed array needs at least 2 "
                                 "(in one process, use a mapping_mirror)", fn);
    size_t smallest = desc->rows / (size_t)size;
    if (smallest == 0)
        return mapping_mpi__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: %zu rows over %d ranks: some rank would own none",
                                 fn, desc->rows, size);
    if (desc->halo > smallest)
        return mapping_mpi__fail(MAPPING_ERR_INVALID_ARGUMENT,
                                 "%s: halo of %zu rows is wider than the smallest block (%zu rows of %zu over %d ranks)",
                                 fn, desc->halo, smallest, desc->rows, size);
    return MAPPING_OK;
}

static mapping_mpi_darray *new_array(const mapping_mpi_darray_desc *desc, int rank, int size)
{
    mapping_mpi_darray *a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
    a->comm = a->ctl = MPI_COMM_NULL;
    a->row_type = MPI_DATATYPE_NULL;
    a->notice_recv = MPI_REQUEST_NULL;
    a->notice_from = -1;
    a->rank = rank;
    a->size = size;
    a->rows = desc->rows;
    a->cols = desc->cols ? desc->cols : 1;
    a->element_bytes = desc->element_bytes;
    a->halo = desc->halo;
    a->row_bytes = a->cols * a->element_bytes;
    size_t base = a->rows / (size_t)size, extra = a->rows % (size_t)size;
    a->owned_rows = base + ((size_t)rank < extra);
    a->first_row = (size_t)rank * base + ((size_t)rank < extra ? (size_t)rank : extra);
    a->up = rank > 0 ? rank - 1 : MPI_PROC_NULL;
    a->down = rank + 1 < size ? rank + 1 : MPI_PROC_NULL;
    return a;
}

/* The two duplicates of comm (collective: made even where the allocation
 * failed, then freed). */
static mapping_status dup_comms(MPI_Comm comm, mapping_mpi_darray *a, mapping_status st)
{
    MPI_Comm *dup = mapping_mpi__scratch(2 * sizeof *dup); /* MPI writes them when done */
    if (!dup)
        return mapping_mpi__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "mapping_mpi_darray_create: out of memory");
    dup[0] = dup[1] = MPI_COMM_NULL;
    MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    int err = MPI_Comm_idup(comm, &dup[0], &req[0]);
    if (err == MPI_SUCCESS)
        err = MPI_Comm_idup(comm, &dup[1], &req[1]);
    int waited = mapping_mpi__wait(NULL, 2, req, MPI_STATUSES_IGNORE);
    if (err == MPI_SUCCESS)
        err = waited;
    if (err != MPI_SUCCESS && st == MAPPING_OK)
        st = mapping_mpi__waited(err, "mapping_mpi_darray_create: MPI_Comm_idup");
    if (waited != MPI_SUCCESS)
        return st; /* given up: the duplicates may still come; leaked */
    for (int i = 0; i < 2; i++) {
        if (a && dup[i] != MPI_COMM_NULL)
            MPI_Comm_set_errhandler(dup[i], MPI_ERRORS_RETURN);
        else if (dup[i] != MPI_COMM_NULL)
            MPI_Comm_free(&dup[i]);
    }
    if (a) {
        a->comm = dup[0];
        a->ctl = dup[1];
    }
    free(dup);
    return st;
}

enum { TAG_NOTICE = 0x6d10 };

mapping_status mapping_mpi_darray_create(MPI_Comm comm, const mapping_mpi_darray_desc *desc, mapping_mpi_darray **out)
{
    static const char fn[] = "mapping_mpi_darray_create";
    if (out)
        *out = NULL;
    int size = 0, rank = 0;
    if (comm == MPI_COMM_NULL || MPI_Comm_size(comm, &size) != MPI_SUCCESS || MPI_Comm_rank(comm, &rank) != MPI_SUCCESS)
        return mapping_mpi__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: the communicator is not valid", fn);
    mapping_status st = check_across(comm, size, desc, check_local(desc, out));
    if (st != MAPPING_OK)
        return st;
    mapping_mpi_darray *a = new_array(desc, rank, size);
    st = a ? MAPPING_OK : mapping_mpi__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory", fn);
    st = dup_comms(comm, a, st);
    if (st == MAPPING_OK &&
        (MPI_Type_contiguous((int)a->row_bytes, MPI_BYTE, &a->row_type) != MPI_SUCCESS ||
         MPI_Type_commit(&a->row_type) != MPI_SUCCESS))
        st = mapping_mpi__fail(MAPPING_ERR_DRIVER, "%s: MPI_Type_contiguous failed", fn);
    if (st == MAPPING_OK)
        st = build(a, desc);
    if (st == MAPPING_OK &&
        MPI_Irecv(a->notice_in, (int)sizeof a->notice_in, MPI_CHAR, MPI_ANY_SOURCE, TAG_NOTICE, a->ctl,
                  &a->notice_recv) != MPI_SUCCESS)
        st = mapping_mpi__fail(MAPPING_ERR_DRIVER, "%s: MPI_Irecv of the failure notices failed", fn);
    if ((st = mapping_mpi__agree(NULL, comm, st, fn)) != MAPPING_OK) {
        if (a && st != MAPPING_ERR_NOT_READY)
            mapping_mpi_darray_destroy_local(a); /* given up (NOT_READY): leaked, MPI may still use it */
        return st;
    }
    *out = a;
    return MAPPING_OK;
}

void mapping_mpi_darray_destroy_local(mapping_mpi_darray *a)
{
    if (!a || a->broken)
        return; /* broken: MPI may still write into it */
    if (a->notice_recv != MPI_REQUEST_NULL) {
        MPI_Cancel(&a->notice_recv);
        MPI_Wait(&a->notice_recv, MPI_STATUS_IGNORE);
    }
    if (a->notice_sends) {
        int flag = 0;
        MPI_Testall(a->size, a->notice_sends, &flag, MPI_STATUSES_IGNORE);
        if (!flag) { /* not delivered yet: MPI keeps sending; the text stays */
            for (int r = 0; r < a->size; r++)
                if (a->notice_sends[r] != MPI_REQUEST_NULL)
                    MPI_Request_free(&a->notice_sends[r]);
            a->notice_out = NULL;
        }
        free(a->notice_sends);
        free(a->notice_out);
    }
    release(a);
}

void mapping_mpi_darray_destroy(mapping_mpi_darray *a)
{
    if (!a)
        return;
    if (!a->broken && a->notice_from < 0 && !a->notice_sends) {
        /* no rank frees while a neighbour may still send to it */
        MPI_Request req;
        if (MPI_Ibarrier(a->comm, &req) == MPI_SUCCESS && mapping_mpi__wait(a, 1, &req, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
            return; /* given up: broken, leaked */
    }
    mapping_mpi_darray_destroy_local(a);
}

mapping_status mapping_mpi_darray_notify_failure(mapping_mpi_darray *a, const char *why)
{
    if (!a)
        return mapping_mpi__fail(MAPPING_ERR_NULL_ARGUMENT, "mapping_mpi_darray_notify_failure: the array is NULL");
    if (a->notice_sends)
        return MAPPING_OK; /* once */
    a->notice_sends = malloc((size_t)a->size * sizeof *a->notice_sends);
    a->notice_out = calloc(1, sizeof a->notice_in);
    if (!a->notice_sends || !a->notice_out) {
        free(a->notice_sends);
        free(a->notice_out);
        a->notice_sends = NULL;
        a->notice_out = NULL;
        return mapping_mpi__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "mapping_mpi_darray_notify_failure: out of memory");
    }
    snprintf(a->notice_out, sizeof a->notice_in, "%s", why ? why : "");
    for (int r = 0; r < a->size; r++) {
        a->notice_sends[r] = MPI_REQUEST_NULL;
        if (r != a->rank)
            MPI_Isend(a->notice_out, (int)sizeof a->notice_in, MPI_CHAR, r, TAG_NOTICE, a->ctl, &a->notice_sends[r]);
    }
    return MAPPING_OK;
}

mapping_status mapping_mpi_darray_get_stats(const mapping_mpi_darray *a, mapping_mpi_darray_stats *out)
{
    if (!a || !out)
        return mapping_mpi__fail(MAPPING_ERR_NULL_ARGUMENT, "mapping_mpi_darray_get_stats: %s is NULL",
                                 a ? "out" : "the array");
    *out = a->stats;
    return MAPPING_OK;
}

mapping_status mapping_mpi_darray_get_info(const mapping_mpi_darray *a, mapping_mpi_darray_info *out)
{
    if (!a || !out)
        return mapping_mpi__fail(MAPPING_ERR_NULL_ARGUMENT, "mapping_mpi_darray_get_info: %s is NULL",
                                 a ? "out" : "the array");
    *out = (mapping_mpi_darray_info){.rank = a->rank, .size = a->size, .rows = a->rows, .cols = a->cols,
                                     .first_row = a->first_row, .owned_rows = a->owned_rows, .halo = a->halo,
                                     .row_bytes = a->row_bytes, .owned_offset = a->halo * a->row_bytes,
                                     .device_index = a->device_index};
    return MAPPING_OK;
}

mapping_mirror *mapping_mpi_darray_mirror(mapping_mpi_darray *a)
{
    return a ? a->block : NULL;
}

mapping_mirror *mapping_mpi_darray_owned(mapping_mpi_darray *a)
{
    return a ? a->owned : NULL;
}

mapping_device *mapping_mpi_darray_device(mapping_mpi_darray *a)
{
    return a ? a->dev : NULL;
}

int mapping_mpi_cuda_aware(const mapping_mpi_darray *a)
{
    return a && a->cuda_aware;
}
