/*
 * mapping_mpi.h: distributed arrays over MPI (libmapping_mpi).
 *
 * An optional library on top of libmapping, built only where CMake finds MPI;
 * libmapping itself never depends on MPI. Link with mapping_mpi, mapping and
 * your MPI (CMake: mapping_mpi and MPI::MPI_C). Every symbol is prefixed
 * mapping_mpi_. C11.
 *
 * ---------------------------------------------------------------------------
 * The distributed array
 * ---------------------------------------------------------------------------
 * A global array of `rows` x `cols` elements (row-major; a 1-D array has
 * cols = 1) is block-distributed by rows over the ranks of a communicator:
 * rank r owns rows [first_row, first_row + owned_rows), in rank order, the
 * first rows % size ranks one row more than the others. Each rank keeps its
 * block and `halo` rows on each side (copies of its neighbours' boundary
 * rows) as one mapping mirror on its device:
 *
 *     local row 0            halo rows: copies of rank r-1's last rows
 *     local row halo         first owned row (global row first_row)
 *     ...
 *     local row halo+owned   halo rows: copies of rank r+1's first rows
 *
 * The mirror tracks validity as always (see mapping.h): compute on the
 * device, mark what you wrote (mapping_mirror_mark_gpu_modified on the owned
 * view, or mapping_mirror_acquire_gpu with MAPPING_WRITE), and the halo
 * exchange moves only what is needed:
 *   1. it syncs to the host the owned boundary rows a neighbour needs, and
 *      only their stale bytes, on your stream (so after your kernel);
 *   2. it exchanges them with non-blocking MPI (MPI_Irecv / MPI_Isend with
 *      the two neighbours, then MPI_Waitall);
 *   3. the received halo rows are marked modified on the host;
 *   4. and synced to the device on your stream: work you queue after the
 *      exchange on the same stream sees them.
 * Only the bytes of those rows move: 2 x halo rows per neighbour per
 * exchange, counted in the device's statistics (d2h_bytes, h2d_bytes), when
 * the boundary rows were modified on the device. Interior work queued on
 * another stream before the exchange overlaps with it.
 *
 * CUDA-aware MPI: where the MPI library says so (MPIX_Query_cuda_support)
 * and the device is a CUDA device, the exchange sends from and receives into
 * device memory directly (no host copies; the received halos are marked
 * modified on the device). mapping_mpi_cuda_aware() says whether it does.
 *
 * Devices: ranks on one node take different devices: local rank (within the
 * node, MPI_COMM_TYPE_SHARED) modulo the device count of the back end
 * ($MAPPING_BACKEND, else the default), unless desc.dev names one.
 *
 * Collective calls: mapping_mpi_darray_create, _destroy, _halo_exchange,
 * _scatter and _gather must be called by every rank of the communicator, in
 * the same order. Bad input is detected on every rank alike (sizes are
 * compared across ranks with one MPI_Allreduce at create), so every rank
 * returns the same error instead of some ranks waiting forever.
 *
 * Thread safety: one thread at a time per array (it is a mirror family).
 */
#ifndef MAPPING_MPI_H
#define MAPPING_MPI_H

#include <mpi.h>
#include "mapping.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mapping_mpi_darray mapping_mpi_darray;

typedef struct mapping_mpi_darray_desc {
    size_t rows;          /* global rows (of a 1-D array: its elements); >= the number of ranks */
    size_t cols;          /* elements per row; 0 = 1 (a 1-D array) */
    size_t element_bytes; /* bytes per element, > 0 */
    size_t halo;          /* halo rows on each side; at most the smallest block (rows / ranks) */
    /* The device to use; NULL = open one (see "Devices" above), closed with
     * the array. */
    mapping_device *dev;
} mapping_mpi_darray_desc;

