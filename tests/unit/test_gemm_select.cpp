// The GEMM kernel selector's documented rules (kernels/cuda/gemm_select.hpp), checked on the
// host: the selector is a pure function of the problem, so every rule is testable without a GPU.
#include "tests/support/catch.hpp"

#include "tests/support/cache_dir.hpp"

#include "ir/error.hpp"
#include "kernels/cuda/gemm_launch.hpp"
#include "kernels/cuda/gemm_params.hpp"
#include "kernels/cuda/gemm_select.hpp"

#include <cstdlib>
#include <string>
#include <utility>

using namespace kiln;
using namespace kiln::gemm;

namespace {

// An H100-like problem: sm_90 with the sm_90a image, 132 SMs, row-major operands (A K-major,
// B N-major), both addressable by TMA, unbatched.
GemmProblem h100(int64_t m, int64_t n, int64_t k, int dtype) {
    GemmProblem pr;
    pr.m = m, pr.n = n, pr.k = k;
    pr.dtype = dtype;
    pr.a_kmajor = true, pr.b_kmajor = false;
    pr.a_tma = pr.b_tma = true;
    pr.sm = 90, pr.sms = 132, pr.have_sm90a = true;
    pr.may_split = true;
    return pr;
}

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

} // namespace

TEST_CASE("gemm selector: paths by architecture, dtype and operand layout (rule 1)") {
    unsetenv("KILN_GEMM_KERNEL");
    unsetenv("KILN_GEMM_SPLITS");
    GemmProblem pr = h100(4096, 4096, 4096, kF16);
    CHECK(select_gemm(pr).path == GemmPath::Wgmma);
    CHECK(select_gemm(pr).entry == "kiln_gemm_wg_f16_kt_256_c2_s4");   // B N-major: the transposed wgmma
    pr.b_kmajor = true;
    CHECK(select_gemm(pr).entry == "kiln_gemm_wg_f16_kk_256_c2_s4");
    pr.b_tma = false;   // e.g. a leading dimension that is not a multiple of 16 bytes
    CHECK(select_gemm(pr).path == GemmPath::Mma);
    pr = h100(4096, 4096, 4096, kBF16);
    pr.sm = 80, pr.sms = 108;
    CHECK(select_gemm(pr).entry == "kiln_gemm_mma_bf16_128x128");
    pr.have_sm90a = false, pr.sm = 90;   // sm_90 without the sm_90a image
    CHECK(select_gemm(pr).path == GemmPath::Mma);

    // float32: exact on the FMA units unless tf32 is allowed; wgmma tf32 needs K-major operands.
    pr = h100(4096, 4096, 4096, kF32);
    CHECK(select_gemm(pr).entry == "kiln_gemm_fma_f32_128x128");
    pr.tf32 = true;
    CHECK(select_gemm(pr).entry == "kiln_gemm_mma_tf32_128x128");
    pr.b_kmajor = true;
    CHECK(select_gemm(pr).entry == "kiln_gemm_wg_tf32_kk_256_c2_s4");
    // A M-major, B K-major: the tk kernels (A through registers), 64 wide or narrower only.
    pr = h100(4096, 128, 4096, kF32);
    pr.tf32 = true, pr.a_kmajor = false, pr.b_kmajor = true;
    CHECK(select_gemm(pr).entry == "kiln_gemm_wg_tf32_tk_64_c1_s8");
    for (const GemmKernel& k : gemm_candidates(pr))
        if (k.path == GemmPath::Wgmma) CHECK((k.a_trans && k.bn <= 64 && starts_with(k.entry, "kiln_gemm_wg_tf32_tk_")));
    pr = h100(6144, 16, 2048, kF32);
    pr.tf32 = true, pr.a_kmajor = false, pr.b_kmajor = true;
    CHECK(select_gemm(pr).entry == "kiln_gemm_wg_tf32_tk_16_c1_s8");
    // Every candidate of a path can run the problem: no wgmma kernel for an operand TMA cannot read.
    pr = h100(4096, 4096, 4096, kF16);
    pr.a_tma = false;
    for (const GemmKernel& k : gemm_candidates(pr)) CHECK(k.path != GemmPath::Wgmma);
}

