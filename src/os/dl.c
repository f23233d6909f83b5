#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include "os/os.h"

void *mapping_os_dlopen_first(const char *env_override, const char *const *names, char *why, size_t why_size)
{
    const char *override = env_override ? getenv(env_override) : NULL;
    if (override && *override) {
        void *lib = dlopen(override, RTLD_NOW | RTLD_LOCAL);
        if (!lib && why)
            snprintf(why, why_size, "%s=%s: %s", env_override, override, dlerror());
        return lib;
    }
    const char *err = "no library name to try";
    for (const char *const *name = names; *name; name++) {
        void *lib = dlopen(*name, RTLD_NOW | RTLD_LOCAL);
        if (lib)
            return lib;
        err = dlerror();
    }
    if (why)
        snprintf(why, why_size, "%s", err ? err : "dlopen failed");
    return NULL;
}

void *mapping_os_dlsym(void *lib, const char *name)
{
    return dlsym(lib, name);
}
