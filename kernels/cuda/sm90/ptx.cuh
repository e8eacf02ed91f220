// The sm_90a instructions the Hopper GEMM kernels are built from, as inline PTX: mbarriers
// (the stages' full/empty handshakes), TMA loads and stores, cluster barriers and distributed
// shared memory, and wgmma with its shared-memory descriptors and register fences. A piece of
// its own so that every other piece (producer, mainloop, epilogue, or a convolution's own
// producer) issues the same instructions without taking in any kernel's logic.
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace kiln::gemm {

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// ---- mbarriers: the stages' full/empty handshakes -----------------------------------------
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
// (The main loops pass 32-bit shared addresses computed before the loop: see consume_tile, mainloop.cuh.)
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
// `bytes` (a multiple of 16, both addresses 16-byte aligned) from shared to global memory by the
// bulk-copy engine, without a tensor map, in this thread's bulk group (the commit and waits below).
__device__ __forceinline__ void bulk_store(void* dst, const void* src, int bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(reinterpret_cast<uint64_t>(dst)),
                 "r"(smem_u32(src)), "r"(bytes)
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
// generic 64-bit addresses before; with these the cluster-split products run as fast or
// faster.)
__device__ __forceinline__ uint32_t cluster_peer_addr(const void* p, int rank) {
    uint32_t out;
    asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(uint32_t(__cvta_generic_to_shared(p))), "r"(rank));
    return out;
}
// The cluster rank of split 0 of this block's tile. A split's cluster holds its tile's k_splits
// blocks, neighbours along x, and where the launcher puts several tiles in one cluster (a
// row's, or two along m: gemm_launch.cpp) those tiles one after the other: rank = tile in the
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
// A K-major tile in the 64-byte swizzle (a convolution's patches in 32-channel halves, ring.cuh):
// rows of 64 bytes, 8-row groups 512 bytes apart (SBO); the leading offset is unused.
__device__ __forceinline__ uint64_t smem_desc_k64(const void* p) {
    const uint32_t a = smem_u32(p);
    return uint64_t((a & 0x3FFFF) >> 4) | uint64_t(1) << 16 | uint64_t(512 >> 4) << 32 | 2ull << 62;
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
#define KILN_WGMMA_D96 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47}"
#define KILN_WGMMA_OUT96 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
#define KILN_WGMMA_D128 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"
#define KILN_WGMMA_OUT128 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define KILN_WGMMA_D192 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95}"
#define KILN_WGMMA_OUT192 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
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
KILN_WGMMA_16BIT(96, __half, "f16", 48, 49, 50, 51, 52)
KILN_WGMMA_16BIT(96, __nv_bfloat16, "bf16", 48, 49, 50, 51, 52)
KILN_WGMMA_16BIT(128, __half, "f16", 64, 65, 66, 67, 68)
KILN_WGMMA_16BIT(128, __nv_bfloat16, "bf16", 64, 65, 66, 67, 68)
KILN_WGMMA_TF32(128, 64, 65, 66)
KILN_WGMMA_16BIT(192, __half, "f16", 96, 97, 98, 99, 100)
KILN_WGMMA_16BIT(192, __nv_bfloat16, "bf16", 96, 97, 98, 99, 100)
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

// m64n256k8 tf32 with A from registers (K-major fragment: a0 (g, q), a1 (g + 8, q), a2 (g, q + 4),
// a3 (g + 8, q + 4) of the warp's 16 rows).
__device__ __forceinline__ void wgmma_tf32_regs(float (&d)[128], const uint32_t* a, uint64_t db) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %133, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 " KILN_WGMMA_D256
                 ", {%128, %129, %130, %131}, %132, p, 1, 1;}\n"
                 : KILN_WGMMA_OUT256
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

// Keeps fragment registers alive (and unmoved) until here: wgmma reads them asynchronously.
template <int R>
__device__ __forceinline__ void fence_fragments(uint32_t (&f)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+r"(f[i])::"memory");
}

} // namespace kiln::gemm
