#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "os/os.h"

/* Whether a path given by the environment names a regular file: dlopen
 * would block for ever opening a FIFO (and read a device). A name without
 * a slash is searched by dlopen in the system's library paths: not ours to
 * check. Opened without blocking, so a FIFO is refused at once. */
static int not_a_regular_file(const char *path)
{
    if (!strchr(path, '/'))
        return 0;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return errno;
    struct stat sb;
    int rc = fstat(fd, &sb) != 0 ? errno : S_ISREG(sb.st_mode) ? 0 : EINVAL;
    close(fd);
    return rc;
}

void *mapping_os_dlopen_first(const char *env_override, const char *const *names, char *why, size_t why_size)
{
    const char *override = env_override ? getenv(env_override) : NULL;
    if (override && *override) {
        int bad = not_a_regular_file(override);
        if (bad) {
            if (why)
                snprintf(why, why_size, "%s=%s: %s", env_override, override,
                         bad == EINVAL ? "not a regular file (a FIFO, a device or a directory)" : strerror(bad));
            return NULL;
        }
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
