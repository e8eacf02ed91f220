// See gemm_cuda.hpp.
#include "kernels/cuda/gemm_cuda.hpp"

#include "compiler/log.hpp"
#include "ir/error.hpp"
#include "kernels/cuda/gemm_params.hpp"
#include "kernels/cuda/gemm_select.hpp"
#include "runtime/context_impl.hpp"

#include <algorithm>

// The module images, generated at build time (kernels/cuda/meson.build): nvcc fatbins.
extern "C" const unsigned char kiln_gemm_sm80_image[];
extern "C" const unsigned char kiln_gemm_sm90_image[];

namespace kiln::gemm {

bool cuda_kernels_built() { return true; }

namespace {

// One operand as a (batch, rows, cols) matrix: strides in elements, batch stride 0 when shared.
struct Mat {
    const char* base = nullptr;   // device address of element (0, 0, 0)
    int64_t s_batch = 0, s_row = 0, s_col = 0;
};

Mat mat(const Tensor& t) {
    const size_t es = dtype_size(t.dtype());
    Mat m;
    m.base = static_cast<const char*>(t.view().storage->data) + t.offset() * es;
    const int r = t.rank();
    m.s_row = t.strides()[r - 2];
    m.s_col = t.strides()[r - 1];
    m.s_batch = r == 3 ? t.strides()[0] : 0;
    // Size-1 dimensions have meaningless strides; give them the stride that makes the other
    // dimension look contiguous, so layout tests see the real layout.
    if (t.shape()[r - 2] == 1) m.s_row = t.shape()[r - 1] == 1 ? 1 : m.s_col * t.shape()[r - 1];
    if (t.shape()[r - 1] == 1) m.s_col = 1;
    if (r == 3 && t.shape()[0] == 1) m.s_batch = 0;
    return m;
}

int gemm_dtype(DType t) { return t == DType::Float16 ? kF16 : t == DType::BFloat16 ? kBF16 : kF32; }

// Whether TMA can address an operand whose contiguous dimension has stride 1: 16-byte aligned
// base, every other stride a multiple of 16 bytes.
bool tma_ok(const Mat& x, bool rows_contiguous, size_t es) {
    const int64_t other = rows_contiguous ? x.s_col : x.s_row;
    const int64_t unit = rows_contiguous ? x.s_row : x.s_col;
    return unit == 1 && reinterpret_cast<uintptr_t>(x.base) % 16 == 0 && (other * (int64_t)es) % 16 == 0 && other > 0 &&
           (x.s_batch * (int64_t)es) % 16 == 0;
}

// A 3-D tiled TMA descriptor with the 128-byte swizzle: dims (inner, outer, batch).
CUtensorMap tensor_map(const void* base, DType dt, uint64_t inner, uint64_t outer, uint64_t batch, int64_t outer_stride,
                       int64_t batch_stride, uint32_t box_inner, uint32_t box_outer) {
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
    cuda::check(d.cuTensorMapEncodeTiled(&map, type, 3, const_cast<void*>(base), dims, strides, box, elem,
                                         CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                         CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
                "cuTensorMapEncodeTiled");
    return map;
}

} // namespace

void cuda_gemm(const Tensor& A, const Tensor& B, Tensor& C, const DotOptions& o) {
    Context& ctx = C.context();
    Context::Impl& impl = ctx.impl();
    cuda::CudaBackend& be = *impl.cuda;
    const int r = C.rank();
    const int64_t batch = r == 3 ? C.shape()[0] : 1;
    const int64_t M = C.shape()[r - 2], N = C.shape()[r - 1], K = A.shape()[A.rank() - 1];
    const DType dt = A.dtype();
    const size_t es = dtype_size(dt);
    const Mat a = mat(A), b = mat(B), c = mat(C);

    GemmParams p{};
    p.a = a.base;
    p.b = b.base;
    p.c = const_cast<char*>(c.base);
    p.a_sm = a.s_row, p.a_sk = a.s_col, p.a_batch = a.s_batch;
    p.b_sk = b.s_row, p.b_sn = b.s_col, p.b_batch = b.s_batch;
    p.c_sm = c.s_row, p.c_sn = c.s_col, p.c_batch = c.s_batch;
    p.m = int32_t(M), p.n = int32_t(N), p.k = int32_t(K), p.batch = int32_t(batch);
    p.alpha = float(o.alpha), p.beta = float(o.beta), p.slope = float(o.slope);
    p.c_dtype = gemm_dtype(C.dtype());
    if (o.relu) p.flags |= kRelu;
    if (o.beta != 0) p.flags |= kBeta;
    Tensor bias;
    if (o.bias) {
        // The kernels read N contiguous float32 values.
        bias = *o.bias;
        const bool direct = bias.dtype() == DType::Float32 && (N == 1 || bias.strides().back() == 1);
        if (!direct) bias = ctx.eval(cast(reshape(bias.expr(), {N}), DType::Float32));
        p.bias = reinterpret_cast<const float*>(static_cast<const char*>(bias.view().storage->data) + bias.offset() * 4);
        p.flags |= kBias;
    }
    if (impl.stochastic_round_bits > 0 && C.dtype() != DType::Float32) {
        p.sr_bits = impl.stochastic_round_bits;
        p.seed = impl.seed;
        p.counter = impl.rng_counter++;
    }

    GemmProblem pr;
    pr.m = M, pr.n = N, pr.k = K, pr.batch = batch;
    pr.dtype = gemm_dtype(dt);
    pr.tf32 = dt == DType::Float32 && impl.allow_tf32;
    pr.a_kmajor = a.s_col == 1;
    pr.b_kmajor = b.s_row == 1;
    pr.a_tma = tma_ok(a, /*rows_contiguous=*/!pr.a_kmajor, es);
    pr.b_tma = tma_ok(b, /*rows_contiguous=*/pr.b_kmajor, es);
    pr.sm = be.info().sm;
    pr.sms = be.info().multiprocessors;
    pr.have_sm90a = true;
    const GemmKernel k = select_gemm(pr);

    p.tiles_m = int32_t((M + k.bm - 1) / k.bm);
    p.tiles_n = int32_t((N + k.bn - 1) / k.bn);
    p.group_m = 8;
    Tensor partials;
    if (o.bsum) {
        partials = ctx.empty({p.tiles_n, batch, M}, DType::Float32);
        p.bsum_partials = static_cast<float*>(partials.view().storage->data);
        p.flags |= kBsum;
    }
    const int64_t blocks = int64_t(p.tiles_m) * p.tiles_n;
    if (blocks > 0x7fffffff || batch > 65535 || M > 0x7fffffff || N > 0x7fffffff || K > 0x7fffffff)
        fail(Error::Kind::Value, "compound_dot: {} x {} x {} with a batch of {} exceeds the GEMM kernels' grid", M, N, K, batch);

    CUfunction f = be.precompiled(k.path == GemmPath::Wgmma ? kiln_gemm_sm90_image : kiln_gemm_sm80_image, k.entry, k.smem);
    log_debug("gemm: {}x{}x{} batch {} {} -> {} (tile {}x{}, {} blocks)", M, N, K, batch, dtype_name(dt), k.entry, k.bm,
              k.bn, blocks * batch);
    if (k.path == GemmPath::Wgmma) {
        // A: K-major boxes (64 k) x (BM rows); M-major boxes (64 m) x (one stage of k) per
        // consumer. B likewise with BN. A stage holds 128 bytes of k.
        const uint32_t bk = 128 / uint32_t(es);
        CUtensorMap ma = k.a_trans ? tensor_map(a.base, dt, M, K, batch, a.s_col, a.s_batch, 64, bk)
                                   : tensor_map(a.base, dt, K, M, batch, a.s_row, a.s_batch, bk, k.bm);
        CUtensorMap mb = k.b_trans ? tensor_map(b.base, dt, N, K, batch, b.s_row, b.s_batch, 64, bk)
                                   : tensor_map(b.base, dt, K, N, batch, b.s_col, b.s_batch, bk, k.bn);
        void* params[] = {&p, &ma, &mb};
        be.launch_precompiled(f, unsigned(blocks), unsigned(batch), k.threads, k.smem, params);
    } else {
        void* params[] = {&p};
        be.launch_precompiled(f, unsigned(blocks), unsigned(batch), k.threads, k.smem, params);
    }
    C.view().storage->written = true;
    if (o.bsum) {
        // The tiles' partial sums, added in a fixed order by one JIT reduction.
        Tensor bs = *o.bsum;
        bs.assign(reshape(sum(partials.expr(), 0), bs.shape()));
    }
}

} // namespace kiln::gemm
