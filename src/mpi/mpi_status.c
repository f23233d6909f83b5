/* libmapping_mpi's error messages and the agreement of ranks on a status. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* ---- waits that give up ---- */

static mapping_mpi_progress_fn progress_fn;
static void                   *progress_user;

void mapping_mpi_set_progress(mapping_mpi_progress_fn fn, void *user)
{
    progress_user = user;
    progress_fn = fn;
}

/* A notice from another rank has come (or came before). */
static bool notice_came(mapping_mpi_darray *a)
{
    if (!a || a->notice_from >= 0)
        return a && a->notice_from >= 0;
    if (a->notice_recv == MPI_REQUEST_NULL)
        return false;
    int flag = 0;
    MPI_Status status;
    if (MPI_Test(&a->notice_recv, &flag, &status) != MPI_SUCCESS || !flag)
        return false;
    a->notice_in[sizeof a->notice_in - 1] = '\0';
    a->notice_from = status.MPI_SOURCE;
    return true;
}

int mapping_mpi_darray_peer_failed(mapping_mpi_darray *a, int *rank, char *why, size_t why_size)
{
    if (!notice_came(a))
        return 0;
    if (rank)
        *rank = a->notice_from;
    if (why && why_size)
        snprintf(why, why_size, "%s", a->notice_in);
    return 1;
}

/* One round: MPI_Testsome over the requests and the notice receive (one
 * progress call); completed requests' statuses kept in statuses. *left: the
 * requests still pending. 1 when a notice came. */
static int test_round(mapping_mpi_darray *a, int n, MPI_Request *reqs, MPI_Status *statuses, int *left, int *err)
{
    enum { MAX = 16 };
    MPI_Request all[MAX + 1];
    MPI_Status  got[MAX + 1];
    int         index[MAX + 1], count = 0, m = n;
    memcpy(all, reqs, (size_t)n * sizeof *reqs);
    if (a && a->notice_recv != MPI_REQUEST_NULL)
        all[m++] = a->notice_recv;
    *err = MPI_Testsome(m, all, &count, index, got);
    if (*err != MPI_SUCCESS || count == MPI_UNDEFINED)
        return 0;
    int notice = 0;
    for (int i = 0; i < count; i++) {
        if (index[i] == n) {
            notice = 1;
            a->notice_recv = MPI_REQUEST_NULL;
            a->notice_in[sizeof a->notice_in - 1] = '\0';
            a->notice_from = got[i].MPI_SOURCE;
            continue;
        }
        reqs[index[i]] = MPI_REQUEST_NULL;
        if (statuses != MPI_STATUSES_IGNORE)
            statuses[index[i]] = got[i];
        (*left)--;
    }
    return notice;
}

int mapping_mpi__wait(mapping_mpi_darray *a, int n, MPI_Request *reqs, MPI_Status *statuses)
{
    int left = 0, err = MPI_SUCCESS;
    for (int i = 0; i < n; i++)
        left += reqs[i] != MPI_REQUEST_NULL;
    if (n > 16) /* test_round's bound: never reached by this library */
        return MPI_Waitall(n, reqs, statuses);
    while (left > 0) {
        int notice = test_round(a, n, reqs, statuses, &left, &err);
        if (err != MPI_SUCCESS)
            return err;
        if (left == 0)
            return MPI_SUCCESS;
        if (notice || (a && a->notice_from >= 0)) {
            mapping_mpi__fail(MAPPING_ERR_NOT_READY, "rank %d failed (%s): gave up waiting; the array is no longer usable",
                              a->notice_from, a->notice_in);
            break;
        }
        if (progress_fn && progress_fn(progress_user)) {
            mapping_mpi__fail(MAPPING_ERR_NOT_READY, "stopped waiting for MPI: the progress function asked to");
            break;
        }
    }
    if (left == 0)
        return MPI_SUCCESS;
    if (a)
        a->broken = true;
    return MAPPING_MPI__GAVE_UP;
}

mapping_status mapping_mpi__waited(int result, const char *what)
{
    if (result == MPI_SUCCESS)
        return MAPPING_OK;
    if (result == MAPPING_MPI__GAVE_UP)
        return MAPPING_ERR_NOT_READY; /* the message is recorded */
    return mapping_mpi__fail_mpi(result, what);
}

mapping_status mapping_mpi__usable(mapping_mpi_darray *a, const char *fn)
{
    if (a->broken)
        return mapping_mpi__fail(MAPPING_ERR_BUSY,
                                 "%s: the array was given up with transfers in flight (a failure%s%s): destroy it", fn,
                                 a->notice_from >= 0 ? " notice: " : "", a->notice_from >= 0 ? a->notice_in : "");
    return MAPPING_OK;
}

mapping_status mapping_mpi__local(mapping_mpi_darray *a, mapping_status st)
{
    if (st != MAPPING_OK || a->deferred == MAPPING_OK)
        return st;
    st = a->deferred;
    a->deferred = MAPPING_OK;
    return mapping_mpi__fail(st, "%s", a->deferred_message);
}

mapping_status mapping_mpi__defer(mapping_mpi_darray *a, mapping_status st)
{
    if (st != MAPPING_OK && a->deferred == MAPPING_OK) {
        a->deferred = st;
        snprintf(a->deferred_message, sizeof a->deferred_message, "(from the previous call on this rank) %s",
                 last_message);
    }
    return st;
}

void *mapping_mpi__scratch(size_t bytes)
{
    return calloc(1, bytes);
}

void mapping_mpi__done(int waited, void *scratch)
{
    if (waited == MPI_SUCCESS)
        free(scratch);
}

mapping_status mapping_mpi__agree(mapping_mpi_darray *a, MPI_Comm comm, mapping_status local, const char *fn)
{
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    /* MPI_MINLOC on (status, rank): the most negative status, the lowest rank having it. */
    int *v = mapping_mpi__scratch(4 * sizeof *v); /* mine, all */
    if (!v)
        return mapping_mpi__fail(MAPPING_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory", fn);
    v[0] = (int)local;
    v[1] = rank;
    MPI_Request req;
    int err = MPI_Iallreduce(v, v + 2, 1, MPI_2INT, MPI_MINLOC, comm, &req);
    if (err == MPI_SUCCESS)
        err = mapping_mpi__wait(a, 1, &req, MPI_STATUSES_IGNORE);
    int value = v[2], at = v[3];
    mapping_mpi__done(err, v);
    if (err != MPI_SUCCESS)
        return mapping_mpi__waited(err, "MPI_Iallreduce");
    if (value != MAPPING_OK && local == MAPPING_OK)
        return mapping_mpi__fail((mapping_status)value, "%s: failed on rank %d (%s); see that rank's message", fn, at,
                                 mapping_status_name((mapping_status)value));
    return local;
}
