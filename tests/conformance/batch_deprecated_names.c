/*
 * mapping_batch_sync_to_gpu / _to_cpu, the deprecated names of
 * mapping_batch_add_to_gpu / _to_cpu: the same functions, and their errors
 * name the function the caller used. (That libmapping.so still exports
 * them: tests/install/abi_aliases.c.)
 */
#include <string.h>
#include "harness.h"

TEST(batch_deprecated_names_queue_the_same_copies)
{
    mapping_device *dev = test_device();
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, 4096, &buf));
    unsigned char a[256], b[256], back_old[256], back_new[256];
    test_pattern(a, sizeof a, 11);
    test_pattern(b, sizeof b, 12);
    mapping_batch *batch;
    CHECK_OK(mapping_batch_create(dev, &batch));
    CHECK_OK(mapping_batch_sync_to_gpu(batch, a, buf, 0, sizeof a));
    CHECK_OK(mapping_batch_add_to_gpu(batch, b, buf, 1024, sizeof b));
    CHECK(mapping_batch_count(batch) == 2);
    CHECK_OK(mapping_batch_sync_to_cpu(batch, buf, 1024, back_old, sizeof back_old));
    CHECK_OK(mapping_batch_add_to_cpu(batch, buf, 0, back_new, sizeof back_new));
    CHECK(mapping_batch_count(batch) == 4);
    CHECK_OK(mapping_batch_flush(NULL, batch));
    CHECK_BYTES(back_old, b, sizeof b);
    CHECK_BYTES(back_new, a, sizeof a);
    mapping_batch_destroy(batch);
    mapping_free_gpu(buf);
}

TEST(batch_errors_name_the_function_called)
{
    mapping_device *dev = test_device();
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, 64, &buf));
    unsigned char host[128];
    mapping_batch *batch;
    CHECK_OK(mapping_batch_create(dev, &batch));
    static const char *const names[] = {"mapping_batch_add_to_gpu", "mapping_batch_sync_to_gpu",
                                        "mapping_batch_add_to_cpu", "mapping_batch_sync_to_cpu"};
    for (int i = 0; i < 4; i++) {
        switch (i) { /* each past the end of the buffer */
        case 0: CHECK_REFUSED(mapping_batch_add_to_gpu(batch, host, buf, 0, 128), MAPPING_ERR_OUT_OF_RANGE); break;
        case 1: CHECK_REFUSED(mapping_batch_sync_to_gpu(batch, host, buf, 0, 128), MAPPING_ERR_OUT_OF_RANGE); break;
        case 2: CHECK_REFUSED(mapping_batch_add_to_cpu(batch, buf, 0, host, 128), MAPPING_ERR_OUT_OF_RANGE); break;
        default: CHECK_REFUSED(mapping_batch_sync_to_cpu(batch, buf, 0, host, 128), MAPPING_ERR_OUT_OF_RANGE); break;
        }
        const char *msg = mapping_last_error_message();
        CHECK(strncmp(msg, names[i], strlen(names[i])) == 0 && msg[strlen(names[i])] == ':');
    }
    CHECK(mapping_batch_count(batch) == 0);
    mapping_batch_destroy(batch);
    mapping_free_gpu(buf);
}
