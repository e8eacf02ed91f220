// The host side of the implicit-GEMM convolution kernels: whether they take a layer, the
// parameter block (conv_params.hpp: the GEMM's epilogue fields plus the geometry), the filter's
// TMA descriptor and, where TMA can bring the patches, the image's im2col descriptor, the tile
// width and the launch. sm_90 runs the wgmma kernels (conv_sm90.cu), every other GPU from sm_80
// the mma.sync fprop (conv_sm80.cu), which gathers both operands and has no weight gradient.
#include "kernels/cuda/conv_cuda.hpp"

#include "compiler/env.hpp"
#include "compiler/log.hpp"
#include "ir/storage.hpp"
#include "kernels/cuda/im2col_params.hpp"
#include "kernels/cuda/conv_params.hpp"
#include "kernels/cuda/conv_select.hpp"
#include "kernels/cuda/gemm_launch.hpp"
#include "runtime/context_impl.hpp"
#include "runtime/cuda/device_backend.hpp"
#include <kiln/context.hpp>

#include "ir/error.hpp"
#include "runtime/cache/disk_cache.hpp"

#include <algorithm>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

extern "C" const unsigned char kiln_conv_sm90_image[];
extern "C" const unsigned char kiln_conv_sm80_image[];
extern "C" const unsigned char kiln_im2col_image[];

