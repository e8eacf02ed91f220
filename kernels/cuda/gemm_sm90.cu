// The Hopper GEMM kernels (sm_90a): wgmma tensor-core instructions fed by the TMA copy engine
// through a ring of shared-memory stages, one producer warpgroup and one or two consumer
// warpgroups per block (warp specialisation).
//
// Why this shape: on H100 the tensor cores outrun everything else; the kernel's job is to keep
// them fed. The producer warpgroup (one issuing thread, up to four in the one-tile kernels)
// issues the TMA copies of the next stages while the consumers multiply the current one: loads, address arithmetic and bounds checks (TMA
// fills out-of-range elements with zeros) leave the consumers' instruction stream entirely.
// The producer gives its registers to the consumers (setmaxnreg), whose accumulators live in
// registers: a 64 x BN tile per consumer.
//
// Operands: 16-bit ones may be K-major (k contiguous) or M/N-major (the transposed view; wgmma
// reads it transposed); tf32 needs K-major operands in shared memory (one kernel takes B
// N-major through registers, below). Shared-memory tiles use the 128-byte swizzle that TMA
// writes and wgmma reads. Each stage is BK = 128 bytes of k (64 16-bit or 32 float elements).
// The epilogue (gemm_common.cuh) runs on the accumulators in registers.
#include "kernels/cuda/gemm_common.cuh"

#include <cuda.h>
#include <type_traits>

namespace kiln::gemm {

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// ---- mbarriers: the stages' full/empty handshakes -----------------------------------------
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
// (The main loops pass 32-bit shared addresses computed before the loop: see consume_tile.)
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) { mbar_arrive(smem_u32(bar)); }
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done = 0;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) { mbar_wait(smem_u32(bar), parity); }

// ---- TMA ------------------------------------------------------------------------------------
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(
            smem_u32(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}

// tma_load into the same offset of the shared memory of every cluster block in `mask`, each
// block's mbarrier at `bar`'s offset completed by the bytes it receives.
__device__ __forceinline__ void tma_load_multicast(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2,
                                                   uint16_t mask) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%3, "
        "%4, %5}], [%2], %6;" ::"r"(smem_u32(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "h"(mask)
        : "memory");
}

// Starts fetching a TMA descriptor (a kernel parameter) into the TMA unit's cache, so that the
// first copy does not wait for it.
__device__ __forceinline__ void tma_prefetch_descriptor(const CUtensorMap* map) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// TMA stores from shared memory, in bulk groups: a group's reads of shared memory can be
// waited for apart from its writes to global memory.
__device__ __forceinline__ void tma_store(const CUtensorMap* map, const void* src, int c0, int c1, int c2) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(
                     reinterpret_cast<uint64_t>(map)),
                 "r"(smem_u32(src)), "r"(c0), "r"(c1), "r"(c2)
                 : "memory");
}
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// All but the most recent group have read their shared memory.
__device__ __forceinline__ void tma_store_wait_read_but_one() {
    asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
}
__device__ __forceinline__ void tma_store_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
// Orders this thread's shared-memory writes before the TMA unit's reads of them.
__device__ __forceinline__ void fence_to_tma() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// ---- clusters -------------------------------------------------------------------------------
// A barrier over every thread of the cluster; the release/acquire pair makes each block's
// shared-memory writes before it visible to the other blocks' reads after it. (Not the
// .aligned form: the producer's threads reach it after diverging.)
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}
// The two halves of cluster_sync, for a barrier whose arrival comes long before its wait.
__device__ __forceinline__ void cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire;" ::: "memory"); }
// The shared::cluster address of `p` (this block's shared memory) in cluster block `rank`, and
// a 16-byte load from such an address. (The split-K reduction read the other blocks through
// generic 64-bit addresses before; with these it measured level to 3.5% faster on the H100's
// cluster-split products.)
__device__ __forceinline__ uint32_t cluster_peer_addr(const void* p, int rank) {
    uint32_t out;
    asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(uint32_t(__cvta_generic_to_shared(p))), "r"(rank));
    return out;
}
// The cluster rank of split 0 of this block's tile. A split's cluster holds its tile's k_splits
// blocks, neighbours along x, and where the launcher puts several tiles in one cluster (a
// row's, or two along m: gemm_cuda.cpp) those tiles one after the other: rank = tile in the
// cluster x k_splits + split.
__device__ __forceinline__ int split_rank_base(int splits) {
    uint32_t rank;
    asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    return int(rank) - int(blockIdx.x) % splits;
}
// An arrival on the mbarrier at shared::cluster address `bar` (another block's, or this one's).
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ float4 load_cluster_f4(uint32_t addr) {
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr));
    return v;
}
// A 4-byte store into the shared memory of cluster block `rank`, at the address `p` has in this
// block, that completes `bar` (at its address in block `rank`) by 4 bytes: the receiver waits
// on its own mbarrier, and no cluster barrier is needed after it.
__device__ __forceinline__ void store_to_peer(float* p, uint64_t* bar, int rank, float v) {
    uint32_t addr, peer_bar;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(addr) : "r"(smem_u32(p)), "r"(rank));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(peer_bar) : "r"(smem_u32(bar)), "r"(rank));
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(addr),
                 "r"(__float_as_uint(v)), "r"(peer_bar)
                 : "memory");
}
// A 16-byte load from this block's shared memory at a 32-bit shared address.
__device__ __forceinline__ float4 load_shared_f4(uint32_t addr) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr));
    return v;
}
// A 16-byte store to the shared::cluster address `addr` that completes the mbarrier at
// shared::cluster address `bar` by 16 bytes (store_to_peer's, four words at once).
__device__ __forceinline__ void store_to_peer_f4(uint32_t addr, uint32_t bar, float4 v) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(addr),
                 "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(bar)
                 : "memory");
}
// mbar_wait with acquire at cluster scope: the stores that completed it came from other blocks.
__device__ __forceinline__ void mbar_wait_cluster(uint64_t* bar, uint32_t parity) {
    uint32_t done = 0;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, "
            "p;\n}\n"
            : "=r"(done)
            : "r"(smem_u32(bar)), "r"(parity)
            : "memory");
    } while (!done);
}

