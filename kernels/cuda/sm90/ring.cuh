// The stage ring between a producer and the consumers: the tile's configuration (WgConfig:
// stage sizes, thread counts), the full/empty mbarriers of the stages, B's share among the
// blocks of a cluster, the ring's initialisation and the alignment the swizzled stages need.
// A piece of its own because it is the contract between the two sides: the GEMM's TMA loads
// (producer.cuh) fill the stages that the consumers' mainloop (mainloop.cuh) reads, and a
// kernel with other operands (a convolution's TMA im2col loads) can fill the same ring for the
// same mainloop.
#pragma once
#include "kernels/cuda/sm90/ptx.cuh"

#include <stdint.h>

namespace kiln::gemm {

// How a stage holds A (the consumers' TA): K-major, a 128-byte swizzled row of k per row of m
// (0); M-major (1); or K-major in two halves (kKHalves), the k-tile's first 32 16-bit k in one
// region of BM rows of 64 bytes in the 64-byte swizzle, its last 32 in a second one after it,
// for a convolution whose taps are 32 channels wide but not 64, each half of one tap.
constexpr int kKHalves = 2;

template <class T, int BN, int CONSUMERS, int STAGES>
struct WgConfig {
    static constexpr int BM = 64 * CONSUMERS;
    static constexpr int BK = 128 / int(sizeof(T));           // one 128-byte swizzle row of k
    static constexpr int kSteps = 4;                           // wgmma k-steps per stage (k16, or k8 for tf32)
    static constexpr int kABytes = BM * 128, kBBytes = BN * 128;
    static constexpr int kStageBytes = kABytes + kBBytes;
    static constexpr int kThreads = 128 * (CONSUMERS + 1);
};

// The stage ring: `full[s]` completes when stage s's TMA copies have landed, `empty[s]` when
// every consumer warp is done reading it. Stage use number u (0, 1, ...) of stage s waits for
// phase parity u & 1.
template <int STAGES>
struct Ring {
    uint64_t full[STAGES], empty[STAGES];
};

// B shared by the blocks of a cluster along m (GemmParams::b_multicast): `blocks` of them, this
// one `rank`; each loads its share of B's stage into all of them.
struct BShare {
    int blocks = 1, rank = 0;
};

template <int STAGES, int CONSUMERS>
__device__ __forceinline__ void init_ring(Ring<STAGES>& ring, int sharers = 1) {
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(&ring.full[s], 1);
            mbar_init(&ring.empty[s], 4 * CONSUMERS * sharers);   // lane 0 of each consumer warp (of each block sharing B)
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
}

// 128-byte swizzled tiles must start on 1024-byte boundaries.
__device__ __forceinline__ unsigned char* aligned_smem(unsigned char* raw) {
    return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
}

} // namespace kiln::gemm
