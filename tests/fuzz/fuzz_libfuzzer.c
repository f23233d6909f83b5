/*
 * The libFuzzer target: each input runs through the decoder (fuzz_ops.h).
 * Built with clang when MAPPING_FUZZ=ON (tests/fuzz/CMakeLists.txt); the back
 * end is $MAPPING_BACKEND (host when unset). scripts/fuzz_smoke.sh runs it.
 */
#include <stdio.h>
#include <stdlib.h>
#include "fuzz_ops.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    int st = fuzz_setup();
    if (st != 0) {
        fprintf(stderr, "fuzz: the device could not be set up (status %d)\n", st);
        exit(st);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fuzz_run(data, size);
}