/* Where this rank's block lies. */
typedef struct mapping_mpi_darray_info {
    int    rank, size;      /* in the array's communicator */
    size_t rows, cols;      /* the global array */
    size_t first_row;       /* global index of the first owned row */
    size_t owned_rows;      /* rows this rank owns */
    size_t halo;            /* halo rows on each side (also at the array's edges, where they are not exchanged) */
    size_t row_bytes;       /* cols x element_bytes */
    size_t owned_offset;    /* bytes from the start of the local block to the first owned row: halo x row_bytes */
    int    device_index;    /* the device's index within its back end */
} mapping_mpi_darray_info;

/* Creates a distributed array (collective). Every rank must pass the same
 * rows, cols, element_bytes and halo (else every rank returns
 * MAPPING_ERR_INVALID_ARGUMENT naming the field); halo must not exceed the
 * smallest block, and the communicator must have at least 2 ranks (one
 * process needs no distribution: use a mapping_mirror). The block's CPU side
 * starts zeroed and valid, the device side stale (as a new mirror). */
MAPPING_API mapping_status mapping_mpi_darray_create(MPI_Comm comm, const mapping_mpi_darray_desc *desc,
                                                     mapping_mpi_darray **out);
/* Destroys the array (collective: a barrier first, none after a failure
 * notice), after its queued copies; closes the device when the array opened
 * it. NULL: no-op (on every rank). See also mapping_mpi_darray_destroy_local. */
MAPPING_API void           mapping_mpi_darray_destroy(mapping_mpi_darray *a);
MAPPING_API mapping_status mapping_mpi_darray_get_info(const mapping_mpi_darray *a, mapping_mpi_darray_info *out);
/* The whole local block (halo rows included) as a mirror, and the view of the
 * owned rows only (offset 0 of the view = the first owned row). Owned by the
 * array: do not destroy them. NULL for NULL. */
MAPPING_API mapping_mirror *mapping_mpi_darray_mirror(mapping_mpi_darray *a);
MAPPING_API mapping_mirror *mapping_mpi_darray_owned(mapping_mpi_darray *a);
MAPPING_API mapping_device *mapping_mpi_darray_device(mapping_mpi_darray *a);

/* The halo exchange (collective; see above). stream: of the array's device,
 * where your kernels run (NULL: blocking). Returns when the MPI part is done
 * and the copies to the device are queued on `stream`. A failure on one rank
 * still completes its MPI part, so its neighbours do not wait forever, and
 * fails the exchange on every rank: the local steps' statuses travel with
 * the transfers (one MPI_Iallreduce), so every rank returns the failing
 * rank's status ("failed on rank N" on the others). A failure queueing the
 * copies to the device, after MPI, is returned by that rank, and by every
 * rank at the array's next collective call. */
MAPPING_API mapping_status mapping_mpi_halo_exchange(mapping_stream *stream, mapping_mpi_darray *a);

/* Scatter (collective): root's global array `global` (rows x cols elements;
 * read on root only, ignored elsewhere) to every rank's owned rows, which
 * become modified on the host. Halo rows are not filled: exchange next. */
MAPPING_API mapping_status mapping_mpi_scatter(mapping_mpi_darray *a, const void *global, int root);
/* Gather (collective): every rank's owned rows, synced to the host on
 * `stream` (after the work queued there) as needed, into root's `global`
 * (written on root only; may be NULL elsewhere). */
MAPPING_API mapping_status mapping_mpi_gather(mapping_stream *stream, mapping_mpi_darray *a, void *global, int root);

/* What the last failing mapping_mpi_ call on this thread said: which
 * argument, which rank's value, or the mapping or MPI call that failed.
 * "" when none has failed. Never NULL. (The MPI library keeps its own
 * message; mapping_last_error_message() covers libmapping's calls.) */
MAPPING_API const char *mapping_mpi_last_error_message(void);

/* 1 if halo exchanges of this array send device memory directly (a
 * CUDA-aware MPI and a CUDA device), else 0. */