TEST_CASE("gemm selector: float32 operands through cp.async when rows-contiguous and aligned (rules 1 and 5)") {
    unsetenv("KILN_GEMM_KERNEL");
    unsetenv("KILN_GEMM_SPLITS");
    unsetenv("KILN_GEMM_COPY");
    GemmProblem pr = h100(4096, 4096, 4096, kF32);
    pr.a_kmajor = false;   // A^T: M-major A; B N-major
    CHECK(fma_async_ok(pr));
    CHECK(select_gemm(pr).entry == "kiln_gemm_fma_f32_tt_128x128");
    CHECK(select_gemm(pr).bk == 16);
    // K-major operands or unaligned rows: the staged kernel.
    CHECK_FALSE(fma_async_ok(h100(4096, 4096, 4096, kF32)));
    CHECK(select_gemm(h100(4096, 4096, 4096, kF32)).entry == "kiln_gemm_fma_f32_128x128");
    pr.b_kmajor = true;
    CHECK_FALSE(fma_async_ok(pr));
    pr = h100(4097, 4095, 4093, kF32);   // any sizes: copies at the ends read what is inside
    pr.a_kmajor = false;
    CHECK(fma_async_ok(pr));
    pr = h100(4096, 4096, 4096, kF32);
    pr.a_kmajor = false;
    pr.b_tma = false;
    CHECK_FALSE(fma_async_ok(pr));
    CHECK(select_gemm(pr).entry == "kiln_gemm_fma_f32_128x128");
    pr.b_tma = true;
    pr.dtype = kF16;
    CHECK_FALSE(fma_async_ok(pr));
    // Rule 5: a copy into that layout pays on large products, not on small ones.
    const auto flops = [](double m, double n, double k) { return 2 * m * n * k; };
    CHECK(fma_copy_pays(4.0 * 4096 * 4096, flops(4096, 4096, 4096)));
    CHECK(fma_copy_pays(4.0 * 1760 * 1760, flops(1760, 7000, 1760)));
    CHECK_FALSE(fma_copy_pays(4.0 * 1760 * 1760, flops(1760, 128, 1760)));
    CHECK_FALSE(fma_copy_pays(4.0 * 512 * 512 * 2, flops(512, 512, 512)));
    // Operands the register-staged kernel would read element by element: copies pay sooner.
    CHECK_FALSE(fma_copy_pays(4.0 * (35 * 4096 + 4096 * 8457), flops(35, 8457, 4096)));
    CHECK(fma_copy_pays(4.0 * (35 * 4096 + 4096 * 8457), flops(35, 8457, 4096), true));
    CHECK_FALSE(fma_copy_pays(4.0 * (1003 * 130 + 130 * 70), flops(1003, 70, 130), true));
    setenv("KILN_GEMM_COPY", "always", 1);
    CHECK(fma_copy_pays(4.0 * 512 * 512 * 2, flops(512, 512, 512)));
    setenv("KILN_GEMM_COPY", "never", 1);
    CHECK_FALSE(fma_copy_pays(4.0 * 4096 * 4096, flops(4096, 4096, 4096)));
    unsetenv("KILN_GEMM_COPY");
    // Narrow products keep the 256 x 16 tile; small grids split k as before.
    pr = h100(7680, 16, 2560, kF32);
    pr.a_kmajor = false;
    CHECK(select_gemm(pr).entry == "kiln_gemm_fma_f32_256x16");
    // One block per SM (a narrow product split along k): the variant with the shorter loop body.
    pr = h100(1760, 128, 1760, kF32);
    pr.a_kmajor = false;
    const GemmKernel k = select_gemm(pr);
    CHECK(k.entry == "kiln_gemm_fma_f32_tt_128x128_u8");
    CHECK(k.splits > 1);
    pr = h100(4096, 128, 4096, kF32);
    pr.a_kmajor = false;
    CHECK(select_gemm(pr).entry == "kiln_gemm_fma_f32_tt_128x128_u8");
    pr = h100(8192, 8192, 8192, kF32);
    pr.a_kmajor = false;
    CHECK(select_gemm(pr).entry == "kiln_gemm_fma_f32_tt_128x128");
    // KILN_GEMM_KERNEL names the staged kernel for problems the cp.async one runs too.
    setenv("KILN_GEMM_KERNEL", "kiln_gemm_fma_f32_128x128", 1);
    pr = h100(4096, 4096, 4096, kF32);
    pr.a_kmajor = false;
    CHECK(select_gemm(pr).entry == "kiln_gemm_fma_f32_128x128");
    unsetenv("KILN_GEMM_KERNEL");
}

