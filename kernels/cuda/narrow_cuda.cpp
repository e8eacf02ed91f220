// The host side of conv_narrow.cu (narrow_params.hpp): whether it takes a layer, the parameter
// block and the launch.
#include "kernels/cuda/conv_cuda.hpp"

#include "compiler/log.hpp"
#include "ir/storage.hpp"
#include "kernels/cuda/gemm_launch.hpp"
#include "kernels/cuda/narrow_params.hpp"
#include "runtime/context_impl.hpp"
#include "runtime/cuda/device_backend.hpp"
#include <kiln/context.hpp>

extern "C" const unsigned char kiln_conv_narrow_image[];

namespace kiln::gemm {

namespace {
using detail::fits_32_bits;
}

bool narrow_takes(Context& ctx, const ConvLayer& L) {
    if (ctx.backend() != Backend::CUDA || cuda::cuda_backend(ctx).info().sm < 80 || conv_im2col_forced()) return false;
    if (L.dtype != DType::Float16 && L.dtype != DType::BFloat16) return false;
    if (L.K > 8 || L.C % 8 != 0 || L.deconv) return false;
    // 2D or 1D, stride 1 (the depth axis of ones, unpadded)
    if (L.image[0] != 1 || L.filter[0] != 1 || L.pad[0] != 0 || L.stride != Dims3{1, 1, 1}) return false;
    const int64_t positions = L.N * L.image[1] * L.image[2];
    for (int a = 1; a < 3; ++a)
        if (!fits_32_bits(L.image[a] + 2 * std::abs(L.pad[a]) + L.filter[a] * L.dilation[a]) ||
            !fits_32_bits(L.output[a] + kNarrowTileW))
            return false;
    if (!fits_32_bits(positions) || !fits_32_bits(L.N * L.output[1] * L.output[2]) || !fits_32_bits(L.C + 64) ||
        !fits_32_bits(L.filter[1] * L.filter[2] * L.C))
        return false;
    // (A window or filter past these never fits in shared memory; within them narrow_smem's int
    // holds the size.)
    if ((L.filter[1] - 1) * L.dilation[1] > 1024 || (L.filter[2] - 1) * L.dilation[2] > 1024 || L.filter[1] * L.filter[2] > 1024)
        return false;
    const int smem = narrow_smem(int(L.filter[1]), int(L.filter[2]), int(L.dilation[1]), int(L.dilation[2]));
    const int64_t blocks = L.N * ((L.output[1] + kNarrowTileH - 1) / kNarrowTileH) * ((L.output[2] + kNarrowTileW - 1) / kNarrowTileW);
    return smem <= cuda::cuda_backend(ctx).info().max_shared_optin && fits_32_bits(blocks);
}

bool conv_narrow(const ConvLayer& L, const Tensor& I5, const Tensor& F, Tensor& C, const DotOptions& o) {
    Context& ctx = C.context();
    if (!narrow_takes(ctx, L) || I5.dtype() != L.dtype || F.dtype() != L.dtype || o.bsum) return false;
    const int64_t rows = L.N * L.output[1] * L.output[2];
    // C: the (rows, K) output, rows ld apart, rounded to nearest (the context's stochastic
    // rounding is the GEMM's epilogue's).
    if (C.rank() != 2 || C.shape()[0] != rows || C.shape()[1] != L.K || (L.K > 1 && C.strides()[1] != 1) ||
        C.strides()[0] < L.K || !fits_32_bits(C.strides()[0]))
        return false;
    const DType out = C.dtype();
    if (out != DType::Float32 && out != DType::Float16 && out != DType::BFloat16) return false;
    if (out != DType::Float32 && context_impl(ctx).stochastic_round_bits > 0) return false;
    if (C.view().storage == I5.view().storage || C.view().storage == F.view().storage) return false;
    const Tensor I = detail::contiguous(I5, ctx), Fc = detail::contiguous(F, ctx);
    if (reinterpret_cast<uintptr_t>(detail::data_of(I)) % 16 != 0) return false;   // (cp.async's 16-byte loads)
    Tensor bias;
    NarrowParams p{};
    if (o.bias) {
        bias = detail::float32_bias(*o.bias, L.K, ctx);
        p.bias = reinterpret_cast<const float*>(detail::data_of(bias));
    }
    p.image = detail::data_of(I), p.filter = detail::data_of(Fc), p.out = detail::data_of(C);
    p.alpha = float(o.alpha), p.beta = float(o.beta), p.slope = float(o.slope);
    p.relu = o.relu, p.bf16 = L.dtype == DType::BFloat16;
    p.out_dtype = out == DType::Float32 ? 0 : out == DType::Float16 ? 1 : 2;
    p.ld = C.strides()[0];
    p.N = int32_t(L.N), p.H = int32_t(L.image[1]), p.W = int32_t(L.image[2]), p.C = int32_t(L.C), p.K = int32_t(L.K);
    p.R = int32_t(L.filter[1]), p.S = int32_t(L.filter[2]), p.P = int32_t(L.output[1]), p.Q = int32_t(L.output[2]);
    p.pad_h = int32_t(L.pad[1]), p.pad_w = int32_t(L.pad[2]), p.dil_h = int32_t(L.dilation[1]), p.dil_w = int32_t(L.dilation[2]);
    p.tiles_h = int32_t((L.output[1] + kNarrowTileH - 1) / kNarrowTileH);
    p.tiles_w = int32_t((L.output[2] + kNarrowTileW - 1) / kNarrowTileW);
    const int smem = narrow_smem(p.R, p.S, p.dil_h, p.dil_w);
    const int64_t blocks = L.N * p.tiles_h * p.tiles_w;
    cuda::CudaBackend& be = cuda::cuda_backend(ctx);
    const char* entry = p.bf16 ? "kiln_conv_narrow_bf16" : "kiln_conv_narrow_f16";
    CUfunction f = be.precompiled(kiln_conv_narrow_image, entry, smem);
    log_debug("conv: narrow {} -> {} ({} blocks, {} bytes of shared memory)", L.str(), entry, blocks, smem);
    void* params[] = {&p};
    be.launch_precompiled(f, unsigned(blocks), 1, 1, 256, unsigned(smem), params, {});
    C.view().storage->written = true;
    return true;
}

} // namespace kiln::gemm
