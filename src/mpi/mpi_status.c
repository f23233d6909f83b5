/* libmapping_mpi's error messages and the agreement of ranks on a status. */
#include <stdarg.h>
#include <stdio.h>
#include "mpi/mpi_internal.h"

static _Thread_local char last_message[512];

const char *mapping_mpi_last_error_message(void)
{
    return last_message;
}

mapping_status mapping_mpi__fail(mapping_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_message, sizeof last_message, fmt, ap);
    va_end(ap);
    return st;
}

mapping_status mapping_mpi__fail_mapping(mapping_status st, const char *what)
{
    return mapping_mpi__fail(st, "%s: %s (%s)", what, mapping_status_name(st), mapping_last_error_message());
}

mapping_status mapping_mpi__fail_mpi(int err, const char *what)
{
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(err, text, &len);
    return mapping_mpi__fail(MAPPING_ERR_DRIVER, "%s failed: %s (MPI error %d)", what, text, err);
}

mapping_status mapping_mpi__agree(MPI_Comm comm, mapping_status local, const char *fn)
{
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    /* MPI_MINLOC on (status, rank): the most negative status, the lowest rank having it. */
    struct { int value, rank; } mine = {(int)local, rank}, all = {0, 0};
    int err = MPI_Allreduce(&mine, &all, 1, MPI_2INT, MPI_MINLOC, comm);
    if (err != MPI_SUCCESS)
        return mapping_mpi__fail_mpi(err, "MPI_Allreduce");
    if (all.value != MAPPING_OK && local == MAPPING_OK)
        return mapping_mpi__fail((mapping_status)all.value, "%s: failed on rank %d (%s); see that rank's message", fn,
                                 all.rank, mapping_status_name((mapping_status)all.value));
    return local;
}