TEST_CASE("gemm selector: tiles by occupancy, narrow tiles for narrow products, persistent for several waves (rule 2)") {
    unsetenv("KILN_GEMM_KERNEL");
    unsetenv("KILN_GEMM_SPLITS");
    CHECK(select_gemm(h100(8192, 8192, 8192, kF16)).entry == "kiln_gemm_wg_f16_kt_256_c2_s4");
    // N <= 128: the narrow wgmma tiles keep every SM streaming A; 16 columns or fewer take the
    // 16-wide tile (no zeros past N loaded), up to 64 the 64-wide one.
    CHECK(select_gemm(h100(7680, 16, 2560, kF16)).entry == "kiln_gemm_wg_f16_kt_16_c1_s8");
    CHECK(select_gemm(h100(6144, 8, 2048, kBF16)).entry == "kiln_gemm_wg_bf16_kt_16_c1_s8");
    CHECK(select_gemm(h100(7680, 64, 2560, kF16)).entry == "kiln_gemm_wg_f16_kt_64_c1_s8");
    CHECK(select_gemm(h100(3072, 128, 1024, kBF16)).entry == "kiln_gemm_wg_bf16_kt_64_c1_s8");
    // The 128 x 64 tile (two consumers) where 64 x 64 tiles need twice the waves, never split in a
    // cluster by the selector (a forced split still runs); 64 x 64 where those fill one wave.
    GemmProblem at = h100(6144, 128, 2048, kF16);
    at.a_kmajor = false;
    CHECK(describe(select_gemm(at)) == "kiln_gemm_wg_f16_tt_64_c2_s8");
    CHECK(describe(select_gemm(h100(8192, 128, 8192, kF16))) == "kiln_gemm_wg_f16_kt_64_c2_s8");
    CHECK(describe(select_gemm(h100(1024, 700, 512, kBF16))) == "kiln_gemm_wg_bf16_kt_64_c2_s8");
    at = h100(4096, 128, 4096, kF16);
    at.a_kmajor = false;
    CHECK(describe(select_gemm(at)) == "kiln_gemm_wg_f16_tt_64_c1_s8");
    // Several waves of 64-wide tiles cost a block's time each: the 128 x 128 tile where it
    // fills one wave, the 64 x 64 one where that fills one wave itself.
    CHECK(describe(select_gemm(h100(6144, 256, 2048, kF16))) == "kiln_gemm_wg_f16_kt_128_c2_s6");
    CHECK(describe(select_gemm(h100(3072, 384, 3072, kF16))) == "kiln_gemm_wg_f16_kt_128_c2_s6");
    CHECK(describe(select_gemm(h100(2048, 256, 2048, kF16))) == "kiln_gemm_wg_f16_kt_64_c1_s8");
    for (const GemmKernel& k : gemm_candidates(h100(2048, 128, 8192, kF16)))
        CHECK_FALSE((k.entry == "kiln_gemm_wg_f16_kt_64_c2_s8" && k.cluster_k));
    setenv("KILN_GEMM_SPLITS", "2c", 1);
    setenv("KILN_GEMM_KERNEL", "kiln_gemm_wg_f16_kt_64_c2_s8", 1);
    CHECK(describe(select_gemm(h100(2048, 128, 8192, kF16))) == "kiln_gemm_wg_f16_kt_64_c2_s8 k/2 cluster");
    unsetenv("KILN_GEMM_KERNEL");
    unsetenv("KILN_GEMM_SPLITS");
    // float32: the 256 x 16 FMA tile for 16 columns, the 128 x 128 one from 128 on.
    CHECK(select_gemm(h100(7680, 16, 2560, kF32)).entry == "kiln_gemm_fma_f32_256x16");
    CHECK(select_gemm(h100(4096, 128, 4096, kF32)).entry == "kiln_gemm_fma_f32_128x128");
    CHECK(select_gemm(h100(8192, 8192, 8192, kF32)).entry == "kiln_gemm_fma_f32_128x128");
    // tf32 allowed but no wgmma (B N-major): narrow products take the exact narrow FMA tile,
    // wider ones mma.sync tf32.
    GemmProblem pr = h100(1760, 16, 1760, kF32);
    pr.tf32 = true;
    CHECK(select_gemm(pr).entry == "kiln_gemm_fma_f32_256x16");
    pr.n = 128;
    CHECK(starts_with(select_gemm(pr).entry, "kiln_gemm_mma_tf32_"));
    // The persistent kernel runs products of several waves into C that TMA can store, with no
    // beta or stochastic rounding; otherwise it is not a candidate.
    pr = h100(8192, 8192, 8192, kF16);
    pr.plain_epilogue = true;
    CHECK(select_gemm(pr).entry == "kiln_gemm_wg_f16_kt_256_c2_s4_p");
    CHECK(select_gemm(pr).persistent);
    pr.b_kmajor = true;
    CHECK(select_gemm(pr).entry == "kiln_gemm_wg_f16_kk_256_c2_s4_p");
    // One wave of 128 x 256 tiles (11 x 12 = 132): the one-tile-per-block kernel.
    pr = h100(1408, 3072, 4096, kBF16);
    pr.plain_epilogue = true;
    CHECK_FALSE(select_gemm(pr).persistent);
    pr.m = 4096;   // 32 x 12 tiles: 2.9 waves
    CHECK(select_gemm(pr).entry == "kiln_gemm_wg_bf16_kt_256_c2_s4_p");
    pr = h100(8192, 8192, 8192, kF16);
    pr.plain_epilogue = false;
    for (const GemmKernel& k : gemm_candidates(pr)) CHECK_FALSE(k.persistent);
    // float32 C: the _pf kernels, for 16-bit operands and tf32; tf32 into 16-bit C has none.
    pr = h100(8192, 8192, 8192, kF16);
    pr.plain_epilogue = pr.c_f32 = true;
    CHECK(select_gemm(pr).entry == "kiln_gemm_wg_f16_kt_256_c2_s4_pf");
    pr = h100(8192, 8192, 8192, kF32);
    pr.tf32 = pr.a_kmajor = pr.b_kmajor = true;
    pr.plain_epilogue = pr.c_f32 = true;
    CHECK(select_gemm(pr).entry == "kiln_gemm_wg_tf32_kk_256_c2_s4_pf");
    pr.c_f32 = false;
    for (const GemmKernel& k : gemm_candidates(pr)) CHECK_FALSE(k.persistent);
    // tf32 with B N-major (rule 1's exception): the persistent kernel that takes B's tile
    // through registers, 256 x 128 tiles, when there are more of them than SMs, C is float32
    // and the epilogue plain; otherwise no wgmma kernel (the launcher copies B to K-major).
    pr = h100(8192, 8192, 8192, kF32);
    pr.tf32 = pr.plain_epilogue = pr.c_f32 = true;
    GemmKernel regs = select_gemm(pr);
    CHECK(regs.entry == "kiln_gemm_wg_tf32_kt_256x128_c2_s4_pf");
    CHECK((regs.b_in_registers && regs.persistent && regs.bm == 256 && regs.bn == 128 && regs.splits == 1));
    CHECK(regs.smem <= 227 * 1024);
    pr.m = 1024, pr.n = 4096;   // 4 x 32 tiles: less than one per SM
    CHECK(select_gemm(pr).path != GemmPath::Wgmma);
    pr.m = 2048;   // 8 x 32
    CHECK(select_gemm(pr).b_in_registers);
    for (int variant = 0; variant < 3; ++variant) {
        GemmProblem no = pr;
        if (variant == 0) no.c_f32 = false;
        if (variant == 1) no.plain_epilogue = false;
        if (variant == 2) no.a_kmajor = false;
        for (const GemmKernel& k : gemm_candidates(no)) CHECK(k.path != GemmPath::Wgmma);
    }
    // Products of one k-tile over many waves (a first convolution layer's patches times its
    // filter, 1x1 convolutions over 64 channels): the one-tile kernels' fixed cost each wave
    // (pipeline fill, epilogue, a block's start) outweighs the 256-wide persistent tile's empty
    // columns, most of all through the general epilogue of a float32 C; a few k-tiles more and
    // the narrow one-tile kernel is back.
    pr = h100(3211264, 64, 27, kF16);
    pr.b_kmajor = pr.plain_epilogue = true;
    CHECK(select_gemm(pr).entry == "kiln_gemm_wg_f16_kk_256_c2_s4_p");
    pr.k = 64, pr.m = 802816;
    CHECK(select_gemm(pr).entry == "kiln_gemm_wg_f16_kk_256_c2_s4_p");
    pr.k = 363, pr.m = 387200;
    CHECK(select_gemm(pr).entry == "kiln_gemm_wg_f16_kk_64_c2_s8");
    pr = h100(802816, 64, 256, kF16);
    pr.plain_epilogue = true;
    CHECK(select_gemm(pr).entry == "kiln_gemm_wg_f16_kt_64_c2_s8");
    pr = h100(3211264, 27, 64, kF16);
    pr.plain_epilogue = pr.c_f32 = true;
    CHECK(select_gemm(pr).entry == "kiln_gemm_wg_f16_kt_256_c2_s4_pf");
    pr.m = 387200, pr.n = 363;
    CHECK(select_gemm(pr).entry == "kiln_gemm_wg_f16_kt_256_c2_s4_pf");
    // Candidates are ordered by path, then by the estimate.
    const auto all = gemm_candidates(h100(2000, 3000, 500, kF16));
    for (size_t i = 1; i < all.size(); ++i)
        if (all[i].path == all[i - 1].path) CHECK(all[i].score <= all[i - 1].score);
}

