/*
 * Distributed arrays: creation (validation agreed across ranks, the device
 * by local rank, the block's mirror and its views), destruction, queries.
 */
#include <limits.h>
#include <stdint.h>
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

mapping_status mapping_mpi_darray_create(MPI_Comm comm, const mapping_mpi_darray_desc *desc, mapping_mpi_darray **out)
{
    static const char fn[] = "mapping_mpi_darray_create";
    if (out)
        *out = NULL;
    int size = 0, rank = 0;
    if (comm == MPI_COMM_NULL || MPI_Comm_size(comm, &size) != MPI_SUCCESS || MPI_Comm_rank(comm, &rank) != MPI_SUCCESS)
        return mapping_mpi__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: the communicator is not valid", fn);
    mapping_status st = check_local(desc, out);

    /* Every rank's sizes, compared: max of v and of -v gives max and min. */
    enum { FIELDS = 4 };
    const char *names[FIELDS] = {"rows", "cols", "element_bytes", "halo"};
    int64_t mine[2 * FIELDS] = {0}, all[2 * FIELDS];
    if (st == MAPPING_OK) {
        int64_t v[FIELDS] = {(int64_t)desc->rows, (int64_t)(desc->cols ? desc->cols : 1),
                             (int64_t)desc->element_bytes, (int64_t)desc->halo};
        for (int i = 0; i < FIELDS; i++) {
            mine[i] = v[i];
            mine[FIELDS + i] = -v[i];
        }
    } else {
        for (int i = 0; i < FIELDS; i++) /* neutral: never the max, never the min */
            mine[i] = mine[FIELDS + i] = INT64_MIN;
    }
    int err = MPI_Allreduce(mine, all, 2 * FIELDS, MPI_INT64_T, MPI_MAX, comm);
    if (err != MPI_SUCCESS)
        return mapping_mpi__fail_mpi(err, "mapping_mpi_darray_create: MPI_Allreduce");
    if ((st = mapping_mpi__agree(comm, st, fn)) != MAPPING_OK)
        return st;
    for (int i = 0; i < FIELDS; i++)
        if (all[i] != -all[FIELDS + i])
            return mapping_mpi__fail(MAPPING_ERR_INVALID_ARGUMENT,
                                     "%s: %s differs across ranks (from %lld to %lld; this rank: %lld)", fn, names[i],
                                     (long long)-all[FIELDS + i], (long long)all[i], (long long)mine[i]);
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

    mapping_mpi_darray *a = calloc(1, sizeof *a);
    st = a ? MAPPING_OK : mapping_mpi__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory", fn);
    if (a) {
        a->comm = MPI_COMM_NULL;
        a->row_type = MPI_DATATYPE_NULL;
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
    }
    /* Collective, so every rank makes it even when its allocation failed. */
    MPI_Comm dup = MPI_COMM_NULL;
    if ((err = MPI_Comm_dup(comm, &dup)) != MPI_SUCCESS && st == MAPPING_OK)
        st = mapping_mpi__fail_mpi(err, "mapping_mpi_darray_create: MPI_Comm_dup");
    if (a) {
        a->comm = dup;
        if (dup != MPI_COMM_NULL)
            MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
        if (st == MAPPING_OK &&
            (MPI_Type_contiguous((int)a->row_bytes, MPI_BYTE, &a->row_type) != MPI_SUCCESS ||
             MPI_Type_commit(&a->row_type) != MPI_SUCCESS))
            st = mapping_mpi__fail(MAPPING_ERR_DRIVER, "%s: MPI_Type_contiguous failed", fn);
        if (st == MAPPING_OK)
            st = build(a, desc);
    } else if (dup != MPI_COMM_NULL) {
        MPI_Comm_free(&dup);
    }
    if ((st = mapping_mpi__agree(comm, st, fn)) != MAPPING_OK) {
        if (a)
            release(a);
        return st;
    }
    *out = a;
    return MAPPING_OK;
}

void mapping_mpi_darray_destroy(mapping_mpi_darray *a)
{
    if (!a)
        return;
    MPI_Barrier(a->comm); /* no rank frees while a neighbour may still send to it */
    release(a);
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