// ---- wgmma ----------------------------------------------------------------------------------
// A shared-memory matrix descriptor: start address, leading and stride byte offsets, 128-byte
// swizzle. K-major tiles: rows of 128 bytes, 8-row groups 1024 bytes apart (SBO); the leading
// offset is unused. M/N-major tiles: 64-element columns of 128 bytes per k, 8-k groups 1024
// bytes apart (SBO) and 64-element blocks along m/n `lbo` bytes apart.
__device__ __forceinline__ uint64_t smem_desc(const void* p, uint32_t lbo) {
    const uint32_t a = smem_u32(p);
    return uint64_t((a & 0x3FFFF) >> 4) | uint64_t((lbo & 0x3FFFF) >> 4) << 16 | uint64_t(1024 >> 4) << 32 | 1ull << 62;
}
// An N-major tile 16 elements wide (the narrow tiles' B): rows of 32 bytes (one k each) in the
// 32-byte swizzle, 8-k groups 256 bytes apart; the tile is one block along n (no LBO).
__device__ __forceinline__ uint64_t smem_desc_mn32(const void* p) {
    const uint32_t a = smem_u32(p);
    return uint64_t((a & 0x3FFFF) >> 4) | uint64_t(256 >> 4) << 32 | 3ull << 62;
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator accesses across the asynchronous wgmma.
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

template <int N, class T, int TA, int TB>
struct Wgmma;

// The accumulator lists of m64nNk*: N / 2 float registers per thread.
#define KILN_WGMMA_D16 "{%0,%1,%2,%3,%4,%5,%6,%7}"
#define KILN_WGMMA_OUT16 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define KILN_WGMMA_D64 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}"
#define KILN_WGMMA_OUT64 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define KILN_WGMMA_D128 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"
#define KILN_WGMMA_OUT128 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define KILN_WGMMA_D256 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}"
#define KILN_WGMMA_OUT256 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

// One specialisation per shape and 16-bit type: the transposes are immediates (TA, TB), the
// scale-d predicate is set from an operand (always 1: accumulate). A, B, P, TA, TB are the
// operand numbers after the accumulators.
#define KILN_WGMMA_16BIT(N, CT, TY, A, B, P, XA, XB)                                                            \
    template <int TA, int TB>                                                                                   \
    struct Wgmma<N, CT, TA, TB> {                                                                               \
        static __device__ __forceinline__ void run(float (&d)[N / 2], uint64_t da, uint64_t db) {               \
            asm volatile("{.reg .pred p; setp.ne.b32 p, %" #P ", 0;\n"                                          \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " " KILN_WGMMA_D##N ", %" #A \
                         ", %" #B ", p, 1, 1, %" #XA ", %" #XB ";}\n"                                          \
                         : KILN_WGMMA_OUT##N                                                                    \
                         : "l"(da), "l"(db), "r"(1), "n"(TA), "n"(TB));                                         \
        }                                                                                                       \
    };
// tf32 reads K-major operands only: no transpose immediates.
#define KILN_WGMMA_TF32(N, A, B, P)                                                                             \
    template <>                                                                                                 \
    struct Wgmma<N, float, 0, 0> {                                                                              \
        static __device__ __forceinline__ void run(float (&d)[N / 2], uint64_t da, uint64_t db) {               \
            asm volatile("{.reg .pred p; setp.ne.b32 p, %" #P ", 0;\n"                                          \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k8.f32.tf32.tf32 " KILN_WGMMA_D##N ", %" #A ", %" #B \
                         ", p, 1, 1;}\n"                                                                        \
                         : KILN_WGMMA_OUT##N                                                                    \
                         : "l"(da), "l"(db), "r"(1));                                                           \
        }                                                                                                       \
    };
KILN_WGMMA_16BIT(16, __half, "f16", 8, 9, 10, 11, 12)
KILN_WGMMA_16BIT(16, __nv_bfloat16, "bf16", 8, 9, 10, 11, 12)
KILN_WGMMA_TF32(16, 8, 9, 10)
KILN_WGMMA_16BIT(64, __half, "f16", 32, 33, 34, 35, 36)
KILN_WGMMA_16BIT(64, __nv_bfloat16, "bf16", 32, 33, 34, 35, 36)
KILN_WGMMA_TF32(64, 32, 33, 34)
KILN_WGMMA_16BIT(128, __half, "f16", 64, 65, 66, 67, 68)
KILN_WGMMA_16BIT(128, __nv_bfloat16, "bf16", 64, 65, 66, 67, 68)
KILN_WGMMA_TF32(128, 64, 65, 66)
KILN_WGMMA_16BIT(256, __half, "f16", 128, 129, 130, 131, 132)
KILN_WGMMA_16BIT(256, __nv_bfloat16, "bf16", 128, 129, 130, 131, 132)
KILN_WGMMA_TF32(256, 128, 129, 130)

// tf32 with A from registers (the A^T kernels: A M-major in shared memory, which tf32's
// descriptors cannot read): a warp's fragment of 16 rows x 8 k is a0 (g, q), a1 (g + 8, q),
// a2 (g, q + 4), a3 (g + 8, q + 4), g = lane / 4, q = lane % 4; B K-major.
template <int N>
struct WgmmaTf32RegA;
#define KILN_WGMMA_TF32_REGA(N, A0, A1, A2, A3, B, P)                                                          \
    template <>                                                                                                 \
    struct WgmmaTf32RegA<N> {                                                                                   \
        static __device__ __forceinline__ void run(float (&d)[N / 2], const uint32_t* a, uint64_t db) {         \
            asm volatile("{.reg .pred p; setp.ne.b32 p, %" #P ", 0;\n"                                          \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k8.f32.tf32.tf32 " KILN_WGMMA_D##N              \
                         ", {%" #A0 ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #B ", p, 1, 1;}\n"                        \
                         : KILN_WGMMA_OUT##N                                                                    \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));                        \
        }                                                                                                       \
    };
KILN_WGMMA_TF32_REGA(16, 8, 9, 10, 11, 12, 13)
KILN_WGMMA_TF32_REGA(64, 32, 33, 34, 35, 36, 37)

// Keeps fragment registers alive (and unmoved) until here: wgmma reads them asynchronously.
template <int R>
__device__ __forceinline__ void fence_fragments(uint32_t (&f)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+r"(f[i])::"memory");
}

// ---- the kernel -----------------------------------------------------------------------------

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

// Producer: loads k-tile `k0` of the block's tile into stage s (TMA, completing on full[s]).
// With B shared (SHARED, share.blocks > 1) the block loads its share of B's boxes (TB == 0:
// BN / blocks rows of n; TB == 1: BK / blocks rows of k), multicast to every block of the
// cluster: the host's B map has boxes of that size.
template <class T, int BN, int CONSUMERS, int STAGES, int TA, int TB, bool SHARED = false>
__device__ __forceinline__ void produce_stage(unsigned char* smem, Ring<STAGES>& ring, int s, const CUtensorMap* map_a,
                                              const CUtensorMap* map_b, int k0, int m0, int n0, int za, int zb,
                                              BShare share = {}) {
    using Cfg = WgConfig<T, BN, CONSUMERS, STAGES>;
    unsigned char* sa = smem + s * Cfg::kStageBytes;
    unsigned char* sb = sa + Cfg::kABytes;
    mbar_expect_tx(&ring.full[s], Cfg::kStageBytes);
    if constexpr (TA == 0) {
        tma_load(sa, map_a, &ring.full[s], k0, m0, za);
    } else {
        // M-major: boxes 128 bytes wide along m (64 16-bit rows, 32 tf32 ones), BK k deep.
        constexpr int kBoxM = 128 / int(sizeof(T)), kBoxBytes = 128 * Cfg::BK;
#pragma unroll
        for (int c = 0; c < CONSUMERS; ++c)
#pragma unroll
            for (int h = 0; h < 64 / kBoxM; ++h)
                tma_load(sa + c * 8192 + h * kBoxBytes, map_a, &ring.full[s], m0 + 64 * c + kBoxM * h, k0, za);
    }
    if constexpr (SHARED) {
        const uint16_t all = uint16_t((1u << share.blocks) - 1);
        if constexpr (TB == 0) {
            const int rows = BN / share.blocks;
            tma_load_multicast(sb + share.rank * rows * 128, map_b, &ring.full[s], k0, n0 + share.rank * rows, zb, all);
        } else {
            const int rows = Cfg::BK / share.blocks;
            constexpr int kRowBytes = BN == 16 ? 32 : 128;
#pragma unroll
            for (int j = 0; j < (BN + 63) / 64; ++j)
                tma_load_multicast(sb + j * 8192 + share.rank * rows * kRowBytes, map_b, &ring.full[s], n0 + 64 * j,
                                   k0 + share.rank * rows, zb, all);
        }
        return;
    }
    if constexpr (TB == 0) {
        tma_load(sb, map_b, &ring.full[s], k0, n0, zb);
    } else {
#pragma unroll
        for (int j = 0; j < (BN + 63) / 64; ++j) tma_load(sb + j * 8192, map_b, &ring.full[s], n0 + 64 * j, k0, zb);
    }
}

// Consumer c's descriptors of stage 0 at k-step 0, A's and B's. A stage s and a k-step kk
// add their byte offsets (>> 4) to the start address field: the stages lie under 256 KB, so
// the 14-bit field never carries into the next.
struct StageDescs {
    uint64_t a, b;
};
template <class T, int BN, int CONSUMERS, int STAGES>
__device__ __forceinline__ StageDescs stage0_descs(const unsigned char* smem, int c, int ta, int tb) {
    using Cfg = WgConfig<T, BN, CONSUMERS, STAGES>;
    const unsigned char* sa = smem + c * 8192;
    const unsigned char* sb = smem + Cfg::kABytes;
    return {ta == 0 ? smem_desc(sa, 16) : smem_desc(sa, 8192),
            tb == 0 ? smem_desc(sb, 16) : BN == 16 ? smem_desc_mn32(sb) : smem_desc(sb, 8192)};
}

// Consumer c: multiplies stage s into its accumulators (rows [64c, 64c + 64) of the tile) and
// commits the wgmma group. `d`: stage0_descs.
template <class T, int BN, int CONSUMERS, int STAGES, int TA, int TB>
__device__ __forceinline__ void consume_stage(float (&acc)[BN / 2], StageDescs d, unsigned s) {
    using Cfg = WgConfig<T, BN, CONSUMERS, STAGES>;
    // The offsets move the start address field (the low 14 bits) alone: 32-bit adds under the
    // descriptors' fixed high words.
    const uint32_t stage = uint32_t(s * Cfg::kStageBytes) >> 4;
    const uint64_t a_hi = d.a & ~0xFFFFFFFFull, b_hi = d.b & ~0xFFFFFFFFull;
    const uint32_t a_lo = uint32_t(d.a) + stage, b_lo = uint32_t(d.b) + stage;
    fence_regs(acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::kSteps; ++kk) {
        // K-major: the next 32 bytes of each swizzled row; M/N-major: the next 16 (or 8) rows of k.
        const uint64_t da = a_hi | (a_lo + (TA == 0 ? 32 * kk : 2048 * kk) / 16);
        const uint64_t db = b_hi | (b_lo + (TB == 0 ? 32 * kk : BN == 16 ? 512 * kk : 2048 * kk) / 16);
        Wgmma<BN, T, TA, TB>::run(acc, da, db);
    }
    wgmma_commit();
    fence_regs(acc);
}

// Producer: k-tiles [kt_begin, kt_begin + ktiles) of one tile into the ring. `it` counts stage
// uses across the tiles a block walks (stage it % STAGES, use it / STAGES). Several threads
// (`issuers`, a divisor of STAGES; this one `issuer`) may share the work, each taking the
// stages s with s % issuers == issuer, so that each waits on its own stages' barriers in
// order.
template <class T, int BN, int CONSUMERS, int STAGES, int TA, int TB, bool SHARED = false>
__device__ __forceinline__ void produce_tile(unsigned char* smem, Ring<STAGES>& ring, const CUtensorMap* map_a,
                                             const CUtensorMap* map_b, int kt_begin, int ktiles, int m0, int n0, int za,
                                             int zb, int& it, int issuer = 0, int issuers = 1, BShare share = {}) {
    constexpr int BK = WgConfig<T, BN, CONSUMERS, STAGES>::BK;
    for (int kt = 0; kt < ktiles; ++kt, ++it) {
        if (it % issuers != issuer) continue;
        const int s = it % STAGES;
        if (it >= STAGES) mbar_wait(&ring.empty[s], ((it / STAGES) - 1) & 1);
        produce_stage<T, BN, CONSUMERS, STAGES, TA, TB, SHARED>(smem, ring, s, map_a, map_b, (kt_begin + kt) * BK, m0, n0,
                                                                za, zb, share);
    }
}

// The one-tile kernels' issuing threads (lane 0 of the producer warpgroup's warps 0, 1, ...)
// for a ring of STAGES. One thread's loop took ~425 cycles a stage plus ~160 per further TMA
// copy in a test of TMA alone (H100, clock64), and threads of different warps issued in
// parallel; in the narrow products 4 issuers instead of one measured level to 4% faster
// on the H100. (The persistent kernels keep one: two changed nothing there.)
template <int STAGES>
constexpr int kIssuers = STAGES % 4 == 0 ? 4 : STAGES % 2 == 0 ? 2 : 1;

// Consumer c (lane `lane` of one of its warps) of a persistent kernel: one tile's product into
// `acc`, zeroed first (a block's only tile: consume_only_tile, below). Each stage is released
// once the multiplies after it are in flight (at most one group outstanding), the last one
// when all are done. `after_issue(kt)` runs for kt < PEEL once k-tile kt's multiplies are
// issued (or where the tile has no k-tile kt): work that overlaps them, such as storing the
// previous tile's results.
struct NothingAfterIssue {
    __device__ void operator()(int) const {}
};
template <class T, int BN, int CONSUMERS, int STAGES, int TA, int TB, int PEEL = 0, class AfterIssue = NothingAfterIssue>
__device__ __forceinline__ void consume_tile(float (&acc)[BN / 2], const unsigned char* smem, Ring<STAGES>& ring, int c,
                                             int lane, int ktiles, int& it, AfterIssue&& after_issue = {}) {
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
    // Every address the loop needs, as 32-bit shared addresses computed once: derived in the
    // loop from generic pointers, they were rebuilt from the shared window's base (S2R) after
    // each stage's wait, and an unrelated change to the epilogue (more live registers) made
    // the unsplit 64 x 64 tile 5-9% slower that way.
    const StageDescs descs = stage0_descs<T, BN, CONSUMERS, STAGES>(smem, c, TA, TB);
    const uint32_t full = smem_u32(&ring.full[0]), empty = smem_u32(&ring.empty[0]);
    // The warp known converged here: after the bsum twin's epilogue (lanes storing row sums
    // alone) the compiler could not tell, and reconverged the warp (WARPSYNC) after every
    // stage's wait, building the stage's descriptors there in vector registers (61
    // instructions a k-tile against the plain twin's 57; bsum over plain at 8192^3 +1.7% ->
    // +0.8-1.0%).
    __syncwarp();
#pragma unroll
    for (int kt = 0; kt < PEEL; ++kt) {
        if (kt < ktiles) {
            mbar_wait(full + 8 * (unsigned(it) % STAGES), (unsigned(it) / STAGES) & 1);
            consume_stage<T, BN, CONSUMERS, STAGES, TA, TB>(acc, descs, unsigned(it) % STAGES);
        }
        after_issue(kt);
        if (kt < ktiles) {
            wgmma_wait<1>();
            fence_regs(acc);
            if (kt > 0 && lane == 0) mbar_arrive(empty + 8 * (unsigned(it - 1) % STAGES));
            ++it;
        }
    }
    // (Following the stage and its phase from one k-tile to the next instead measured level on
    // the persistent kernels' plain product and slowed their bsum twin (bsum over plain at 4096^3 +2.0-2.3% -> +2.9%).
    // consume_only_tile's unrolled loop needs the ring at stage 0.)
    for (int kt = PEEL; kt < ktiles; ++kt, ++it) {
        const unsigned s = unsigned(it) % STAGES;   // (unsigned: no sign fix-ups in the loop)
        mbar_wait(full + 8 * s, (unsigned(it) / STAGES) & 1);
        consume_stage<T, BN, CONSUMERS, STAGES, TA, TB>(acc, descs, s);
        wgmma_wait<1>();
        fence_regs(acc);
        if (kt > 0 && lane == 0) mbar_arrive(empty + 8 * (unsigned(it - 1) % STAGES));
    }
    wgmma_wait<0>();
    fence_regs(acc);
    if (ktiles > 0 && lane == 0) mbar_arrive(empty + 8 * (unsigned(it - 1) % STAGES));
}

// How a one-tile kernel's consumer warp releases a stage: on this block's empty barrier, or,
// where the cluster's blocks share B (SHARED, BShare), on the empty barriers of every block of
// the cluster, whose producers all write into this block's stages. Those skip the releases
// that no producer waits for (the last STAGES k-tiles'), so that no arrival reaches a block
// after it has exited.
template <int STAGES, bool SHARED>
struct StageRelease {
    uint32_t empty;        // this block's empty[0], a shared::cta address
    uint32_t peer[8];      // SHARED: empty[0] in cluster block r, shared::cluster addresses
    int blocks;
    __device__ __forceinline__ StageRelease(uint32_t empty_cta, const Ring<STAGES>& ring, BShare share)
        : empty(empty_cta), blocks(share.blocks) {
        if constexpr (SHARED) {
#pragma unroll
            for (int r = 0; r < 8; ++r) peer[r] = r < blocks ? cluster_peer_addr(&ring.empty[0], r) : 0;
        }
    }
    // Stage s, which held k-tile kt of ktiles, is read.
    __device__ __forceinline__ void arrive(unsigned s, int kt, int ktiles) const {
        if constexpr (!SHARED) {
            mbar_arrive(empty + 8 * s);
        } else if (kt + STAGES < ktiles) {
#pragma unroll
            for (int r = 0; r < 8; ++r)
                if (r < blocks) mbar_arrive_cluster(peer[r] + 8 * s);
        }
    }
};

// consume_only_tile for tf32 with A M-major (the tk kernels): tf32's shared-memory operands
// must be K-major, so A comes from registers, each thread loading its fragment (a0-a3 of a
// k-step) from the stage's 128-byte swizzled boxes (32 rows of m by BK k each; row k of m's box
// at 128 k, m's 16-byte chunk XOR k % 8). In a warp the loads of one register cover 8 rows of
// m in 4 rows of k: 2 lanes a bank. Each k-step is a group of its own with one of two fragment
// sets, waited for (wgmma_wait<1>) before its set is reloaded, as in the B-in-registers
// kernel: with the four k-steps of a stage in one group and a set per stage, ptxas serialised
// every multiply (C7513: fragment registers written while a group that reads others is in
// flight), which this form avoids (SASS: HGMMA, then WARPGROUP.DEPBAR.LE gsb0, 0x1).
template <int BN, int CONSUMERS, int STAGES>
__device__ __forceinline__ void consume_only_tile_tf32_rega(float (&acc)[BN / 2], const unsigned char* smem, uint64_t b0,
                                                           uint32_t full, uint32_t empty, int c, int lane, int ktiles) {
    using Cfg = WgConfig<float, BN, CONSUMERS, STAGES>;
    const int warp = int(threadIdx.x % 128) / 32, g = lane / 4, q = lane % 4;
    // The shared address in stage 0 of A's element (row m of the consumer's 64, k % 8 = kq) at k-step 0.
    const uint32_t base = smem_u32(smem);
    const auto address = [c, base](int m, int kq) {
        return base + uint32_t(c * 8192 + 4096 * (m / 32) + 128 * kq + 16 * (((m % 32) / 4) ^ kq) + 4 * (m % 4));
    };
    const uint32_t lo_q = address(16 * warp + g, q), hi_q = address(16 * warp + g + 8, q);
    const uint32_t lo_q4 = address(16 * warp + g, q + 4), hi_q4 = address(16 * warp + g + 8, q + 4);
    const uint64_t b_hi = b0 & ~0xFFFFFFFFull;
    uint32_t frag[2][4];
    unsigned phase = 0;   // (consume_only_tile has reconverged the warp)
    for (int kt0 = 0; kt0 < ktiles; kt0 += STAGES, phase ^= 1) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            if (kt0 + s >= ktiles) break;
            mbar_wait(full + 8 * s, phase);
            const uint32_t stage = uint32_t(s * Cfg::kStageBytes);
            const uint32_t b_lo = uint32_t(b0) + (stage >> 4);
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                uint32_t(&f)[4] = frag[kk % 2];
                const uint32_t at = stage + 1024 * kk;
                asm volatile("ld.shared.b32 %0, [%1];" : "=r"(f[0]) : "r"(lo_q + at));
                asm volatile("ld.shared.b32 %0, [%1];" : "=r"(f[1]) : "r"(hi_q + at));
                asm volatile("ld.shared.b32 %0, [%1];" : "=r"(f[2]) : "r"(lo_q4 + at));
                asm volatile("ld.shared.b32 %0, [%1];" : "=r"(f[3]) : "r"(hi_q4 + at));
                fence_fragments(f);
                fence_regs(acc);
                wgmma_fence();
                WgmmaTf32RegA<BN>::run(acc, f, b_hi | (b_lo + 2 * kk));
                wgmma_commit();
                fence_regs(acc);
                wgmma_wait<1>();
                fence_fragments(frag[(kk + 1) % 2]);
                fence_regs(acc);
                // The previous stage's last k-step is done: its shared memory is free.
                if (kk == 0 && lane == 0 && kt0 + s > 0) mbar_arrive(empty + 8 * ((s + STAGES - 1) % STAGES));
            }
        }
    }
    wgmma_wait<0>();
    fence_regs(acc);
    fence_fragments(frag[0]);
    fence_fragments(frag[1]);
    if (ktiles > 0 && lane == 0) mbar_arrive(empty + 8 * ((ktiles - 1) % STAGES));
}