TEST_CASE("gemm selector: split-K for products that leave most SMs idle (rule 3)") {
    unsetenv("KILN_GEMM_KERNEL");
    unsetenv("KILN_GEMM_SPLITS");
    // 512x8x500000 float32: 2 narrow tiles, k cut into 64 slices (one block per SM at most).
    GemmKernel k = select_gemm(h100(512, 8, 500000, kF32));
    CHECK(k.entry == "kiln_gemm_fma_f32_256x16");
    CHECK(k.splits == 64);
    for (const GemmKernel& c : gemm_candidates(h100(512, 8, 500000, kF16))) {
        const int64_t blocks = ((512 + c.bm - 1) / c.bm) * ((8 + c.bn - 1) / c.bn);
        CHECK(blocks * c.splits <= 132);
        CHECK(c.splits <= 64);
    }
    // Enough tiles, short k, a batch, or splitting not allowed: no slices.
    CHECK(select_gemm(h100(8192, 8192, 8192, kF16)).splits == 1);
    CHECK(select_gemm(h100(512, 8, 40, kF32)).splits == 1);
    GemmProblem pr = h100(512, 8, 500000, kF32);
    pr.batch = 2, pr.may_split = false;
    for (const GemmKernel& c : gemm_candidates(pr)) CHECK(c.splits == 1);
}

