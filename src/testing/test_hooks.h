/*
 * The one internal header for tests: what tests may use of the library
 * beyond include/mapping.h. src/testing/ sits above every layer (it may
 * read any of them) and nothing in the library calls it. Tests under tests/internal/ and tests/backend/
 * include this header rather than the layers' own headers; tests under
 * tests/conformance/ include nothing of src/ (tests/CMakeLists.txt checks).
 *
 * What it offers:
 * - fault injection: mapping__inject_fault(dev, n) (declared in core/core.h,
 *   src/core/fault.c): the (n+1)th back-end operation from now on fails with
 *   MAPPING_ERR_FAULT_INJECTED; n < 0 disarms;
 *   mapping__inject_fault_any(dev, n) counts every fallible back-end call
 *   (streams, events, waits, page-locked memory too); mapping_os_inject_alloc_fault(n)
 *   (os/os.h, src/os/memory.c) fails the (n+1)th allocation of the library;
 *   tests/internal/fault_sweep.c sweeps both;
 * - the core objects and the back-end table (core/core.h), for tests that
 *   call a back end's operations directly;
 * - mapping__transfer_ranges and mapping__transfer_sorted_ranges
 *   (transfer/transfer.h), the coherence layer's entry points into batching;
 * - the JSON string writer (os/json.h), to build the strings tests expect;
 * - read-only accessors of a mirror's state (below, src/testing/test_hooks.c),
 *   to read with the range-set functions of coherence/range_set.h.
 */
#ifndef MAPPING_TEST_HOOKS_H
#define MAPPING_TEST_HOOKS_H

#include <stddef.h>
#include "coherence/range_set.h"
#include "os/json.h"
#include "core/core.h"
#include "transfer/transfer.h"

/* A mirror family's ranges on one side (MAPPING_CPU or MAPPING_GPU), in
 * absolute offsets of the family (the root's): stale, modified (marked and
 * not yet synced), pending (stale, with a copy to that side queued). */
const mapping_range_set *mapping__test_mirror_stale(const mapping_mirror *m, mapping_side side);
const mapping_range_set *mapping__test_mirror_modified(const mapping_mirror *m, mapping_side side);
const mapping_range_set *mapping__test_mirror_pending(const mapping_mirror *m, mapping_side side);
/* How many queued copies (and recorded accesses) of the family are tracked
 * and not folded yet. */
size_t mapping__test_mirror_inflight(const mapping_mirror *m);
/* How many marks the family's mark log holds, not yet applied to the sets
 * (after compactions: merged ranges, not the marks made). */
size_t mapping__test_mirror_logged(const mapping_mirror *m);
/* Forces $MAPPING_DEVICE_DIFF for the process: 0 auto, 1 on, 2 off, 3 a bad
 * value; -1 reads the environment again at the next use. */
void mapping__test_device_diff_mode(int mode);
/* Bytes of the family whose device-side shadow is known (MAPPING_MIRROR_DEVICE_DIFF). */
size_t mapping__test_mirror_diff_known(const mapping_mirror *m);
/* Whether the device's back end has a compare kernel (mapping_backend.diff_blocks). */
bool mapping__test_device_can_diff(const mapping_device *dev);
/* Whether write tracking's fault log runs here, and if not why
 * (track/fault_log.h). */
bool mapping__test_fault_log(const char **why);
/* Whether every thread's page faults are counted as they begin
 * (track/fault_count.h), which lets the fault log be trusted with threads. */
bool mapping__test_fault_entries(void);
/* The count itself (false when not available). */
bool mapping__test_fault_entries_count(uint64_t *out);
/* The copy threads in force (os/copy_pool.c: mapping_open sets the count
 * from $MAPPING_COPY_THREADS). */
int mapping__test_copy_threads(void);

#endif
