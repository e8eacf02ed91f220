// The launch of a chosen GEMM kernel (run_kernel): its grid and clusters (split-K, rows of
// tiles, B shared along m, tiles along m), bsum's partials, split-K's slices and their
// reduction, the TMA descriptors and the lean twins (rule 7); and selected_kernel, which
// reports what the same decisions launch. Apart from the public entry (gemm_cuda.cpp) and the
// operands (gemm_operands.cpp) so that the launch's decisions, which selected_kernel and
// run_kernel must make alike, sit together.
#include "kernels/cuda/gemm_launch.hpp"

#include "compiler/env.hpp"
#include "compiler/log.hpp"
#include "ir/error.hpp"
#include "kernels/cuda/gemm_params.hpp"
#include "kernels/cuda/gemm_select.hpp"
#include "runtime/context_impl.hpp"
#include "runtime/cuda/device_backend.hpp"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <string>

namespace kiln::gemm {

using namespace detail;

namespace {

// A 3-D tiled TMA descriptor: dims (inner, outer, batch), the swizzle as wide as the box's
// inner extent (128 bytes, or 32 for the narrow tiles' 16-element N-major B).
CUtensorMap encode_tensor_map(const void* base, DType dt, uint64_t inner, uint64_t outer, uint64_t batch,
                              int64_t outer_stride, int64_t batch_stride, uint32_t box_inner, uint32_t box_outer) {
    const cuda::Driver& d = cuda::driver();
    const size_t es = dtype_size(dt);
    CUtensorMap map;
    const CUtensorMapDataType type = dt == DType::Float16    ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                     : dt == DType::BFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                             : CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
    cuuint64_t dims[3] = {inner, outer, batch_stride ? batch : 1};
    cuuint64_t strides[2] = {cuuint64_t(outer_stride) * es,
                             batch_stride ? cuuint64_t(batch_stride) * es : cuuint64_t(outer_stride) * es * outer};
    strides[1] = (strides[1] + 15) / 16 * 16;
    cuuint32_t box[3] = {box_inner, box_outer, 1};
    cuuint32_t elem[3] = {1, 1, 1};
    const size_t inner_bytes = box_inner * es;
    const CUtensorMapSwizzle swizzle = inner_bytes <= 32   ? CU_TENSOR_MAP_SWIZZLE_32B
                                       : inner_bytes <= 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                                           : CU_TENSOR_MAP_SWIZZLE_128B;
    cuda::check(d.cuTensorMapEncodeTiled(&map, type, 3, const_cast<void*>(base), dims, strides, box, elem,
                                         CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                                         CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
                "cuTensorMapEncodeTiled");
    return map;
}

// Rule 7 (gemm_select.hpp): the one-tile wgmma kernels up to 128 wide run a lean twin where
// the epilogue is plain: 16-bit C of the operands' dtype with the register epilogue, and no
// split but one in a cluster through registers; the persistent kernels into 16-bit C of the
// operands' dtype likewise. The twin's entry suffix, or nullptr for none.
const char* lean_twin(const GemmKernel& k, const GemmParams& p, DType dt, bool bsum) {
    if (p.flags & kColSums) return k.persistent ? "_lean_cols" : nullptr;   // (col_sums_in_epilogue)
    if (!lean_kernels_allowed() || k.path != GemmPath::Wgmma || p.c_dtype != gemm_dtype(dt) || p.c_dtype == kF32) return nullptr;
    const bool plain = k.persistent ? !k.b_in_registers   // (16-bit C: the selector chose it for a plain epilogue)
                                    : k.bn <= 128 && (k.splits == 1 || (k.cluster_k && k.bn <= kSplitPushMaxBn)) &&
                                          rows_of_16_bytes(p);
    if (!plain) return nullptr;
    return bsum ? "_lean_bsum" : "_lean";
}

thread_local bool last_launch_lean = false;
thread_local int last_launch_b_share = 1;
thread_local int last_launch_cluster = 1;
thread_local int64_t last_launch_blocks = 0;
thread_local bool last_launch_counted = false;
thread_local std::string last_launch_entry;

} // namespace

// The last descriptors encoded on this thread: programs multiply the same buffers again and
// again, and encoding costs about a microsecond of host time per operand.
CUtensorMap detail::tensor_map(const void* base, DType dt, uint64_t inner, uint64_t outer, uint64_t batch, int64_t outer_stride,
                       int64_t batch_stride, uint32_t box_inner, uint32_t box_outer) {
    using Key = std::array<uint64_t, 9>;
    struct Entry { Key key; CUtensorMap map; };
    thread_local std::array<Entry, 16> recent{};
    thread_local size_t next = 0;
    const Key key = {uint64_t(reinterpret_cast<uintptr_t>(base)), uint64_t(dt), inner, outer, batch, uint64_t(outer_stride),
                     uint64_t(batch_stride), box_inner, uint64_t(box_outer) + 1};   // + 1: never the empty key
    for (const Entry& e : recent)
        if (e.key == key) return e.map;
    Entry& e = recent[next++ % recent.size()];
    e.key = key;
    e.map = encode_tensor_map(base, dt, inner, outer, batch, outer_stride, batch_stride, box_inner, box_outer);
    return e.map;
}

bool last_gemm_launch_lean() { return last_launch_lean; }
std::string last_gemm_entry() { return last_launch_entry; }
bool last_gemm_counted() { return last_launch_counted; }
int last_gemm_b_share() { return last_launch_b_share; }
int last_gemm_cluster() { return last_launch_cluster; }
int64_t last_gemm_blocks() { return last_launch_blocks; }

// The module image that holds a wgmma entry: float16 entries have one of their own
// (gemm_sm90.cu is compiled in two parts).
static const unsigned char* sm90_image(const std::string& entry) {
    return entry.rfind("kiln_gemm_wg_f16_", 0) == 0 ? kiln_gemm_sm90_f16_image : kiln_gemm_sm90_image;
}

int clusters_at_once_one_per_sm(cuda::CudaBackend& be, const std::string& entry, int size, int threads, int smem) {
    // More dynamic shared memory than half an SM holds keeps the count at one block per SM.
    const int lone = std::max(smem, be.info().max_shared_optin / 2 + 1);
    return be.max_active_clusters(be.precompiled(sm90_image(entry), entry, lone), unsigned(size), unsigned(threads),
                                  unsigned(lone));
}

// Whether `rows` rows of `tiles_n` one-tile wgmma blocks, each row one cluster, all run at once.
static bool rows_fit_in_clusters(cuda::CudaBackend& be, const GemmKernel& k, int64_t rows, int64_t tiles_n) {
    return rows <= be.max_active_clusters(be.precompiled(sm90_image(k.entry), k.entry, k.smem), unsigned(tiles_n),
                                          unsigned(k.threads), unsigned(k.smem));
}
// Whether a plain one-tile wgmma launch groups its rows of 2-4 tiles into clusters (run_kernel,
// which with bsum also clusters rows of up to 8).
static bool launches_row_clusters(cuda::CudaBackend& be, const GemmKernel& k, int64_t rows, int64_t tiles_n) {
    return tiles_n >= 2 && tiles_n <= 4 && rows_fit_in_clusters(be, k, rows, tiles_n);
}

// How many blocks along m share B's stages (GemmParams::b_multicast): 4 or 2 for the 16-wide
// one-tile kernels, 1 otherwise. A column of 16-wide tiles is every block of the grid reading
// the same few rows of B at once (B's stage is 2 KB against A's 8 KB); loaded once and
// multicast to every block of a cluster instead, they make the product faster than clusters
// of the same size without the multicast. Wider tiles lost or held level that way, as did
// clusters that do not all run at once. A share is whole 8-row swizzle atoms of B's box:
// K-major B (16 rows of n) splits in 2, N-major B (64 rows of k) in 4. Not tf32: its B is
// K-major, copied (a quarter of A's bytes a stage, shared in clusters of 2), and shared it
// ran slower; its 16-wide tile with A M-major reads A through registers, whose loop keeps
// its own releases.
static int b_share_blocks(cuda::CudaBackend& be, const GemmKernel& k, int64_t tiles_m, int64_t tiles_n, int64_t batch, DType dt) {
    if (k.path != GemmPath::Wgmma || k.persistent || k.splits != 1 || k.bn != 16 || k.b_in_registers || dt == DType::Float32)
        return 1;
    const int box_rows = k.b_trans ? 128 / int(dtype_size(dt)) : k.bn;
    for (const int blocks : {4, 2})
        if (tiles_m % blocks == 0 && (box_rows / blocks) % 8 == 0 &&
            tiles_m / blocks * tiles_n * batch <= clusters_at_once_one_per_sm(be, k.entry, blocks, k.threads, k.smem))
            return blocks;
    return 1;
}

namespace {

// The kernel as launched: rule 3's split in clusters where it can run as chosen. A tile's
// clusters must all run at once (a second wave of them doubles the time; where they all fit,
// clusters of 3 beat clusters of 2), so a count whose clusters do not fit steps down to the
// next that does (3 only where the sums cross in registers, which the
// selector judged from C's TMA alignment); 2 always fits, one block per SM. A count forced by
// KILN_GEMM_SPLITS stays as it is, but for that condition of 3.
GemmKernel as_launched(cuda::CudaBackend& be, const GemmKernel& chosen, const GemmParams& p, DType dt) {
    GemmKernel k = chosen;
    if (!k.cluster_k || k.splits <= 2) return k;
    const bool push = dt != DType::Float32 && split_sums_pushed(p, k.bn);   // (the selector's split_push_applies)
    const char* forced = std::getenv("KILN_GEMM_SPLITS");
    const bool keep = forced && *forced;
    const int64_t tiles = ((int64_t(p.m) + k.bm - 1) / k.bm) * ((int64_t(p.n) + k.bn - 1) / k.bn) * p.batch;
    for (const int s : {8, 4, 3, 2}) {
        if (s > chosen.splits || (s == 3 && !push)) continue;
        if (s == 2 || (keep && s == chosen.splits) ||
            tiles <= clusters_at_once_one_per_sm(be, k.entry, s, k.threads, k.smem)) {
            k.splits = s;
            return k;
        }
    }
    return k;
}

} // namespace

std::string selected_kernel(const Tensor& A, const Tensor& B, const Tensor& C) {
    cuda::CudaBackend& be = cuda::cuda_backend(C.context());
    const double flops = 2.0 * double(C.size()) * double(A.shape()[A.rank() - 1]);
    const bool tf32 = A.dtype() == DType::Float32 && C.context().allow_tf32();
    GemmProblem pr = problem_of(A, C, mat(A), mat(B), be);
    std::string staged;
    const Staging st = staging(A, B, C, tf32, /*plain=*/true, flops, be);
    if (st.a) {
        pr.a_tma = true;
        pr.a_kmajor = staged_kmajor(A, true, tf32);
        staged += " A";
    }
    if (st.b) {
        pr.b_tma = true;
        pr.b_kmajor = staged_kmajor(B, false, tf32);
        staged += " B";
    }
    // The plain product as launched, and its lean twin (rule 7), judged on C as it is.
    const Mat c = mat(C);
    GemmParams p{};
    p.c = const_cast<char*>(c.base);
    p.c_sm = c.s_row, p.c_sn = c.s_col, p.c_batch = c.s_batch;
    p.c_dtype = gemm_dtype(C.dtype());
    p.m = int32_t(pr.m), p.n = int32_t(pr.n), p.batch = int32_t(pr.batch);
    if (context_impl(C.context()).stochastic_round_bits > 0 && C.dtype() != DType::Float32) p.sr_bits = 1;
    pr.plain_epilogue = pr.plain_epilogue && p.sr_bits == 0;   // as cuda_gemm judges it
    const GemmKernel k = as_launched(be, select_gemm(pr), p, A.dtype());
    // B shared along m where no row cluster is launched (run_kernel's choice, judged alike).
    const int64_t tiles_m = (pr.m + k.bm - 1) / k.bm, tiles_n = (pr.n + k.bn - 1) / k.bn;
    int share = b_share_blocks(be, k, tiles_m, tiles_n, pr.batch, A.dtype());
    if (share > 1 && launches_row_clusters(be, k, tiles_m * pr.batch, tiles_n)) share = 1;
    return describe(k) + (share > 1 ? " B shared x" + std::to_string(share) : "") +
           (lean_twin(k, p, A.dtype(), false) ? " lean" : "") + (staged.empty() ? "" : " (copied" + staged + ")");
}

float detail::median_launch_ms(cuda::CudaBackend& be, const std::function<void()>& run) {
    const cuda::Driver& d = cuda::driver();
    struct Event {   // destroyed also when a launch throws
        CUevent e = nullptr;
        ~Event() {
            if (e) cuda::driver().cuEventDestroy(e);
        }
    } e0, e1;
    cuda::check(d.cuEventCreate(&e0.e, CU_EVENT_DEFAULT), "cuEventCreate");
    cuda::check(d.cuEventCreate(&e1.e, CU_EVENT_DEFAULT), "cuEventCreate");
    run();
    std::array<float, 3> ms{};
    for (float& v : ms) {
        d.cuEventRecord(e0.e, be.stream());
        run();
        d.cuEventRecord(e1.e, be.stream());
        cuda::check(d.cuEventSynchronize(e1.e), "cuEventSynchronize");
        d.cuEventElapsedTime(&v, e0.e, e1.e);
    }
    std::sort(ms.begin(), ms.end());
    return ms[1];
}

GemmParams detail::slice_params(const GemmParams& p, void* slices) {
    GemmParams q = p;
    q.c = slices;
    q.c_sm = p.n, q.c_sn = 1, q.c_batch = int64_t(p.m) * p.n;
    q.c_dtype = kF32;
    q.flags = 0;
    q.alpha = 1, q.beta = 0, q.sr_bits = 0;
    return q;
}

void detail::reduce_slices(cuda::CudaBackend& be, const GemmParams& p, const float* slices) {
    GemmParams fin = p;
    void* params[] = {&fin, &slices};
    // With bsum 8 / reduce_warps_per_row rows a block; into C by columns 32 x 32 elements a
    // block; otherwise 4 elements per thread (see the kernel).
    const int64_t M = p.m, N = p.n, rows_per_block = 8 / reduce_warps_per_row(p.n);
    const int64_t grid = (p.flags & kBsum)        ? (M + rows_per_block - 1) / rows_per_block
                         : c_by_columns(p) ? ((M + 31) / 32) * ((N + 31) / 32)
                                                : (M * N / 4 + 255) / 256 + 1;
    // kHist: the block's counters are its dynamic shared memory.
    const int smem = (p.flags & kHist) ? 4 * p.hist_bins : 0;
    fin.hist_smem = 0;
    be.launch_precompiled(be.precompiled(kiln_gemm_sm80_image, "kiln_gemm_reduce_splits", smem), unsigned(grid), 1, 1, 256,
                          smem, params, {.programmatic = sm80_image_programmatic(be)});
}

bool detail::sm80_image_programmatic(const cuda::CudaBackend& be) { return be.info().sm == 90 && be.programmatic_launches(); }

int detail::counters_at(cuda::CudaBackend& be, CUfunction f, int smem, int bytes) {
    const int at = (smem + 15) & ~15;
    return at + bytes + be.static_shared(f) <= be.info().max_shared_optin ? at : -1;
}

void detail::add_col_partials(const Tensor& partials, bool every_8th, int64_t n, Tensor sums) {
    const Slice rows = every_8th ? Slice::range(0, partials.shape()[0], 8) : Slice::all();
    sums.assign(reshape(sum(partials.slice({rows, Slice::range(0, n)}).expr(), 0, true), sums.shape()));
}

bool detail::col_sums_in_epilogue(const GemmKernel& k, const GemmParams& p, DType dt) {
    if (!env::flag("KILN_GEMM_COLSUMS").value_or(true)) return false;
    if (k.path != GemmPath::Wgmma || k.splits != 1 || k.b_in_registers || p.batch != 1 || !rows_of_16_bytes(p)) return false;
    // The persistent kernels: their kLeanCols twin (16-bit C of the operands' dtype, both K-major,
    // no bsum).
    return !k.persistent || (lean_kernels_allowed() && p.c_dtype == gemm_dtype(dt) && !k.a_trans && !k.b_trans &&
                             !(p.flags & kBsum) && p.tiles_n <= 32);
}

// One product with kernel `k`: tiles, split-K slices and their reduction, bsum partials and
// their sum (into `bsum` when given), column sums (into `col_sums`, where the kernel adds them).
// `p` holds the operands and the epilogue.
bool detail::run_kernel(Context& ctx, cuda::CudaBackend& be, const GemmKernel& chosen, GemmParams p, const Mat& a,
                        const Mat& b, DType dt, const Tensor* bsum, int c_rank, const Tensor* col_sums, bool* summed) {
    const GemmKernel k = as_launched(be, chosen, p, dt);
    if (summed) *summed = false;
    const int64_t M = p.m, N = p.n, K = p.k, batch = p.batch;
    const size_t es = dtype_size(dt);
    p.tiles_m = int32_t((M + k.bm - 1) / k.bm);
    p.tiles_n = int32_t((N + k.bn - 1) / k.bn);
    p.group_m = 8;
    p.k_splits = k.splits;
    p.k_cluster = k.cluster_k ? 1 : 0;
    const bool slices_k = k.splits > 1 && !k.cluster_k;   // global slices and the reduction kernel
    const bool one_tile_wgmma = k.path == GemmPath::Wgmma && !k.persistent && k.splits == 1;
    // In the one-tile kernels a row of 2-4 tiles is launched as one cluster where every row's
    // cluster runs at once (with bsum, rows of 2-8: bsum_cluster, below): its blocks,
    // which read the same rows of A, then run together on one GPC, and the product is faster,
    // the more so on the wider tiles. The GPCs hold fewer clusters than SMs / cluster: a grid
    // of more rows than that ran a second wave of clusters, much slower, hence the check that
    // every row's cluster runs at once. Rows of 8 were slower on small products.
    // bsum over a row of 2-8 tiles: the row is one cluster whose blocks add each other's row
    // sums from shared memory (rows of tiles in raster order), where every row's cluster runs
    // at once; otherwise partials in global memory (a second wave of clusters doubled the
    // time).
    const bool bsum_cluster = bsum && one_tile_wgmma && p.tiles_n >= 2 && p.tiles_n <= 8 &&
                              rows_fit_in_clusters(be, k, int64_t(p.tiles_m) * batch, p.tiles_n);
    if (bsum_cluster) p.bsum_cluster = 1;
    const bool row_cluster =
        bsum_cluster || (one_tile_wgmma && launches_row_clusters(be, k, int64_t(p.tiles_m) * batch, p.tiles_n));
    if (row_cluster) p.group_m = 1;
    // Split-K in a cluster over a row of 2-8 tiles: the cluster holds the row's tiles, each
    // with its k_splits blocks (rank = tile in the row x k_splits + split), where splits x
    // tiles fit in one cluster and every such cluster runs at once. The blocks reading the same
    // rows of A then run together on one GPC, as the unsplit row clusters above do, which is
    // faster than the split's own clusters. Not with bsum, whose row sums still meet in global
    // memory: in such clusters it gained nothing.
    // The kernel's dynamic shared memory: a split in a cluster adds the receive buffer of the
    // slices' sums (gemm_params.hpp).
    const bool cluster_split = k.path == GemmPath::Wgmma && k.cluster_k;
    const int kernel_smem =
        k.smem + (cluster_split && k.bn <= kSplitPushMaxBn ? split_receive_bytes(k.bm, k.bn, k.splits) : 0);
    int cluster_blocks = k.splits;
    if (cluster_split && !bsum && p.tiles_n >= 2 && k.splits * p.tiles_n <= 8) {
        if (int64_t(p.tiles_m) * batch <= clusters_at_once_one_per_sm(be, k.entry, k.splits * p.tiles_n, k.threads, kernel_smem)) {
            cluster_blocks = k.splits * p.tiles_n;
            p.group_m = 1;   // a row's tiles in consecutive blocks
        }
    }
    // A grid one 64 x 64 tile wide split in 2: clusters of two tiles along m, each with its two
    // slices (4 blocks), where every such cluster runs at once, which is faster than the
    // split's clusters of 2. Splits of 3 and 4 held level that way, and so did two rows of
    // tiles in one cluster where rows are 2 tiles wide.
    if (cluster_split && k.splits == 2 && p.tiles_n == 1 && k.bm == 64 && k.bn == 64 && p.tiles_m % 2 == 0 &&
        int64_t(p.tiles_m / 2) * batch <= clusters_at_once_one_per_sm(be, k.entry, 4, k.threads, kernel_smem))
        cluster_blocks = 4;
    // A grid of rows one tile wide (tiles_n = 1) that fills the GPU's SMs to between 7/8 and all
    // of them is launched as clusters of 4 tiles along m, where every cluster runs at once,
    // which makes such products faster (longer ones held level); grids under 7/8 of the SMs
    // were level or slower as clusters of 4, so they stay plain. The clusters must fit at once
    // one block to an SM: the 16-wide tile, of which an SM holds two, was slower as clusters
    // that did not. (Where it shares B, below, the 16-wide tile is launched in that share's
    // clusters instead.)
    // The 16-wide tile's B shared along m (b_share_blocks): clusters of `share_b` tiles of one
    // column, the raster one group (consecutive blocks share the column).
    const int share_b = one_tile_wgmma && !row_cluster ? b_share_blocks(be, k, p.tiles_m, p.tiles_n, batch, dt) : 1;
    const bool b_shared = share_b > 1;
    if (b_shared) {
        p.b_multicast = share_b;
        p.group_m = p.tiles_m;
    }
    const int64_t sms = be.info().multiprocessors, row_blocks = int64_t(p.tiles_m) * batch;
    const bool m_cluster = !b_shared && one_tile_wgmma && p.tiles_n == 1 && p.tiles_m % 4 == 0 && 8 * row_blocks >= 7 * sms &&
                           row_blocks <= sms &&
                           row_blocks / 4 <= clusters_at_once_one_per_sm(be, k.entry, 4, k.threads, k.smem);
    // One wave of one-tile blocks that no cluster launch groups: the raster group of rule 6
    // (gemm_select.hpp), which puts the blocks that share rows of A or columns of B on
    // neighbouring SMs.
    if (one_tile_wgmma && !row_cluster && !m_cluster && !b_shared && row_blocks * p.tiles_n <= sms)
        p.group_m = one_wave_raster_group(k.bm, k.bn, p.tiles_m, p.tiles_n);
    // bsum: with several tiles per row, each tile's row sums go to `partials` and the last
    // tile of a row adds them (turn counters in the backend's zeroed scratch); the persistent
    // kernels tag their partials instead and a row's last tile in the walk adds them, in a
    // cooperative launch (sm90/scheduler.cuh); with one tile per row, or global k slices (the
    // reduction kernel sees whole rows), the sums go to bsum directly.
    Tensor partials;
    if (bsum) {
        const Tensor& bs = *bsum;
        // bsum is (M), (M, 1), (batch, M) or (batch, M, 1).
        p.bsum = data_of(bs);
        p.bsum_sb = c_rank == 3 ? bs.strides()[0] : 0;
        p.bsum_sm = bs.strides()[c_rank == 3 ? 1 : 0];
        p.bsum_dtype = gemm_dtype(bs.dtype());
        if (k.persistent && p.tiles_n > 1) {
            const auto words = be.tagged_scratch(size_t(p.tiles_n) * size_t(batch) * size_t(M) * 8);
            p.bsum_tagged = reinterpret_cast<uint64_t*>(words.words);
            p.bsum_epoch = words.tag;
        } else if (!slices_k && !bsum_cluster && p.tiles_n > 1) {
            partials = ctx.empty({p.tiles_n, batch, M}, DType::Float32);
            p.bsum_partials = static_cast<float*>(partials.view().storage->data);
            p.bsum_turns = reinterpret_cast<uint32_t*>(be.zeroed_scratch(size_t(batch) * p.tiles_m * 4));
            partials.view().storage->written = true;
        }
        p.flags |= kBsum;
    }
    // Split-K: the GEMM kernel stores each slice's raw sums as slices[split]; a second kernel
    // adds them in order and applies the epilogue (`p`). (A single kernel whose slices take
    // turns adding into one buffer was slower: the turns serialise.)
    GemmParams q = p;
    Tensor slices;
    if (slices_k) {
        slices = ctx.empty({k.splits, M, N}, DType::Float32);
        q = slice_params(p, slices.view().storage->data);
    }
    // Global slices: blockIdx.y = batch entry x splits + split; in a cluster the blocks of a
    // tile are neighbours along x.
    int64_t blocks = int64_t(p.tiles_m) * p.tiles_n * (k.cluster_k ? k.splits : 1);
    int64_t grid_y = batch * (k.cluster_k ? 1 : k.splits);
    if (k.persistent) {   // one block per SM (rule 6: persistent_grid), batches folded into the walk
        blocks = persistent_grid(blocks * batch, be.info().multiprocessors);
        grid_y = 1;
    }
    if (blocks > 0x7fffffff || grid_y > 65535)
        fail(Error::Kind::Value, "compound_dot: {} x {} x {} with a batch of {} exceeds the GEMM kernels' grid", M, N, K, batch);

    // Programmatic launch (gemm_common.cuh): the one-tile wgmma kernels, and the sm_80 image's
    // where its sm_90 code runs. Not the persistent kernels: they ran level or slower with it.
    // A grid of the sm_80 image with at most one block per SM, started while the kernel before
    // it still holds SMs, could be placed two blocks to an SM (the block scheduler fills
    // whatever room there is), which slowed the one-block-per-SM FMA kernel. Asking for more
    // than half an SM's shared memory keeps such a grid at one block per SM.
    const bool programmatic = k.path == GemmPath::Wgmma ? !k.persistent && be.programmatic_launches()
                                                        : sm80_image_programmatic(be);
    int smem = kernel_smem;
    if (programmatic && k.path != GemmPath::Wgmma && blocks * grid_y <= be.info().multiprocessors)
        smem = std::max(smem, be.info().max_shared_optin / 2 + 1);
    // Column sums: the one-tile kernels' warps' sums past the tile's bias (shared memory), added
    // in warp order into a row of `col_partials` a row of tiles; the persistent kernels' each
    // warp's running sums over the block's tiles into a row of its own a block (every entry
    // written, zeros where the block did not go), added in warp order into the block's first.
    // Then one JIT reduction over those rows, in order: the same bits in every run.
    Tensor col_partials;
    const int col_s_bytes = k.persistent ? 0 : (k.threads - 128) / 32 * k.bn * 4;
    const auto col_s_fits = [&] {   // beside the one-tile kernel's static and dynamic shared memory
        const std::string e = k.entry + (b_shared ? "_shb" : "");
        return smem + col_s_bytes + be.static_shared(be.precompiled(sm90_image(e), e, 0)) <= be.info().max_shared_optin;
    };
    if (col_sums && col_sums_in_epilogue(k, p, dt) && (k.persistent || col_s_fits())) {
        col_partials = k.persistent ? ctx.empty({blocks * 8, int64_t(p.tiles_n) * k.bn}, DType::Float32)
                                    : ctx.empty({p.tiles_m, N}, DType::Float32);
        p.col_partials = q.col_partials = static_cast<float*>(col_partials.view().storage->data);
        p.flags |= kColSums;
        q.flags |= kColSums;
        smem += col_s_bytes;
    }
    const char* twin = lean_twin(k, p, dt, bsum != nullptr);
    last_launch_b_share = share_b;
    // The one-tile wgmma kernels' clusters: a split's (with its row's tiles, above), B's share,
    // a row's tiles, or 4 along m.
    const int cluster = k.path != GemmPath::Wgmma || k.persistent ? 1
                        : k.cluster_k                            ? cluster_blocks
                        : b_shared                               ? share_b
                        : row_cluster                            ? p.tiles_n
                        : m_cluster                              ? 4
                                                                 : 1;
    last_launch_cluster = cluster;
    last_launch_blocks = blocks * grid_y;
    // kHist: every kernel counts the values it stores into counters in shared memory past its
    // own: finish_tile and the 16-bit register epilogue a warp's each, the persistent kernels
    // (their twins too) the block's (their stages leave no room for a warp's each), global
    // slices' reduction its block's. The one-tile kernels' lean twins hold no counting code, so
    // a counted product runs the full kernel of the same tile. Where the counters do not fit
    // beside the kernel's static and dynamic shared memory, the product runs uncounted and is
    // counted after the call.
    const auto entry_of = [&](const char* suffix) { return k.entry + (b_shared ? "_shb" : "") + (suffix ? suffix : ""); };
    const auto function = [&](const std::string& e, int dynamic) {
        return be.precompiled(k.path == GemmPath::Wgmma ? sm90_image(e) : kiln_gemm_sm80_image, e, dynamic);
    };
    bool counted = false;
    if (p.flags & kHist) {
        if (slices_k) {
            counted = true;   // by the reduction (reduce_slices); the slices are not C
        } else {
            const char* counting = k.persistent ? twin : nullptr;
            const int bytes = (k.persistent ? 1 : k.threads / 32) * q.hist_bins * 4;
            const int at = counters_at(be, function(entry_of(counting), 0), smem, bytes);
            if (at >= 0) {
                q.hist_smem = at;
                smem = at + bytes;
                counted = true;
                twin = counting;
            } else {
                q.flags &= ~kHist;
            }
        }
    }
    const std::string entry = entry_of(twin);
    last_launch_lean = twin != nullptr;
    last_launch_entry = entry;
    last_launch_counted = counted;
    CUfunction f = function(entry, smem);
    log_debug("gemm: {}x{}x{} batch {} {} -> {}{}{} (tile {}x{}, {} blocks, clusters of {})", M, N, K, batch, dtype_name(dt),
              describe(k), b_shared ? " B shared x" + std::to_string(share_b) : "", twin ? " lean" : "", k.bm, k.bn,
              blocks * grid_y, cluster);
    if (k.path == GemmPath::Wgmma) {
        // A: K-major boxes (a stage's k) x (BM rows); M-major boxes 128 bytes wide (64 16-bit
        // rows, 32 tf32 ones) x (a stage's k), one or two per consumer. B likewise with BN
        // (N-major boxes at most 64 wide: the 16-wide tile's B is one box of 16, in the 32-byte
        // swizzle). A stage holds 128 bytes of k.
        const uint32_t bk = 128 / uint32_t(es);
        CUtensorMap ma, mb;
        if (k.b_in_registers) {   // A in 32 x 256 K-major boxes, B in 32 x 32 N-major boxes
            ma = tensor_map(a.base, dt, K, M, batch, a.s_row, a.s_batch, bk, 256);
            mb = tensor_map(b.base, dt, N, K, batch, b.s_row, b.s_batch, 32, bk);
        } else {
            ma = k.a_trans ? tensor_map(a.base, dt, M, K, batch, a.s_col, a.s_batch, bk, bk)
                           : tensor_map(a.base, dt, K, M, batch, a.s_row, a.s_batch, bk, k.bm);
            const uint32_t share = uint32_t(share_b);   // (B's box is a block's share of it)
            mb = k.b_trans ? tensor_map(b.base, dt, N, K, batch, b.s_row, b.s_batch, uint32_t(std::min(k.bn, 64)), bk / share)
                           : tensor_map(b.base, dt, K, N, batch, b.s_col, b.s_batch, bk, uint32_t(k.bn) / share);
        }
        if (k.persistent) {
            // C in boxes of 64 rows x 128 bytes (the kernel's staged results; 32 x 32 float32
            // values for the B-in-registers kernel).
            const DType cdt = p.c_dtype == kF16 ? DType::Float16 : p.c_dtype == kBF16 ? DType::BFloat16 : DType::Float32;
            CUtensorMap mc = k.b_in_registers
                                 ? tensor_map(p.c, cdt, N, M, batch, p.c_sm, p.c_batch, 32, 32)
                                 : tensor_map(p.c, cdt, N, M, batch, p.c_sm, p.c_batch, 128 / uint32_t(dtype_size(cdt)), 64);
            // bsum's tagged partials need every block resident: a cooperative launch.
            void* params[] = {&q, &ma, &mb, &mc};
            be.launch_precompiled(f, unsigned(blocks), unsigned(grid_y), 1, k.threads, smem, params,
                                  {.cooperative = p.bsum_tagged != nullptr});
        } else {
            void* params[] = {&q, &ma, &mb};
            be.launch_precompiled(f, unsigned(blocks), unsigned(grid_y), 1, k.threads, smem, params,
                                  {.cluster = unsigned(cluster), .programmatic = programmatic});
        }
    } else {
        void* params[] = {&q};
        be.launch_precompiled(f, unsigned(blocks), unsigned(grid_y), 1, k.threads, smem, params, {.programmatic = programmatic});
    }
    if (slices_k) {
        slices.view().storage->written = true;
        reduce_slices(be, p, static_cast<const float*>(slices.view().storage->data));
    }
    if (bsum) bsum->view().storage->written = true;
    if (col_partials.defined()) {
        col_partials.view().storage->written = true;
        add_col_partials(col_partials, k.persistent, N, *col_sums);
        if (summed) *summed = true;
    }
    return counted;
}

} // namespace kiln::gemm