TEST_CASE("gemm selector: split-K in a cluster for the wgmma one-tile kernels (rule 3)") {
    unsetenv("KILN_GEMM_KERNEL");
    unsetenv("KILN_GEMM_SPLITS");
    // 1760x16x1760: 28 tiles of 64 x 16 leave 104 SMs idle; 4 blocks per tile fill 112.
    GemmKernel k = select_gemm(h100(1760, 16, 1760, kF16));
    CHECK(k.cluster_k);
    CHECK(k.splits == 4);
    CHECK(k.entry == "kiln_gemm_wg_f16_kt_16_c1_s8");
    CHECK(describe(k) == "kiln_gemm_wg_f16_kt_16_c1_s8 k/4 cluster");
    // 2560x64x2560: 40 tiles of 64 x 64, in clusters of 2. 1760x128x1760 (56 tiles) splits
    // only where the slices' sums cross blocks in registers (16-bit C that TMA can store, no
    // beta or stochastic rounding); with the general split epilogue (beta here) it stays
    // unsplit: that epilogue costs more on the wider tile than the shorter k saves.
    k = select_gemm(h100(2560, 64, 2560, kF16));
    CHECK(describe(k) == "kiln_gemm_wg_f16_kt_64_c1_s8 k/2 cluster");
    CHECK(describe(select_gemm(h100(1760, 128, 1760, kF16))) == "kiln_gemm_wg_f16_kt_64_c1_s8");
    GemmProblem plain = h100(1760, 128, 1760, kF16);
    plain.plain_epilogue = true;
    CHECK(describe(select_gemm(plain)) == "kiln_gemm_wg_f16_kt_64_c1_s8 k/2 cluster");
    plain.bsum = true;   // two tiles a row: the split would add the row sums through global memory
    CHECK(describe(select_gemm(plain)) == "kiln_gemm_wg_f16_kt_64_c1_s8");
    plain.bsum = false;
    plain.c_f32 = true;   // float32 C: the general epilogue
    CHECK(describe(select_gemm(plain)) == "kiln_gemm_wg_f16_kt_64_c1_s8");
    // Where the sums cross in registers, 3 blocks a tile where 4 would not fit one to an SM
    // (2560x64x2560: 120 blocks); not into float32 C. One tile a row (N = 64): bsum does not
    // change the split.
    GemmProblem narrow = h100(2560, 64, 2560, kF16);
    narrow.plain_epilogue = true;
    CHECK(describe(select_gemm(narrow)) == "kiln_gemm_wg_f16_kt_64_c1_s8 k/3 cluster");
    narrow.bsum = true;
    CHECK(describe(select_gemm(narrow)) == "kiln_gemm_wg_f16_kt_64_c1_s8 k/3 cluster");
    narrow.c_f32 = true;
    CHECK(describe(select_gemm(narrow)) == "kiln_gemm_wg_f16_kt_64_c1_s8 k/2 cluster");
    // 128 x 128 tiles pay more for a cluster's epilogue: tf32 4096x128x4096 (K-major operands)
    // stays on unsplit 64 x 64 tiles.
    GemmProblem t = h100(4096, 128, 4096, kF32);
    t.tf32 = t.a_kmajor = t.b_kmajor = true;
    CHECK(describe(select_gemm(t)) == "kiln_gemm_wg_tf32_kk_64_c1_s8");
    // Cluster candidates: 2 or 4 blocks, at most one block per SM, 2 k-tiles per slice; only
    // wgmma one-tile kernels; batches allowed (global slices refuse them).
    for (bool batched : {false, true}) {
        GemmProblem pr = h100(1760, 128, 1760, kF16);
        if (batched) pr.batch = 2, pr.may_split = false;
        bool any = false;
        for (const GemmKernel& c : gemm_candidates(pr)) {
            if (!c.cluster_k) continue;
            any = true;
            const int64_t tiles = ((1760 + c.bm - 1) / c.bm) * ((128 + c.bn - 1) / c.bn) * pr.batch;
            CHECK((c.splits == 2 || c.splits == 4));
            CHECK(tiles * c.splits <= 132);
            CHECK((1760 + 63) / 64 >= 2 * c.splits);
            CHECK(c.path == GemmPath::Wgmma);
            CHECK_FALSE(c.persistent);
        }
        CHECK(any);
    }
    // Short k (2 k-tiles: fewer than 2 per slice even for 2 slices): none.
    for (const GemmKernel& c : gemm_candidates(h100(1760, 16, 100, kF16))) CHECK_FALSE(c.cluster_k);
    // Enough tiles: none.
    for (const GemmKernel& c : gemm_candidates(h100(8192, 8192, 8192, kF16))) CHECK(c.splits == 1);
    // The estimate: a cluster split costs a fixed time, global slices a launch and their bytes;
    // a long-k product with few tiles still takes global slices (16 of them, more blocks than 4
    // per tile can give).
    k = select_gemm(h100(512, 8, 500000, kF16));
    CHECK_FALSE(k.cluster_k);
    CHECK(k.splits == 16);
    // KILN_GEMM_SPLITS=<n>c: only cluster splits of n, on the kernels that have them.
    setenv("KILN_GEMM_SPLITS", "8c", 1);
    for (const GemmKernel& c : gemm_candidates(h100(4096, 4096, 4096, kF16))) {
        if (c.path == GemmPath::Wgmma && !c.persistent) {
            CHECK(c.cluster_k);
            CHECK(c.splits == 8);
        } else {
            CHECK(c.splits == 1);
        }
    }
    setenv("KILN_GEMM_SPLITS", "5c", 1);
    try {
        gemm_candidates(h100(1760, 16, 1760, kF16));
        FAIL("expected an error");
    } catch (const Error& e) {
        CHECK(std::string(e.what()) == "KILN_GEMM_SPLITS=5c: a cluster split has 2, 3, 4 or 8 blocks");
    }
    // 3c splits only where the sums cross in registers (rule 3); elsewhere the kernels run unsplit.
    setenv("KILN_GEMM_SPLITS", "3c", 1);
    GemmProblem pushable = h100(2560, 64, 2560, kF16);
    pushable.plain_epilogue = true;
    for (const GemmKernel& c : gemm_candidates(pushable))
        CHECK(c.splits == (c.path == GemmPath::Wgmma && !c.persistent && c.bn <= 64 ? 3 : 1));
    for (const GemmKernel& c : gemm_candidates(h100(2560, 64, 2560, kF16))) CHECK(c.splits == 1);
    unsetenv("KILN_GEMM_SPLITS");
}

