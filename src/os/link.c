/* Link values (bandwidth, latency) and the environment's numbers: one set
 * of rules for every way in (mapping_open's desc, $MAPPING_HOST_LINK,
 * mapping_device_set_link). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "os/os.h"

const char *mapping_os_link_check(double bandwidth, double latency)
{
    if (!isfinite(bandwidth) || !isfinite(latency))
        return "bandwidth and latency must be finite numbers";
    if (bandwidth != 0 && !(bandwidth >= MAPPING_OS_LINK_MIN_BANDWIDTH && bandwidth <= MAPPING_OS_LINK_MAX_BANDWIDTH))
        return "bandwidth must be 0 (default) or between 1e3 and 1e15 bytes per second";
    if (!(latency >= 0 && latency <= MAPPING_OS_LINK_MAX_LATENCY))
        return "latency must be between 0 and 1 second";
    return NULL;
}

bool mapping_os_parse_double(const char *text, const char *end_chars, const char **end, double *out)
{
    if (!text || !*text || !((*text >= '0' && *text <= '9') || *text == '.'))
        return false; /* no sign, no space, no "inf"/"nan": a plain decimal or exponent number */
    char *stop;
    errno = 0;
    double v = strtod(text, &stop);
    if (stop == text || errno == ERANGE || !isfinite(v))
        return false;
    for (const char *c = text; c < stop; c++)
        if (!strchr("0123456789.eE+-", *c))
            return false; /* hexadecimal */
    if (*stop && !(end_chars && strchr(end_chars, *stop)))
        return false;
    *out = v;
    if (end)
        *end = stop;
    return true;
}
