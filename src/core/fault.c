#include "core/core.h"

void mapping__inject_fault(mapping_device *dev, int n)
{
    if (n < 0) {
        atomic_store(&dev->fault_armed, 0);
        return;
    }
    atomic_store(&dev->fault_any, 0);
    atomic_store(&dev->fault_countdown, n);
    atomic_store(&dev->fault_armed, 1);
}

void mapping__inject_fault_any(mapping_device *dev, int n)
{
    mapping__inject_fault(dev, n);
    atomic_store(&dev->fault_any, n >= 0);
}

int mapping__fault_remaining(const mapping_device *dev)
{
    if (!atomic_load(&dev->fault_armed))
        return -1;
    int n = atomic_load(&dev->fault_countdown);
    return n > 0 ? n : 0;
}

mapping_status mapping__fault_check_any(mapping_device *dev, const char *op)
{
    if (!atomic_load_explicit(&dev->fault_any, memory_order_relaxed))
        return MAPPING_OK;
    return mapping__fault_check(dev, op);
}

mapping_status mapping__fault_check(mapping_device *dev, const char *op)
{
    if (!atomic_load_explicit(&dev->fault_armed, memory_order_relaxed))
        return MAPPING_OK;
    if (atomic_fetch_sub(&dev->fault_countdown, 1) > 0)
        return MAPPING_OK;
    int armed = 1; /* one fault per arming, also when two threads get here */
    if (!atomic_compare_exchange_strong(&dev->fault_armed, &armed, 0))
        return MAPPING_OK;
    return mapping__fail(MAPPING_ERR_FAULT_INJECTED, "%s: fault injected by a test", op);
}