// consume_tile for a block's only tile (the one-tile kernels; stage uses from 0): the loop
// unrolled by STAGES, so that each copy's stage, barriers and descriptors are constants and
// only the phase changes from one round of the ring to the next. In the narrow tiles the
// instructions between a stage's arrival and its multiplies set the pace:
// 41 a k-tile on the 16-wide twin, from 59 with consume_tile's loop.
template <class T, int BN, int CONSUMERS, int STAGES, int TA, int TB, bool SHARED = false>
__device__ __forceinline__ void consume_only_tile(float (&acc)[BN / 2], const unsigned char* smem, Ring<STAGES>& ring,
                                                  int c, int lane, int ktiles, BShare share = {}) {
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
    const StageDescs descs = stage0_descs<T, BN, CONSUMERS, STAGES>(smem, c, TA, TB);
    uint32_t full = smem_u32(&ring.full[0]), empty = smem_u32(&ring.empty[0]);
    // Held in registers: otherwise the compiler rebuilt them from the block's cluster id (S2R,
    // a long-latency read) at the top of each k-tile, between one stage's multiplies and the
    // next stage's wait.
    asm volatile("" : "+r"(full), "+r"(empty));
    __syncwarp();   // (see consume_tile: here it moves the first k-tile's WARPSYNC out of the loop)
    if constexpr (std::is_same_v<T, float> && TA == 1) {
        // (B is never shared here: the host does not share it with these kernels.)
        consume_only_tile_tf32_rega<BN, CONSUMERS, STAGES>(acc, smem, descs.b, full, empty, c, lane, ktiles);
    } else {
        const StageRelease<STAGES, SHARED> release(empty, ring, share);
        unsigned phase = 0;
        for (int kt0 = 0; kt0 < ktiles; kt0 += STAGES, phase ^= 1) {
#pragma unroll
            for (int s = 0; s < STAGES; ++s) {
                if (kt0 + s >= ktiles) break;
                mbar_wait(full + 8 * s, phase);
                consume_stage<T, BN, CONSUMERS, STAGES, TA, TB>(acc, descs, s);
                wgmma_wait<1>();
                fence_regs(acc);
                // The stage before this one is read: released (none before the first k-tile).
                if (lane == 0 && kt0 + s > 0) release.arrive((s + STAGES - 1) % STAGES, kt0 + s - 1, ktiles);
            }
        }
        wgmma_wait<0>();
        fence_regs(acc);
        if (ktiles > 0 && lane == 0) release.arrive((ktiles - 1) % STAGES, ktiles - 1, ktiles);
    }
}

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

// Which epilogues a one-tile kernel's code holds: every one (kGeneral), or, in its lean twins
// (the entry points), the 16-bit register epilogue into C of the operands' dtype alone, without
// bsum (kLeanPlain) or with it (kLeanBsum).
enum { kGeneral, kLeanPlain, kLeanBsum };

// The epilogue into 16-bit C whose rows are 16-byte aligned, without beta or stochastic
// rounding (rows_of_16_bytes, gemm_params.hpp): alpha, bias and ReLU are applied in the
// accumulators' registers, the row sums for bsum added there (each row's share in 4 lanes,
// then 2 shuffles), and the results rounded to C's dtype, so the tile crosses shared memory as
// 16-bit values (half the bytes of the float32 staging that the general epilogue, finish_tile,
// needs for beta and stochastic rounding), and each warp then stores whole rows with 16-byte
// writes. Skipping the epilogue altogether took 4096^3 from 242 to 215 us (ncu, H100): the
// general one was 11% of the product; this one takes it to 224 us. The bias comes from shared
// memory (`bias_s`, filled before the main loop): read from global memory here, each thread's
// 2 * BN / 8 columns cost 15% at 4096^3, and filled here, behind a barrier, 3%.
// (store_tile_16bit's rows_begin and rows_end: the rows of the tile it stores, and whose bsum
// it counts; a block of a split tile stores only its own.)

// The register epilogue of two neighbouring columns: alpha * accumulator + bias, then the
// activation (ReLU, or leaky with the slope).
__device__ __forceinline__ float2 epilogue_pair(const GemmParams& p, float a0, float a1, float2 bias, bool relu) {
    float v0 = p.alpha * a0 + bias.x, v1 = p.alpha * a1 + bias.y;
    if (relu) {
        v0 = activation(v0, p.slope);
        v1 = activation(v1, p.slope);
    }
    return make_float2(v0, v1);
}

// A thread's shares of its two rows (g and g + 8: r0, r1) added over the 4 lanes of its quad
// (a row's columns are spread over them in the accumulator layout) in two shuffles and a fixed
// order: lanes with q even end with row g's sum, q odd with row g + 8's. (Each row over the
// quad apart, the same adds in four shuffles, and one lane storing both sums: bias + ReLU +
// bsum cost 0.35-0.45% more of the product at 4096^3.)
__device__ __forceinline__ float quad_sum_pair(float r0, float r1, int q) {
    const bool odd = q & 1;
    const float s = (odd ? r1 : r0) + __shfl_xor_sync(0xffffffffu, odd ? r0 : r1, 1);
    return s + __shfl_xor_sync(0xffffffffu, s, 2);
}

// Two values rounded to C's 16-bit dtype, in one 32-bit word.
__device__ __forceinline__ uint32_t pack2(float a, float b, int dtype) {
    if (dtype == kBF16) {
        const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
        return *reinterpret_cast<const uint32_t*>(&v);
    }
    const __half2 v = __floats2half2_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&v);
}
// The two values of a pack2 word, as floats.
__device__ __forceinline__ float2 unpack2(uint32_t w, int dtype) {
    if (dtype == kBF16) return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
    return __half22float2(*reinterpret_cast<const __half2*>(&w));
}

// Zeroes the accumulators of this thread's columns at or past N (the tile's first `cols_left`
// columns are inside C). TMA fills B's columns past N with zeros, so these hold A . 0: zero,
// or NaN where a row of A holds an infinity, which the register epilogues' row sums (bsum)
// must not see. Register 4j + r: column 8j + 2q + r % 2.
template <int BN>
__device__ __forceinline__ void zero_columns_past_n(float (&acc)[BN / 2], int cols_left, int q) {
    if (cols_left >= BN) return;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r)
            if (8 * j + 2 * q + r % 2 >= cols_left) acc[4 * j + r] = 0.f;
}

// The register epilogue of the persistent kernel into 16-bit C: a consumer's 64 x BN results
// as alpha * accumulator + bias, the activation (kActRelu: ReLU; kActLeaky: with the slope),
// rounded to C's dtype in pairs (results[2j + h]: row g + 8h, columns 8j + 2q and + 1), and
// where SUMS the whole sums of its two rows' rounded values (rounded_row_sums: on the tensor
// cores, ~0.4% of the product less, 0.2-0.6 by job, than a max and an add a value plus the
// quad's shuffles in float32 at 4096^3). What holds for the whole
// product (C's dtype, the activation, bsum) is a template argument: tested per pair, the pass
// took 2000 (plain) to 2800 (bias + ReLU) cycles a tile (clock64, fp16 4096^3, the tensor cores
// idle).
enum { kActNone, kActRelu, kActLeaky };
// activation(v, 0) in one instruction: max(v, 0), NaN staying NaN (fmaxf would return 0).
__device__ __forceinline__ float relu_keep_nan(float v) {
    float r;
    asm("max.NaN.f32 %0, %1, 0f00000000;" : "=f"(r) : "f"(v));
    return r;
}
// The row sums of a consumer's rounded results on the tensor cores: the packed results are, four
// words at a time, the A fragment of an m16n8k16 multiply (words 4s .. 4s + 3: rows g and g + 8,
// columns 16s + 2q, + 1, + 8, + 9), B a 16 x 8 matrix of ones, so that every column of the float32
// product is a row's sum over the 16 columns. row_sum[h]: the whole sum of row g + 8h, in every
// lane of the quad. Columns past N hold zeros (zero_columns_past_n, the bias past N is zero).
template <bool BF16, int BN>
__device__ __forceinline__ void rounded_row_sums(const uint32_t (&results)[BN / 4], float (&row_sum)[2]) {
    constexpr uint32_t kOnes = BF16 ? 0x3F803F80u : 0x3C003C00u;
    constexpr int kChains = BN / 16 < 4 ? BN / 16 : 4;   // of multiplies, each one's results the next one's C
    float d[kChains][4] = {};
#pragma unroll
    for (int s = 0; s < BN / 16; ++s) {
        float(&e)[4] = d[s % kChains];
        const uint32_t* a = results + 4 * s;
        if constexpr (BF16)
            asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%8}, {%0,%1,%2,%3};"
                : "+f"(e[0]), "+f"(e[1]), "+f"(e[2]), "+f"(e[3])
                : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(kOnes));
        else
            asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%8}, {%0,%1,%2,%3};"
                : "+f"(e[0]), "+f"(e[1]), "+f"(e[2]), "+f"(e[3])
                : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(kOnes));
    }
    row_sum[0] = d[0][0], row_sum[1] = d[0][2];
#pragma unroll
    for (int c = 1; c < kChains; ++c) row_sum[0] += d[c][0], row_sum[1] += d[c][2];
}
template <bool BF16, int ACT, bool SUMS, int BN>
__device__ __forceinline__ void round_results(const GemmParams& p, const float (&acc)[BN / 2], const float* bias_s, int q,
                                              uint32_t (&results)[BN / 4], float (&row_sum)[2]) {
    const float alpha = p.alpha, slope = p.slope;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        const float2 b = *reinterpret_cast<const float2*>(bias_s + 8 * j + 2 * q);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float v0 = alpha * acc[4 * j + 2 * h] + b.x, v1 = alpha * acc[4 * j + 2 * h + 1] + b.y;
            if constexpr (ACT == kActRelu) {
                v0 = relu_keep_nan(v0);
                v1 = relu_keep_nan(v1);
            } else if constexpr (ACT == kActLeaky) {
                v0 = v0 > 0.f ? v0 : v0 * slope;
                v1 = v1 > 0.f ? v1 : v1 * slope;
            }
            results[2 * j + h] = pack2(v0, v1, BF16 ? kBF16 : kF16);
        }
    }
    if constexpr (SUMS) rounded_row_sums<BF16, BN>(results, row_sum);
}
// Calls f(splits) with a cluster split's count (2, 3, 4 or 8: the host's choices) as a
// std::integral_constant value.
template <class F>
__device__ __forceinline__ void with_split_count(int splits, F&& f) {
    if (splits == 2) f(std::integral_constant<int, 2>{});
    else if (splits == 3) f(std::integral_constant<int, 3>{});
    else if (splits == 4) f(std::integral_constant<int, 4>{});
    else f(std::integral_constant<int, 8>{});
}
// Calls f(bf16, act, sums) with the product's choices as std::integral_constant values.
template <class F>
__device__ __forceinline__ void with_epilogue_choices(const GemmParams& p, F&& f) {
    const auto by_act = [&](auto bf16, auto sums) {
        if (!(p.flags & kRelu)) f(bf16, std::integral_constant<int, kActNone>{}, sums);
        else if (p.slope == 0.f) f(bf16, std::integral_constant<int, kActRelu>{}, sums);
        else f(bf16, std::integral_constant<int, kActLeaky>{}, sums);
    };
    const auto by_sums = [&](auto bf16) {
        if (p.flags & kBsum) by_act(bf16, std::true_type{});
        else by_act(bf16, std::false_type{});
    };
    if (p.c_dtype == kBF16) by_sums(std::true_type{});
    else by_sums(std::false_type{});
}

// bsum over a row of tiles in one cluster (bsum_cluster). Row r of the tile is added up by the
// row's block of rank r % tiles_n, from slots gathered[t * BM + r] (t: the tile the sum comes
// from). Each block leaves its sums of its own rows in its slot and sends those of the other
// blocks' rows straight into their slots with st.async, which counts the bytes on the owner's
// `sums_in` mbarrier; an owner waits on that barrier alone, adds the slots in tile order (the
// same bits in every run) and stores bsum. Every row is sent, rows past M too, so that the
// owner's barrier expects a fixed count. Sending needs the owner running with its barrier
// initialised: the cluster barrier arrived at the kernel's start (`cluster_arrive_relaxed`) is
// waited for before the epilogue. No block is written to after it exits: it exits only once
// its barrier has counted every byte sent to it.
// (Each block writing the others' shared memory, then one cluster barrier for all: ~2,500
// cycles on 1760x128x1760 fp16, the barrier 880-1,140 of them. Through
// global memory, the row's last tile waited for a count and a load round trip after all
// others: +21-47% over the plain product on the H100's one-wave N <= 128 shapes.)
template <int BM>
__device__ __forceinline__ uint32_t bsum_cluster_bytes(const GemmParams& p) {
    const int tiles = p.tiles_n, rank = int(blockIdx.x) % tiles;
    return 4u * uint32_t((BM - rank + tiles - 1) / tiles) * uint32_t(tiles - 1);
}
// The owner's adds: every consumer thread waits, whether it adds rows or not, so that the
// block stays until every byte sent to it has landed.
template <int BM>
__device__ __forceinline__ void add_owned_rows(const GemmParams& p, const float* gathered, uint64_t* sums_in, int m0, int z,
                                               int ctid, int nthreads) {
    const int tiles = p.tiles_n, rank = int(blockIdx.x) % tiles;
    mbar_wait_cluster(sums_in, 0);
    for (int r = rank + tiles * ctid; r < BM && m0 + r < p.m; r += tiles * nthreads) {
        float s = 0.f;
        for (int t = 0; t < tiles; ++t) s += gathered[t * BM + r];
        store_bsum(p, z, m0 + r, s);
    }
}
// This tile's sum of its row r into the slot of r's owner (row_sums: this tile's slot).
__device__ __forceinline__ void share_row_sum(const GemmParams& p, float* row_sums, uint64_t* sums_in, int r, float s) {
    const int owner = r % p.tiles_n;
    if (owner == int(blockIdx.x) % p.tiles_n) row_sums[r] = s;
    else store_to_peer(row_sums + r, sums_in, owner, s);
}

