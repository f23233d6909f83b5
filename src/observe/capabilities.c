/* Capability names, from MAPPING_CAP_LIST. */
#include "mapping.h"

const char *mapping_capability_name(mapping_capability cap)
{
    switch (cap) {
#define MAPPING_CAP_NAME_(name, bit, label) \
    case MAPPING_CAP_##name:                \
        return label;
        MAPPING_CAP_LIST(MAPPING_CAP_NAME_)
#undef MAPPING_CAP_NAME_
    }
    return NULL;
}
