// A small emulation of the CUDA execution model, enough to run specbind's generated kernels as
// host C++ for the CPU test harness: the built-in index variables, the qualifiers, and the two
// bit-cast intrinsics the kernels use. Launches are loops over (block, thread), written by the
// generated host_launch.cpp. No shared memory, no barriers: the kernels use neither.
#pragma once
#include <cstring>

struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};

static dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict

static inline float __uint_as_float(unsigned int u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

static inline unsigned int __float_as_uint(float f) {
    unsigned int u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}
