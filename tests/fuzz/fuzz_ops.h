/*
 * The fuzz decoder (fuzz_ops.c): turns any byte string into a sequence of
 * operations on mirrors, views, access intents, streams, events, host
 * functions and batches of one device, runs them through the public API
 * (include/mapping.h only) and checks every byte of both sides against a
 * plain byte model. A mismatch prints what differs, and the operations that
 * led there, and aborts.
 *
 * Two programs drive it: the libFuzzer target (fuzz_libfuzzer.c, clang,
 * -DMAPPING_FUZZ=ON) and a replay driver (fuzz_replay.c, any compiler) that
 * runs the files of a corpus, so the normal test suite replays the checked-in
 * seed corpus (tests/fuzz/corpus/) on every back end. docs/testing.md says
 * how to fuzz for longer.
 */
#ifndef MAPPING_FUZZ_OPS_H
#define MAPPING_FUZZ_OPS_H

#include <stddef.h>
#include <stdint.h>

/* Opens the device once per process: back end $MAPPING_BACKEND (host when
 * unset), device 0. Returns 0, or 77 when the back end is absent (the reason
 * is printed), or 1 on another failure. */
int fuzz_setup(void);
/* Runs one input. Returns 0; aborts on a model mismatch or an unexpected
 * status. $MAPPING_FUZZ_TRACE=1 prints each operation. */
int fuzz_run(const uint8_t *data, size_t size);
/* Operations run and bytes compared since the process started. */
void fuzz_totals(unsigned long long *ops, unsigned long long *bytes_checked);
/* Rounds of the tracked world run (op_tracked_round; 0 without a tracking
 * mechanism). */
unsigned long long fuzz_tracked_rounds(void);

#endif