template <class T, int BM, int BN, int NTHREADS, int LEAN = kGeneral>
__device__ __forceinline__ void store_tile_16bit(const GemmParams& p, const float (&acc)[BN / 2], unsigned char* smem,
                                                 const float* bias_s, int m0, int n0, int tile_n, int z, int row0, int q,
                                                 int tid, float* row_sums, uint64_t* sums_in, int rows_begin = 0,
                                                 int rows_end = BM) {
    constexpr int LD = BN + 8;   // 16-bit elements per staged row: rows 16 bytes apart in bank terms
    uint16_t* tile = reinterpret_cast<uint16_t*>(smem);
    // bsum: rows row0 and row0 + 8, whole (round_results) or this thread's share (BN > 128)
    float row_sum[2] = {0.f, 0.f};
    // C's dtype, the activation and bsum as template arguments (round_results): with them
    // tested per pair the executed code was several times longer, and this code runs once a
    // block, each instruction fetched from L2 (ncu: 45% of the split 2560x64x2560's warp
    // samples were stalls for instructions here).
    // (The 256-wide tile keeps the per-pair tests: its 128 accumulators and the results beside
    // them would spill, and it runs the large products, where this is a small part.)
    if constexpr (BN <= 128) {
        uint32_t results[BN / 4];
        if constexpr (LEAN != kGeneral) {   // C of the operands' dtype, bsum known: only the activation varies
            constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>, kSums = LEAN == kLeanBsum;
            if (!(p.flags & kRelu)) round_results<kBf16, kActNone, kSums, BN>(p, acc, bias_s, q, results, row_sum);
            else if (p.slope == 0.f) round_results<kBf16, kActRelu, kSums, BN>(p, acc, bias_s, q, results, row_sum);
            else round_results<kBf16, kActLeaky, kSums, BN>(p, acc, bias_s, q, results, row_sum);
        } else {
            with_epilogue_choices(p, [&](auto bf16, auto act, auto sums) {
                round_results<bf16.value, act.value, sums.value, BN>(p, acc, bias_s, q, results, row_sum);
            });
        }
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                *reinterpret_cast<uint32_t*>(tile + (row0 + 8 * h) * LD + 8 * j + 2 * q) = results[2 * j + h];
    } else {
        const bool relu = p.flags & kRelu;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
            const int col = 8 * j + 2 * q;
            const float2 b = *reinterpret_cast<const float2*>(bias_s + col);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float2 v = epilogue_pair(p, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1], b, relu);
                const uint32_t w = pack2(v.x, v.y, p.c_dtype);
                *reinterpret_cast<uint32_t*>(tile + (row0 + 8 * h) * LD + col) = w;
                if (p.flags & kBsum) {   // the values as rounded; columns past N hold zeros (zero_columns_past_n)
                    const float2 r = unpack2(w, p.c_dtype);
                    row_sum[h] += r.x + r.y;
                }
            }
        }
    }
    // bsum: each row's sum from its quad's shares. With bsum_cluster they cross blocks before
    // the C stores below; otherwise they are added and stored after those, so that the
    // shuffles' latency hides behind the stores' (2560x64x2560 with bsum: 9.37 -> 9.20 us).
    const auto finish_row_sums = [&] {
        // lane q < 2: row row0 + 8q
        const float s = BN > 128 ? quad_sum_pair(row_sum[0], row_sum[1], q) : (q & 1) ? row_sum[1] : row_sum[0];
        const int r = row0 + 8 * (q & 1), m = m0 + r;
        if (q < 2 && p.bsum_cluster) share_row_sum(p, row_sums, sums_in, r, s);
        else if (q < 2 && m < p.m && r >= rows_begin && r < rows_end) {
            if (p.tiles_n == 1) store_bsum(p, z, m, s);
            else p.bsum_partials[(int64_t(tile_n) * p.batch + z) * p.m + m] = s;
        }
    };
    if (LEAN != kLeanPlain && (p.flags & kBsum) && p.bsum_cluster) finish_row_sums();
    asm volatile("bar.sync 1, %0;" ::"n"(NTHREADS) : "memory");
    // bsum_cluster: this block's rows added (and their bsum stored) before its C stores, which
    // then overlap the last stores' latency (0.1-0.15 us a call less than after them on the
    // H100's one-wave products).
    if (LEAN != kLeanPlain && p.bsum_cluster)
        add_owned_rows<BM>(p, row_sums - (int(blockIdx.x) % p.tiles_n) * BM, sums_in, m0, z, tid, NTHREADS);
    // Each row: BN / 8 chunks of 16 bytes, a lane per chunk.
    constexpr int kChunks = BN / 8, kRowsPerPass = 32 / kChunks;
    const int warp = tid / 32, lane = tid % 32;
    const int r_in = lane / kChunks, chunk = lane % kChunks;
    uint16_t* C = static_cast<uint16_t*>(p.c) + int64_t(z) * p.c_batch;
    const int n = n0 + 8 * chunk;
    for (int r = rows_begin + warp * kRowsPerPass + r_in; r < rows_end; r += (NTHREADS / 32) * kRowsPerPass) {
        const int m = m0 + r;
        if (m >= p.m) break;
        const uint4 v = *reinterpret_cast<const uint4*>(tile + r * LD + 8 * chunk);
        uint16_t* dst = C + int64_t(m) * p.c_sm + n;
        if (n + 8 <= p.n) {
            *reinterpret_cast<uint4*>(dst) = v;
        } else {
            const uint16_t* e = reinterpret_cast<const uint16_t*>(&v);
            for (int i = 0; i < 8 && n + i < p.n; ++i) dst[i] = e[i];
        }
    }
    if (LEAN != kLeanPlain && (p.flags & kBsum) && !p.bsum_cluster) finish_row_sums();
}

// A consumer's accumulators into the block's float32 tile in shared memory (rows tile_ld(BN)
// floats apart). Register 4j + r holds row row0 + 8 (r / 2), column 8j + 2q + r % 2.
template <int BN>
__device__ __forceinline__ void stage_accumulators(float* tile, const float (&acc)[BN / 2], int row0, int q) {
    constexpr int ld = tile_ld(BN);
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        *reinterpret_cast<float2*>(tile + row0 * ld + 8 * j + 2 * q) = make_float2(acc[4 * j], acc[4 * j + 1]);
        *reinterpret_cast<float2*>(tile + (row0 + 8) * ld + 8 * j + 2 * q) = make_float2(acc[4 * j + 2], acc[4 * j + 3]);
    }
}

// The epilogue of split-K in a cluster: the k_splits blocks of a tile (a cluster, one k slice
// each) stage their float32 sums in shared memory; block `rank` adds rows [rank R, rank R + R)
// of the tile (R = BM / k_splits) over the cluster's blocks in rank order (deterministic sums,
// the same in every run), reading the others' shared memory, and finishes those rows like the
// general epilogue (finish_tile: alpha, bias, activation, beta, stochastic rounding, bsum).
// No float32 slices cross global memory and no second kernel runs: with a separate reduction
// kernel, a split product was worth about 0.4 of an unsplit one of the same occupancy on the
// small-N shapes. k_splits is 2, 4 or 8 (the host's choice;
// splits of 3 run split_k_push_epilogue only).
// Used where split_k_push_epilogue (below) is not: tiles wider than kSplitPushMaxBn, beta,
// stochastic rounding, float32 C.
template <int BM, int BN, int NTHREADS, class Sync>
__device__ __forceinline__ void split_k_epilogue(const GemmParams& p, const float (&acc)[BN / 2], float* tile, int m0,
                                                 int n0, Tile at, int z, int row0, int q, int ctid, Sync sync) {
    constexpr int ld = tile_ld(BN);
    stage_accumulators<BN>(tile, acc, row0, q);
    cluster_sync();   // every block's sums are staged
    const int splits = p.k_splits, rank = int(blockIdx.x) % splits, rows = BM / splits;
    float* mine = tile + rank * rows * ld;
    const int base = split_rank_base(splits);
    uint32_t peers[8];
#pragma unroll
    for (int r = 0; r < 8; ++r) peers[r] = cluster_peer_addr(mine, base + (r < splits ? r : 0));
    constexpr int kVecs = BN / 4;   // float4 columns per row
    for (int i = ctid; i < rows * kVecs; i += NTHREADS) {
        const int off = (i / kVecs) * ld + 4 * (i % kVecs);
        float4 v[8];
#pragma unroll
        for (int r = 0; r < 8; ++r)
            if (r < splits) v[r] = load_cluster_f4(peers[r] + 4 * uint32_t(off));
        float4 s = v[0];
#pragma unroll
        for (int r = 1; r < 8; ++r)
            if (r < splits) s.x += v[r].x, s.y += v[r].y, s.z += v[r].z, s.w += v[r].w;
        // Only this block adds these rows: the others read rows of their own here.
        *reinterpret_cast<float4*>(mine + off) = s;
    }
    sync();
    const int m_rows = m0 + rank * rows;
    switch (splits) {
        case 2: finish_tile<BM / 2, BN, NTHREADS>(p, mine, m_rows, n0, at.n, z, ctid); break;
        case 4: finish_tile<BM / 4, BN, NTHREADS>(p, mine, m_rows, n0, at.n, z, ctid); break;
        default: finish_tile<BM / 8, BN, NTHREADS>(p, mine, m_rows, n0, at.n, z, ctid); break;
    }
    // bsum over several tiles per row: each block of the cluster counts its share of the rows.
    bsum_across_tiles<BM>(p, m0, at.m, z, ctid, NTHREADS, sync);
    cluster_sync();   // the other blocks are done reading this one's shared memory
}

// Split-K in a cluster into 16-bit C without beta or stochastic rounding (kSplitPushMaxBn,
// gemm_params.hpp): the slices' sums cross blocks from registers. Block `rank` owns the 8-row
// groups [split_first_group(rank), split_first_group(rank + 1)) of the tile. A thread's
// accumulators are two row groups of 8 rows (rows row0 and row0 + 8, BN / 16 float4 values
// each); a group owned by another block is sent with st.async into that block's receive
// buffer, in a layout that mirrors the registers (slot [source][group][float4][lane], so that
// a warp's 16-byte stores and the owner's loads are 512 contiguous bytes), counted on the
// owner's `split_in` mbarrier. The owner waits on that barrier alone, adds its groups over the
// slices in rank order (the same bits in every run) in its registers and finishes its rows
// with the 16-bit register epilogue. No block waits for another to be done reading, and the
// receive buffer is not part of the stages, so a block sends as soon as its main loop ends.
// (The general split epilogue above, staging in float32, a cluster barrier, the others' rows
// read through distributed shared memory, finish_tile and a second barrier, took 3.7 us
// against the unsplit 64 x 64 tile's 1.4.)
// The bytes block `rank` of a split receives: the other blocks' sums of its row groups.
template <int BM, int BN>
__device__ __forceinline__ uint32_t split_incoming_bytes(int splits) {
    const int rank = int(blockIdx.x) % splits;
    const int owned = split_first_group(BM / 8, splits, rank + 1) - split_first_group(BM / 8, splits, rank);
    return uint32_t(4 * (splits - 1) * 8 * owned * BN);
}
template <class T, int BM, int BN, int NTHREADS, int SPLITS, int LEAN, class Sync>
__device__ __forceinline__ void split_k_push_epilogue(const GemmParams& p, float (&acc)[BN / 2], unsigned char* smem,
                                                      const float* bias_s, float4* receive, uint64_t* split_in, int m0,
                                                      int n0, Tile at, int z, int c, int warp, int lane, int tid,
                                                      Sync sync) {
    constexpr int kVecs = BN / 16;                   // float4 values per row group per thread
    constexpr int kGroups = BM / 8;
    constexpr int kSlotGroups = split_first_group(kGroups, SPLITS, 1);   // the most groups a block owns
    constexpr uint32_t kSourceBytes = kSlotGroups * kVecs * 512;        // one source's slots
    const int rank = int(blockIdx.x) % SPLITS;
    const auto owner_of = [](int group) { return group * SPLITS / kGroups; };
    const auto slot_of = [&](int group) { return group - split_first_group(kGroups, SPLITS, owner_of(group)); };
    // The group's float4 v: columns 16v + 2q, + 1, 16v + 8 + 2q, + 1 of row row0 + 8h.
    const auto vec = [&](int v, int h) {
        return make_float4(acc[8 * v + 2 * h], acc[8 * v + 2 * h + 1], acc[8 * v + 4 + 2 * h], acc[8 * v + 5 + 2 * h]);
    };
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int group = 8 * c + 2 * warp + h, owner = owner_of(group);
        if (owner == rank) continue;
        const int source = rank < owner ? rank : rank - 1;
        const float4* slot = receive + ((source * kSlotGroups + slot_of(group)) * kVecs) * 32 + lane;
        const int peer = split_rank_base(SPLITS) + owner;
        const uint32_t to = cluster_peer_addr(slot, peer), bar = cluster_peer_addr(split_in, peer);
#pragma unroll
        for (int v = 0; v < kVecs; ++v) store_to_peer_f4(to + 512u * v, bar, vec(v, h));
    }
    // Every thread waits, whether it owns rows or not: the block stays until every byte sent
    // to it has landed.
    mbar_wait_cluster(split_in, 0);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int group = 8 * c + 2 * warp + h;
        if (owner_of(group) != rank) continue;
        const uint32_t slots = smem_u32(receive + (slot_of(group) * kVecs) * 32 + lane);
