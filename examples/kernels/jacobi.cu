// The Jacobi step of examples/multi_device_jacobi.c on CUDA: the formula of
// examples/jacobi_kernel.h, in the same order, so results equal the serial
// reference exactly. One thread per cell of the block's owned rows (x: column,
// y: owned row). Shipped as PTX (jacobi_ptx.h); regenerate with
// scripts/regenerate_ptx.sh.
extern "C" __global__ void jacobi(const float *u, float *v, unsigned int cols, unsigned int first_row,
                                  unsigned int rows, unsigned int owned, unsigned int halo)
{
    unsigned int j = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y * blockDim.y + threadIdx.y;
    unsigned int g = first_row + i;
    if (i >= owned || g == 0 || g + 1 == rows || j == 0 || j + 1 >= cols)
        return;
    unsigned long long k = (unsigned long long)(i + halo) * cols + j;
    v[k] = 0.25f * (((u[k - cols] + u[k + cols]) + u[k - 1]) + u[k + 1]);
}
