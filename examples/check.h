/* The examples' one error-handling helper: on failure, print the call, the
 * status and the library's detailed message, and return 1 from main. */
#ifndef MAPPING_EXAMPLE_CHECK_H
#define MAPPING_EXAMPLE_CHECK_H

#include <stdio.h>
#include "mapping.h"

#define CHECK(call)                                                                                            \
    do {                                                                                                       \
        mapping_status st_ = (call);                                                                           \
        if (st_ != MAPPING_OK) {                                                                               \
            fprintf(stderr, "%s: %s (%s)\n", #call, mapping_status_string(st_), mapping_last_error_message()); \
            return 1;                                                                                          \
        }                                                                                                      \
    } while (0)

#endif