#pragma unroll
        for (int v = 0; v < kVecs; ++v) {
            // The other blocks' sums (source i: block i, or i + 1 from this block's rank on),
            // then all of them added in rank order.
            float4 in[SPLITS - 1];
#pragma unroll
            for (int i = 0; i < SPLITS - 1; ++i) in[i] = load_shared_f4(slots + kSourceBytes * i + 512u * v);
            const float4 own = vec(v, h);
            const auto term = [&](int r) { return r < rank ? in[r] : r == rank ? own : in[r - 1]; };
            float4 sum = term(0);
#pragma unroll
            for (int r = 1; r < SPLITS; ++r) {
                const float4 t = term(r);
                sum.x += t.x, sum.y += t.y, sum.z += t.z, sum.w += t.w;
            }
            acc[8 * v + 2 * h] = sum.x, acc[8 * v + 2 * h + 1] = sum.y;
            acc[8 * v + 4 + 2 * h] = sum.z, acc[8 * v + 5 + 2 * h] = sum.w;
        }
    }
    const int g = lane / 4, q = lane % 4;
    if (LEAN != kLeanPlain && (p.flags & kBsum)) zero_columns_past_n<BN>(acc, p.n - n0, q);
    store_tile_16bit<T, BM, BN, NTHREADS, LEAN>(p, acc, smem, bias_s, m0, n0, at.n, z, 64 * c + 16 * warp + g, q, tid,
                                                nullptr, nullptr, 8 * split_first_group(kGroups, SPLITS, rank),
                                                8 * split_first_group(kGroups, SPLITS, rank + 1));
    if constexpr (LEAN != kLeanPlain) bsum_across_tiles<BM>(p, m0, at.m, z, tid, NTHREADS, sync);
}

// bsum_cluster (above) after the general epilogue: finish_tile left the tile's row sums in
// this tile's slot; they are sent from there. (The 16-bit epilogue sends them from registers
// and adds its own rows itself.)
template <int BM, class Sync>
__device__ __forceinline__ void bsum_across_cluster(const GemmParams& p, float* gathered, uint64_t* sums_in, int m0, int z,
                                                    int ctid, int nthreads, Sync consumers_sync) {
    const int tiles = p.tiles_n, rank = int(blockIdx.x) % tiles;
    consumers_sync();   // this tile's row sums are in gathered[rank]
    for (int r = ctid; r < BM; r += nthreads)
        if (r % tiles != rank) store_to_peer(gathered + rank * BM + r, sums_in, r % tiles, gathered[rank * BM + r]);
    add_owned_rows<BM>(p, gathered, sums_in, m0, z, ctid, nthreads);
}

// SHARE (the 16-wide tile's `_shb` entries): B shared along m (b_multicast > 1), a kernel of its
// own so that the kernels without it keep their code (with both in one kernel the 16-wide
// tile's unshared loop took 1760x16x1760 (k/4) 4.0 -> 4.5 us, and in two copies it still read
// ~1 instruction a stage more).
template <class T, int BN, int CONSUMERS, int STAGES, int TA, int TB, int LEAN = kGeneral, bool SHARE = false>
__device__ __forceinline__ void wgmma_gemm(const GemmParams& p, const CUtensorMap* map_a, const CUtensorMap* map_b) {
    using Cfg = WgConfig<T, BN, CONSUMERS, STAGES>;
    constexpr int BM = Cfg::BM, BK = Cfg::BK;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = aligned_smem(smem_raw);
    __shared__ __align__(8) Ring<STAGES> ring;

    const int tid = threadIdx.x;
    const Tile at = tile_of(p, tile_index(p));
    const Work w = work_of(p, BK);
    const int z = w.z;
    const int m0 = at.m * BM, n0 = at.n * BN;
    const int ktiles = w.kt_end - w.kt_begin;
    if (tid == 0) {
        tma_prefetch_descriptor(map_a);
        tma_prefetch_descriptor(map_b);
    }
    // Split-K in a cluster through the blocks' registers (split_k_push_epilogue), where the
    // receive buffer fits beside the stages (the host sizes shared memory by the same rule).
    // (The lean twins' splits are all of this kind; see the entry points.)
    constexpr bool lean = LEAN != kGeneral;
    const bool push_split = p.k_cluster && (lean ? BN <= kSplitPushMaxBn : split_sums_pushed(p, BN));
    const bool bsum_cluster = LEAN != kLeanPlain && p.bsum_cluster, k_cluster = p.k_cluster;
    if (k_cluster && !push_split && (lean || p.k_splits == 3)) __trap();   // the host's choice of kernel is wrong
    // Completes when the other blocks' sums of this block's rows have landed: their row sums
    // (bsum_cluster) or their slices' sums (push_split).
    __shared__ __align__(8) uint64_t sums_in;
    if ((bsum_cluster || push_split) && tid == 0) {
        mbar_init(&sums_in, 1);
        mbar_expect_tx(&sums_in, bsum_cluster ? bsum_cluster_bytes<BM>(p) : split_incoming_bytes<BM, BN>(p.k_splits));
    }
    // B shared along m (b_multicast): the blocks of a cluster share n0 and their k-tiles.
    static_assert(!SHARE || BN == 16, "only the 16-wide tile shares B");
    BShare share;
    if constexpr (SHARE) {
        share.blocks = p.b_multicast;
        asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(share.rank));
    }
    init_ring<STAGES, CONSUMERS>(ring, share.blocks);   // (its fence publishes sums_in's initialisation to the cluster)
    // Waited for before sums cross blocks, or, with B shared, before the first multicast copy
    // (every block's barriers initialised).
    if (bsum_cluster || push_split || SHARE) cluster_arrive_relaxed();
    // Launched programmatically (gemm_cuda.cpp): the setup above overlapped the end of the kernel
    // before this one. The next kernel's blocks may start once every block of this grid allows
    // it (or has exited): the 16-wide tile allows it now (its blocks, two to an SM, share SMs
    // with the next grid's, which do their setup meanwhile); the others once their main loop is
    // done where it is short (under 32 k-tiles), else not at all, so that the next grid's blocks
    // start as this grid's exit. The next grid's blocks waiting on the SMs this grid left idle
    // made the one-block-per-SM kernels slower, the more the longer they streamed: on the H100
    // fp16 4096x256x4096 took 19.4 us a call allowed at the exit, 23.4 after the main loop, 23.8
    // at the start; 4608x64x4096 13.0, 14.2-15.3 and 18.6-18.8; 7424x64x2560 10.6, 12.6 and 12.6;
    // but 512^3 4.3, 3.9 and 3.9, 3072x128x1024 5.5, 5.2 and 5.5, 1760x128x1760 (split in 2) 6.0,
    // 5.9 and 6.3; the 16-wide tile lost after the main loop (7680x16x2560 13.8 against 12.5)
    // and mostly at the exit (6144x16x2048 A^T 8.7 against 8.5).
    wait_for_prior_grids();
    if constexpr (BN == 16) allow_next_grid();

    const int wg = tid / 128;
    if (wg == 0) {
        // Producer: lane 0 of the first kIssuers warps keep the ring full.
        if constexpr (CONSUMERS == 2) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if constexpr (SHARE) cluster_wait();
        if (tid % 32 == 0 && tid / 32 < kIssuers<STAGES>) {
            int it = 0;
            const int za = p.a_batch ? z : 0, zb = p.b_batch ? z : 0;
            produce_tile<T, BN, CONSUMERS, STAGES, TA, TB, SHARE>(smem, ring, map_a, map_b, w.kt_begin, ktiles, m0, n0, za, zb,
                                                                  it, tid / 32, kIssuers<STAGES>, share);
        }
        if (k_cluster && !push_split) {   // the consumers' two cluster barriers
            cluster_sync();
            cluster_sync();
        } else if (bsum_cluster || push_split) {   // the barrier arrived at the start
            cluster_wait();
        }
        return;
    }

    // Consumers: warpgroup c multiplies rows [64c, 64c + 64) of the tile.
    if constexpr (CONSUMERS == 2) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int c = wg - 1;
    const int ctid = tid - 128 * wg, warp = ctid / 32, lane = ctid % 32;
    // The tile's bias, for the 16-bit epilogue: loaded now, its latency hidden by the main loop
    // (the barrier that opens the epilogue makes it visible).
    float* bias_s = reinterpret_cast<float*>(smem + STAGES * Cfg::kStageBytes);
    if (lean || rows_of_16_bytes(p)) {   // (zeros without a bias: the register epilogue adds it unconditionally)
        const bool bias = p.flags & kBias;
        for (int i = tid - 128; i < BN; i += 128 * CONSUMERS) bias_s[i] = bias && n0 + i < p.n ? __ldg(p.bias + n0 + i) : 0.f;
    }
    float acc[BN / 2];
    consume_only_tile<T, BN, CONSUMERS, STAGES, TA, TB, SHARE>(acc, smem, ring, c, lane, ktiles, share);
    if (BN != 16 && ktiles < 32 && tid == 128) allow_next_grid();   // (one thread a block suffices)

    // Epilogue. Register 4j + r holds row 16 warp + g + 8 (r / 2), column 8j + 2q + r % 2 of
    // this consumer's 64 x BN block. Once both consumers are done with the stages (no TMA is
    // in flight: every stage issued was waited for), the blocks go to shared memory and are
    // written to C row by row.
    constexpr int kConsumerThreads = 128 * CONSUMERS;
    asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads) : "memory");
    const int g = lane / 4, q = lane % 4;
    const int row0 = 64 * c + 16 * warp + g;
    const auto consumers_sync = [] { asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads) : "memory"); };
    if (bsum_cluster || push_split) cluster_wait();   // the other blocks run, their sums_in initialised
    if (push_split) {
        float4* receive = reinterpret_cast<float4*>(smem + STAGES * Cfg::kStageBytes + BN * 4);   // after the bias
        // The split count as a template argument: the adds and the row groups' owners in
        // straight-line code (with the count at run time the adds took ~1 us).
        with_split_count(p.k_splits, [&](auto splits) {
            split_k_push_epilogue<T, BM, BN, kConsumerThreads, splits.value, LEAN>(
                p, acc, smem, bias_s, receive, &sums_in, m0, n0, at, w.zc, c, warp, lane, tid - 128, consumers_sync);
        });
        return;
    }
    if (!lean && k_cluster) {
        split_k_epilogue<BM, BN, kConsumerThreads>(p, acc, reinterpret_cast<float*>(smem), m0, n0, at, w.zc, row0, q,
                                                   tid - 128, consumers_sync);
        return;
    }
    if constexpr (LEAN == kLeanPlain) {
        store_tile_16bit<T, BM, BN, kConsumerThreads, LEAN>(p, acc, smem, bias_s, m0, n0, at.n, w.zc, row0, q, tid - 128,
                                                            nullptr, nullptr);
    } else {
        // bsum_cluster: the row sums of the cluster's tiles (up to 8), this tile's in its slot.
        __shared__ float gathered[8 * BM];
        float* row_sums = gathered + (p.bsum_cluster ? int(blockIdx.x) % p.tiles_n : 0) * BM;
        if (lean || rows_of_16_bytes(p)) {
            if (p.flags & kBsum) zero_columns_past_n<BN>(acc, p.n - n0, q);
            store_tile_16bit<T, BM, BN, kConsumerThreads, LEAN>(p, acc, smem, bias_s, m0, n0, at.n, w.zc, row0, q,
                                                                tid - 128, row_sums, &sums_in);
        } else if constexpr (!lean) {
            float* tile = reinterpret_cast<float*>(smem);
            stage_accumulators<BN>(tile, acc, row0, q);
            asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads) : "memory");
            finish_tile<BM, BN, kConsumerThreads>(p, tile, m0, n0, at.n, w.zc, tid - 128, p.bsum_cluster ? row_sums : nullptr);
        }
        if (p.bsum_cluster) {
            if constexpr (!lean)
                if (!rows_of_16_bytes(p))   // (the 16-bit epilogue added its rows before its C stores)
                    bsum_across_cluster<BM>(p, gathered, &sums_in, m0, w.zc, tid - 128, kConsumerThreads, consumers_sync);
        }
        else bsum_across_tiles<BM>(p, m0, at.m, w.zc, tid - 128, kConsumerThreads, consumers_sync);
    }
}

// bsum in the persistent kernels. A row of tiles is added up by the block that runs its last
// tile in the walk (column tiles_n - 1: the walk visits a row's columns in order), the row's
// adder; every other tile of the row stores its row sums as tagged partials (one 64-bit word:
// this launch's tag above the float's bits, a single-copy-atomic store). The adder's bsum
// warps (warps 1-3 of the producer's warpgroup) start on the row as soon as they reach that
// tile, while its consumers are still multiplying it: they read the row's partials, the tile's
// own too (stored tagged like the others), re-reading those whose tag is not yet this
// launch's, add them in tile order and store bsum. Where the tile is the block's last, its
// consumers add the row themselves (add_row_last), their own sums from shared memory. The
// sums' order, and so their bits, are those of the design before: the last tile of a row to
// finish counted itself on a turn counter (an acquire-release atomic) and then loaded the
// row's partials, so an acquire-release fence and three round trips to L2 came after the
// grid's last tiles, while their C stores fill the memory system (ncu, 4096^3, over bias +
// ReLU: fp16 +4-5 us of 220, tf32 +13 us of 405). Here nothing waits on an atomic or a fence.
// An adder waits only for tiles earlier in the walk, which are running or done as long as
// every block of the grid is resident: the launch is cooperative.
template <int STAGES, int BM>
struct PersistentBarriers {
    Ring<STAGES> ring;
    int pending_box[2][3];   // per consumer: where the results waiting in registers go (n0, m0, z)
    float own_sums[BM];      // the row sums of the block's last tile, where it adds its row (the
                             // tf32 B-in-registers kernel: also consumer 1's share of each tile's)
};

