/* Built against an installed libmapping_mpi, outside the tree, and run on 2
 * ranks: scatter a 2-D array, exchange the halos, gather it back. */
#include <mapping_mpi.h>
#include <stdio.h>
#include <string.h>

enum { ROWS = 8, COLS = 4 };

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size, ok = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    float global[ROWS][COLS], back[ROWS][COLS];
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < COLS; c++)
            global[r][c] = (float)(r * COLS + c);
    memset(back, 0, sizeof back);
    mapping_mpi_darray_desc desc = {.rows = ROWS, .cols = COLS, .element_bytes = sizeof(float), .halo = 1};
    mapping_mpi_darray *a = NULL;
    mapping_stream *stream = NULL;
    mapping_mpi_darray_info info;
    if (mapping_mpi_darray_create(MPI_COMM_WORLD, &desc, &a) != MAPPING_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, mapping_mpi_last_error_message());
        MPI_Finalize();
        return 1;
    }
    ok = mapping_stream_create(mapping_mpi_darray_device(a), &stream) == MAPPING_OK &&
         mapping_mpi_darray_get_info(a, &info) == MAPPING_OK && mapping_mpi_scatter(a, global, 0) == MAPPING_OK &&
         mapping_mpi_halo_exchange(stream, a) == MAPPING_OK && mapping_stream_synchronize(stream) == MAPPING_OK;
    /* The halo above this rank's block holds the row before it. */
    const float *local = mapping_mirror_cpu(mapping_mpi_darray_mirror(a));
    if (ok && rank > 0)
        ok = local[0] == global[info.first_row - 1][0] && local[COLS - 1] == global[info.first_row - 1][COLS - 1];
    ok = ok && mapping_mpi_gather(stream, a, back, 0) == MAPPING_OK;
    if (ok && rank == 0)
        ok = memcmp(global, back, sizeof back) == 0;
    int all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    mapping_stream_destroy(stream);
    mapping_mpi_darray_destroy(a);
    if (rank == 0)
        printf("%s on %d ranks\n", all_ok ? "ok" : "FAILED", size);
    MPI_Finalize();
    return all_ok ? 0 : 1;
}
