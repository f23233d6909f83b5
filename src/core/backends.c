/*
 * The table of back ends (one line each), each loaded once per process on
 * first use, and the default choice.
 */
#include <stdlib.h>
#include <string.h>
#include "core/backends.h"
#include "core/ops.h"

/* The back ends, one line each, in listing order; later lines are preferred
 * by the default choice of mapping_open(NULL) (mapping__backend_default).
 * A back end's code lives in src/backend/<name>/ and defines
 * mapping_backend_<name>; the build defines MAPPING_BACKEND_COMPILED_<name>
 * as 1 when it is compiled in (CMake's MAPPING_BACKENDS list), else 0. */
#define MAPPING_BACKEND_TABLE(X) \
    X(host)                      \
    X(opencl)                    \
    X(cuda)

#define DECLARE_(name) extern const mapping_backend mapping_backend_##name;
MAPPING_BACKEND_TABLE(DECLARE_)
#undef DECLARE_

/* &mapping_backend_<name> when compiled in, else NULL. */
#define TABLE_IF_0(name) NULL
#define TABLE_IF_1(name) &mapping_backend_##name
#define TABLE_IF_(compiled, name) TABLE_IF_##compiled(name)
#define TABLE_OF_(compiled, name) TABLE_IF_(compiled, name)

typedef struct backend_slot {
    const char            *name;
    const mapping_backend *be; /* NULL: not compiled in */
    pthread_once_t         once;
    mapping_status         status;
    int                    device_count;
    char                   reason[256];
} backend_slot;

enum {
#define INDEX_(name) SLOT_##name,
    MAPPING_BACKEND_TABLE(INDEX_)
#undef INDEX_
    SLOT_COUNT
};

static backend_slot slots[SLOT_COUNT] = {
#define SLOT_(name) {#name, TABLE_OF_(MAPPING_BACKEND_COMPILED_##name, name), PTHREAD_ONCE_INIT, MAPPING_OK, 0, ""},
    MAPPING_BACKEND_TABLE(SLOT_)
#undef SLOT_
};

static void load_slot(backend_slot *s)
{
    if (!s->be) {
        s->status = MAPPING_ERR_NO_BACKEND;
        strcpy(s->reason, "not compiled into this build");
        return;
    }
    s->status = s->be->load(s->reason, sizeof s->reason, &s->device_count);
    if (s->status == MAPPING_OK && s->device_count == 0) {
        s->status = MAPPING_ERR_NO_DEVICE;
        strcpy(s->reason, "the driver loaded but reports no devices");
    }
    if (s->status == MAPPING_OK)
        s->reason[0] = '\0';
}

/* pthread_once takes no argument: one loader per slot, generated. */
#define LOADER_(name) \
    static void load_##name(void) { load_slot(&slots[SLOT_##name]); }
MAPPING_BACKEND_TABLE(LOADER_)
#undef LOADER_
static void (*const loaders[SLOT_COUNT])(void) = {
#define LOADER_NAME_(name) load_##name,
    MAPPING_BACKEND_TABLE(LOADER_NAME_)
#undef LOADER_NAME_
};

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

const char *mapping__backend_names(void)
{
#define NAME_(name) ", " #name
    static const char names[] = MAPPING_BACKEND_TABLE(NAME_);
#undef NAME_
    return names + 2;
}

/* Is one of the back end's devices more than the CPU's own memory? */
static bool has_separate_memory(const mapping_backend *be, int device_count)
{
    for (int d = 0; d < device_count; d++) {
        mapping_device_info info;
        if (mapping__op_device_info(be, d, &info) == MAPPING_OK && !(info.caps & MAPPING_CAP_CPU_MEMORY))
            return true;
    }
    return false;
}

int mapping__backend_default(void)
{
    /* From the end of the table: the first back end with a device whose
     * memory is not the CPU's (an OpenCL CPU device is used only when asked
     * for), else the first available one of the table (host). Back ends
     * before the choice are not loaded, except host: a bad setting of
     * its own (MAPPING_HOST_DEVICES=0) makes it the choice, so that
     * mapping_open fails naming the variable, as for any bad value, rather
     * than silently opening another back end. */
    if (slots[SLOT_host].be && loaded_slot(SLOT_host)->status == MAPPING_ERR_INVALID_ARGUMENT)
        return SLOT_host;
    int fallback = -1;
    for (int i = SLOT_COUNT - 1; i >= 0; i--) {
        mapping_backend_info info;
        const mapping_backend *be = mapping__backend_get(i, &info);
        if (!be)
            continue;
        if (has_separate_memory(be, info.device_count))
            return i;
        fallback = i;
    }
    /* None available: the first compiled one (host), so that mapping_open
     * says why it is unavailable (e.g. a bad MAPPING_HOST_DEVICES). */
    for (int i = 0; i < SLOT_COUNT && fallback < 0; i++)
        if (slots[i].be)
            fallback = i;
    return fallback;
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
        return mapping__fail(MAPPING_ERR_NO_BACKEND, "%s: unknown back end \"%s\" (%s)", fn, backend,
                             mapping__backend_names());
    mapping_backend_info info;
    const mapping_backend *be = mapping__backend_get(i, &info);
    *count = 0;
    if (!be)
        return MAPPING_OK; /* compiled out or unavailable: no devices */
    for (int d = 0; d < info.device_count && d < max; d++)
        if ((st = mapping__op_device_info(be, d, &out[d])) != MAPPING_OK)
            return st;
    *count = info.device_count;
    return MAPPING_OK;
}