// A persistent kernel's walk: tiles per batch entry, tiles in all, k-tiles per tile, and
// whether bsum adds rows over several tiles.
struct PersistentWalk {
    int per_entry, total, ktiles;
    bool rows_span_tiles;
};
__device__ __forceinline__ PersistentWalk persistent_walk(const GemmParams& p, int bk) {
    const int per_entry = p.tiles_m * p.tiles_n;
    return {per_entry, per_entry * p.batch, (p.k + bk - 1) / bk, (p.flags & kBsum) && p.tiles_n > 1};
}

template <int STAGES, int BM>
__device__ __forceinline__ void init_persistent_barriers(PersistentBarriers<STAGES, BM>& bars, const unsigned char* smem) {
    if (threadIdx.x == 0 && smem_u32(smem) % 1024 != 0) __trap();   // the 128-byte swizzle's tiles need it
    init_ring<STAGES, 2>(bars.ring);
}

__device__ __forceinline__ bool is_row_adder(const GemmParams& p, const Tile& at) { return at.n == p.tiles_n - 1; }

// A tile's partial row sum s of row m, tagged with this launch (st.relaxed of one 64-bit word:
// the tag and the value arrive together or not at all).
__device__ __forceinline__ void store_tagged(const GemmParams& p, int tile_n, int z, int m, float s) {
    const uint64_t w = uint64_t(p.bsum_epoch) << 32 | __float_as_uint(s);
    uint64_t* at = p.bsum_tagged + (int64_t(tile_n) * p.batch + z) * p.m + m;
    asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(at), "l"(w) : "memory");
}
__device__ __forceinline__ uint64_t load_tagged(const uint64_t* at) {
    uint64_t w;
    asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(w) : "l"(at) : "memory");
    return w;
}

// Tile tile_n's sum s of its row r (row m of C): into shared memory where the block adds the
// row itself (add_row_last), else as a tagged partial where rows span tiles, else to bsum.
__device__ __forceinline__ void deliver_row_sum(const GemmParams& p, float* own_sums, bool add_here, bool spans, int tile_n,
                                                int z, int r, int m, float s) {
    if (add_here) own_sums[r] = s;
    else if (m < p.m && spans) store_tagged(p, tile_n, z, m, s);
    else if (m < p.m) store_bsum(p, z, m, s);
}

// Row m's sum over its first `tiles` tiles, in tile order, from the tagged partials: GROUP
// words in flight per round trip to L2; the words not yet tagged with this launch are read
// again, all at once, until every one is, `backoff_ns` apart. (Read again one after another,
// each word that was not there at the first read cost a round trip of its own: where a row's
// tiles end together in the grid's last wave, that put 3-13 us after them.)
template <int GROUP>
__device__ __forceinline__ float tagged_row_sum(const GemmParams& p, int z, int m, int tiles, unsigned backoff_ns) {
    const uint64_t* col = p.bsum_tagged + int64_t(z) * p.m + m;
    const int64_t tile_stride = int64_t(p.batch) * p.m;
    const uint32_t tag = p.bsum_epoch;
    float s = 0.f;
    for (int t0 = 0; t0 < tiles; t0 += GROUP) {
        uint64_t w[GROUP];
#pragma unroll
        for (int j = 0; j < GROUP; ++j) w[j] = t0 + j < tiles ? load_tagged(col + (t0 + j) * tile_stride) : uint64_t(tag) << 32;
        for (;;) {
            bool missing = false;
#pragma unroll
            for (int j = 0; j < GROUP; ++j) missing |= uint32_t(w[j] >> 32) != tag;
            if (!missing) break;
            if (backoff_ns) __nanosleep(backoff_ns);
#pragma unroll
            for (int j = 0; j < GROUP; ++j)
                if (uint32_t(w[j] >> 32) != tag) w[j] = load_tagged(col + (t0 + j) * tile_stride);
        }
#pragma unroll
        for (int j = 0; j < GROUP; ++j) s += __uint_as_float(uint32_t(w[j]));
    }
    return s;
}

// Whether tile t is this block's last in the walk.
__device__ __forceinline__ bool last_of_block(int t, int total) { return t + int(gridDim.x) >= total; }

// The bsum warps (96 threads, this one `bt`): each tile of this block that adds its row, but
// the block's last (which its consumers add themselves, add_row_last), rows bt, bt + 96, ...
// of the tile over all the row's tiles (GROUP words in flight). They reach the tile while its
// consumers multiply it, or earlier, and wait for the partials sleeping 1 us between reads:
// these sums are needed by the kernel's end only.
template <int BM, int GROUP>
__device__ __forceinline__ void add_bsum_rows(const GemmParams& p, int per_entry, int total, int bt) {
    for (int t = blockIdx.x; t < total; t += gridDim.x) {
        const int z = t / per_entry;
        const Tile at = tile_of(p, t - z * per_entry);
        if (!is_row_adder(p, at) || last_of_block(t, total)) continue;
        for (int m = at.m * BM + bt; m < at.m * BM + BM && m < p.m; m += 96)
            store_bsum(p, z, m, tagged_row_sum<GROUP>(p, z, m, p.tiles_n, 1000));
    }
}

// The block's last tile, where it adds its row: the consumers, idle after its epilogue, take a
// row each (`i` of `nthreads`), with GROUP of the row's other partials in flight at once.
// Where the grid's last wave holds most of a row's tiles, their partials land as that wave
// ends; the bsum warps, with their few registers (a few words in flight per round trip),
// ended the kernel 4-8 us after the consumers there (globaltimer, fp16 4096^3).
template <int BM, int GROUP>
__device__ __forceinline__ void add_row_last(const GemmParams& p, const float* own_sums, int m0, int z, int i,
                                             int nthreads) {
    for (int r = i; r < BM && m0 + r < p.m; r += nthreads)
        store_bsum(p, z, m0 + r, tagged_row_sum<GROUP>(p, z, m0 + r, p.tiles_n - 1, 0) + own_sums[r]);
}

// The persistent variant, for products of several waves of tiles into C whose rows TMA can
// address, with alpha, bias, ReLU and bsum (no beta or stochastic rounding): one block per
// SM walks the tiles blockIdx.x, + gridDim.x, ... (batches folded in). The producer runs ahead
// across tiles, so the next tile's stages load while the consumers finish this one, and the
// consumers hardly wait for their stores: each applies the epilogue in registers, writes a
// part of its 64 x 256 results (64 x 64 16-bit or 64 x 32 float32 values, one box of 64 rows x
// 128 bytes in the 128-byte swizzle) into one of two buffers of its own, and one thread hands
// the box to TMA; the next part but one waits for TMA to have read it out of the buffer. (In
// the one-tile-per-block kernel the epilogue and a new block's first loads stop the tensor
// cores each tile.) Shared memory holds 4 stages (ncu, fp16 4096^3 without epilogue: 3
// stages 221 us, tensor pipe 91% busy; 4 stages 203 us, 98%), the four 8 KB buffers, the
// tile's bias twice (tiles alternate, the consumers share it) and the barriers: 227 KB, all
// there is, so the block's dynamic shared memory must start 1024-byte aligned (checked). bsum
// over several tiles per row: the consumers store the tile's row sums as tagged partials and
// the bsum warps of the block that adds the row read them (add_bsum_rows).
template <class T, int STAGES, int TA, int TB, bool C32, int LEAN = kGeneral>
__device__ __forceinline__ void wgmma_gemm_persistent(const GemmParams& p, const CUtensorMap* map_a,
                                                      const CUtensorMap* map_b, const CUtensorMap* map_c) {
    static_assert(!(LEAN != kGeneral && C32), "the persistent kernels' twins: 16-bit C");
    using Cfg = WgConfig<T, 256, 2, STAGES>;
    constexpr int BM = Cfg::BM, BN = 256, BK = Cfg::BK;
    // A consumer stages its 64 x BN results a part at a time, in two 8 KB buffers used in turn:
    // a part is one box of 64 rows x 128 bytes (64 16-bit or 32 float32 columns), and before a
    // buffer is written again only the store of two parts ago must have read it out. (With
    // one 16 KB buffer and two parts per tile, waiting for the first part's store to leave
    // the buffer took 1000-1300 of the ~4900 cycles of a tile's epilogue: clock64, fp16
    // 4096^3.)
    constexpr int kPartCols = C32 ? 32 : 64, kParts = BN / kPartCols;
    constexpr int kPartBytes = 64 * kPartCols * (C32 ? 4 : 2);
    using Barriers = PersistentBarriers<STAGES, BM>;
    extern __shared__ __align__(1024) unsigned char smem[];
    unsigned char* staged_base = smem + STAGES * Cfg::kStageBytes;
    float* bias_base = reinterpret_cast<float*>(staged_base + 4 * kPartBytes);   // [2][BN], after 2 x 2 buffers
    Barriers& bars = *reinterpret_cast<Barriers*>(bias_base + 2 * BN);
    Ring<STAGES>& ring = bars.ring;
    const int tid = threadIdx.x;
    const PersistentWalk walk = persistent_walk(p, BK);
    const int per_entry = walk.per_entry, total = walk.total, ktiles = walk.ktiles;
    const bool spans = LEAN != kLeanPlain && walk.rows_span_tiles;
    init_persistent_barriers(bars, smem);

    const int wg = tid / 128;
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n");   // room for the bsum warps' 4 words in flight
        if (tid == 0) {
            int it = 0;
            for (int t = blockIdx.x; t < total; t += gridDim.x) {
                const int z = t / per_entry;
                const Tile at = tile_of(p, t - z * per_entry);
                produce_tile<T, BN, 2, STAGES, TA, TB>(smem, ring, map_a, map_b, 0, ktiles, at.m * BM, at.n * BN,
                                                       p.a_batch ? z : 0, p.b_batch ? z : 0, it);
            }
        } else if (spans && tid >= 32) {
            add_bsum_rows<BM, 4>(p, per_entry, total, tid - 32);
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n");   // 128 x 56 + 256 x 224 <= 64K
    const int c = wg - 1;
    const int ctid = tid - 128 * wg, warp = ctid / 32, lane = ctid % 32;
    const int g = lane / 4, q = lane % 4;
    unsigned char* staged_bufs = staged_base + c * 2 * kPartBytes;   // this consumer's two buffers
    int part = 0;                                                     // parts staged so far
    const bool bias = p.flags & kBias, relu = p.flags & kRelu;
    const auto consumer_sync = [c] { asm volatile("bar.sync %0, 128;" ::"r"(2 + c) : "memory"); };
    // Part hf of the tile at box = (n0, m0, z) from staged to C: this consumer's 64 rows x
    // kPartCols columns, one TMA box, after every thread of the consumer has written it. Only
    // thread 0 reads the box.
    const auto send_part = [&](unsigned char* staged, const int* box, int hf) {
        fence_to_tma();
        consumer_sync();
        if (ctid == 0) {
            tma_store(map_c, staged, box[0] + kPartCols * hf, box[1], box[2]);
            tma_store_commit();
        }
    };
    // The next staging buffer, once the store of two parts ago has read it out.
    const auto next_buffer = [&] {
        unsigned char* staged = staged_bufs + (part++ % 2) * kPartBytes;
        if (ctid == 0) tma_store_wait_read_but_one();
        consumer_sync();
        return staged;
    };
    // 16-bit C: a tile's results wait in registers, rounded to C's dtype, until the next tile's
    // first multiplies are issued; its parts are stored one per k-tile while those run. (Staged
    // right after their tile's last multiply, the tensor cores idled through every part's
    // barriers and waits: ~4000 cycles a tile, 5-7% of the product at 4096^3.) The block's
    // tiles before tile t wait this way; only the thread that hands parts to TMA needs to know
    // where they go (bars.pending_box: registers are short here).
    uint32_t results[C32 ? 1 : BN / 4];   // register 2j + h: row g + 8h, columns 8j + 2q, + 1
    int* const pending_box = bars.pending_box[c];   // n0, m0, z
    const auto store_pending_part = [&](int hf, int t) {
        if constexpr (!C32) {
            if (t == int(blockIdx.x)) return;
            unsigned char* staged = next_buffer();
#pragma unroll
            for (int jj = 0; jj < kPartCols / 8; ++jj)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    *reinterpret_cast<uint32_t*>(staged + (16 * warp + g + 8 * h) * 128 + (jj ^ g) * 16 + 4 * q) =
                        results[2 * (hf * (kPartCols / 8) + jj) + h];
            send_part(staged, pending_box, hf);
        }
    };
    int it = 0;
    for (int t = blockIdx.x, u = 0; t < total; t += gridDim.x, ++u) {
        const int z = t / per_entry;
        const Tile at = tile_of(p, t - z * per_entry);
        const int m0 = at.m * BM + 64 * c, n0 = at.n * BN;
        // This consumer's half of the tile's bias, loaded now (the main loop hides the loads)
        // and staged after it.
        const int bias_col = 128 * c + ctid;
        const float bias_next = bias && n0 + bias_col < p.n ? __ldg(p.bias + n0 + bias_col) : 0.f;
        float acc[BN / 2];
        consume_tile<T, BN, 2, STAGES, TA, TB, C32 ? 0 : kParts>(acc, smem, ring, c, lane, ktiles, it,
                                                                 [&](int hf) { store_pending_part(hf, t); });

        // bias_s[u % 2] was last read in tile u - 2's epilogue, before both consumers passed
        // tile u - 1's barrier 1.
        float* bias_s = bias_base + (u % 2) * BN;
        bias_s[bias_col] = bias_next;
        asm volatile("bar.sync 1, 256;" ::: "memory");   // both halves of bias_s are in
        // Register 4j + r: row 16 warp + g + 8 (r / 2), column 8j + 2q + r % 2 of this
        // consumer's 64 x BN block. Part hf holds columns [kPartCols hf, kPartCols (hf + 1)),
        // register group jj of it the part's columns 8jj..8jj + 7: 16-bit, 16-byte chunk jj of
        // the row, 4 bytes each; float32, chunk 2 jj + q / 2, 8 bytes each. Row r's chunk c
        // sits at c ^ (r % 8) (the 128-byte swizzle; r % 8 = g).
        float row_sum[2] = {0.f, 0.f};   // bsum: its two rows, whole (16-bit C) or this thread's share (C32)
        if (LEAN != kLeanPlain && (p.flags & kBsum)) zero_columns_past_n<BN>(acc, p.n - at.n * BN, q);
        if constexpr (LEAN != kGeneral) {   // C of the operands' dtype, bsum known
            constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>, kSums = LEAN == kLeanBsum;
            if (!relu) round_results<kBf16, kActNone, kSums, BN>(p, acc, bias_s, q, results, row_sum);
            else if (p.slope == 0.f) round_results<kBf16, kActRelu, kSums, BN>(p, acc, bias_s, q, results, row_sum);
            else round_results<kBf16, kActLeaky, kSums, BN>(p, acc, bias_s, q, results, row_sum);
        } else if constexpr (!C32) {
            with_epilogue_choices(p, [&](auto bf16, auto act, auto sums) {
                round_results<bf16.value, act.value, sums.value, BN>(p, acc, bias_s, q, results, row_sum);
            });
        }
#pragma unroll
        for (int hf = 0; hf < (C32 ? kParts : 0); ++hf) {
            unsigned char* staged = next_buffer();
#pragma unroll
            for (int jj = 0; jj < kPartCols / 8; ++jj) {
                const int j = hf * (kPartCols / 8) + jj;
                const float2 b = *reinterpret_cast<const float2*>(bias_s + 8 * j + 2 * q);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const float2 v = epilogue_pair(p, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1], b, relu);
                    const int r = 16 * warp + g + 8 * h;
                    *reinterpret_cast<float2*>(staged + r * 128 + ((2 * jj + q / 2) ^ g) * 16 + 8 * (q % 2)) = v;
                    row_sum[h] += v.x + v.y;   // columns past N hold zeros (zero_columns_past_n)
                }
            }
            const int box[3] = {n0, m0, z};
            send_part(staged, box, hf);
        }
        if constexpr (!C32) {
            if (ctid == 0) pending_box[0] = n0, pending_box[1] = m0, pending_box[2] = z;
            if (last_of_block(t, total))   // no next tile to hide the stores behind
#pragma unroll
                for (int hf = 0; hf < kParts; ++hf) store_pending_part(hf, t + int(gridDim.x));
        }
        if (LEAN != kLeanPlain && (p.flags & kBsum)) {
            // The tile's row sums: to bsum (one tile per row), as tagged partials, or, where the
            // block's last tile adds its row, to its consumers through shared memory.
            const bool add_here = spans && is_row_adder(p, at) && last_of_block(t, total);
            // lane q < 2 delivers row g + 8q
            const float s = C32 ? quad_sum_pair(row_sum[0], row_sum[1], q) : (q & 1) ? row_sum[1] : row_sum[0];
            const int r = 64 * c + 16 * warp + g + 8 * (q & 1), m = at.m * BM + r;
            if (q < 2) deliver_row_sum(p, bars.own_sums, add_here, spans, at.n, z, r, m, s);
            if (add_here) {
                asm volatile("bar.sync 1, 256;" ::: "memory");   // own_sums written by both consumers
                add_row_last<BM, 16>(p, bars.own_sums, at.m * BM, z, ctid + 128 * c, 256);
            }
        }
    }
    if (ctid == 0) tma_store_wait_all();
}