namespace kiln::gemm {

namespace {

// KILN_CONV_KERNEL, for A/B runs: 0 "im2col" (the patch matrix and the GEMM), 1 "walk" (the
// fprop walk, conv_walk.cuh, where it applies), 2 "tile" (fprop one tile a block, never the
// walk), 3 "balanced" and 4 "sliced" (the update's split: wgrad_split_choice), 5 "mma" (on
// sm_90 too, what other GPUs run: the mma.sync fprop, the update by im2col), 6 "walkt" (the
// transposed walk, conv_walk_t.cuh, wherever it can run: at most 128 channels; "walk" and "tile"
// never take it);
// unset: kiln's choice. Read at each call.
std::optional<int> conv_kernel_choice() {
    return env::choice("KILN_CONV_KERNEL", {"im2col", "walk", "tile", "balanced", "sliced", "mma", "walkt"});
}
// Whether fprop takes the mma.sync kernel on this GPU: every GPU but sm_90, or KILN_CONV_KERNEL=mma.
bool mma_kernels(const cuda::CudaBackend& be) { return be.info().sm != 90 || conv_kernel_choice() == 5; }
// The weight gradient's splits KILN_CONV_KERNEL allows: =balanced the balanced split wherever a
// width has it, =sliced the slices only.
WgradSplit wgrad_split_choice() {
    const std::optional<int> forced = conv_kernel_choice();
    return forced == 3 ? WgradSplit::Balanced : forced == 4 ? WgradSplit::Sliced : WgradSplit::Any;
}

// The plan a launch takes: fprop_plan's, where can_walk(tile) says whether that tile's walk can
// run and can_walk_t whether the transposed walk can; KILN_CONV_KERNEL=walk walks wherever it
// can (the 256-wide tile over more than 128 channels, else the plan's tile), =tile never, and
// neither takes the transposed walk; =walkt takes it wherever it can run. plain_rows as walk_for's.
template <class CanWalk>
FpropPlan fprop_choice(const ConvLayer& L, int sms, bool patches_by_tma, bool plain_rows, CanWalk&& can_walk,
                       bool can_walk_t) {
    const std::optional<int> forced = conv_kernel_choice();
    if (forced == 6 && can_walk_t) return {tile_of(L, L.K <= 64 ? 64 : 128), false, 0, true};
    const bool wide = forced != 2 && L.K > 128 && can_walk(tile_of(L, 256)) &&
                      (!walk_has_kernel(L, 192, plain_rows) || can_walk(tile_of(L, 192)));
    FpropPlan plan = fprop_plan(L, sms, patches_by_tma, forced != 2 && can_walk(tile_of(L, L.K <= 64 ? 64 : 128)), wide,
                                plain_rows, can_walk_t && forced != 1 && forced != 2);
    if (forced == 1 && wide) plan = {tile_of(L, 256), true};
    else if (forced == 1 && can_walk(plan.tile)) plan.walk = true;
    return plan;
}

// KILN_AUTOTUNE=1 (as for the GEMM): the first call of a problem times the kernels that could
// run it (one run to warm up, then the median of three, with events) into a scratch output of
// the call's dtype, strides and alignment with the call's epilogue, keeps the fastest for the
// process and in the disk cache (keyed by the problem and the device), and later calls and
// processes launch it. The choices, by key, for conv_fprop_kernel and conv_wgrad_kernel.
bool autotune_enabled() { return env::flag("KILN_AUTOTUNE").value_or(false); }

std::mutex tuned_mu;
std::unordered_map<std::string, std::string>& tuned() {
    static std::unordered_map<std::string, std::string> m;
    return m;
}
std::unordered_map<std::string, std::string>& tuned_entry() {   // the layer's last tuned kernel
    static std::unordered_map<std::string, std::string> m;
    return m;
}
std::string layer_key(const char* op, const ConvLayer& L) { return fmt::format("{} {} {}", op, L.str(), dtype_name(L.dtype)); }
// The kernel name conv_fprop_kernel / conv_wgrad_kernel report for op on L: the tuner's last
// choice for the layer, once it has run.
std::optional<std::string> tuned_name(const char* op, const ConvLayer& L) {
    if (!autotune_enabled()) return std::nullopt;
    std::lock_guard<std::mutex> lock(tuned_mu);
    const auto it = tuned_entry().find(layer_key(op, L));
    if (it == tuned_entry().end()) return std::nullopt;
    return it->second + " (tuned)";
}

// A scratch copy of the matrix c (rows x cols of `es`-byte elements at strides s_row, s_col)
// at the same address alignment: its tensor and where the matrix starts in it.
std::pair<Tensor, char*> scratch_like(Context& ctx, const detail::Mat& c, int64_t rows, int64_t cols, int64_t s_row,
                                      int64_t s_col, int64_t es) {
    const int64_t misalign = int64_t(reinterpret_cast<uintptr_t>(c.base) % 256);
    const int64_t bytes = ((rows - 1) * s_row + (cols - 1) * s_col + 1) * es + misalign;
    Tensor t = ctx.empty({(bytes + 3) / 4}, DType::Float32);
    t.view().storage->written = true;
    return {t, static_cast<char*>(t.view().storage->data) + misalign};
}

// The tuned candidate for key: from this process, the disk cache, or by timing each candidate
// (named by `describe`, launched by `run`) once; recorded as the layer's choice (op's
// tuned_name); nullptr when there is none to choose from.
template <class C, class D, class R>
const C* tuned_choice(cuda::CudaBackend& be, const char* op, const ConvLayer& L, const std::string& key,
                      const std::vector<C>& candidates, D&& describe, R&& run) {
    std::lock_guard<std::mutex> lock(tuned_mu);
    auto named = [&](const std::string& name) -> const C* {
        for (const C& c : candidates)
            if (describe(c) == name) return &c;
        return nullptr;
    };
    auto chosen = [&](const C* c) {
        if (c) tuned()[key] = tuned_entry()[layer_key(op, L)] = describe(*c);
        return c;
    };
    if (auto it = tuned().find(key); it != tuned().end())
        if (const C* c = named(it->second)) return chosen(c);
    cache::DiskCache* disk = be.disk_cache();
    const cache::DiskCacheKey dkey{"conv-autotune|" + key, be.target(), be.info().name};
    if (disk)
        if (auto hit = disk->load(dkey))
            if (const C* c = named(std::string(hit->begin(), hit->end()))) return chosen(c);
    const C* best = nullptr;
    float best_ms = 0;
    for (const C& c : candidates) {
        const float ms = detail::median_launch_ms(be, [&] { run(c); });
        log_debug("conv autotune: {}: {} {:.4f} ms", key, describe(c), ms);
        if (!best || ms < best_ms) best = &c, best_ms = ms;
    }
    if (!best) return nullptr;
    const std::string name = describe(*best);
    log_info("conv autotune: {} -> {} ({:.4f} ms)", key, name, best_ms);
    if (disk) disk->store(dkey, std::vector<char>(name.begin(), name.end()));
    return chosen(best);
}

using detail::fits_32_bits;

// Every size, padding, stride and dilation of L in the kernels' 32-bit fields, with room for
// their sums (an image coordinate plus the padding, a tap times the dilation); the strides and
// dilations, divisors of the fast divisions, are at least 1. (A phase of a strided bprop has a
// negative padding.)
bool geometry_fits(const ConvLayer& L) {
    for (int a = 0; a < 3; ++a) {
        const int64_t pad = L.pad[a] < 0 ? -L.pad[a] : L.pad[a];
        if (!fits_32_bits(L.image[a] + pad + 1) || !fits_32_bits(L.output[a]) || !fits_32_bits(L.stride[a]) ||
            !fits_32_bits(L.filter[a] * L.dilation[a] + pad + 1))
            return false;
    }
    return fits_32_bits(L.N) && fits_32_bits(L.C) && fits_32_bits(L.K);
}

bool takes(cuda::CudaBackend& be, const ConvLayer& L) {
    if (conv_kernel_choice() == 0) return false;
    if (be.info().sm < 80) return false;
    if (L.dtype != DType::Float16 && L.dtype != DType::BFloat16) return false;
    if (L.C % 8 != 0 || !geometry_fits(L)) return false;
    const int64_t rows = positions_of(L);
    const int64_t taps = taps_of(L);
    const int64_t image = L.image[0] * L.image[1] * L.image[2] * L.C;
    return fits_32_bits(rows + 128) && fits_32_bits(taps + 64) && fits_32_bits(image) && fits_32_bits(L.K) &&
           (mma_kernels(be) ? mma_tile(L).smem : widest_tile(L).smem) <= be.info().max_shared_optin;
}

// The rank of the TMA im2col descriptor that can bring L's patches (sm90/conv_fprop.cuh), or 0
// for the gather. TMA takes a k-tile of 64 channels of one tap, so C must be a multiple of 64,
// or with `halves` (fprop's kernels over channel_halves layers) 32 channels of one tap a half;
// the descriptor has the image's axes other than unpadded ones of size 1 (W always; H, D where
// used), and holds, per axis, the output positions' window as corners relative to the image's
// ends: from -pad to (out - 1) stride + 1 - size - pad, each within a range that shrinks with
// the rank (2^15, 2^7, 2^4), with a stride of at most 8 and the filter's offsets within 16 bits.
int im2col_rank(const ConvLayer& L, const void* image, bool halves = false) {
    if (L.C % (halves && channel_halves(L) ? 32 : 64) != 0 || reinterpret_cast<uintptr_t>(image) % 16 != 0) return 0;
    // (An axis of ones with padding is used: its one output position may read the padding.)
    auto used = [&](int a) { return L.image[a] != 1 || L.filter[a] != 1 || L.output[a] != 1 || L.pad[a] != 0; };
    const int rank = used(0) ? 5 : used(1) ? 4 : 3;
    const int64_t lim = rank == 3 ? 32768 : rank == 4 ? 128 : 16;
    for (int a = 5 - rank; a < 3; ++a) {
        const int64_t lower = -L.pad[a], upper = (L.output[a] - 1) * L.stride[a] + 1 - L.image[a] + lower;
        if (L.stride[a] > 8 || lower < -lim || lower >= lim || upper < -lim || upper >= lim ||
            (L.filter[a] - 1) * L.dilation[a] >= 65536)
            return 0;
    }
    return rank;
}

// The im2col descriptor of rank `rank` for the image I (N, D, H, W, C) of L: boxes of `pixels`
// output positions x 64 channels in the 128-byte swizzle (`halves`: 32 channels in the 64-byte
// one), axes innermost first (C, W, H, D, N; an unused D or H folds into N), the pixels where
// `layout` puts them. Nothing where the driver refuses a view's descriptor (a dense image's
// refusal is an error).
std::optional<CUtensorMap> im2col_map(const ConvLayer& L, const void* image, int rank, uint32_t pixels = 128,
                                      ImageLayout layout = {}, bool halves = false) {
    const size_t es = dtype_size(L.dtype);
    cuuint64_t dims[5], strides[4];
    cuuint32_t elem[5] = {1, 1, 1, 1, 1};
    int lower[3], upper[3];
    dims[0] = cuuint64_t(L.C);
    for (int i = 1; i < rank - 1; ++i) {   // W, then H, then D
        const int a = 3 - i;
        dims[i] = cuuint64_t(L.image[a]);
        elem[i] = cuuint32_t(L.stride[a]);
        lower[i - 1] = int(-L.pad[a]);
        upper[i - 1] = int((L.output[a] - 1) * L.stride[a] + 1 - L.image[a] - L.pad[a]);
    }
    dims[rank - 1] = cuuint64_t(L.N * L.image[0] * L.image[1] * L.image[2] * L.C) / (dims[0] * [&] {
        cuuint64_t v = 1;
        for (int i = 1; i < rank - 1; ++i) v *= dims[i];
        return v;
    }());
    const bool view = layout.pixel != 0;
    strides[0] = cuuint64_t(view ? layout.pixel : L.C) * es;
    strides[1] = cuuint64_t(view ? layout.row : L.image[2] * L.C) * es;   // (W's rows: H, or N where H folds into it)
    for (int i = 2; i < rank - 1; ++i) strides[i] = strides[i - 1] * dims[i];
    CUtensorMap map;
    const CUresult r = cuda::driver().cuTensorMapEncodeIm2col(
        &map, L.dtype == DType::Float16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        cuuint32_t(rank), const_cast<void*>(image), dims, strides, lower, upper, halves ? 32 : 64, pixels, elem,
        CU_TENSOR_MAP_INTERLEAVE_NONE, halves ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B,
        CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (view && r != CUDA_SUCCESS) {
        log_debug("conv: the driver refuses the im2col descriptor of {} over pixels {} and rows {} elements apart",
                  L.str(), layout.pixel, layout.row);
        return std::nullopt;
    }
    cuda::check(r, "cuTensorMapEncodeIm2col");
    return map;
}

// Whether I (contiguous) holds L's image where `layout` puts its pixels: both strides multiples
// of 16 bytes, each row's W pixels within a row, and the last pixel's channels inside I.
bool layout_fits(const ConvLayer& L, const Tensor& I, ImageLayout layout) {
    if (layout.pixel == 0) return true;
    const int64_t es = int64_t(dtype_size(L.dtype));
    const int64_t rows = L.N * L.image[0] * L.image[1];
    return I.is_contiguous() && layout.pixel > 0 && layout.row > 0 && layout.pixel * es % 16 == 0 &&
           layout.row * es % 16 == 0 && (L.image[2] - 1) * layout.pixel + L.C <= layout.row &&
           (rows - 1) * layout.row + (L.image[2] - 1) * layout.pixel + L.C <= I.size();
}

// t contiguous and starting on a 16-byte boundary, as the kernels' 16-byte copies and TMA want it:
// t itself, or a copy (a view that starts mid-vector).
Tensor aligned16(const Tensor& t, Context& ctx) {
    const Tensor c = detail::contiguous(t, ctx);
    return reinterpret_cast<uintptr_t>(detail::data_of(c)) % 16 == 0 ? c : ctx.eval(c.expr());
}

// The layer's geometry in the kernels' 32-bit fields (the callers have checked that they fit).
ConvShape conv_shape(const ConvLayer& L) {
    ConvShape s;
    s.N = int32_t(L.N), s.C = int32_t(L.C);
    s.D = int32_t(L.image[0]), s.H = int32_t(L.image[1]), s.W = int32_t(L.image[2]);
    s.M = int32_t(L.output[0]), s.P = int32_t(L.output[1]), s.Q = int32_t(L.output[2]);
    s.T = int32_t(L.filter[0]), s.R = int32_t(L.filter[1]), s.S = int32_t(L.filter[2]);
    s.pad_d = int32_t(L.pad[0]), s.pad_h = int32_t(L.pad[1]), s.pad_w = int32_t(L.pad[2]);
    s.str_d = int32_t(L.stride[0]), s.str_h = int32_t(L.stride[1]), s.str_w = int32_t(L.stride[2]);
    s.dil_d = int32_t(L.dilation[0]), s.dil_h = int32_t(L.dilation[1]), s.dil_w = int32_t(L.dilation[2]);
    return s;
}

// The epilogue's fields of a convolution kernel's parameters storing into C (element (m, n) at
// m c_sm + n c_sn): alpha, beta, ReLU and its slope, C's dtype, and stochastic rounding of a
// 16-bit C from the context's stream. (The bias, where there is one, is the caller's.)
void set_epilogue(GemmParams& g, const detail::Mat& c, int64_t c_sm, int64_t c_sn, DType c_dtype, const DotOptions& o,
                  Context::Impl& impl) {
    g.c = const_cast<char*>(c.base);
    g.c_sm = c_sm, g.c_sn = c_sn;
    g.alpha = float(o.alpha), g.beta = float(o.beta), g.slope = float(o.slope);
    g.c_dtype = detail::gemm_dtype(c_dtype);
    if (o.relu) g.flags |= kRelu;
    if (o.beta != 0) g.flags |= kBeta;
    if (impl.stochastic_round_bits > 0 && c_dtype != DType::Float32) {
        g.sr_bits = impl.stochastic_round_bits;
        g.seed = impl.seed;
        g.counter = impl.rng_counter++;
    }
    g.batch = 1;
    g.group_m = 1;
}

} // namespace

Tensor im2col_cuda(const ConvLayer& L, const Tensor& I5) {
    Context& ctx = I5.context();
    cuda::CudaBackend& be = cuda::cuda_backend(ctx);
    const Tensor I = detail::contiguous(I5, ctx);
    const int64_t es = int64_t(dtype_size(I.dtype()));
    const int64_t rows = positions_of(L);
    const int64_t taps = taps_of(L);
    const int64_t ld = (taps + 16 / es - 1) / (16 / es) * (16 / es);   // rows 16 bytes apart, as TMA wants
    if (!fits_32_bits(rows) || !fits_32_bits(ld) || !fits_32_bits(L.image[0] * L.image[1] * L.image[2] * L.C) ||
        !geometry_fits(L))
        fail(Error::Kind::Value, "conv: {} has more than 2^31 output positions, taps or image elements, or a size, "
             "padding, stride or dilation past 2^31", L.str());
    Tensor buffer = ctx.empty({rows, ld}, I.dtype());
    // The widest vector that a tap's channels are whole vectors of and the image's start aligns to.
    const char* image = detail::data_of(I);
    int vb = 16;
    while (vb > es && ((L.C * es) % vb != 0 || reinterpret_cast<uintptr_t>(image) % uintptr_t(vb) != 0)) vb /= 2;
    Im2colParams p{};
    p.image = image;
    p.cols = detail::data_of(buffer);
    p.ld = ld, p.elem = int32_t(es), p.rows = int32_t(rows), p.taps = int32_t(taps);
    p.shape = conv_shape(L);
    p.chunks_per_row = fast_div(uint32_t(ld * es / 16));
    p.q = fast_div(uint32_t(p.shape.Q)), p.p = fast_div(uint32_t(p.shape.P)), p.m = fast_div(uint32_t(p.shape.M));
    p.c = fast_div(uint32_t(p.shape.C)), p.s = fast_div(uint32_t(p.shape.S)), p.r = fast_div(uint32_t(p.shape.R));
    // A 2D or 1D layer whose taps are under 16 bytes (a first layer's 3 channels): a block per row
    // of output positions from the image rows it stages in shared memory (im2col.cu).
    const int64_t span = (L.output[2] - 1) * L.stride[2] + L.filter[2];
    const int64_t staged = L.filter[1] * span * L.C * es;
    if (vb < 16 && L.image[0] == 1 && L.filter[0] == 1 && L.output[0] == 1 && L.pad[0] == 0 && L.dilation[2] == 1 &&
        staged <= 48 * 1024) {
        const std::string entry = fmt::format("kiln_im2col_rows_e{}", es);
        CUfunction f = be.precompiled(kiln_im2col_image, entry, int(staged));
        log_debug("conv: im2col {} -> {} ({} x {}, {} blocks, {} bytes staged)", L.str(), entry, rows, taps, L.N * L.output[1],
                  staged);
        void* params[] = {&p};
        be.launch_precompiled(f, unsigned(L.N * L.output[1]), 1, 1, 256, unsigned(staged), params, {});
        buffer.view().storage->written = true;
        return buffer.slice({Slice::all(), Slice::range(0, taps)});
    }
    const std::string entry = fmt::format("kiln_im2col_v{}", vb);
    CUfunction f = be.precompiled(kiln_im2col_image, entry, 0);
    // A thread per 16-byte chunk of the buffer (grid-stride past kGridStrideWaves waves).
    const int64_t chunks = rows * ld * es / 16;
    const int64_t blocks = be.stride_grid(f, (chunks + 255) / 256, 256);
    log_debug("conv: im2col {} -> {} ({} x {}, {} blocks)", L.str(), entry, rows, taps, blocks);
    void* params[] = {&p};
    be.launch_precompiled(f, unsigned(blocks), 1, 1, 256, 0, params, {});
    buffer.view().storage->written = true;
    return buffer.slice({Slice::all(), Slice::range(0, taps)});
}

Tensor col2im_cuda(const ConvLayer& L, const Tensor& dcols) {
    Context& ctx = dcols.context();
    cuda::CudaBackend& be = cuda::cuda_backend(ctx);
    const int64_t rows = positions_of(L);
    const int64_t taps = taps_of(L);
    KILN_CHECK_INTERNAL(dcols.dtype() == DType::Float32 && dcols.rank() == 2 && dcols.shape()[0] == rows &&
                            dcols.shape()[1] == taps && dcols.strides()[1] == 1,
                        "col2im_cuda: the patch gradient of {} is {} {} with strides {}", L.str(),
                        dtype_name(dcols.dtype()), shape_str(dcols.shape()), shape_str(dcols.strides()));
    if (!fits_32_bits(rows) || !fits_32_bits(taps) || !fits_32_bits(L.N * L.image[0] * L.image[1] * L.image[2]) ||
        !geometry_fits(L))
        fail(Error::Kind::Value, "conv: {} has more than 2^31 output positions, taps or image positions, or a size, "
             "padding, stride or dilation past 2^31", L.str());
    Tensor image = ctx.empty({L.N, L.image[0], L.image[1], L.image[2], L.C}, DType::Float32);
    Col2imParams p{};
    p.cols = reinterpret_cast<const float*>(detail::data_of(dcols));
    p.image = reinterpret_cast<float*>(detail::data_of(image));
    p.ld = dcols.strides()[0];
    p.shape = conv_shape(L);
    p.c = fast_div(uint32_t(p.shape.C)), p.w = fast_div(uint32_t(p.shape.W)), p.h = fast_div(uint32_t(p.shape.H));
    p.d = fast_div(uint32_t(p.shape.D));
    p.str_d = fast_div(uint32_t(p.shape.str_d)), p.str_h = fast_div(uint32_t(p.shape.str_h));
    p.str_w = fast_div(uint32_t(p.shape.str_w));
    CUfunction f = be.precompiled(kiln_im2col_image, "kiln_col2im_f32", 0);
    const int64_t elements = image.size();
    const int64_t blocks = be.stride_grid(f, (elements + 255) / 256, 256);
    log_debug("conv: col2im {} ({} x {} -> {} elements, {} blocks)", L.str(), rows, taps, elements, blocks);
    void* params[] = {&p};
    be.launch_precompiled(f, unsigned(blocks), 1, 1, 256, 0, params, {});
    image.view().storage->written = true;
    return image;
}

bool fold_fits(int64_t n, const Dims3& x, int64_t c, const Dims3& pad, const Dims3& j, int64_t cf) {
    // (Blocks and a row's elements index by 32 bits; strides and pads are under the sizes.)
    return fits_32_bits(n * x[0] * x[1]) && fits_32_bits(n * j[0] * j[1] * j[2]) && fits_32_bits(cf * j[2]) &&
           fits_32_bits((x[2] + pad[2]) * c) && fits_32_bits(x[0] + pad[0]) && fits_32_bits(x[1] + pad[1]);
}

namespace {
std::string dims_str(const Dims3& d) { return fmt::format("{}x{}x{}", d[0], d[1], d[2]); }

FoldParams fold_params(const Tensor& src, void* dst, int64_t n, const Dims3& x, int64_t c, const Dims3& stride,
                       const Dims3& pad, const Dims3& j, int64_t cf, const char* op) {
    if (!fold_fits(n, x, c, pad, j, cf))
        fail(Error::Kind::Value, "conv: {} ({} images of {} positions, {} channels, stride {}): past 2^31 positions", op,
             n, dims_str(x), c, dims_str(stride));
    FoldParams p{};
    p.src = detail::data_of(src);
    p.dst = dst;
    p.n = int32_t(n), p.c = int32_t(c), p.cf = int32_t(cf);
    for (int a = 0; a < 3; ++a)
        p.x[a] = int32_t(x[a]), p.j[a] = int32_t(j[a]), p.s[a] = int32_t(stride[a]), p.pad[a] = int32_t(pad[a]);
    const int64_t es = int64_t(dtype_size(src.dtype()));
    // fold's tile: the positions whose staged rows fit in kFoldPositionMaxBytes (all of a first
    // layer's row).
    p.tile = int32_t(std::clamp<int64_t>(kFoldPositionMaxBytes / (stride[0] * stride[1] * stride[2] * c * es), 1, j[2]));
    p.div_tiles = fast_div(uint32_t((j[2] + p.tile - 1) / p.tile));
    p.div_j1 = fast_div(uint32_t(j[1])), p.div_j0 = fast_div(uint32_t(j[0]));
    p.div_chunks = fast_div(uint32_t(std::max<int64_t>(1, cf * es / 16))), p.div_sc = fast_div(uint32_t(stride[2] * c));
    p.div_x1 = fast_div(uint32_t(x[1])), p.div_x0 = fast_div(uint32_t(x[0]));
    p.div_s0 = fast_div(uint32_t(stride[0])), p.div_s1 = fast_div(uint32_t(stride[1]));
    return p;
}

} // namespace

Tensor fold_cuda(const Tensor& x5, const Dims3& stride, const Dims3& pad, const Dims3& positions, int64_t channels) {
    Context& ctx = x5.context();
    cuda::CudaBackend& be = cuda::cuda_backend(ctx);
    const Tensor x = detail::contiguous(x5, ctx);
    const Shape& s = x.shape();
    const int64_t es = int64_t(dtype_size(x.dtype()));
    KILN_CHECK_INTERNAL(x.rank() == 5 && es == 2 && channels >= stride[0] * stride[1] * stride[2] * s[4] &&
                            channels % 8 == 0 && stride[0] * stride[1] * stride[2] * s[4] * es <= kFoldPositionMaxBytes,
                        "fold_cuda: {} {} into {} channels by stride {}", dtype_name(x.dtype()), shape_str(s), channels,
                        dims_str(stride));
    Tensor out = ctx.empty({s[0], positions[0], positions[1], positions[2], channels}, x.dtype());
    FoldParams p = fold_params(x, detail::data_of(out), s[0], {s[1], s[2], s[3]}, s[4], stride, pad, positions, channels,
                               "the stride folded into the channels");
    log_debug("conv: fold {} {} by stride {} pad {} -> {}", dtype_name(x.dtype()), shape_str(s), dims_str(stride),
              dims_str(pad), shape_str(out.shape()));
    const int64_t blocks = s[0] * positions[0] * positions[1] * ((positions[2] + p.tile - 1) / p.tile);
    const unsigned staged = unsigned(stride[0] * stride[1] * stride[2] * s[4] * p.tile * es);
    CUfunction f = be.precompiled(kiln_im2col_image, fmt::format("kiln_fold_e{}", es), int(staged));
    void* params[] = {&p};
    be.launch_precompiled(f, unsigned(blocks), 1, 1, 256, staged, params, {});
    out.view().storage->written = true;
    return out;
}

Tensor filter_taps_cuda(const Tensor& F5, const Dims3& taps, const Dims3& base, const Dims3& step) {
    return filter_taps_cuda(F5, std::vector<TapSet>{{taps, base, step}}).front();
}

std::vector<Tensor> filter_taps_cuda(const Tensor& F5, const std::vector<TapSet>& sets, bool side_by_side) {
    Context& ctx = F5.context();
    cuda::CudaBackend& be = cuda::cuda_backend(ctx);
    const Shape& s = F5.shape();
    KILN_CHECK_INTERNAL(F5.rank() == 5 && dtype_size(F5.dtype()) == 2 && F5.is_contiguous() && s[0] % 8 == 0 &&
                            s[4] % 8 == 0 && fits_32_bits(s[0]) && fits_32_bits(s[4]) && !sets.empty(),
                        "filter_taps_cuda: {} {}, {} sets", dtype_name(F5.dtype()), shape_str(s), sets.size());
    int64_t total = 0;
    for (const TapSet& t : sets) {
        for (int a = 0; a < 3; ++a) {
            const int64_t last = t.base[a] + t.step[a] * (t.taps[a] - 1);
            KILN_CHECK_INTERNAL(t.taps[a] >= 1 && t.base[a] >= 0 && t.base[a] < s[1 + a] && last >= 0 && last < s[1 + a],
                                "filter_taps_cuda: taps {} from {} by {} of {}", dims_str(t.taps), dims_str(t.base),
                                dims_str(t.step), shape_str(s));
        }
        total += s[4] * t.taps[0] * t.taps[1] * t.taps[2] * s[0];
    }
    KILN_CHECK_INTERNAL(!side_by_side || sets.size() <= size_t(kMaxTapSets), "filter_taps_cuda: {} sets side by side",
                        sets.size());
    const int64_t row_taps = total / (s[4] * s[0]);   // (side by side: every set's taps in a row)
    const Tensor buffer = ctx.empty({total}, F5.dtype());
    CUfunction f = be.precompiled(kiln_im2col_image, "kiln_filter_taps_e2", 0);
    std::vector<Tensor> out;
    int64_t at = 0;
    for (size_t first = 0; first < sets.size(); first += kMaxTapSets) {
        FilterTapsParams p{};
        p.filter = detail::data_of(F5);
        p.out = detail::data_of(buffer);
        p.K = int32_t(s[0]), p.T = int32_t(s[1]), p.R = int32_t(s[2]), p.S = int32_t(s[3]), p.C = int32_t(s[4]);
        p.row_taps = side_by_side ? int32_t(row_taps) : 0;
        int64_t z = 0;   // the launch's output taps
        for (size_t i = first; i < std::min(sets.size(), first + size_t(kMaxTapSets)); ++i, ++p.sets) {
            const TapSet& t = sets[i];
            for (int a = 0; a < 3; ++a) {
                p.taps[p.sets][a] = int32_t(t.taps[a]);
                p.base[p.sets][a] = int32_t(t.base[a]);
                p.step[p.sets][a] = int32_t(t.step[a]);
            }
            const Shape shape{s[4], t.taps[0], t.taps[1], t.taps[2], s[0]};
            const int64_t set_taps = t.taps[0] * t.taps[1] * t.taps[2];
            z += set_taps;
            KILN_CHECK_INTERNAL(z <= 65535, "filter_taps_cuda: {} taps in one launch", z);
            p.z_end[p.sets] = int32_t(z);
            if (side_by_side) {
                // Taps [at, at + set_taps) of each channel's row of row_taps.
                p.out_at[p.sets] = at * s[0];
                const Tensor all = *buffer.reshape_view({s[4], row_taps, s[0]});
                out.push_back(*all.slice({Slice::all(), Slice::range(at, at + set_taps), Slice::all()}).reshape_view(shape));
                at += set_taps;
                continue;
            }
            p.out_at[p.sets] = at;
            out.push_back(*buffer.slice({Slice::range(at, at + numel(shape))}).reshape_view(shape));
            at += numel(shape);
        }
        void* params[] = {&p};
        be.launch_precompiled(f, unsigned((s[4] + 63) / 64), unsigned((s[0] + 63) / 64), unsigned(z), 256, 0, params,
                              {.programmatic = be.programmatic_launches()});
    }
    buffer.view().storage->written = true;
    return out;
}

void unfold_cuda(const Tensor& folded, Tensor& x, const Dims3& stride, const Dims3& pad) {
    Context& ctx = folded.context();
    cuda::CudaBackend& be = cuda::cuda_backend(ctx);
    const Tensor f = detail::contiguous(folded, ctx);
    const Shape &s = f.shape(), &xs = x.shape();
    const int64_t es = int64_t(dtype_size(f.dtype()));
    KILN_CHECK_INTERNAL(f.rank() == 5 && x.rank() == 5 && (es == 2 || es == 4) && x.dtype() == f.dtype() &&
                            x.is_contiguous() && xs[0] == s[0] && s[4] >= stride[0] * stride[1] * stride[2] * xs[4],
                        "unfold_cuda: {} {} to {} {} by stride {}", dtype_name(f.dtype()), shape_str(s),
                        dtype_name(x.dtype()), shape_str(xs), dims_str(stride));
    FoldParams p = fold_params(f, detail::data_of(x), s[0], {xs[1], xs[2], xs[3]}, xs[4], stride, pad, {s[1], s[2], s[3]},
                               s[4], "the stride unfolded from the channels");
    log_debug("conv: unfold {} {} by stride {} pad {} -> {}", dtype_name(f.dtype()), shape_str(s), dims_str(stride),
              dims_str(pad), shape_str(xs));
    CUfunction kernel = be.precompiled(kiln_im2col_image, fmt::format("kiln_unfold_e{}", es), 0);
    void* params[] = {&p};
    be.launch_precompiled(kernel, unsigned(xs[0] * xs[1] * xs[2]), 1, 1, 256, 0, params, {});
    x.view().storage->written = true;
}

void conv_autotune_forget() {
    std::lock_guard<std::mutex> lock(tuned_mu);
    tuned().clear();
    tuned_entry().clear();
}

namespace {
// The plan conv_fprop_implicit takes for L (the tuner aside), its patches by TMA where the
// descriptor holds the window, the walk where an output of the layer's dtype of its own, without
// beta, could take it (what the benchmarks store; stochastic rounding is the context's).
FpropPlan expected_plan(Context& ctx, const ConvLayer& L, bool plain_rows) {
    cuda::CudaBackend& be = cuda::cuda_backend(ctx);
    const int sms = be.info().multiprocessors;
    const bool tma = im2col_rank(L, nullptr, true) != 0;   // (allocations are 16-byte aligned)
    const bool output_ok = tma && L.K % 8 == 0 && context_impl(ctx).stochastic_round_bits == 0;
    return fprop_choice(
        L, sms, tma, plain_rows,
        [&](const ConvTile& u) {
            return output_ok && walk_fits_tiles(L, u, sms) && walk_has_kernel(L, u.bn, plain_rows) &&
                   walk_for(L, u, false, plain_rows).smem <= be.info().max_shared_optin;
        },
        output_ok && !channel_halves(L) && plain_rows && L.K <= 128 && walk_t_for(L).smem <= be.info().max_shared_optin);
}
} // namespace

std::string conv_fprop_kernel(Context& ctx, const ConvLayer& L, bool column_sums, bool plain_rows) {
    if (ctx.backend() != Backend::CUDA) return "";
    cuda::CudaBackend& be = cuda::cuda_backend(ctx);
    if (!takes(be, L)) return "";
    if (mma_kernels(be)) return mma_tile(L).entry + " (patches gathered)";
    if (auto tuned = tuned_name("fprop", L)) {
        // (The tuner times the plain entries; the 256-wide walk adds the sums in its own.)
        const ConvTile wide = tile_of(L, 256);
        if (column_sums && *tuned == walk_for(L, wide, false, plain_rows).entry + " (tuned)")
            return walk_for(L, wide, true, plain_rows).entry + " (tuned)";
        return *tuned;
    }
    const bool tma = im2col_rank(L, nullptr, true) != 0;   // (allocations are 16-byte aligned)
    const std::string name = describe(L, expected_plan(ctx, L, plain_rows), column_sums, plain_rows);
    return !tma ? name : channel_halves(L) ? name + " (patches by TMA in 32-channel halves)" : name + " (patches by TMA)";
}

std::optional<double> conv_fprop_estimate_us(Context& ctx, const ConvLayer& L) {
    if (ctx.backend() != Backend::CUDA || !takes(cuda::cuda_backend(ctx), L) || mma_kernels(cuda::cuda_backend(ctx)) ||
        L.K <= 64)
        return std::nullopt;
    return expected_plan(ctx, L, true).us;
}

bool conv_im2col_forced() { return conv_kernel_choice() == 0; }

bool pointwise_implicit(Context& ctx, const ConvLayer& L, bool into_view) {
    if (ctx.backend() != Backend::CUDA || mma_kernels(cuda::cuda_backend(ctx))) return false;
    return pointwise_prefers_implicit(L, cuda::cuda_backend(ctx).info().multiprocessors, into_view) &&
           !conv_fprop_kernel(ctx, L).empty();
}

namespace {
thread_local bool last_counted = false, last_summed = false;
thread_local ImageLayout last_layout;
} // namespace

bool last_conv_counted() { return last_counted; }
bool last_conv_summed() { return last_summed; }
ImageLayout last_conv_layout() { return last_layout; }

bool patches_by_tma(Context& ctx, const ConvLayer& L) {
    return ctx.backend() == Backend::CUDA && !mma_kernels(cuda::cuda_backend(ctx)) && im2col_rank(L, nullptr) != 0;
}

bool conv_fprop_implicit(const ConvLayer& L, const Tensor& I5, const Tensor& F, Tensor& C, const DotOptions& o,
                         StoreExtras* extras, ImageLayout layout, uint32_t siblings) {
    const StoreCount* count = extras ? extras->count : nullptr;
    if (extras) extras->counted = false, extras->summed = false;
    last_counted = false, last_summed = false, last_layout = {};
    Context& ctx = C.context();
    cuda::CudaBackend& be = cuda::cuda_backend(ctx);
    if (!takes(be, L) || I5.dtype() != L.dtype || F.dtype() != L.dtype) return false;
    // (A layout places pixels in I5's dense storage: never copied.)
    const Tensor I = layout.pixel ? detail::contiguous(I5, ctx) : aligned16(I5, ctx);
    if (!layout_fits(L, I, layout)) return false;
    std::optional<CUtensorMap> map_a;   // (the image's patches by TMA where the descriptor holds them)
    const bool mma = mma_kernels(be);
    const bool halves = !mma && channel_halves(L);   // (A in halves: the `_h` entries, tile_of and walk_for)
    const int rank = mma ? 0 : im2col_rank(L, detail::data_of(I), true);
    if (rank) map_a = im2col_map(L, detail::data_of(I), rank, 128, layout, halves);
    if (layout.pixel && !map_a) return false;
    Context::Impl& impl = context_impl(ctx);
    const Tensor Fc = aligned16(F, ctx);
    const int64_t rows = positions_of(L);
    const int64_t taps = taps_of(L);
    const int sms = be.info().multiprocessors;

    ConvParams p{};
    GemmParams& g = p.gemm;
    const bool grouped = C.rank() == 3;
    KILN_CHECK_INTERNAL((C.rank() == 2 || grouped) && C.shape()[0] * (grouped ? C.shape()[1] : 1) == rows &&
                            C.shape()[C.rank() - 1] == L.K,
                        "conv_fprop_implicit: output {} for {}", shape_str(C.shape()), L.str());
    detail::Mat c;
    if (grouped) c.base = detail::data_of(C), c.s_row = C.strides()[1], c.s_col = C.strides()[2];
    else c = detail::mat(C);
    set_epilogue(g, c, c.s_row, c.s_col, C.dtype(), o, impl);
    if (grouped) g.c_group = int32_t(C.shape()[1]), g.c_sg = C.strides()[0];
    g.m = int32_t(rows), g.n = int32_t(L.K), g.k = int32_t(taps);
    Tensor bias;
    if (o.bias) {
        bias = detail::float32_bias(*o.bias, L.K, ctx);
        g.bias = reinterpret_cast<const float*>(detail::data_of(bias));
        g.flags |= kBias;
    }
    g.tiles_m = int32_t((rows + 127) / 128);
    p.image = detail::data_of(I);
    p.shape = conv_shape(L);
    p.im2col_rank = map_a ? rank : 0;
    // (Where I or F was copied here, that copy's kernel comes between the siblings: it waits.)
    const bool copied = detail::data_of(I) != detail::data_of(I5) || detail::data_of(Fc) != detail::data_of(F);
    if (!mma) p.siblings = copied ? siblings & ~kAfterSibling : siblings;
    if (mma) {
        // The mma.sync kernel: a block per tile, both operands gathered 16 bytes at a time.
        g.b = detail::data_of(Fc);
        const ConvTile t = mma_tile(L);
        g.tiles_n = int32_t((L.K + t.bn - 1) / t.bn);
        const int64_t blocks = int64_t(g.tiles_m) * g.tiles_n;
        if (!fits_32_bits(blocks)) return false;
        int smem = t.smem;
        // A histogram: the 8 warps' counters past the dynamic shared memory, where they fit.
        const int bytes = kConvMmaThreads / 32 * (count ? count->bins : 0) * 4;
        const int at = count ? detail::counters_at(be, be.precompiled(kiln_conv_sm80_image, t.entry, 0), smem, bytes) : -1;
        if (at >= 0) {
            g.hist = static_cast<uint32_t*>(count->counters);
            g.hist_bins = count->bins, g.hist_offset = count->offset, g.hist_smem = at;
            g.flags |= kHist;
            smem = at + bytes;
            extras->counted = last_counted = true;
        }
        log_debug("conv: fprop {} -> {} ({} x {} x {}, {} blocks, patches gathered)", L.str(), t.entry, rows, L.K, taps,
                  blocks);
        void* params[] = {&p};
        CUfunction f = be.precompiled(kiln_conv_sm80_image, t.entry, smem);
        be.launch_precompiled(f, unsigned(blocks), 1, 1, kConvMmaThreads, unsigned(smem), params,
                              {.programmatic = detail::sm80_image_programmatic(be)});
        C.view().storage->written = true;
        return true;
    }
    // Whether C's rows are plain (not a strided gradient's phase's grouped rows) and of the
    // layer's dtype: the 256-wide walk then runs on the GEMM's persistent kernel (walk_for). The
    // tuner's scratch, plain, is timed with the kernel this call would run.
    const bool plain = g.c_group == 0 && C.dtype() == L.dtype;
    // The walk (conv_walk.cuh): a block per SM running ahead across its tiles, where there are
    // more tiles than SMs, the patches come by TMA, the register epilogue stores and its
    // buffers fit. The cost model, KILN_CONV_KERNEL=walk or the tuner chooses it.
    auto walk_runs = [&](const ConvTile& u) {
        return walk_fits_tiles(L, u, sms) && p.im2col_rank && rows_of_16_bytes(g) && walk_has_kernel(L, u.bn, plain) &&
               walk_for(L, u, false, plain).smem <= be.info().max_shared_optin &&
               (u.bn <= 128 || !count);   // (the wider walks count no histogram)
    };
    // The transposed walk (conv_walk_t.cuh): at most 128 channels, the patches by TMA, plain 16-bit
    // rows of the layer's dtype, no histogram.
    const WalkTile walk_t = walk_t_for(L);
    const bool walk_t_runs = L.K <= 128 && !halves && p.im2col_rank && rows_of_16_bytes(g) && plain && !count &&
                             walk_t.smem <= be.info().max_shared_optin;
    const int64_t walk_t_blocks = std::min<int64_t>(sms, (rows + 255) / 256);
    // Launches tile u (walking or one tile a block) with parameters q; smem: the one-tile
    // kernel's dynamic shared memory.
    auto launch = [&](const FpropPlan& x, ConvParams q, int smem) {
        const ConvTile& u = x.tile;
        GemmParams& h = q.gemm;
        h.tiles_n = int32_t((L.K + u.bn - 1) / u.bn);
        // The filter as a K x taps K-major matrix: boxes of one 128-byte k-tile x BN rows.
        CUtensorMap map_b = detail::tensor_map(detail::data_of(Fc), L.dtype, uint64_t(taps), uint64_t(L.K), 1, taps, 0,
                                               64, uint32_t(u.bn));
        CUtensorMap patches = map_a.value_or(CUtensorMap{});
        if (x.transposed) {
            // C by TMA in boxes of 256 rows x 64 channels (the tile, transposed back).
            CUtensorMap map_c = detail::tensor_map(h.c, C.dtype(), uint64_t(h.n), uint64_t(h.m), 1, h.c_sm, 0, 64, 256);
            void* params[] = {&q, &map_b, &patches, &map_c};
            CUfunction f = be.precompiled(kiln_conv_sm90_image, walk_t.entry, walk_t.smem);
            // (A producer warpgroup and a consumer per 64 channels of the tile.)
            be.launch_precompiled(f, unsigned(walk_t_blocks), 1, 1, unsigned(128 * (u.bn / 64 + 1)),
                                  unsigned(walk_t.smem), params,
                                  {.programmatic = be.programmatic_launches()});
        } else if (x.walk) {
            // C by TMA: on the GEMM's persistent kernel in boxes of 64 rows x 128 bytes, its
            // raster a row of tiles after another, not launched early (as the GEMM's); on the
            // walk, plain rows in boxes of 16 rows x 128 bytes (a phase's grouped rows: the
            // warps' own stores).
            const WalkTile w = walk_for(L, u, (h.flags & kColSums) != 0, plain);
            if (w.persistent) h.group_m = 1, h.batch = 1;
            else q.c_by_tma = h.c_group == 0;
            CUtensorMap map_c{};
            if (w.persistent || q.c_by_tma)
                map_c = detail::tensor_map(h.c, C.dtype(), uint64_t(h.n), uint64_t(h.m), 1, h.c_sm, 0, 64,
                                           w.persistent ? 64 : 16);
            void* params[] = {&q, &map_b, &patches, &map_c};
            const int dynamic = std::max(smem, w.smem);
            CUfunction f = be.precompiled(kiln_conv_sm90_image, w.entry, dynamic);
            be.launch_precompiled(f, unsigned(sms), 1, 1, 384, unsigned(dynamic), params,
                                  {.programmatic = !w.persistent && be.programmatic_launches()});
        } else {
            void* params[] = {&q, &map_b, &patches};
            CUfunction f = be.precompiled(kiln_conv_sm90_image, u.entry, smem);
            be.launch_precompiled(f, unsigned(int64_t(h.tiles_m) * h.tiles_n), 1, 1, 384, unsigned(smem), params,
                                  {.programmatic = be.programmatic_launches()});
        }
    };
    // The cost model's plan, the walk only where it can run (fprop_choice); or the tuner's.
    FpropPlan plan = fprop_choice(L, sms, p.im2col_rank != 0, plain, walk_runs, walk_t_runs);
    if (autotune_enabled() && !count && !conv_kernel_choice()) {
        // Each tile width the channels fill at least half of (and whose stages fit), one tile a
        // block, and where it can run its walk.
        std::vector<FpropPlan> candidates;
        for (int bn : {64, 96, 128, 192, 256}) {
            if (bn > 64 && bn / 2 >= L.K) break;
            if (bn == 96 && !tile_96_suits(L, p.im2col_rank != 0)) continue;
            const ConvTile u = tile_of(L, bn);
            if (bn != 192 && u.smem <= be.info().max_shared_optin) candidates.push_back({u, false});   // (192: the walk only)
            if (walk_runs(u)) candidates.push_back({u, true});
        }
        if (walk_t_runs) candidates.push_back({tile_of(L, L.K <= 64 ? 64 : 128), false, 0, true});
        const std::string key = fmt::format("fprop {} {} pixels {}/{} out {} {}x{} rows16 {} plain {} patches {} relu {} beta {} bias {} sr {} on {} ({} SMs)",
                                            L.str(), dtype_name(L.dtype), layout.pixel, layout.row, dtype_name(C.dtype()), c.s_row, c.s_col,
                                            rows_of_16_bytes(g), plain, p.im2col_rank, o.relu, o.beta != 0, o.bias.has_value(),
                                            g.sr_bits, be.info().name, sms);
        std::pair<Tensor, char*> scratch;   // the timed launches' output, made on a miss
        const FpropPlan* chosen = tuned_choice(
            be, "fprop", L, key, candidates, [&](const FpropPlan& x) { return describe(L, x, false, plain); },
            [&](const FpropPlan& x) {
                if (!scratch.second)
                    scratch = scratch_like(ctx, c, rows, L.K, c.s_row, c.s_col, int64_t(dtype_size(C.dtype())));
                ConvParams q = p;
                q.siblings = 0;   // (launched between the phases' own)
                q.gemm.c = scratch.second;
                q.gemm.c_group = 0, q.gemm.c_sg = 0;   // (the scratch's rows are plain)
                launch(x, q, x.tile.smem);
            });
        if (chosen) plan = *chosen;
    }
    const ConvTile& t = plan.tile;
    const int64_t tiles_n = (L.K + t.bn - 1) / t.bn, blocks = int64_t(g.tiles_m) * tiles_n;
    const WalkTile walk = plan.walk ? walk_for(L, t, false, plain) : WalkTile{};
    int smem = plan.transposed ? walk_t.smem : plan.walk ? walk.smem : t.smem;
    // Channel sums (kColSums), then their sum over the partials' rows: one tile a block, each row
    // of tiles' column sums (the warps' sums past the tile's bias, added in warp order); the
    // walk, each warp's running sums over its block's tiles (WarpColSums), a row a warp, added
    // into the block's first at its end; the transposed walk, each thread's two channels in
    // registers over its block's tiles, a row of 64 a consumer a block.
    Tensor partials;
    const int col_s_bytes = plan.walk || plan.transposed ? 0 : conv_col_sum_bytes(t.bn);
    if (extras && extras->column_sums && rows_of_16_bytes(g) && (!plan.walk || tiles_n <= 64) &&
        smem + col_s_bytes <= be.info().max_shared_optin) {
        partials = plan.transposed ? ctx.empty({walk_t_blocks, int64_t(t.bn)}, DType::Float32)
                   : plan.walk     ? ctx.empty({int64_t(sms) * 8, tiles_n * t.bn}, DType::Float32)
                                   : ctx.empty({g.tiles_m, L.K}, DType::Float32);
        g.col_partials = reinterpret_cast<float*>(detail::data_of(partials));
        g.flags |= kColSums;
        smem += col_s_bytes;
    }
    // A histogram: each epilogue warp's counters (8 warps: the two consumers) past the kernel's
    // dynamic shared memory (16-byte aligned), where they fit beside its static and dynamic
    // shared memory; otherwise the call counts the output after the convolution.
    const int bytes = 256 / 32 * (count ? count->bins : 0) * 4;
    const int at = count ? detail::counters_at(be, be.precompiled(kiln_conv_sm90_image, plan.walk ? walk.entry : t.entry, 0),
                                               smem, bytes)
                         : -1;
    if (at >= 0) {
        g.hist = static_cast<uint32_t*>(count->counters);
        g.hist_bins = count->bins, g.hist_offset = count->offset, g.hist_smem = at;
        g.flags |= kHist;
        smem = at + bytes;
        extras->counted = true;
        last_counted = true;
    }
    if (plan.transposed)
        log_debug("conv: fprop {} -> {} ({} x {} x {}, {} tiles of 256 positions on {} blocks{})", L.str(), walk_t.entry,
                  rows, L.K, taps, (rows + 255) / 256, walk_t_blocks, partials.defined() ? ", channel sums" : "");
    else if (plan.walk)
        log_debug("conv: fprop {} -> {} ({} x {} x {}, {} tiles on {} blocks{})", L.str(),
                  walk_for(L, t, partials.defined(), plain).entry, rows, L.K, taps,
                  blocks, sms, partials.defined() ? ", channel sums" : "");
    else
        log_debug("conv: fprop {} -> {} ({} x {} x {}, {} blocks, patches {}{})", L.str(), t.entry, rows, L.K, taps, blocks,
                  p.im2col_rank ? fmt::format("by TMA im2col, rank {}{}", p.im2col_rank, halves ? ", 32-channel halves" : "")
                                : std::string(halves ? "gathered in 32-channel halves" : "gathered"),
                  partials.defined() ? ", channel sums" : "");
    launch(plan, p, smem);
    last_layout = layout;
    C.view().storage->written = true;
    if (partials.defined()) {
        partials.view().storage->written = true;
        detail::add_col_partials(partials, plan.walk, L.K, *extras->column_sums);
        extras->summed = last_summed = true;
    }
    return true;
}

namespace {

// A strided gradient's phases as one walk takes them: their common patch layer (the first
// phase's, with each axis's largest padding, its window reaching every phase's last tap from
// there), each phase's offsets into it (the padding it has less), and the walk's width; none
// where the phases differ in anything but their taps and padding, or the walk cannot run them.
struct PhasedLaunch {
    ConvLayer patches;
    std::vector<Dims3> offsets;
    PhasedWalk walk;
};
std::optional<PhasedLaunch> phased_launch(cuda::CudaBackend& be, const std::vector<ConvLayer>& phases) {
    if (phases.size() < 2 || phases.size() > size_t(kMaxPhases) || mma_kernels(be) || conv_kernel_choice() == 2)
        return std::nullopt;
    const ConvLayer& A = phases.front();
    PhasedLaunch out{A, {}, {}};
    for (const ConvLayer& D : phases) {
        if (D.N != A.N || D.C != A.C || D.K != A.K || D.dtype != A.dtype || D.image != A.image || D.output != A.output ||
            D.stride != Dims3{1, 1, 1} || D.dilation != A.dilation || !takes(be, D))
            return std::nullopt;
        for (int a = 0; a < 3; ++a) out.patches.pad[a] = std::max(out.patches.pad[a], D.pad[a]);
    }
    for (const ConvLayer& D : phases) {
        Dims3 o{};
        for (int a = 0; a < 3; ++a) {
            o[a] = out.patches.pad[a] - D.pad[a];
            if (o[a] != 0 && D.dilation[a] != 1) return std::nullopt;
            out.patches.filter[a] = std::max(out.patches.filter[a], o[a] + D.filter[a]);
        }
        out.offsets.push_back(o);
    }
    if (A.K <= 64 || !geometry_fits(out.patches) || im2col_rank(out.patches, nullptr) == 0) return std::nullopt;
    int64_t taps = 0;
    for (const ConvLayer& D : phases) taps += D.filter[0] * D.filter[1] * D.filter[2];
    out.walk = phased_walk(A, taps, int(phases.size()), be.info().multiprocessors);
    if (out.walk.smem > be.info().max_shared_optin) return std::nullopt;
    return out;
}

} // namespace

std::string conv_phased_kernel(Context& ctx, const std::vector<ConvLayer>& phases) {
    if (ctx.backend() != Backend::CUDA) return "";
    const std::optional<PhasedLaunch> l = phased_launch(cuda::cuda_backend(ctx), phases);
    return l ? l->walk.entry : "";
}

bool conv_dgrad_phased(const std::vector<ConvLayer>& phases, const Tensor& E5, const std::vector<Tensor>& taps,
                       const std::vector<Tensor>& rows, const DotOptions& o) {
    Context& ctx = E5.context();
    cuda::CudaBackend& be = cuda::cuda_backend(ctx);
    KILN_CHECK_INTERNAL(taps.size() == phases.size() && rows.size() == phases.size(),
                        "conv_dgrad_phased: {} phases, {} taps, {} rows", phases.size(), taps.size(), rows.size());
    const std::optional<PhasedLaunch> l = phased_launch(be, phases);
    if (!l) return false;
    const ConvLayer& A = phases.front();
    if (E5.dtype() != A.dtype) return false;
    const Tensor E = aligned16(E5, ctx);
    const int rank = im2col_rank(l->patches, detail::data_of(E));
    if (rank == 0) return false;
    // The taps: views of one buffer, channel rows of every phase's taps (filter_taps_cuda side by
    // side); the rows: views of one gradient alike but for where they start.
    const int64_t es = int64_t(dtype_size(A.dtype));
    const Tensor& T0 = taps.front();
    const Tensor& R0 = rows.front();
    const char* const taps_at = detail::data_of(T0);
    const char* rows_at = detail::data_of(R0);
    for (size_t i = 0; i < phases.size(); ++i) {
        const Tensor &T = taps[i], &R = rows[i];
        if (T.dtype() != A.dtype || T.rank() != 5 || T.view().storage != T0.view().storage ||
            T.strides()[0] != T0.strides()[0] || T.strides()[4] != 1 || detail::data_of(T) < taps_at ||
            R.rank() != 3 || R.dtype() != R0.dtype() || R.shape() != R0.shape() || R.strides() != R0.strides() ||
            R.view().storage != R0.view().storage)
            return false;
        rows_at = std::min(rows_at, static_cast<const char*>(detail::data_of(R)));
    }
    Context::Impl& impl = context_impl(ctx);
    ConvParams p{};
    GemmParams& g = p.gemm;
    detail::Mat c;
    c.base = rows_at, c.s_row = R0.strides()[1], c.s_col = R0.strides()[2];
    set_epilogue(g, c, c.s_row, c.s_col, R0.dtype(), o, impl);
    g.c_group = int32_t(R0.shape()[1]), g.c_sg = R0.strides()[0];
    g.m = int32_t(positions_of(A)), g.n = int32_t(A.K), g.k = int32_t(taps_of(A));
    const int bn = l->walk.bn;
    g.tiles_m = int32_t((positions_of(A) + 127) / 128), g.tiles_n = int32_t((A.K + bn - 1) / bn);
    if (!rows_of_16_bytes(g) || R0.shape()[0] * R0.shape()[1] != positions_of(A) || R0.shape()[2] != A.K) return false;
    ConvPhases ph{};
    ph.count = int32_t(phases.size());
    for (size_t i = 0; i < phases.size(); ++i) {
        const ConvLayer& D = phases[i];
        const int64_t c_at = detail::data_of(rows[i]) - rows_at, k_first = detail::data_of(taps[i]) - taps_at;
        if (c_at % 16 != 0 || k_first % (64 * es) != 0) return false;
        ConvPhase& f = ph.phase[i];
        f.c_at = c_at / es, f.k = int32_t(taps_of(D)), f.k_first = int32_t(k_first / es);
        f.R = int32_t(D.filter[1]), f.S = int32_t(D.filter[2]);
        f.od = uint16_t(l->offsets[i][0]), f.oh = uint16_t(l->offsets[i][1]), f.ow = uint16_t(l->offsets[i][2]);
        if (taps[i].shape() != Shape{A.K, D.filter[0], D.filter[1], D.filter[2], A.C}) return false;
    }
    p.image = detail::data_of(E);
    p.shape = conv_shape(l->patches);
    p.im2col_rank = rank;
    // B: the channel rows of all the phases' taps, boxes of one k-tile x bn rows.
    const int64_t row = T0.strides()[0];
    const CUtensorMap map_b = detail::tensor_map(taps_at, A.dtype, uint64_t(row), uint64_t(A.K), 1, row, 0, 64, uint32_t(bn));
    const std::optional<CUtensorMap> map_a = im2col_map(l->patches, detail::data_of(E), rank, 128);
    const int64_t items = int64_t(g.tiles_m) * g.tiles_n;
    const unsigned blocks = unsigned(std::min<int64_t>(items, be.info().multiprocessors));
    log_debug("conv: {} phases of {} -> {} ({} x {}, {} items of every phase on {} blocks)", phases.size(), A.str(),
              l->walk.entry, positions_of(A), A.K, items, blocks);
    CUtensorMap patches = *map_a;
    void* params[] = {&p, const_cast<CUtensorMap*>(&map_b), &patches, &ph};
    CUfunction f = be.precompiled(kiln_conv_sm90_image, l->walk.entry, l->walk.smem);
    be.launch_precompiled(f, blocks, 1, 1, 384, unsigned(l->walk.smem), params,
                          {.programmatic = be.programmatic_launches()});
    R0.view().storage->written = true;
    return true;
}

namespace {

// The tuner's candidates: for each tile width the model weighs, the model's best slice count
// for it, and half and twice that, and the balanced split (128 and 256 wide), whose stages fit.
std::vector<WgradPlan> wgrad_candidates(const ConvLayer& L, int sms, int max_smem) {
    const int max_splits = int(std::min<int64_t>((positions_of(L) + 63) / 64, 64));
    std::vector<WgradPlan> out;
    for (int bn : {64, 128, 256}) {
        if (bn > 64 && bn / 2 >= L.K) break;
        const int split = wgrad_plan(L, sms, bn, WgradSplit::Sliced).splits;
        std::vector<WgradPlan> plans;
        for (int sp : {split / 2, split, split * 2})
            if (sp >= 1 && sp <= max_splits) plans.push_back(wgrad_plan_of(L, bn, sp));
        if (bn > 64) plans.push_back(wgrad_balanced_of(L, bn, sms));
        for (const WgradPlan& w : plans) {
            if (w.smem > max_smem) continue;
            if (std::none_of(out.begin(), out.end(), [&](const WgradPlan& x) { return describe(x) == describe(w); }))
                out.push_back(w);
        }
    }
    return out;
}

// Whether the implicit weight gradient takes L on this GPU: the fprop kernel's conditions, with
// the patches by TMA (C a multiple of 64, a window the descriptor holds).
bool wgrad_takes(cuda::CudaBackend& be, const ConvLayer& L) {
    return takes(be, L) && !mma_kernels(be) && L.K % 8 == 0 && im2col_rank(L, nullptr) != 0 &&
           wgrad_plan(L, be.info().multiprocessors).smem <= be.info().max_shared_optin;
}

} // namespace

std::string conv_wgrad_kernel(Context& ctx, const ConvLayer& L) {
    if (ctx.backend() != Backend::CUDA) return "";
    cuda::CudaBackend& be = cuda::cuda_backend(ctx);
    if (!wgrad_takes(be, L)) return "";
    if (auto tuned = tuned_name("wgrad", L)) return *tuned;
    return describe(wgrad_plan(L, be.info().multiprocessors, 0, wgrad_split_choice()));
}

bool conv_wgrad_implicit(const ConvLayer& L, const Tensor& I5, const Tensor& E5, Tensor& grad_F, const DotOptions& o,
                         const StoreCount* count, bool* counted, ImageLayout layout) {
    if (counted) *counted = false;
    last_counted = false, last_layout = {};
    Context& ctx = grad_F.context();
    cuda::CudaBackend& be = cuda::cuda_backend(ctx);
    if (!wgrad_takes(be, L) || I5.dtype() != L.dtype || E5.dtype() != L.dtype) return false;
    const Tensor I = detail::contiguous(I5, ctx);   // (a layout places pixels in I5's dense storage)
    if (!layout_fits(L, I, layout)) return false;
    const Tensor E = detail::contiguous(E5, ctx);
    const int rank = im2col_rank(L, detail::data_of(I));
    if (rank == 0 || reinterpret_cast<uintptr_t>(detail::data_of(E)) % 16 != 0) return false;
    const std::optional<CUtensorMap> patches = im2col_map(L, detail::data_of(I), rank, 64, layout);
    if (!patches) return false;
    Context::Impl& impl = context_impl(ctx);
    const int64_t rows = positions_of(L);
    const int64_t taps = taps_of(L);
    const int sms = be.info().multiprocessors;
    WgradPlan w = wgrad_plan(L, sms, 0, wgrad_split_choice());

    // The epilogue's parameters: grad_F (K x taps) written as its transpose, element (tap, k).
    ConvParams p{};
    GemmParams& g = p.gemm;
    const detail::Mat c = detail::mat(grad_F);
    set_epilogue(g, c, c.s_col, c.s_row, grad_F.dtype(), o, impl);
    g.m = int32_t(taps), g.n = int32_t(L.K), g.k = int32_t(rows);
    g.tiles_m = int32_t((taps + 127) / 128);
    p.image = detail::data_of(I);
    p.shape = conv_shape(L);
    p.im2col_rank = rank;
    // E as a rows x K matrix in boxes of 64 channels x 64 rows; I's patches 64 positions at a time.
    CUtensorMap map_e = detail::tensor_map(detail::data_of(E), L.dtype, uint64_t(L.K), uint64_t(rows), 1, L.K, 0, 64, 64);
    CUtensorMap map_i = *patches;
    // Launches plan u with parameters q (whose epilogue stores where q.gemm.c points). Split, the
    // blocks store raw float32 planes, slices[split] (taps x K, in `planes`), and the reduction
    // applies the epilogue.
    // smem: the kernel's dynamic shared memory (u.smem, or more for a histogram's counters).
    // Balanced (u.runs > 0): a block an SM, all resident (a cooperative launch: a run waits for
    // the later runs' partials of the tile it finishes), the partials in a scratch tensor and
    // their flags tagged words of the backend's (a fresh tag each launch, so none is reset).
    auto launch = [&](const WgradPlan& u, ConvParams q, float* planes, int smem) {
        GemmParams h = q.gemm;
        h.tiles_n = int32_t((L.K + u.bn - 1) / u.bn);
        h.k_splits = u.splits;
        q.gemm = u.splits > 1 ? detail::slice_params(h, planes) : h;
        CUfunction f = be.precompiled(kiln_conv_sm90_image, u.entry, smem);
        void* params[] = {&q, &map_e, &map_i};
        if (u.runs > 0) {
            Tensor partials = ctx.empty({u.runs, 128 * u.bn}, DType::Float32);
            partials.view().storage->written = true;
            const auto flags = be.tagged_scratch(size_t(u.runs) * 8);
            q.part_sums = static_cast<float*>(partials.view().storage->data);
            q.part_flags = reinterpret_cast<uint64_t*>(flags.words);
            q.part_tag = flags.tag;
            be.launch_precompiled(f, unsigned(u.runs), 1, 1, 384, unsigned(smem), params, {.cooperative = true});
            return;
        }
        be.launch_precompiled(f, unsigned(int64_t(h.tiles_m) * h.tiles_n), unsigned(u.splits), 1, 384, unsigned(smem),
                              params, {.programmatic = be.programmatic_launches()});
        if (u.splits > 1) detail::reduce_slices(be, h, planes);
    };
    auto planes_for = [&](int splits) {
        if (splits <= 1) return Tensor();
        Tensor planes = ctx.empty({splits, taps, L.K}, DType::Float32);
        planes.view().storage->written = true;
        return planes;
    };
    if (autotune_enabled() && !conv_kernel_choice()) {
        const std::vector<WgradPlan> candidates = wgrad_candidates(L, sms, be.info().max_shared_optin);
        int most = 1;
        for (const WgradPlan& u : candidates) most = std::max(most, u.splits);
        const std::string key = fmt::format("wgrad {} {} pixels {}/{} out {} {}x{} patches {} beta {} sr {} on {} ({} SMs)", L.str(),
                                            dtype_name(L.dtype), layout.pixel, layout.row, dtype_name(grad_F.dtype()), c.s_row, c.s_col, rank,
                                            o.beta != 0, g.sr_bits, be.info().name, sms);
        std::pair<Tensor, char*> scratch;   // the timed launches' output and planes, made on a miss
        Tensor planes;
        const WgradPlan* chosen = tuned_choice(
            be, "wgrad", L, key, candidates, [](const WgradPlan& u) { return describe(u); },
            [&](const WgradPlan& u) {
                if (!scratch.second) {
                    scratch = scratch_like(ctx, c, L.K, taps, c.s_row, c.s_col, int64_t(dtype_size(grad_F.dtype())));
                    planes = planes_for(most);
                }
                ConvParams q = p;
                q.gemm.c = scratch.second;
                launch(u, q, most > 1 ? static_cast<float*>(planes.view().storage->data) : nullptr, u.smem);
            });
        if (chosen) w = *chosen;
    }
    const Tensor slices = planes_for(w.splits);
    log_debug("conv: update {} -> {} ({} x {} x {}, {} tiles x {} slices)", L.str(), w.entry, taps, L.K, rows,
              int64_t(g.tiles_m) * ((L.K + w.bn - 1) / w.bn), w.splits);
    // A histogram: split, the reduction counts what it stores (its block's counters);
    // otherwise each epilogue warp's counters (8: the two consumers) past the kernel's dynamic
    // shared memory, where they fit beside it; else the call counts grad_F after this.
    int smem = w.smem;
    if (count) {
        const int bytes = 256 / 32 * count->bins * 4;
        const int at = w.splits > 1 ? 0 : detail::counters_at(be, be.precompiled(kiln_conv_sm90_image, w.entry, 0), smem, bytes);
        if (at >= 0) {
            g.hist = static_cast<uint32_t*>(count->counters);
            g.hist_bins = count->bins, g.hist_offset = count->offset;
            g.flags |= kHist;
            if (w.splits == 1) g.hist_smem = at, smem = at + bytes;
            if (counted) *counted = true;
            last_counted = true;
        }
    }
    launch(w, p, w.splits > 1 ? static_cast<float*>(slices.view().storage->data) : nullptr, smem);
    last_layout = layout;
    grad_F.view().storage->written = true;
    return true;
}

} // namespace kiln::gemm