TEST_CASE("gemm selector: KILN_GEMM_KERNEL and KILN_GEMM_SPLITS (rule 4)") {
    setenv("KILN_GEMM_KERNEL", "kiln_gemm_wg_f16_kt_128_c2_s6", 1);
    CHECK(select_gemm(h100(4096, 4096, 4096, kF16)).entry == "kiln_gemm_wg_f16_kt_128_c2_s6");
    setenv("KILN_GEMM_KERNEL", "kiln_gemm_fma_f32_128x128", 1);
    try {
        select_gemm(h100(64, 64, 64, kF16));
        FAIL("expected an error");
    } catch (const Error& e) {
        CHECK(std::string(e.what()).find("KILN_GEMM_KERNEL=kiln_gemm_fma_f32_128x128 cannot run this problem (64x64x64, "
                                         "batch 1); the kernels that can: kiln_gemm_wg_f16_kt_") != std::string::npos);
    }
    unsetenv("KILN_GEMM_KERNEL");
    setenv("KILN_GEMM_SPLITS", "5", 1);
    for (const GemmKernel& c : gemm_candidates(h100(256, 256, 100000, kF16))) CHECK(c.splits == 5);
    setenv("KILN_GEMM_SPLITS", "1", 1);
    CHECK(select_gemm(h100(512, 8, 500000, kF32)).splits == 1);
    unsetenv("KILN_GEMM_SPLITS");
}

