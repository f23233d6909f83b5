#include "core/core.h"

void mapping__inject_fault(mapping_device *dev, int n)
{
    if (n < 0) {
        atomic_store(&dev->fault_armed, 0);
        return;
    }
    atomic_store(&dev->fault_countdown, n);
    atomic_store(&dev->fault_armed, 1);
}

mapping_status mapping__fault_check(mapping_device *dev, const char *op)
{
    if (!atomic_load_explicit(&dev->fault_armed, memory_order_relaxed))
        return MAPPING_OK;
    if (atomic_fetch_sub(&dev->fault_countdown, 1) > 0)
        return MAPPING_OK;
    atomic_store(&dev->fault_armed, 0); /* one fault per arming */
    return mapping__fail(MAPPING_ERR_FAULT_INJECTED, "%s: fault injected by a test", op);
}