// ---- tf32 with B N-major: B through registers ------------------------------------------------
// tf32 wgmma reads only K-major operands from shared memory, but its A operand may come from
// registers, which the threads load in whatever layout shared memory holds. With B N-major (B
// stored K x N: the plain row-major product) this kernel computes C^T = B^T A^T: B's tile is the
// register operand, loaded from its N-major stage with 64-bit shared-memory loads, A's K-major
// tile the shared-memory one, and the epilogue writes the transposed accumulators. It replaces
// a transposing copy of B into K-major order that took 5-12% of the product's time at
// 8192^3-4096^3 on the H100.
//
// The tile is 256 rows of C (M) by 128 columns (N); consumer c multiplies columns
// [64c, 64c + 64): its m64n256k8 multiplies take 64 columns of B as wgmma's M and the 256 rows
// of A as wgmma's N. A stage is A's 256 x 32 K-major box (32 KB) and B's four 32 x 32 N-major
// boxes (4 KB each), all in the 128-byte swizzle.
//
// Which wgmma row (16 warp + g + 8 h; g = lane / 4) stands for which column of B is free (the
// epilogue undoes it), and it is chosen so that both the fragment loads and the epilogue's
// staging writes hit every bank once per half-warp. The row pair (g, g + 8) is a column pair
// (n, n + 1): registers a0, a1 (and a2, a3, four k later) are one 8-byte load. Its 16-byte
// chunk (of 8 per 128-byte row of a box) is t or t ^ 5 for half-warp t = 2 (warp % 2) + g / 4:
// in a half-warp the loads' rows are 4 consecutive k (chunk XOR k % 8 in 0..3 or 4..7) and
// the staging writes' rows 4 rows of C two apart (XOR 2q + r): either way the 16 lanes
// cover 8 chunks x 2 halves.
struct BRegsConfig {
    static constexpr int BM = 256, BN = 128, BK = 32;
    static constexpr int kABytes = BM * 128, kBBytes = BN * 128, kStageBytes = kABytes + kBBytes;
    static constexpr int kParts = 8;                    // a consumer's 256 x 64 results in 32-row parts
    static constexpr int kPartBytes = 32 * 64 * 4;      // two 32 x 32 float32 boxes
};

// m64n256k8 tf32 with A from registers (K-major fragment: a0 (g, q), a1 (g + 8, q), a2 (g, q + 4),
// a3 (g + 8, q + 4) of the warp's 16 rows).
__device__ __forceinline__ void wgmma_tf32_regs(float (&d)[128], const uint32_t* a, uint64_t db) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %133, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 " KILN_WGMMA_D256
                 ", {%128, %129, %130, %131}, %132, p, 1, 1;}\n"
                 : KILN_WGMMA_OUT256
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

// One k-step (8 k) of a stage into the accumulators, committed as its own group: this thread's
// B fragment (two 8-byte loads at `stage` + `off0` / `off1`), then the multiply with the
// stage's A tile (at `stage`). `frag` must not be written again before that group is waited for.
__device__ __forceinline__ void consume_kstep_bregs(float (&acc)[128], uint32_t (&frag)[4], const unsigned char* stage,
                                                    int off0, int off1, int kk) {
    const uint2 lo = *reinterpret_cast<const uint2*>(stage + off0 + 1024 * kk);
    const uint2 hi = *reinterpret_cast<const uint2*>(stage + off1 + 1024 * kk);
    frag[0] = lo.x, frag[1] = lo.y, frag[2] = hi.x, frag[3] = hi.y;
    fence_fragments(frag);
    fence_regs(acc);
    wgmma_fence();
    wgmma_tf32_regs(acc, frag, smem_desc(stage + 32 * kk, 16));
    wgmma_commit();
    fence_regs(acc);
}

// bsum in the B-in-registers kernel: a thread holds, of a 32-row part, rows 8 jj + 2 q + r
// (value 2 jj + r, the sum of its two columns); the 8 lanes of a warp that share q hold the
// same rows over different columns. Three exchange-and-add steps (lanes 16, 8 and 4 apart)
// halve the values each time, so that lane (g, q) ends with row 8 (g / 2) + 2 q + g % 2 of
// the part summed over the warp's 16 columns: 7 shuffles, in a fixed order. (Reading each
// part's values back from the staged buffer, on the consumers' path between parts, cost
// 7 of the 12 us that bsum added to bias + ReLU at tf32 4096^3, ncu at base clock.)
__device__ __forceinline__ float sum_over_columns_scattered(const float (&v)[8], int g) {
    const bool hi4 = g & 4, hi2 = g & 2, hi1 = g & 1;
    float h4[4], h2[2];
#pragma unroll
    for (int k = 0; k < 4; ++k) h4[k] = (hi4 ? v[k + 4] : v[k]) + __shfl_xor_sync(0xffffffffu, hi4 ? v[k] : v[k + 4], 16);
#pragma unroll
    for (int k = 0; k < 2; ++k) h2[k] = (hi2 ? h4[k + 2] : h4[k]) + __shfl_xor_sync(0xffffffffu, hi2 ? h4[k] : h4[k + 2], 8);
    return (hi1 ? h2[1] : h2[0]) + __shfl_xor_sync(0xffffffffu, hi1 ? h2[0] : h2[1], 4);
}

// A persistent kernel (the walk, the producer, bsum's counting warps and the parts' double
// buffering as in wgmma_gemm_persistent) for tf32 into float32 C with A K-major and B
// N-major. Shared memory: 4 stages of 48 KB, four 8 KB staging buffers, 1 KB of row sums and
// the barriers, 225 KB.
template <int STAGES>
__device__ __forceinline__ void wgmma_gemm_persistent_bregs(const GemmParams& p, const CUtensorMap* map_a,
                                                            const CUtensorMap* map_b, const CUtensorMap* map_c) {
    using Cfg = BRegsConfig;
    constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, kPartBytes = Cfg::kPartBytes;
    using Barriers = PersistentBarriers<STAGES, BM>;
    extern __shared__ __align__(1024) unsigned char smem[];
    unsigned char* staged_base = smem + STAGES * Cfg::kStageBytes;
    float* other_sums = reinterpret_cast<float*>(staged_base + 4 * kPartBytes);   // bsum: consumer 0's share of the tile's row sums [BM]
    Barriers& bars = *reinterpret_cast<Barriers*>(other_sums + BM);
    Ring<STAGES>& ring = bars.ring;
    const int tid = threadIdx.x;
    const PersistentWalk walk = persistent_walk(p, BK);
    const int per_entry = walk.per_entry, total = walk.total, ktiles = walk.ktiles;
    const bool spans = walk.rows_span_tiles;
    init_persistent_barriers(bars, smem);

    const int wg = tid / 128;
    if (wg == 0) {
        // Room for the bsum warps' 8 words in flight; the consumers need no more than the 168
        // registers the kernel is compiled for (128 x 88 + 256 x 200 <= 64K).
        asm volatile("setmaxnreg.dec.sync.aligned.u32 88;\n");
        if (tid == 0) {
            int it = 0;
            for (int t = blockIdx.x; t < total; t += gridDim.x) {
                const int z = t / per_entry;
                const Tile at = tile_of(p, t - z * per_entry);
                const int m0 = at.m * BM, n0 = at.n * BN, za = p.a_batch ? z : 0, zb = p.b_batch ? z : 0;
                for (int kt = 0; kt < ktiles; ++kt, ++it) {
                    const int s = it % STAGES;
                    if (it >= STAGES) mbar_wait(&ring.empty[s], ((it / STAGES) - 1) & 1);
                    unsigned char* sa = smem + s * Cfg::kStageBytes;
                    mbar_expect_tx(&ring.full[s], Cfg::kStageBytes);
                    tma_load(sa, map_a, &ring.full[s], kt * BK, m0, za);
#pragma unroll
                    for (int j = 0; j < BN / 32; ++j)
                        tma_load(sa + Cfg::kABytes + 4096 * j, map_b, &ring.full[s], n0 + 32 * j, kt * BK, zb);
                }
            }
        } else if (spans && tid >= 32) {
            add_bsum_rows<BM, 8>(p, per_entry, total, tid - 32);
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 200;\n");
    const int c = wg - 1;
    const int ctid = tid - 128 * wg, warp = ctid / 32, lane = ctid % 32;
    const int g = lane / 4, q = lane % 4;
    // This thread's wgmma rows (g, g + 8) are B's columns (n, n + 1) of box `box` (32 columns)
    // of the stage, chunk `chunk`, half `half` (see the section's comment).
    const int box = 2 * c + warp / 2, chunk = (2 * (warp % 2) + g / 4) ^ (5 * ((g / 2) % 2)), half = g % 2;
    const int n_in_tile = 32 * box + 4 * chunk + 2 * half;
    // Fragment loads: rows k = q and q + 4 of each 8 k (the swizzle XORs the chunk with k % 8).
    const int b_off = Cfg::kABytes + 4096 * box + 8 * half;
    const int off0 = b_off + 128 * q + 16 * (chunk ^ q), off1 = b_off + 128 * (q + 4) + 16 * (chunk ^ (q + 4));
    unsigned char* staged_bufs = staged_base + c * 2 * kPartBytes;   // this consumer's two buffers
    const bool bias = p.flags & kBias, relu = p.flags & kRelu, bsum = p.flags & kBsum;
    const auto consumer_sync = [c] { asm volatile("bar.sync %0, 128;" ::"r"(2 + c) : "memory"); };
    int part = 0, it = 0;
    uint32_t frag[2][4];
    for (int t = blockIdx.x, u = 0; t < total; t += gridDim.x, ++u) {
        const int z = t / per_entry;
        const Tile at = tile_of(p, t - z * per_entry);
        const int m0 = at.m * BM, n = at.n * BN + n_in_tile;
        const float2 b = bias ? make_float2(n < p.n ? __ldg(p.bias + n) : 0.f, n + 1 < p.n ? __ldg(p.bias + n + 1) : 0.f)
                              : make_float2(0.f, 0.f);
        float acc[128];
#pragma unroll
        for (int i = 0; i < 128; ++i) acc[i] = 0.f;
        // Each k-step is a group of its own, with one of two fragment sets (4 registers each):
        // k-step i loads set i % 2 while the group of k-step i - 1 may still run, then waits
        // for that group, which frees the other set. (A fragment set per stage, 16 registers,
        // twice, would not fit beside the 128 accumulators in the 168 registers a thread has
        // at 384 threads per block: it spilled.)
        // The warp known converged, and the stage index unsigned, as in consume_tile: 67
        // instructions a k-tile against 77, without a reconvergence after each wait.
        __syncwarp();
        for (int kt = 0; kt < ktiles; ++kt, ++it) {
            const unsigned s = unsigned(it) % STAGES;
            mbar_wait(&ring.full[s], (unsigned(it) / STAGES) & 1);
            const unsigned char* stage = smem + s * Cfg::kStageBytes;
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                consume_kstep_bregs(acc, frag[kk % 2], stage, off0, off1, kk);
                wgmma_wait<1>();
                fence_fragments(frag[(kk + 1) % 2]);
                fence_regs(acc);
                // The previous stage's last k-step is done: its shared memory is free.
                if (kk == 0 && kt > 0 && lane == 0) mbar_arrive(&ring.empty[unsigned(it - 1) % STAGES]);
            }
        }
        wgmma_wait<0>();
        fence_regs(acc);
        fence_fragments(frag[0]);
        fence_fragments(frag[1]);
        if (ktiles > 0 && lane == 0) mbar_arrive(&ring.empty[(it - 1) % STAGES]);

        // Register 4j + 2h + r: C row 8j + 2q + r of the tile, column n + h (zeroed past N for
        // bsum, as zero_columns_past_n does for the other layout). Part hf holds rows
        // [32 hf, 32 hf + 32) of this consumer's 64 columns, as two 32 x 32 boxes (box % 2);
        // row r's chunk x sits at x ^ (r % 8).
        // bsum: part hf's row 8 (g / 2) + 2 q + g % 2 over this warp's 16 columns.
        float sums[Cfg::kParts];
        if (bsum && n + 1 >= p.n)
#pragma unroll
            for (int i = 0; i < 128; ++i)
                if (n + (i / 2) % 2 >= p.n) acc[i] = 0.f;
#pragma unroll
        for (int hf = 0; hf < Cfg::kParts; ++hf, ++part) {
            unsigned char* staged = staged_bufs + (part % 2) * kPartBytes;
            if (ctid == 0) tma_store_wait_read_but_one();   // the store of two parts ago is out
            consumer_sync();
            float pair_sums[8];   // bsum: rows 8 jj + 2 q + r (index 2 jj + r), this thread's 2 columns
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
                const int j = 4 * hf + jj;
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const float2 v = epilogue_pair(p, acc[4 * j + r], acc[4 * j + 2 + r], b, relu);
                    const int row = 8 * jj + 2 * q + r;
                    *reinterpret_cast<float2*>(staged + 4096 * (box % 2) + 128 * row + 16 * (chunk ^ (row % 8)) + 8 * half) = v;
                    pair_sums[2 * jj + r] = v.x + v.y;   // columns past N hold zeros (zeroed above)
                }
            }
            if (bsum) sums[hf] = sum_over_columns_scattered(pair_sums, g);
            fence_to_tma();
            consumer_sync();
            if (ctid == 0) {
                tma_store(map_c, staged, at.n * BN + 64 * c, m0 + 32 * hf, z);
                tma_store(map_c, staged + 4096, at.n * BN + 64 * c + 32, m0 + 32 * hf, z);
                tma_store_commit();
            }
        }
        if (bsum) {
            // The tile's row sums over the 8 warps' columns: each consumer adds its 4 warps'
            // in turn (warp 0 to 3) into an array of its own in shared memory, the two at once,
            // one barrier per turn; then each row is consumer 0's sum plus consumer 1's. Lane
            // (g, q) of each warp holds, per part, the row 8 (g / 2) + 2 q + g % 2 of the part.
            // Consumer 1's array is own_sums, which only the block's last tile uses otherwise,
            // after these reads (each thread writes there only the row it has read). (The 8
            // warps in turn into one array took 9 barriers a tile: bias + ReLU + bsum over plain
            // +2.3% at 4096^3 against +1.5%.)
            float* row_sums = c == 0 ? other_sums : bars.own_sums;
            asm volatile("bar.sync 1, 256;" ::: "memory");   // the last tile's rows are delivered
#pragma unroll 1
            for (int turn = 0; turn < 4; ++turn) {
                if (warp == turn)
#pragma unroll
                    for (int hf = 0; hf < Cfg::kParts; ++hf) {
                        const int r = 32 * hf + 8 * (g / 2) + 2 * q + g % 2;
                        row_sums[r] = turn == 0 ? sums[hf] : row_sums[r] + sums[hf];
                    }
                asm volatile("bar.sync 1, 256;" ::: "memory");
            }
            // The tile's row sums: to bsum (one tile per row), as tagged partials, or, where the
            // block's last tile adds its row, to its consumers through shared memory.
            const bool add_here = spans && is_row_adder(p, at) && last_of_block(t, total);
            const int r = ctid + 128 * c;
            const float row_sum = other_sums[r] + bars.own_sums[r];
            deliver_row_sum(p, bars.own_sums, add_here, spans, at.n, z, r, m0 + r, row_sum);
            if (add_here) {
                asm volatile("bar.sync 1, 256;" ::: "memory");   // own_sums is complete
                add_row_last<BM, 24>(p, bars.own_sums, m0, z, r, 256);
            }
        }
    }
    if (ctid == 0) tma_store_wait_all();
}

} // namespace kiln::gemm