TEST_CASE("gemm selector: operand copies (rule 5)") {
    unsetenv("KILN_GEMM_COPY");
    const auto flops = [](double m, double n, double k) { return 2 * m * n * k; };
    // Readable with rows 128 bytes apart: never copied, whatever the size or the override.
    CHECK_FALSE(copy_pays(true, false, 64e6, flops(8192, 8192, 8192)));
    setenv("KILN_GEMM_COPY", "always", 1);
    CHECK_FALSE(copy_pays(true, false, 64e6, flops(8192, 8192, 8192)));
    unsetenv("KILN_GEMM_COPY");
    // Readable, rows along N 14000 bytes apart (every other one 16 bytes off a sector): the
    // product runs a third slower, so fp16 4096x7000x4096's B (57 MB, copy ~41 us) and
    // 1760x7000x1760's B (25 MB, ~19 us against 35% of ~62) are copied; a small product's is
    // not (the copy's launch alone outweighs it).
    CHECK(copy_pays(true, true, 4096.0 * 7000 * 2, flops(4096, 7000, 4096)));
    CHECK(copy_pays(true, true, 1760.0 * 7000 * 2, flops(1760, 7000, 1760)));
    CHECK_FALSE(copy_pays(true, true, 64.0 * 7000 * 2, flops(64, 7000, 64)));
    // Which rows are off sectors: 14000 bytes apart (N = 7000 in 16 bits) yes; 13984 and 14016
    // (6992, 7008) no, though not 128 bytes apart; a base or batch entries 16 bytes off too.
    CHECK(rows_off_sectors(0x10000, 14000, 0));
    CHECK_FALSE(rows_off_sectors(0x10000, 13984, 0));
    CHECK_FALSE(rows_off_sectors(0x10000, 14016, 14016 * 4096));
    CHECK(rows_off_sectors(0x10010, 14016, 0));
    CHECK(rows_off_sectors(0x10000, 14016, 14016 * 4096 + 16));
    // Unreadable: fp16 1024x700x512 (B's rows 1400 bytes) is copied; a tiny product is not
    // (the copy's launch outweighs the portable kernels' time).
    CHECK(copy_pays(false, false, 512.0 * 700 * 2, flops(1024, 700, 512)));
    CHECK_FALSE(copy_pays(false, false, 16.0 * 16 * 2, flops(16, 16, 16)));
    // tf32 1760x16x1760's N-major B (113 KB) is copied K-major: ~3.2 us with the product
    // against ~6.6 on the portable kernels; 6144x16x2048 A^T's M-major A (50 MB, ~37 us) is not.
    CHECK(copy_pays(false, false, 1760.0 * 16 * 4, flops(1760, 16, 1760)));
    CHECK_FALSE(copy_pays(false, false, 6144.0 * 2048 * 4 + 2048.0 * 16 * 4, flops(6144, 16, 2048)));
    // KILN_GEMM_COPY overrides the estimate where a copy is possible.
    setenv("KILN_GEMM_COPY", "never", 1);
    CHECK_FALSE(copy_pays(false, false, 512.0 * 700 * 2, flops(1024, 700, 512)));
    CHECK_FALSE(copy_pays(true, true, 4096.0 * 7000 * 2, flops(4096, 7000, 4096)));
    setenv("KILN_GEMM_COPY", "always", 1);
    CHECK(copy_pays(false, false, 16.0 * 16 * 2, flops(16, 16, 16)));
    CHECK(copy_pays(true, true, 1760.0 * 7000 * 2, flops(1760, 7000, 1760)));
    unsetenv("KILN_GEMM_COPY");
}

TEST_CASE("gemm selector: one wave's raster group, fewest bytes per 8 consecutive blocks (rule 6)") {
    // 128 x 64 tiles, 32 x 4 (4096x256x4096): groups of 8 put 8 rows of A and one column of B
    // under 8 consecutive blocks (8 x 128 + 64 per k), groups of 2 put 2 rows and all 4 columns
    // (2 x 128 + 4 x 64); groups of 1 read as much as 2 (a window of 8 blocks is 2 rows of 4),
    // and ties go to the larger group.
    CHECK(one_wave_raster_group(128, 64, 32, 4) == 2);
    CHECK(one_wave_raster_group(128, 64, 16, 8) == 2);
    // Square tiles: 4 rows x 2 columns beat 8 x 1 and 2 x 4 equal them.
    CHECK(one_wave_raster_group(128, 128, 8, 8) == 4);
    CHECK(one_wave_raster_group(64, 64, 64, 2) == 4);
    // 128 x 256 tiles: 4 x 2 (4 x 128 + 2 x 256) against 8 x 1 (8 x 128 + 256).
    CHECK(one_wave_raster_group(128, 256, 31, 4) == 4);
    // Rows one tile wide: every group walks the same order, so the default stays.
    CHECK(one_wave_raster_group(128, 64, 60, 1) == 8);
    CHECK(one_wave_raster_group(64, 16, 100, 1) == 8);
    // Partial groups at the grid's bottom count too: 5 x 3 tiles of 64 x 64 read the fewest bytes
    // in groups of 1 (each window of 8 blocks then spans 3 rows of all 3 columns).
    CHECK(one_wave_raster_group(64, 64, 5, 3) == 1);
    // Fewer rows than a group: 3 x 16 tiles of 128 x 64 (groups of 2: 2 rows x 4 columns).
    CHECK(one_wave_raster_group(128, 64, 3, 16) == 2);
}

