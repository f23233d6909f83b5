/* Calls every deprecated name of mapping.h: compiles cleanly by default, and
 * warns at each call with MAPPING_WARN_DEPRECATED (test header.deprecated). */
#include "mapping.h"

int uses_deprecated(mapping_batch *b, mapping_device *dev, mapping_buffer *buf, mapping_stream *s);
int uses_deprecated(mapping_batch *b, mapping_device *dev, mapping_buffer *buf, mapping_stream *s)
{
    char host[16];
    void *native;
    mapping_native_device nd;
    return mapping_batch_sync_to_gpu(b, host, buf, 0, sizeof host) + mapping_batch_sync_to_cpu(b, buf, 0, host, 16) +
           mapping_native_device_handles(dev, &nd) + mapping_native_buffer(buf, &native) +
           mapping_native_stream(s, &native);
}
