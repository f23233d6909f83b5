/*
 * libmapping_mpi's objects. This library sits above the public API: it uses
 * mapping.h and MPI only, never libmapping's internals.
 */
#ifndef MAPPING_MPI_INTERNAL_H
#define MAPPING_MPI_INTERNAL_H

#include <stdbool.h>
#include "mapping_mpi.h"

/* A halo exchange's delta state (mapping_mpi_darray_set_delta): per side
 * (0 up, 1 down), what was last sent, and the packed messages. */
typedef struct mapping_mpi__delta {
    bool           on;
    size_t         capacity;         /* bytes of one message: header + the halo's bytes */
    unsigned char *shadow[2];        /* the boundary rows as last sent */
    bool           shadow_valid[2];
    unsigned char *pack[2], *unpack[2];
    int            send_bytes[2];    /* this exchange's message sizes */
} mapping_mpi__delta;

struct mapping_mpi_darray {
    MPI_Comm     comm;     /* a duplicate of the caller's: our messages stay ours */
    MPI_Comm     ctl;      /* another duplicate: failure notices (mapping_mpi_darray_notify_failure) */
    MPI_Datatype row_type; /* row_bytes contiguous bytes */
    int          rank, size;
    int          up, down; /* neighbours (rank -1 / +1), MPI_PROC_NULL at the edges */
    size_t       rows, cols, element_bytes, halo, row_bytes;
    size_t       first_row, owned_rows;
    int         *counts, *displs; /* rows per rank and first row, for scatter / gather */

    mapping_device *dev;
    bool            own_dev;
    int             device_index;
    bool            cuda_aware;

    mapping_mirror *block;              /* halo + owned + halo rows */
    mapping_mirror *owned;              /* view: the owned rows */
    mapping_mirror *send_up, *send_down; /* views: the first / last `halo` owned rows (NULL at an edge or halo 0) */
    mapping_mirror *recv_up, *recv_down; /* views: the halo rows above / below (NULL likewise) */

    mapping_mpi__delta delta;
    mapping_mpi_darray_stats stats;
    mapping_status deferred;        /* a local failure after an exchange's agreement: every rank fails the next call */
    char           deferred_message[560];
    bool           broken;          /* a wait was given up with transfers in flight: unusable, leaked at destroy */
    int            agree[4];        /* an exchange's agreement: (status, rank) in, out */

    /* Failure notices: a posted receive from any rank, and what this rank sent. */
    MPI_Request notice_recv;
    char        notice_in[256];
    int         notice_from;        /* -1: none received */
    MPI_Request *notice_sends;
    char        *notice_out;
};

/* Waits for n requests (statuses may be MPI_STATUSES_IGNORE): MPI_Testall in
 * a loop that also watches a's failure notices (a may be NULL) and calls the
 * progress function (mapping_mpi_set_progress). MPI_SUCCESS when all
 * completed, MAPPING_MPI__GAVE_UP when the wait was given up (a notice, or
 * the progress function asked to stop: the message is recorded; the requests
 * stay in flight and a is marked broken), or an MPI error code. */
#define MAPPING_MPI__GAVE_UP (-1)
int mapping_mpi__wait(mapping_mpi_darray *a, int n, MPI_Request *reqs, MPI_Status *statuses);
/* Memory a non-blocking MPI call may write until it completes: freed by
 * mapping_mpi__done when the wait succeeded, else leaked (MPI may still
 * write it). */
void *mapping_mpi__scratch(size_t bytes);
void  mapping_mpi__done(int waited, void *scratch);
/* mapping_mpi__wait's result as a status, recording the message. */
mapping_status mapping_mpi__waited(int result, const char *what);
/* The array may take a collective call: not broken (else MAPPING_ERR_BUSY, recorded). */
mapping_status mapping_mpi__usable(mapping_mpi_darray *a, const char *fn);
/* The local status to agree on: st, else a failure deferred from the last
 * call (consumed). */
mapping_status mapping_mpi__local(mapping_mpi_darray *a, mapping_status st);
/* Records a failure after an agreement: returned now, and by every rank at the next collective call. */
mapping_status mapping_mpi__defer(mapping_mpi_darray *a, mapping_status st);

/* Delta halos (delta.c): the message for side s from the send view's host
 * bytes (its size in a->delta.send_bytes[s]); and the received message for
 * side s into the halo view (marked modified on the host where written). */
void           mapping_mpi__delta_pack(mapping_mpi_darray *a, int s, const unsigned char *rows, size_t n);
mapping_status mapping_mpi__delta_unpack(mapping_mpi_darray *a, int s, mapping_mirror *halo, int received);
void           mapping_mpi__delta_free(mapping_mpi_darray *a);

/* Records the failure for mapping_mpi_last_error_message() and returns st. */
mapping_status mapping_mpi__fail(mapping_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A libmapping call failed: records "<what>: <its message>" and returns st. */
mapping_status mapping_mpi__fail_mapping(mapping_status st, const char *what);
/* An MPI call failed (with MPI_ERRORS_RETURN): records its error string. */
mapping_status mapping_mpi__fail_mpi(int err, const char *what);

/* Agreement across ranks: every rank passes its local status; all get the
 * first failing rank's status (a rank that was fine records that another
 * rank failed). */
mapping_status mapping_mpi__agree(mapping_mpi_darray *a, MPI_Comm comm, mapping_status local, const char *fn);

#endif
