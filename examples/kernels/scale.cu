// The example's kernel (examples/cuda_kernel.c): y[i] = a * x[i] + y[i].
// Shipped as PTX (scale.ptx, and scale_ptx.h, the same text as a C string);
// regenerate both with scripts/regenerate_ptx.sh.
extern "C" __global__ void saxpy(float a, const float *x, float *y, unsigned int n)
{
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        y[i] = a * x[i] + y[i];
}
