// The selector's rules; see gemm_select.hpp.
#include "kernels/cuda/gemm_select.hpp"

#include "compiler/env.hpp"
#include "ir/error.hpp"
#include "kernels/cuda/gemm_params.hpp"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <utility>
#include <fmt/format.h>

namespace kiln::gemm {

namespace {

// The persistent kernel's per-SM rate relative to the one-tile-per-block kernel it replaces
// (rule 2's header).
constexpr double kPersistentRate = 1.02;

const char* dtype_tag(int dtype, bool tf32) { return dtype == kF16 ? "f16" : dtype == kBF16 ? "bf16" : tf32 ? "tf32" : "f32"; }

// Rule 3's fixed cost of a split in a cluster, microseconds, for a bm x bn tile: two cluster
// barriers, the other blocks' sums read from distributed shared memory and the general
// epilogue on the block's rows, which grow with the tile; fitted to the kernel times of split
// and unsplit products. 16-bit products into 16-bit C without beta or stochastic rounding, on
// tiles up to kSplitPushMaxBn wide, send the slices' sums from registers instead
// (sm90/epilogue.cuh, split_k_push_epilogue), without the float32 staging, the remote reads
// and the second barrier, so the fixed cost there is a third of the general one's.
bool split_push_applies(const GemmProblem& pr, int bn) {
    return pr.dtype != kF32 && !pr.c_f32 && pr.plain_epilogue && bn <= kSplitPushMaxBn;
}
double cluster_split_us(const GemmProblem& pr, int bm, int bn) {
    const double size = double(bm) * bn / (64.0 * 64.0);
    return split_push_applies(pr, bn) ? 0.5 + 0.5 * size : 1.0 + 1.5 * size;
}

// estimate_us's extra cost of bsum over a row of tiles in a cluster split (see there).
constexpr double kSplitRowSumsUs = 2.0;

// KILN_GEMM_SPLITS: -1 when unset; the count, and whether it asks for a cluster ("4c").
struct ForcedSplits {
    int n = -1;
    bool cluster = false;
};
ForcedSplits forced_splits() {
    ForcedSplits f;
    const std::optional<std::string> v = env::text("KILN_GEMM_SPLITS");
    if (!v) return f;
    f.cluster = v->back() == 'c';
    const std::string_view count = f.cluster ? std::string_view(*v).substr(0, v->size() - 1) : std::string_view(*v);
    const env::Parsed<long long> n = env::parse_integer("KILN_GEMM_SPLITS", count, 1, 64);
    if (!n.value)
        fail(Error::Kind::Value, "KILN_GEMM_SPLITS={}: not a split; valid: a count of k slices from 1 to 64, or 2c, 3c, 4c, "
                                 "8c (a split in clusters of that many blocks)",
             *v);
    f.n = (int)*n.value;
    if (f.cluster && f.n != 2 && f.n != 3 && f.n != 4 && f.n != 8)
        fail(Error::Kind::Value, "KILN_GEMM_SPLITS={}: a cluster split has 2, 3, 4 or 8 blocks", *v);
    return f;
}

// KILN_GEMM_COPY: true for always, false for never; nullopt when unset (or not understood, warned).
std::optional<bool> forced_copy() {
    const std::optional<int> c = env::choice("KILN_GEMM_COPY", {"always", "never"});
    return c ? std::optional<bool>(*c == 0) : std::nullopt;
}

int64_t tiles_of(const GemmProblem& pr, int bm, int bn) {
    return ((pr.m + bm - 1) / bm) * ((pr.n + bn - 1) / bn) * pr.batch;
}

// Rule 3, global slices: the k slices for a tile (1 when the blocks fill half of the SMs, or
// k is short).
int slices_for(const GemmProblem& pr, int bm, int bn, int bk) {
    const int64_t blocks = tiles_of(pr, bm, bn);
    const int64_t ktiles = (pr.k + bk - 1) / bk;
    if (!pr.may_split || blocks * 2 > pr.sms || ktiles < 8) return 1;
    // Whole waves only: slices beyond one block per SM would start a second, mostly idle wave.
    // (At most 64 slices; with at most one block per SM, the slices' sums stay below
    // 4 bytes x SMs x a tile's elements.)
    return int(std::max<int64_t>(1, std::min<int64_t>({pr.sms / blocks, ktiles / 4, 64})));
}

// Rule 3, clusters: the most of 2, 3 and 4 blocks per tile that keeps one block per SM and 2
// k-tiles per slice (1: none); 3 only where the slices' sums cross in registers (its blocks own
// 3, 3 and 2 of a tile's 8-row groups; the general split epilogue divides the rows evenly).
// (Not 8: clusters of 8 were slower than 4 wherever both fit.)
int cluster_splits_for(const GemmProblem& pr, int bm, int bn, int bk) {
    const int64_t blocks = tiles_of(pr, bm, bn);
    const int64_t ktiles = (pr.k + bk - 1) / bk;
    if (blocks * 2 > pr.sms) return 1;
    int best = 1;
    for (int cs : {2, 3, 4})
        if (blocks * cs <= pr.sms && ktiles >= 2 * cs && (cs != 3 || split_push_applies(pr, bn))) best = cs;
    return best;
}

// Rule 2's fixed costs of the wgmma kernels on short k-loops, microseconds, fitted to the H200's
// kernel times of products of 1-6 k-tiles (first convolution layers' and 1x1 convolutions'
// GEMMs): a one-tile block's pipeline fill, epilogue and start, each wave, with the 16-bit
// register epilogue, and with the general one (float32 staged through shared memory: float32
// C, beta, stochastic rounding); the persistent kernel's per tile, which its producer's running
// ahead leaves to the epilogue's stores, 16-bit and float32. Charged up to kShortLoopKTiles
// k-tiles: the tile rates were fitted on long k-loops, which fold these costs in.
constexpr double kWaveFixedUs = 2.7, kWaveFixedGeneralUs = 8.5;
constexpr double kPersistentTileUs = 1.8, kPersistentTileF32Us = 4.3;
constexpr int64_t kShortLoopKTiles = 8;
constexpr int kSmemPerSm = 228 * 1024;   // sm_90's shared memory per SM

// Rule 2's estimate, microseconds: the flops (k in whole k-tiles on wgmma) at the tile's rate,
// scaled by the fraction of the launched tile area inside C and by how evenly the blocks fill
// the SMs' waves (one block per SM at a time for these tile sizes), plus the wgmma kernels'
// fixed costs on short k-loops, plus a split's. Global slices: a second launch (~3 us) and the
// slices' float32 sums written and read at 3 TB/s.
double estimate_us(const GemmProblem& pr, const GemmKernel& k, double rate) {
    const int64_t tm = (pr.m + k.bm - 1) / k.bm, tn = (pr.n + k.bn - 1) / k.bn;
    const int64_t blocks = tm * tn * pr.batch * k.splits;
    const int64_t waves = (blocks + pr.sms - 1) / pr.sms;
    const double fill = double(blocks) / double(waves * pr.sms);
    const double inside = double(pr.m * pr.n) / double(tm * k.bm * tn * k.bn);
    const double peak = pr.dtype == kF32 ? 350e12 : 700e12;
    // (The wgmma kernels' k-tiles; the FMA kernels' steps are too short to count.)
    const bool wgmma = k.path == GemmPath::Wgmma;
    const int64_t ktiles = (pr.k + k.bk - 1) / k.bk, k_padded = wgmma ? ktiles * k.bk : pr.k;
    const double flops = 2.0 * double(pr.m) * double(pr.n) * double(k_padded) * double(pr.batch);
    if (blocks < 2 * pr.sms) rate *= k.lone_block_rate;
    if (blocks > pr.sms) rate *= k.waves_rate;
    double us = 1e6 * flops / (rate * fill * inside * peak);
    if (wgmma && ktiles <= kShortLoopKTiles) {
        // (The blocks an SM holds at once, as its shared memory allows: two of the 64 x 16 tile.)
        const int64_t per_sm = std::max<int64_t>(1, kSmemPerSm / std::max(k.smem, 1));
        const double rounds = double((blocks + pr.sms * per_sm - 1) / (pr.sms * per_sm));
        const bool general = pr.c_f32 || !pr.plain_epilogue;
        us += k.persistent ? rounds * (pr.c_f32 ? kPersistentTileF32Us : kPersistentTileUs)
                           : rounds * (general ? kWaveFixedGeneralUs : kWaveFixedUs);
    }
    if (k.splits > 1 && k.cluster_k) us += cluster_split_us(pr, k.bm, k.bn);
    // bsum over a row of several tiles: unsplit one-tile kernels add the row in one cluster
    // (through distributed shared memory), a cluster split through global partials and a
    // count, which costs the split more: kSplitRowSumsUs.
    if (pr.bsum && tn > 1 && k.splits > 1 && k.cluster_k) us += kSplitRowSumsUs;
    if (k.splits > 1 && !k.cluster_k) us += 3.0 + 1e6 * 2.0 * 4.0 * double(k.splits) * double(pr.m * pr.n) / 3e12;
    return us;
}

} // namespace

bool fma_async_ok(const GemmProblem& pr) {
    return pr.dtype == kF32 && !pr.a_kmajor && pr.a_tma && !pr.b_kmajor && pr.b_tma;
}

bool fma_copy_pays(double bytes, double flops, bool element_loads) {
    if (const std::optional<bool> force = forced_copy()) return *force;
    const double copy = 2 * bytes / 3e12 + 3e-6;
    return element_loads ? copy < flops / 10e12 : copy < 0.05 * flops / 45e12;
}

bool lean_kernels_allowed() {
    return env::flag("KILN_GEMM_LEAN").value_or(true);
}

std::string describe(const GemmKernel& k) {
    if (k.splits == 1) return k.entry;
    return fmt::format("{} k/{}{}", k.entry, k.splits, k.cluster_k ? " cluster" : "");
}

std::vector<GemmKernel> gemm_candidates(const GemmProblem& pr) {
    std::vector<GemmKernel> out;
    // Each tile runs unsplit, and split when rule 3 allows it; the estimate picks between them.
    // (KILN_GEMM_SPLITS: only its split.)
    const ForcedSplits forced = forced_splits();
    const auto push = [&](GemmKernel k, double rate, int splits, bool cluster) {
        k.splits = splits;
        k.cluster_k = cluster && splits > 1;
        k.score = 1.0 / estimate_us(pr, k, rate);
        out.push_back(k);
    };
    // `clusters`: the kernel can split k in a cluster (the wgmma one-tile kernels); `auto_clusters`:
    // the selector may choose such a split (KILN_GEMM_SPLITS may force one either way).
    const auto add = [&](const GemmKernel& k, double rate, bool clusters, bool auto_clusters = true) {
        if (forced.n >= 0) {
            if (forced.cluster && clusters && forced.n > 1 && (forced.n != 3 || split_push_applies(pr, k.bn)))
                push(k, rate, forced.n, true);
            else if (!forced.cluster && pr.may_split && forced.n > 1) push(k, rate, forced.n, false);
            else push(k, rate, 1, false);
            return;
        }
        push(k, rate, 1, false);
        if (const int s = slices_for(pr, k.bm, k.bn, k.bk); s > 1) push(k, rate, s, false);
        if (const int s = clusters && auto_clusters ? cluster_splits_for(pr, k.bm, k.bn, k.bk) : 1; s > 1)
            push(k, rate, s, true);
    };
    const bool tensor = pr.dtype != kF32 || pr.tf32;
    const std::string tag = dtype_tag(pr.dtype, pr.tf32);
    const bool wgmma_sm = tensor && pr.sm == 90 && pr.have_sm90a && pr.a_tma && pr.b_tma;
    // tf32 reads K-major operands from shared memory; A M-major goes through registers on the
    // narrow one-tile kernels (the tk kernels: 64 x 64, 128 x 64 and 64 x 16).
    const bool tf32_a_regs = wgmma_sm && pr.dtype == kF32 && !pr.a_kmajor && pr.b_kmajor;
    const bool wgmma = wgmma_sm && (pr.dtype != kF32 || (pr.a_kmajor && pr.b_kmajor) || tf32_a_regs);
    if (wgmma_sm && pr.dtype == kF32 && pr.a_kmajor && !pr.b_kmajor && pr.c_f32 && pr.plain_epilogue &&
        tiles_of(pr, 256, 128) > pr.sms) {
        GemmKernel k;
        k.path = GemmPath::Wgmma;
        k.bm = 256;
        k.bn = 128;
        k.b_trans = true;
        k.b_in_registers = true;
        k.entry = "kiln_gemm_wg_tf32_kt_256x128_c2_s4_pf";
        k.threads = 384;
        k.bk = 32;
        k.persistent = true;
        // 4 stages of 48 KB, four 8 KB staging buffers, 1 KB of row sums, the barriers and the
        // adder's row sums (1 KB).
        k.smem = 4 * (256 + 128) * 128 + 4 * 8192 + 256 * 4 + 256 + 256 * 4;
        push(k, kPersistentRate, 1, false);
    }
    if (wgmma) {
        // (BN, consumer warpgroups, stages, relative per-SM rate)
        struct Wg { int bn, cons, stages; double rate; };
        // The 16-wide tile: products at most 16 columns wide (per k-tile it loads 10 KB, the
        // 64-wide tile 16 KB, of which 6 KB are zeros past N = 16; the loads set their pace).
        // The 128 x 64 tile (two consumers): where 64 x 64 tiles would need twice the waves. A
        // narrow block's pace is set by the bytes its SM receives, so one wave of 128 x 64 tiles
        // (768 KB a block on 6144x128x2048 A^T) beats two of 64 x 64 (512 KB each); its rate
        // sits between theirs. Split in a cluster it lost to the 64 x 64 tile everywhere (its
        // split epilogue costs more than the split saves), so the selector does not split it so.
        for (Wg w : {Wg{256, 2, 4, 1.0}, Wg{128, 2, 6, 0.9}, Wg{64, 1, 8, 0.7}, Wg{16, 1, 8, 0.3}, Wg{64, 2, 8, 0.8}}) {
            if (tf32_a_regs && w.bn > 64) continue;
            GemmKernel k;
            k.path = GemmPath::Wgmma;
            k.bm = 64 * w.cons;
            k.bn = w.bn;
            k.a_trans = !pr.a_kmajor;
            k.b_trans = !pr.b_kmajor;
            k.entry = fmt::format("kiln_gemm_wg_{}_{}{}_{}_c{}_s{}", tag, k.a_trans ? 't' : 'k', k.b_trans ? 't' : 'k', w.bn,
                                  w.cons, w.stages);
            k.threads = 128 * (w.cons + 1);
            // The stages and 1 KB of alignment slack, then the tile's bias (float32 per column).
            const int stages_bytes = w.stages * (k.bm + w.bn) * 128 + 1024;
            k.smem = stages_bytes + w.bn * 4;
            k.bk = pr.dtype == kF32 ? 32 : 64;
            // Several waves of 64-wide tiles: a narrow block's pace is the bytes its SM receives,
            // so each further wave costs a whole block's time, which the fill alone does not
            // count; with the factor such products go to the 128 x 128 tile where it fills one
            // wave. (35x8457x4096 A^T, 133 blocks of 64 x 64, keeps them: the factor stays above
            // the 256-wide tile's split there, which ran no faster.)
            if (w.bn == 64) k.waves_rate = 0.85;
            add(k, w.rate, true, !(w.bn == 64 && w.cons == 2));
            const int64_t tiles = tiles_of(pr, k.bm, k.bn);
            if (w.bn == 256 && (pr.dtype != kF32 || pr.c_f32) && pr.plain_epilogue && tiles > pr.sms) {
                GemmKernel pk = k;
                pk.entry = fmt::format("kiln_gemm_wg_{}_{}{}_256_c2_s4_{}", tag, k.a_trans ? 't' : 'k', k.b_trans ? 't' : 'k',
                                       pr.c_f32 ? "pf" : "p");
                pk.persistent = true;
                pk.smem = persistent_smem(k.bm, w.bn);
                push(pk, kPersistentRate * w.rate, 1, false);
            }
        }
    }
    if (tensor && pr.sm >= 80) {
        const int esize = pr.dtype == kF32 ? 4 : 2, pad = pr.dtype == kF32 ? 4 : 8;
        struct Mm { int bm, bn, threads; double rate; };
        for (Mm t : {Mm{128, 128, 256, 0.45}, Mm{64, 64, 128, 0.3}}) {
            GemmKernel k;
            k.path = GemmPath::Mma;
            k.bm = t.bm;
            k.bn = t.bn;
            k.entry = fmt::format("kiln_gemm_mma_{}_{}x{}", tag, t.bm, t.bn);
            k.threads = t.threads;
            // The pipeline's two stages, or the epilogue's float tile (rows of bn + 4).
            k.smem = std::max(2 * (t.bm + t.bn) * (32 + pad) * esize, t.bm * (t.bn + 4) * 4);
            k.bk = 32;
            add(k, t.rate, false);
        }
    }
    if (pr.dtype == kF32) {
        GemmKernel k;
        k.path = GemmPath::Fma;
        k.bm = k.bn = 128;
        k.entry = "kiln_gemm_fma_f32_128x128";
        k.threads = 128;   // 16 x 8 results per thread
        k.smem = std::max(2 * 8 * (128 + 4 + 128 + 4) * 4, 128 * (128 + 4) * 4);
        k.bk = 8;
        add(k, 0.1, false);
        // The cp.async tile (fma_async_ok): same tile and splits, its rate above the staged
        // kernel's (its operands pass through no registers, and one barrier serves 16 k).
        if (fma_async_ok(pr)) {
            GemmKernel ak = k;
            ak.entry = "kiln_gemm_fma_f32_tt_128x128";
            ak.bk = 16;
            // 4 stages of [16][132] floats for each operand; the epilogue's tile is as large.
            ak.smem = std::max(4 * 2 * 16 * (128 + 4) * 4, 128 * (128 + 4) * 4);
            // Its loop is one 37 KB body: with one block per SM a lone warp per scheduler
            // waits on instruction fetch, so below two blocks per SM its rate takes a factor
            // of 0.65 against _u8's, whose bodies are 8 k-steps; at two blocks per SM the one
            // body is the faster.
            ak.lone_block_rate = 0.65;
            add(ak, 0.11, false);
            ak.entry = "kiln_gemm_fma_f32_tt_128x128_u8";
            ak.lone_block_rate = 1;
            add(ak, 0.108, false);
        }
        // Narrow products: 256 x 16 tiles, 4 x 4 results per thread (a quarter of the 128 x 128
        // tile's rate where both fill their tiles: fewer results per thread reuse each
        // operand read less).
        GemmKernel nk = k;
        nk.bm = 256;
        nk.bn = 16;
        nk.entry = "kiln_gemm_fma_f32_256x16";
        nk.threads = 256;
        nk.smem = std::max(2 * 8 * (256 + 4 + 16 + 4) * 4, 256 * (16 + 4) * 4);
        add(nk, 0.025, false);
    }
    // Paths first (a faster path beats any tile of a slower one), then the estimate. tf32
    // allows the tensor cores without requiring them: on products 16 columns wide or narrower
    // the exact narrow FMA tile beats mma.sync tf32, whose tiles are mostly empty there, so
    // there it ranks before the mma.sync path.
    const auto rank = [&](const GemmKernel& k) {
        if (k.path == GemmPath::Fma && k.bn == 16 && pr.tf32 && pr.n <= 16) return 1;
        return k.path == GemmPath::Wgmma ? 0 : k.path == GemmPath::Mma ? 2 : 3;
    };
    std::stable_sort(out.begin(), out.end(), [&](const GemmKernel& a, const GemmKernel& b) {
        if (rank(a) != rank(b)) return rank(a) < rank(b);
        return a.score > b.score;
    });
    return out;
}

bool copy_pays(bool readable, bool mn_unaligned, double bytes, double flops) {
    if (readable && !mn_unaligned) return false;
    if (const std::optional<bool> force = forced_copy()) return *force;
    const double copy = 2 * bytes / 3e12 + 3e-6, product = flops / 700e12;
    return readable ? copy < kUnalignedRowsCost * product : copy + product < flops / kPortableRate;
}

bool rows_off_sectors(uintptr_t base, int64_t row_stride, int64_t batch_stride) {
    return base % 32 != 0 || row_stride % 32 != 0 || batch_stride % 32 != 0;
}

int64_t persistent_grid(int64_t tiles, int64_t sms) {
    const int64_t grid = std::min(tiles, sms), aligned = grid / 8 * 8;
    const auto rounds = [tiles](int64_t g) { return (tiles + g - 1) / g; };
    return aligned > 0 && rounds(aligned) == rounds(grid) ? aligned : grid;
}

int one_wave_raster_group(int bm, int bn, int64_t tiles_m, int64_t tiles_n) {
    // It runs on every launch it applies to, and its search costs host time: rows one tile
    // wide (every group walks them in the same order) return at once, and the last grid's
    // answer is kept per thread, for products issued again and again.
    if (tiles_n == 1) return 8;
    struct Last { int bm = 0, bn = 0; int64_t tiles_m = 0, tiles_n = 0; int group = 8; };
    thread_local Last last;
    if (last.bm == bm && last.bn == bn && last.tiles_m == tiles_m && last.tiles_n == tiles_n) return last.group;
    const int64_t total = tiles_m * tiles_n;
    // gemm_common.cuh's tile_of: block pid -> (tile row, tile column).
    const auto tile_of = [&](int64_t group_m, int64_t pid) {
        const int64_t width = group_m * tiles_n, first_m = pid / width * group_m;
        const int64_t rows = std::min(tiles_m - first_m, group_m), in_group = pid % width;
        return std::pair<int64_t, int64_t>{first_m + in_group % rows, in_group / rows};
    };
    int best = 8;
    double best_bytes = 0;
    for (int group_m : {8, 4, 2, 1}) {
        double bytes = 0;
        for (int64_t w = 0; w < total; w += 8) {
            int64_t rows[8], cols[8];
            int nrows = 0, ncols = 0;
            for (int64_t pid = w; pid < std::min(total, w + 8); ++pid) {
                const auto [m, n] = tile_of(group_m, pid);
                if (std::find(rows, rows + nrows, m) == rows + nrows) rows[nrows++] = m;
                if (std::find(cols, cols + ncols, n) == cols + ncols) cols[ncols++] = n;
            }
            bytes += double(nrows) * bm + double(ncols) * bn;
        }
        if (group_m == 8 || bytes < best_bytes) best = group_m, best_bytes = bytes;
    }
    last = {bm, bn, tiles_m, tiles_n, best};
    return best;
}

GemmKernel select_gemm(const GemmProblem& pr) {
    std::vector<GemmKernel> all = gemm_candidates(pr);
    KILN_CHECK_INTERNAL(!all.empty(), "no GEMM kernel for this problem");
    if (const char* forced = std::getenv("KILN_GEMM_KERNEL"); forced && *forced) {
        for (const GemmKernel& k : all)
            if (k.entry == forced) return k;
        std::string names;
        for (const GemmKernel& k : all) names += (names.empty() ? "" : ", ") + k.entry;
        fail(Error::Kind::Value, "KILN_GEMM_KERNEL={} cannot run this problem ({}x{}x{}, batch {}); the kernels that can: {}",
             forced, pr.m, pr.n, pr.k, pr.batch, names);
    }
    return all.front();
}

} // namespace kiln::gemm