TEST_CASE("gemm selector: the persistent grid, a multiple of 8 blocks where the rounds stay (rule 6)") {
    // 4096^3 in 128 x 256 tiles: 512 tiles take 4 rounds on 132 blocks and on 128.
    CHECK(persistent_grid(512, 132) == 128);
    // 8192^3: 2048 tiles, 16 rounds either way.
    CHECK(persistent_grid(2048, 132) == 128);
    // 4096x7000x4096: 32 x 28 tiles, 7 rounds either way.
    CHECK(persistent_grid(896, 132) == 128);
    // 8448x48000x2816: 66 x 188 tiles, 94 rounds on 132 blocks but 97 on 128: all SMs.
    CHECK(persistent_grid(12408, 132) == 132);
    // One round: every tile its block, 8 blocks fewer would take a second round.
    CHECK(persistent_grid(132, 132) == 132);
    CHECK(persistent_grid(100, 132) == 100);
    CHECK(persistent_grid(96, 132) == 96);
    // Fewer than 8 tiles or SMs.
    CHECK(persistent_grid(5, 132) == 5);
    CHECK(persistent_grid(40, 6) == 6);
    // A GPU of 114 SMs (the H100 PCIe): 1000 tiles take 9 rounds on 114 and on 112 blocks.
    CHECK(persistent_grid(1000, 114) == 112);
    CHECK(persistent_grid(1026, 114) == 114);   // 9 rounds on 114, 10 on 112
}

// Where the epilogue adds C's column sums (a convolution's bsum through the GEMM; gemm_launch.hpp,
// col_sums_in_epilogue): the wgmma kernels through the 16-bit register epilogue, unsplit and
// unbatched; the persistent ones only through their kLeanCols twin (C of the operands' dtype,
// both operands K-major, no bsum, at most 32 columns of tiles, lean twins allowed); never with
// KILN_GEMM_COLSUMS=0.
TEST_CASE("gemm launcher: which kernels add C's column sums in their epilogue") {
    using detail::col_sums_in_epilogue;
    GemmKernel persistent;
    persistent.path = GemmPath::Wgmma, persistent.persistent = true, persistent.bm = 128, persistent.bn = 256;
    GemmKernel one_tile = persistent;
    one_tile.persistent = false;
    GemmParams p{};
    p.c = reinterpret_cast<void*>(uintptr_t(1) << 20);
    p.c_dtype = kF16, p.c_sn = 1, p.c_sm = 296, p.batch = 1, p.tiles_n = 2;
    const DType f16 = DType::Float16;
    CHECK(col_sums_in_epilogue(persistent, p, f16));
    CHECK(col_sums_in_epilogue(one_tile, p, f16));
    auto both = [&](const GemmParams& q, const GemmKernel& kp = GemmKernel{}, const GemmKernel& ko = GemmKernel{}) {
        const GemmKernel& a = kp.path == GemmPath::Wgmma ? kp : persistent;
        const GemmKernel& b = ko.path == GemmPath::Wgmma ? ko : one_tile;
        return std::pair<bool, bool>(col_sums_in_epilogue(a, q, f16), col_sums_in_epilogue(b, q, f16));
    };
    using Pair = std::pair<bool, bool>;
    GemmParams q = p;
    q.tiles_n = 32;
    CHECK(both(q) == Pair(true, true));
    q.tiles_n = 33;   // the persistent twin's mask of visited columns holds 32
    CHECK(both(q) == Pair(false, true));
    q = p, q.flags = kBsum;   // the twin holds no bsum
    CHECK(both(q) == Pair(false, true));
    q = p, q.c_dtype = kBF16;   // C of another dtype than the operands'
    CHECK(both(q) == Pair(false, true));
    {
        GemmKernel mp = persistent, mo = one_tile;
        mp.a_trans = mo.a_trans = true;   // A M-major: only the kk twin was built
        CHECK(both(p, mp, mo) == Pair(false, true));
    }
    // Not through the 16-bit register epilogue: rows not 16 bytes apart, float32 C, beta,
    // stochastic rounding; nor batched, split, B in registers, or off the wgmma path.
    q = p, q.c_sm = 300;
    CHECK(both(q) == Pair(false, false));
    q = p, q.c_dtype = kF32;
    CHECK(both(q) == Pair(false, false));
    q = p, q.flags = kBeta;
    CHECK(both(q) == Pair(false, false));
    q = p, q.sr_bits = 7;
    CHECK(both(q) == Pair(false, false));
    q = p, q.batch = 2;
    CHECK(both(q) == Pair(false, false));
    {
        GemmKernel sp = persistent, so = one_tile;
        sp.splits = so.splits = 2;
        CHECK(both(p, sp, so) == Pair(false, false));
        GemmKernel rp = persistent, ro = one_tile;
        rp.b_in_registers = ro.b_in_registers = true;
        CHECK(both(p, rp, ro) == Pair(false, false));
        GemmKernel mma = one_tile;
        mma.path = GemmPath::Mma;
        CHECK_FALSE(col_sums_in_epilogue(mma, p, f16));
    }
    {
        const test::ScopedEnv lean("KILN_GEMM_LEAN", "0");   // no twins: the persistent kernels read C again
        CHECK(both(p) == Pair(false, true));
    }
    const test::ScopedEnv off("KILN_GEMM_COLSUMS", "0");
    CHECK(both(p) == Pair(false, false));
}
