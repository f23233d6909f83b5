/*
 * libmapping_mpi's objects. This library sits above the public API: it uses
 * mapping.h and MPI only, never libmapping's internals.
 */
#ifndef MAPPING_MPI_INTERNAL_H
#define MAPPING_MPI_INTERNAL_H

#include <stdbool.h>
#include "mapping_mpi.h"

struct mapping_mpi_darray {
    MPI_Comm     comm;     /* a duplicate of the caller's: our messages stay ours */
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
};

/* Records the failure for mapping_mpi_last_error_message() and returns st. */
mapping_status mapping_mpi__fail(mapping_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A libmapping call failed: records "<what>: <its message>" and returns st. */
mapping_status mapping_mpi__fail_mapping(mapping_status st, const char *what);
/* An MPI call failed (with MPI_ERRORS_RETURN): records its error string. */
mapping_status mapping_mpi__fail_mpi(int err, const char *what);

/* Agreement across ranks: every rank passes its local status; all get the
 * first failing rank's status (a rank that was fine records that another
 * rank failed). */
mapping_status mapping_mpi__agree(MPI_Comm comm, mapping_status local, const char *fn);

#endif