using namespace kiln::gemm;

// Entry points: kiln_gemm_wg_<dtype>_<a major><b major>_<BM>x<BN>_s<stages>, k = K-major,
// t = transposed (M- or N-major). The host (gemm_cuda.cpp) builds the same names.
#define KILN_WG_KERNEL(T, tn, BN, CONS, ST, TA, TB, ta, tb)                                                      \
    extern "C" __global__ void __launch_bounds__(128 * (CONS + 1), 1)                                            \
        kiln_gemm_wg_##tn##_##ta##tb##_##BN##_c##CONS##_s##ST(const __grid_constant__ GemmParams p,             \
                                                               const __grid_constant__ CUtensorMap map_a,        \
                                                               const __grid_constant__ CUtensorMap map_b) {      \
        wgmma_gemm<T, BN, CONS, ST, TA, TB>(p, &map_a, &map_b);                                                  \
    }
// The same kernel for the plain epilogue alone, entry name + "_lean": 16-bit C of the operands'
// dtype in rows of 16 bytes, no beta, stochastic rounding or bsum, splits in a cluster only
// through registers (split_k_push_epilogue); + "_lean_bsum": the same with bsum. Its code is a tenth of the general kernel's
// (the 64 x 64 tile: ~1,000 instructions against ~15,500), which matters because a block runs
// its epilogue once, each instruction line fetched from L2 as it goes:
// on the H100 fp16 3072x128x1024 took 4.41 us a call against 5.24, 512^3 3.16 against 3.85.
#define KILN_WG_LEAN_KERNEL(T, tn, BN, CONS, ST, TA, TB, ta, tb)                                                 \
    extern "C" __global__ void __launch_bounds__(128 * (CONS + 1), 1)                                            \
        kiln_gemm_wg_##tn##_##ta##tb##_##BN##_c##CONS##_s##ST##_lean(const __grid_constant__ GemmParams p,      \
                                                                      const __grid_constant__ CUtensorMap map_a, \
                                                                      const __grid_constant__ CUtensorMap map_b) { \
        wgmma_gemm<T, BN, CONS, ST, TA, TB, kLeanPlain>(p, &map_a, &map_b);                                      \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(128 * (CONS + 1), 1)                                            \
        kiln_gemm_wg_##tn##_##ta##tb##_##BN##_c##CONS##_s##ST##_lean_bsum(const __grid_constant__ GemmParams p, \
                                                                           const __grid_constant__ CUtensorMap map_a, \
                                                                           const __grid_constant__ CUtensorMap map_b) { \
        wgmma_gemm<T, BN, CONS, ST, TA, TB, kLeanBsum>(p, &map_a, &map_b);                                       \
    }
// The 16-wide tile with B shared along m (SHARE): entry name + "_shb", and its lean twins
// "_shb_lean" and "_shb_lean_bsum".
#define KILN_WG_SHARED_KERNEL(T, tn, TA, TB, ta, tb, LEAN, suffix)                                               \
    extern "C" __global__ void __launch_bounds__(256, 1)                                                         \
        kiln_gemm_wg_##tn##_##ta##tb##_16_c1_s8_shb##suffix(const __grid_constant__ GemmParams p,               \
                                                            const __grid_constant__ CUtensorMap map_a,           \
                                                            const __grid_constant__ CUtensorMap map_b) {         \
        wgmma_gemm<T, 16, 1, 8, TA, TB, LEAN, true>(p, &map_a, &map_b);                                          \
    }
#define KILN_WG_SHARED_KERNELS(T, tn, TA, TB, ta, tb)             \
    KILN_WG_SHARED_KERNEL(T, tn, TA, TB, ta, tb, kGeneral, )      \
    KILN_WG_SHARED_KERNEL(T, tn, TA, TB, ta, tb, kLeanPlain, _lean) \
    KILN_WG_SHARED_KERNEL(T, tn, TA, TB, ta, tb, kLeanBsum, _lean_bsum)
// Persistent: kiln_gemm_wg_<dtype>_<a><b>_256_c2_s4_p (16-bit C), ..._pf (float32 C), and the
// twins of the 16-bit kernel for C of the operands' dtype only (rule 7), ..._p_lean without bsum
// and ..._p_lean_bsum with it: nine interleaved runs on the H100 put the first 0.7-1.6% under
// the general kernel at 4096^3 and 8192^3.
#define KILN_WG_PERSISTENT_C(T, tn, TA, TB, ta, tb, C32, LEAN, suffix)                                           \
    extern "C" __global__ void __launch_bounds__(384, 1)                                                        \
        kiln_gemm_wg_##tn##_##ta##tb##_256_c2_s4_##suffix(const __grid_constant__ GemmParams p,                  \
                                                          const __grid_constant__ CUtensorMap map_a,             \
                                                          const __grid_constant__ CUtensorMap map_b,             \
                                                          const __grid_constant__ CUtensorMap map_c) {           \
        wgmma_gemm_persistent<T, 4, TA, TB, C32, LEAN>(p, &map_a, &map_b, &map_c);                               \
    }
#define KILN_WG_PERSISTENT(T, tn, TA, TB, ta, tb)                                     \
    KILN_WG_PERSISTENT_C(T, tn, TA, TB, ta, tb, false, kGeneral, p)                   \
    KILN_WG_PERSISTENT_C(T, tn, TA, TB, ta, tb, true, kGeneral, pf)                   \
    KILN_WG_PERSISTENT_C(T, tn, TA, TB, ta, tb, false, kLeanPlain, p_lean)            \
    KILN_WG_PERSISTENT_C(T, tn, TA, TB, ta, tb, false, kLeanBsum, p_lean_bsum)
#define KILN_WG_CONFIGS(T, tn, TA, TB, ta, tb)         \
    KILN_WG_KERNEL(T, tn, 256, 2, 4, TA, TB, ta, tb)   \
    KILN_WG_KERNEL(T, tn, 128, 2, 6, TA, TB, ta, tb)   \
    KILN_WG_KERNEL(T, tn, 64, 1, 8, TA, TB, ta, tb)    \
    KILN_WG_KERNEL(T, tn, 16, 1, 8, TA, TB, ta, tb)    \
    KILN_WG_KERNEL(T, tn, 64, 2, 8, TA, TB, ta, tb)    \
    KILN_WG_LEAN_KERNEL(T, tn, 128, 2, 6, TA, TB, ta, tb) \
    KILN_WG_LEAN_KERNEL(T, tn, 64, 1, 8, TA, TB, ta, tb) \
    KILN_WG_LEAN_KERNEL(T, tn, 16, 1, 8, TA, TB, ta, tb) \
    KILN_WG_LEAN_KERNEL(T, tn, 64, 2, 8, TA, TB, ta, tb) \
    KILN_WG_SHARED_KERNELS(T, tn, TA, TB, ta, tb)      \
    KILN_WG_PERSISTENT(T, tn, TA, TB, ta, tb)
#define KILN_WG_LAYOUTS(T, tn)                \
    KILN_WG_CONFIGS(T, tn, 0, 0, k, k)        \
    KILN_WG_CONFIGS(T, tn, 0, 1, k, t)        \
    KILN_WG_CONFIGS(T, tn, 1, 0, t, k)        \
    KILN_WG_CONFIGS(T, tn, 1, 1, t, t)
KILN_WG_LAYOUTS(__half, f16)
KILN_WG_LAYOUTS(__nv_bfloat16, bf16)
KILN_WG_KERNEL(float, tf32, 256, 2, 4, 0, 0, k, k)
KILN_WG_KERNEL(float, tf32, 128, 2, 6, 0, 0, k, k)
KILN_WG_KERNEL(float, tf32, 64, 1, 8, 0, 0, k, k)
KILN_WG_KERNEL(float, tf32, 64, 2, 8, 0, 0, k, k)
KILN_WG_KERNEL(float, tf32, 16, 1, 8, 0, 0, k, k)
// tf32 with A M-major, A through registers (consume_only_tile_tf32_rega).
KILN_WG_KERNEL(float, tf32, 64, 1, 8, 1, 0, t, k)
KILN_WG_KERNEL(float, tf32, 64, 2, 8, 1, 0, t, k)
KILN_WG_KERNEL(float, tf32, 16, 1, 8, 1, 0, t, k)
KILN_WG_PERSISTENT_C(float, tf32, 0, 0, k, k, true, kGeneral, pf)
// tf32 with B N-major, B through registers: 256 x 128 tiles.
extern "C" __global__ void __launch_bounds__(384, 1)
    kiln_gemm_wg_tf32_kt_256x128_c2_s4_pf(const __grid_constant__ GemmParams p, const __grid_constant__ CUtensorMap map_a,
                                          const __grid_constant__ CUtensorMap map_b,
                                          const __grid_constant__ CUtensorMap map_c) {
    wgmma_gemm_persistent_bregs<4>(p, &map_a, &map_b, &map_c);
}
