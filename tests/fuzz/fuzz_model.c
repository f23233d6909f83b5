/*
 * The mirror-core model (tests/conformance/mirror_matrix_model.c, compiled
 * here with MIRROR_MATRIX_FUZZ) behind the fuzz decoder's interface
 * (fuzz_ops.h), so the same two drivers run it: fuzz_replay.c as
 * mapping_fuzz_model_replay (CTest fuzz.replay_model.<backend>, over
 * tests/fuzz/corpus-model/) and fuzz_libfuzzer.c as mapping_fuzz_model
 * (scripts/fuzz_smoke.sh).
 *
 * An input is one op sequence over the feature matrix: its first bytes pick
 * the cell (shape: whole mirror, views, sharded, multimirror; blocking or
 * streams; race checker on or off), whether the families track writes
 * (where the process has a mechanism: MAPPING_TRACK), the sizes and the
 * device diff; then one byte per choice of each op (the op, the family, the
 * handle, the range, the writer...), until the input ends or 400 ops have
 * run. Bytes written come from a generator seeded by the input. After every
 * op both sides are compared with the model; a mismatch prints the ops and
 * aborts.
 */
#include <stdio.h>
#include "fuzz_ops.h"

int  mirror_matrix_fuzz_setup(void);
int  mirror_matrix_fuzz_run(const uint8_t *data, size_t size);
void mirror_matrix_fuzz_totals(unsigned long long *steps, unsigned long long *bytes, unsigned long long *tracked);

int fuzz_setup(void)
{
    return mirror_matrix_fuzz_setup();
}

int fuzz_run(const uint8_t *data, size_t size)
{
    return mirror_matrix_fuzz_run(data, size);
}

void fuzz_totals(unsigned long long *ops, unsigned long long *bytes_checked)
{
    unsigned long long tracked;
    mirror_matrix_fuzz_totals(ops, bytes_checked, &tracked);
}

unsigned long long fuzz_tracked_rounds(void)
{
    unsigned long long ops, bytes, tracked;
    mirror_matrix_fuzz_totals(&ops, &bytes, &tracked);
    return tracked;
}