MAPPING_API int mapping_mpi_cuda_aware(const mapping_mpi_darray *a);

/* ---------------------------------------------------------------------------
 * Statistics and delta halos
 * ------------------------------------------------------------------------- */
typedef struct mapping_mpi_darray_stats {
    uint64_t exchanges;          /* halo exchanges completed on this rank */
    uint64_t mpi_bytes_sent;     /* bytes this rank's exchanges handed to MPI (delta headers included) */
    uint64_t mpi_bytes_received; /* bytes its exchanges received */
    uint64_t delta_bytes_saved;  /* halo bytes a delta exchange did not send: unchanged since the last one */
} mapping_mpi_darray_stats;
MAPPING_API mapping_status mapping_mpi_darray_get_stats(const mapping_mpi_darray *a, mapping_mpi_darray_stats *out);

/* Delta halos (collective; on must be the same on every rank, else every
 * rank fails with MAPPING_ERR_INVALID_ARGUMENT). With on = 1, an exchange
 * sends only the boundary bytes that changed since the last exchange, in
 * 64-byte granules found by comparing with a copy of what was last sent
 * (so no mark is needed beyond the usual ones), as one message per
 * neighbour: a header with the byte ranges, then their bytes. The receiver
 * writes those ranges into its halo rows on the host and syncs only them to
 * the device. The halo rows must not be written between exchanges (they hold
 * what was received). The first exchange after switching on sends all.
 * Not with a CUDA-aware exchange (MAPPING_ERR_UNSUPPORTED on every rank). */
MAPPING_API mapping_status mapping_mpi_darray_set_delta(mapping_mpi_darray *a, int on);

/* ---------------------------------------------------------------------------
 * A rank that fails: no other rank waits forever
 * ---------------------------------------------------------------------------
 * Every wait of a collective call (mapping_mpi_darray_create, _destroy,
 * _halo_exchange, _scatter, _gather, _set_delta) polls its requests, and
 * gives up when
 *   - a failure notice arrived from another rank of the array (that rank
 *     called mapping_mpi_darray_notify_failure: it raised an exception, was
 *     interrupted, or gave up itself), or
 *   - the progress function (mapping_mpi_set_progress) returned non-zero.
 * The call then returns MAPPING_ERR_NOT_READY; mapping_mpi_darray_peer_failed
 * says whether a notice came. MPI cannot take back a transfer once posted, so
 * an array whose wait was given up with transfers in flight is broken: every
 * later collective call on it returns MAPPING_ERR_BUSY, and destroying it
 * frees nothing that MPI may still write (its memory is leaked on purpose). */
typedef int (*mapping_mpi_progress_fn)(void *user);
/* Process-wide: fn(user) is called on every round of every wait (often:
 * keep it cheap; it runs on the waiting thread). NULL: none. */
MAPPING_API void mapping_mpi_set_progress(mapping_mpi_progress_fn fn, void *user);
/* Tells every other rank of the array that this rank stopped taking part
 * (non-blocking; once per array; why: up to 255 bytes, may be NULL). */
MAPPING_API mapping_status mapping_mpi_darray_notify_failure(mapping_mpi_darray *a, const char *why);
/* 1 if another rank's failure notice arrived (never waits): *rank (may be
 * NULL) its rank, why (may be NULL) its text; else 0. */
MAPPING_API int mapping_mpi_darray_peer_failed(mapping_mpi_darray *a, int *rank, char *why, size_t why_size);
/* Frees this rank's part of the array without communicating: for a caller
 * whose ranks free their arrays at different times or in different orders
 * (a garbage collector), and after a failure. No rank may exchange on the
 * array afterwards. A broken array's memory is leaked, not freed. NULL: no-op. */
MAPPING_API void mapping_mpi_darray_destroy_local(mapping_mpi_darray *a);

#ifdef __cplusplus
}
#endif
#endif /* MAPPING_MPI_H */
