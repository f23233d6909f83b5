/*
 * The back ends compiled in, each loaded once per process on first use.
 */
#include <stdlib.h>
#include <string.h>
#include "core/backends.h"

typedef struct backend_slot {
    const char            *name;
    const mapping_backend *be; /* NULL: not compiled in */
    pthread_once_t         once;
    mapping_status         status;
    int                    device_count;
    char                   reason[256];
} backend_slot;

static backend_slot slots[] = {
    {"host", &mapping_backend_host, PTHREAD_ONCE_INIT, MAPPING_OK, 0, ""},
#ifdef MAPPING_WITH_OPENCL
    {"opencl", &mapping_backend_opencl, PTHREAD_ONCE_INIT, MAPPING_OK, 0, ""},
#else
    {"opencl", NULL, PTHREAD_ONCE_INIT, MAPPING_OK, 0, ""},
#endif
#ifdef MAPPING_WITH_CUDA
    {"cuda", &mapping_backend_cuda, PTHREAD_ONCE_INIT, MAPPING_OK, 0, ""},
#else
    {"cuda", NULL, PTHREAD_ONCE_INIT, MAPPING_OK, 0, ""},
#endif
};
enum { SLOT_COUNT = sizeof slots / sizeof slots[0] };

#define DEFINE_LOADER(i)                                                                                   \
    static void load_##i(void)                                                                             \
    {                                                                                                      \
        backend_slot *s = &slots[i];                                                                       \
        if (!s->be) {                                                                                      \
            s->status = MAPPING_ERR_NO_BACKEND;                                                            \
            strcpy(s->reason, "not compiled into this build");                                             \
            return;                                                                                        \
        }                                                                                                  \
        s->status = s->be->load(s->reason, sizeof s->reason, &s->device_count);                           \
        if (s->status == MAPPING_OK && s->device_count == 0) {                                             \
            s->status = MAPPING_ERR_NO_DEVICE;                                                             \
            strcpy(s->reason, "the driver loaded but reports no devices");                                 \
        }                                                                                                  \
        if (s->status == MAPPING_OK)                                                                       \
            s->reason[0] = '\0';                                                                           \
    }
DEFINE_LOADER(0)
DEFINE_LOADER(1)
DEFINE_LOADER(2)
static void (*const loaders[SLOT_COUNT])(void) = {load_0, load_1, load_2};

static backend_slot *loaded_slot(int i)
{
    pthread_once(&slots[i].once, loaders[i]);
    return &slots[i];
}

int mapping__backend_count(void)
{
    return SLOT_COUNT;
}

const mapping_backend *mapping__backend_get(int i, mapping_backend_info *info)
{
    backend_slot *s = loaded_slot(i);
    if (info) {
        memset(info, 0, sizeof *info);
        strncpy(info->name, s->name, sizeof info->name - 1);
        info->compiled = s->be != NULL;
        info->available = s->status == MAPPING_OK;
        info->device_count = s->device_count;
        strncpy(info->reason, s->reason, sizeof info->reason - 1);
    }
    return s->status == MAPPING_OK ? s->be : NULL;
}

int mapping__backend_index(const char *name)
{
    for (int i = 0; i < SLOT_COUNT; i++)
        if (strcmp(slots[i].name, name) == 0)
            return i;
    return -1;
}

mapping_status mapping_list_backends(mapping_backend_info *out, int max, int *count)
{
    static const char fn[] = "mapping_list_backends";
    mapping_status st;
    if ((st = mapping__check_ptr(fn, "count", count)))
        return st;
    if (max < 0 || (max > 0 && !out))
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: max is %d with out %p", fn, max, (void *)out);
    for (int i = 0; i < SLOT_COUNT && i < max; i++)
        mapping__backend_get(i, &out[i]);
    *count = SLOT_COUNT;
    return MAPPING_OK;
}

mapping_status mapping_list_devices(const char *backend, mapping_device_info *out, int max, int *count)
{
    static const char fn[] = "mapping_list_devices";
    mapping_status st;
    if ((st = mapping__check_ptr(fn, "backend", backend)) || (st = mapping__check_ptr(fn, "count", count)))
        return st;
    if (max < 0 || (max > 0 && !out))
        return mapping__fail(MAPPING_ERR_INVALID_ARGUMENT, "%s: max is %d with out %p", fn, max, (void *)out);
    int i = mapping__backend_index(backend);
    if (i < 0)
        return mapping__fail(MAPPING_ERR_NO_BACKEND, "%s: unknown back end \"%s\" (host, opencl, cuda)", fn, backend);
    mapping_backend_info info;
    const mapping_backend *be = mapping__backend_get(i, &info);
    *count = 0;
    if (!be)
        return MAPPING_OK; /* compiled out or unavailable: no devices */
    for (int d = 0; d < info.device_count && d < max; d++)
        if ((st = be->device_info(d, &out[d])) != MAPPING_OK)
            return st;
    *count = info.device_count;
    return MAPPING_OK;
}
