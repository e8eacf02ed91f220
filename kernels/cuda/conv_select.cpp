// The convolution kernels' cost models (conv_select.hpp): pure host code.
#include "kernels/cuda/conv_select.hpp"

#include "kernels/cuda/conv_cuda.hpp"   // kFoldPositionMaxBytes
#include "kernels/cuda/conv_params.hpp"   // conv_mma_smem
#include "kernels/cuda/gemm_select.hpp"   // persistent_smem

#include <fmt/format.h>

#include <algorithm>

namespace kiln::gemm {

int64_t positions_of(const ConvLayer& L) { return L.N * L.output[0] * L.output[1] * L.output[2]; }
int64_t taps_of(const ConvLayer& L) { return L.filter[0] * L.filter[1] * L.filter[2] * L.C; }

bool channel_halves(const ConvLayer& L) { return L.C % 32 == 0 && L.C % 64 != 0; }
bool walk_has_kernel(const ConvLayer& L, int bn, bool plain_rows) {
    return bn != 96 && (!channel_halves(L) || (bn == 256 && plain_rows));
}
bool tile_96_suits(const ConvLayer& L, bool patches_by_tma) {
    return L.K > 64 && L.K <= 96 && patches_by_tma && !channel_halves(L);
}

ConvTile tile_of(const ConvLayer& L, int bn) {
    ConvTile t;
    t.bn = bn;
    t.stages = t.bn == 64 ? 4 : t.bn == 96 || t.bn == 128 ? 6 : 4;
    t.smem = t.stages * (128 * 128 + t.bn * 128) + t.bn * 4 + 1024;
    t.entry = fmt::format("kiln_conv_fprop_{}{}_{}_s{}", channel_halves(L) ? "h_" : "",
                          L.dtype == DType::Float16 ? "f16" : "bf16", t.bn, t.stages);
    return t;
}

ConvTile mma_tile(const ConvLayer& L) {
    ConvTile t;
    t.bn = L.K <= 64 ? 64 : 128;
    t.stages = 4;
    t.smem = conv_mma_smem(t.bn, t.stages);
    t.entry = fmt::format("kiln_conv_mma_{}_{}_s{}", L.dtype == DType::Float16 ? "f16" : "bf16", t.bn, t.stages);
    return t;
}

// The plan by a cost model, microseconds: one tile a block takes waves x (k-tiles x a k-tile's
// time + a fixed cost: the pipeline's fill, the epilogue, the block's start); the walk takes
// its share of the tiles per SM x (the same, its fixed cost a third: it loads the next tile
// while storing this one, but its k-tile is slower, with 5 stages instead of 6). The 256-wide
// tile's k-tile costs less than two 128-wide ones (per multiply it brings 3/4 of the bytes
// from L2); past the channels a tile's columns cost as much as inside. Where the producer
// gathers the patches (no TMA), its 128 rows x 128 bytes per k-tile set the pace: a 256-wide
// k-tile costs only a quarter more than a 128-wide one. Fitted to the H200's kernel times on the
// seeds' layers (k-tiles 9-144, 98-6272 row tiles): within 10% of each. The 256-wide walk
// (where the channels fill more than half of it, wide_walk_possible), on the GEMM's persistent
// kernel, fitted to its kernel times on an H100 (VGG-A's conv3, conv4 and conv6, 18-72 k-tiles
// over 6-12 rounds: 0.655 us a k-tile, 1.5 a tile); into grouped rows (a strided gradient's
// phases) the walk's own, 3 stages, its k-tile 1.6 times the 128-wide walk's and its fixed cost
// 2.4 times (KILN_AUTOTUNE on an H100, ResNet-50's shapes). The 192-wide walk (4 stages, where
// 192 or 384 channels would leave a 128- or 256-wide tile partly empty) between the two: its
// k-tile 1.5 times the 128-wide walk's less the wider tile's saving on L2 bytes, its fixed cost
// as its share of results to store; within 6% of an H100's times on AlexNet's conv2 fprop (96 us
// modelled, 94 measured), conv3 fprop (51, 48) and conv3 bprop (64, 61). Output channels up to
// 64 take the 64-wide tile, not modelled: its walk where it can run, over at most
// kNarrowWalkKtiles k-tiles, else one tile a block, two blocks an SM. Measured on an H100
// (ResNet-50, VGG-A and AlexNet layers, float16): the walk took 6-24% less over 1 and 9 k-tiles,
// the same over 4 (both at the memory's pace), 3-4% more over 18 and 75, where one block's fill
// and epilogue overlapping the other's multiplies costs less than the walk's slower k-tile; with
// bias, ReLU and bsum 2-22% less over 1, 4 and 9. Over 65-96 channels with the patches by TMA
// (not in halves) the 96-wide one-tile kernel is an option: the 128-wide one's k-tile scaled by
// the width it multiplies (0.29 us), which leaves no quarter of its columns idle.
constexpr int64_t kNarrowWalkKtiles = 12;
namespace {
// A walk's terms, microseconds: a k-tile, and a tile's fixed cost.
struct WalkCost {
    double per_ktile, fixed;
};
WalkCost walk_cost(int bn, bool plain_rows) {
    if (bn == 128) return {0.43, 1.26};
    if (bn == 192) return plain_rows ? WalkCost{0.55, 2.2} : WalkCost{0.6, 2.6};
    return plain_rows ? WalkCost{0.655, 1.5} : WalkCost{0.68, 3.0};
}
} // namespace
// The transposed walk (conv_walk_t.cuh) reads a third less shared memory per multiply than the
// 64-wide tile, which shared memory held back: on an H100, ResNet-50's 64-channel 3x3 0.146 ms
// against the 64-wide walk's 0.189, its 64-channel 1x1 0.079 against 0.083. Up to 32 channels
// half its rows would be empty; under a wave of its tiles the 128-position tiles spread wider.
// Over 65-128 channels (two consumers, 3 stages) it is one of fprop_plan's options: per 256
// positions 0.8 us a k-tile and 1.6 a tile, fitted to an H100's kernel times (ResNet-50's
// 128-channel 3x3 fprop 0.096 ms against the 128-wide walk's 0.113, bprop 0.101 against 0.119;
// VGG-A's conv2 fprop 0.197 against 0.256, conv3 bprop 0.197 against the one-tile 0.214).
bool transposed_suits(const ConvLayer& L, int sms) {
    return L.K > 32 && L.K <= 128 && (positions_of(L) + 255) / 256 >= sms;
}

WalkTile walk_t_for(const ConvLayer& L) {
    WalkTile w;
    const int width = L.K <= 64 ? 64 : 128;
    w.stages = width == 64 ? 4 : 3;
    w.smem = w.stages * (width * 128 + 256 * 128) + width / 64 * 256 * 128 + 1024;
    w.entry = fmt::format("kiln_conv_fprop_walkt_{}_{}_s{}", L.dtype == DType::Float16 ? "f16" : "bf16", width, w.stages);
    return w;
}

FpropPlan fprop_plan(const ConvLayer& L, int sms, bool patches_by_tma, bool walk_possible, bool wide_walk_possible,
                     bool plain_rows, bool transposed_possible) {
    const int64_t tiles_m = (positions_of(L) + 127) / 128;
    const int64_t ktiles = (taps_of(L) + 63) / 64;
    // (Patches in halves: no transposed walk; of the others, walk_has_kernel's.)
    const bool transposed = transposed_possible && !channel_halves(L) && transposed_suits(L, sms);
    if (L.K <= 64 && transposed) return {tile_of(L, 64), false, 0, true};
    if (L.K <= 64)
        return {tile_of(L, 64), walk_possible && walk_has_kernel(L, 64, plain_rows) && ktiles <= kNarrowWalkKtiles};
    struct Option { int bn; bool walk; double per_ktile, fixed; };
    const Option options[] = {
        {96, false, 0.29, 2.6},
        {128, false, patches_by_tma ? 0.377 : 0.9, 2.8},
        {256, false, patches_by_tma ? 0.74 : 1.15, 4.2},
        {128, true, walk_cost(128, plain_rows).per_ktile, walk_cost(128, plain_rows).fixed},
        {192, true, walk_cost(192, plain_rows).per_ktile, walk_cost(192, plain_rows).fixed},
        {256, true, walk_cost(256, plain_rows).per_ktile, walk_cost(256, plain_rows).fixed},
    };
    FpropPlan best;
    double best_us = 0;
    for (const Option& o : options) {
        if (o.walk && !((o.bn > 128 ? wide_walk_possible : walk_possible) && walk_has_kernel(L, o.bn, plain_rows)))
            continue;
        if (o.bn > 128 && o.bn / 2 >= L.K) continue;   // half the tile or more past the channels
        if (o.bn == 96 && !tile_96_suits(L, patches_by_tma)) continue;
        const int64_t blocks = tiles_m * ((L.K + o.bn - 1) / o.bn), rounds = (blocks + sms - 1) / sms;
        const double us = double(rounds) * (double(ktiles) * o.per_ktile + o.fixed);
        if (best.tile.bn == 0 || us < best_us) best = {tile_of(L, o.bn), o.walk, us}, best_us = us;
    }
    if (transposed) {   // (L.K <= 128: the 128-wide tile, 256 positions a tile)
        const int64_t rounds = ((positions_of(L) + 255) / 256 + sms - 1) / sms;
        const double us = double(rounds) * (double(ktiles) * 0.8 + 1.6);
        if (us < best_us) best = {tile_of(L, 128), false, us, true}, best_us = us;
    }
    return best;
}

ConvTile widest_tile(const ConvLayer& L) { return tile_of(L, L.K <= 64 ? 64 : L.K <= 128 ? 128 : 256); }

bool walk_fits_tiles(const ConvLayer& L, const ConvTile& t, int sms) {
    const int64_t tiles = (positions_of(L) + 127) / 128 * ((L.K + t.bn - 1) / t.bn);
    return tiles > sms;
}

WalkTile walk_for(const ConvLayer& L, const ConvTile& t, bool column_sums, bool plain_rows) {
    WalkTile w;
    if (t.bn == 256 && plain_rows) {
        w.stages = 4, w.persistent = true;
        w.smem = persistent_smem(128, 256);
        w.entry = fmt::format("kiln_conv_fprop_pers_{}{}_256_s4{}", channel_halves(L) ? "h_" : "",
                              L.dtype == DType::Float16 ? "f16" : "bf16", column_sums ? "_cols" : "");
        return w;
    }
    w.stages = t.bn == 64 ? 6 : t.bn == 128 ? 5 : t.bn == 192 ? 4 : 3;
    w.smem = w.stages * (128 * 128 + t.bn * 128) + 128 * (t.bn + 8) * 2 + 4 * t.bn * 4 + 1024;
    w.entry = fmt::format("kiln_conv_fprop_walk_{}_{}_s{}{}", L.dtype == DType::Float16 ? "f16" : "bf16", t.bn, w.stages,
                          column_sums && t.bn == 256 ? "_bsum" : "");
    return w;
}

std::string describe(const ConvLayer& L, const FpropPlan& plan, bool column_sums, bool plain_rows) {
    if (plan.transposed) return walk_t_for(L).entry;
    return plan.walk ? walk_for(L, plan.tile, column_sums, plain_rows).entry : plan.tile.entry;
}

PhasedWalk phased_walk(const ConvLayer& L, int64_t taps, int phases, int sms) {
    const int64_t tiles_m = (positions_of(L) + 127) / 128, ktiles = (taps * L.C + 63) / 64;
    PhasedWalk best;
    for (int bn : {128, 256}) {
        if (bn == 256 && 128 >= L.K) break;   // half the tile or more past the channels
        const WalkCost w = walk_cost(bn, false);   // (into grouped rows)
        const int64_t items = tiles_m * ((L.K + bn - 1) / bn), rounds = (items + sms - 1) / sms;
        const double us = double(rounds) * (double(ktiles) * w.per_ktile + double(phases) * w.fixed);
        if (best.bn && us >= best.us) continue;
        const WalkTile t = walk_for(L, tile_of(L, bn), false, false);
        best.bn = bn, best.stages = t.stages, best.smem = t.smem, best.us = us;
        best.entry = fmt::format("kiln_conv_dgrad_phases_{}_{}_s{}", L.dtype == DType::Float16 ? "f16" : "bf16", bn,
                                 t.stages);
    }
    return best;
}

// The weight gradient's tile and split. The product is taps x K over the rows, split into
// slices so that the blocks fill the SMs: for each tile width the channels fill and each split
// count, the time is modelled as waves x k-tiles per block x a k-tile's multiply (proportional
// to the width, the 64-wide one as 96 since it moves as much A per multiply, the 256-wide one
// as 0.85 x 256 since per multiply it brings 3/4 of the 128-wide one's bytes), plus a fixed cost
// per wave (filling the pipeline, the epilogue), plus, split, the float32 planes written and
// read back by the reduction; the cheapest wins. Few slices of a large output (ResNet's
// 512-channel layers) lose to the planes' traffic; many slices of a small one fill the GPU.
// The balanced split costs its run's k-tiles (the sequence's share of an SM, so no part-empty
// last wave) at 1.15 x a one-tile block's (measured on the H200: a cooperative launch, one
// block an SM, no overlap with the previous kernel's tail), a fixed cost per tile it finishes
// (the producer waits for each epilogue but the last), and for each further run a tile spans
// one partial that its finishing block reads back alone, one after another at the end
// (about 8 us each there): it wins where the slices leave a last wave part empty and few runs
// share a tile (ResNet's and VGG's 512-channel 3x3 layers at 7 and 14 pixels), and loses to
// the slices' reduction kernel, which reads every plane at once, where many runs share one.
namespace {
// The weight gradient's 128 x bn tiles of grad_F^T, the k-tiles (64 output positions) of each,
// and a kernel's entry name (kind "wgrad" or "wgrad_bal").
int64_t wgrad_tiles(const ConvLayer& L, int bn) { return (taps_of(L) + 127) / 128 * ((L.K + bn - 1) / bn); }
int64_t wgrad_ktiles(const ConvLayer& L) { return (positions_of(L) + 63) / 64; }
// The balanced split's runs: a block an SM, never more than the k-tiles.
int64_t wgrad_runs(const ConvLayer& L, int bn, int sms) { return std::min<int64_t>(sms, wgrad_tiles(L, bn) * wgrad_ktiles(L)); }
std::string wgrad_entry(const ConvLayer& L, const char* kind, int bn, int stages) {
    return fmt::format("kiln_conv_{}_{}_{}_s{}", kind, L.dtype == DType::Float16 ? "f16" : "bf16", bn, stages);
}
} // namespace

WgradPlan wgrad_plan_of(const ConvLayer& L, int bn, int splits) {
    WgradPlan w;
    w.bn = bn, w.splits = splits;
    w.stages = bn == 64 ? 8 : bn == 128 ? 6 : 4;
    w.smem = w.stages * (128 * 128 + bn * 128) + 1024;
    w.entry = wgrad_entry(L, "wgrad", bn, w.stages);
    return w;
}

WgradPlan wgrad_balanced_of(const ConvLayer& L, int bn, int sms) {
    WgradPlan w = wgrad_plan_of(L, bn, 1);
    w.runs = int(wgrad_runs(L, bn, sms));
    w.entry = wgrad_entry(L, "wgrad_bal", bn, w.stages);
    return w;
}

std::string describe(const WgradPlan& w) {
    return w.runs > 0      ? fmt::format("{} balanced over {}", w.entry, w.runs)
           : w.splits > 1 ? fmt::format("{} split {}", w.entry, w.splits)
                          : w.entry;
}

WgradPlan wgrad_plan(const ConvLayer& L, int sms, int only_bn, WgradSplit split) {
    const int64_t taps = taps_of(L);
    const int64_t ktiles = wgrad_ktiles(L);
    constexpr double kTileUs = 0.45;     // a 128 x 128 x 64 k-tile at about 600 TFLOP/s over 132 SMs
    constexpr double kWaveUs = 2.0;      // pipeline fill and epilogue per wave
    constexpr double kBytesPerUs = 3.0e6;   // HBM, bytes per microsecond
    constexpr double kPartialUs = 8.0;       // a balanced run's partial tile, stored and read back
    // The cheapest (width, slices; balanced), its plan made once at the end.
    int best_bn = 0, best_splits = 1;
    bool best_balanced = false;
    double best_us = 0;
    const auto consider = [&](int bn, int splits, bool balanced, double us) {
        if (best_bn == 0 || us < best_us) best_bn = bn, best_splits = splits, best_balanced = balanced, best_us = us;
    };
    for (int bn : {64, 128, 256}) {
        if (bn > 64 && bn / 2 >= L.K) break;   // half the tile or more past the channels
        if (only_bn && bn != only_bn) continue;
        const int64_t tiles = wgrad_tiles(L, bn);
        const double width = bn == 256 ? 0.85 * 256 : std::max(bn, 96);
        const double tile_us = kTileUs * width / 128.0;
        if (split != WgradSplit::Balanced)
            for (int64_t splits = 1; splits <= std::min<int64_t>(ktiles, 64); ++splits) {
                const int64_t blocks = tiles * splits, waves = (blocks + sms - 1) / sms, per = (ktiles + splits - 1) / splits;
                double us = double(waves) * (double(per) * tile_us + kWaveUs);
                if (splits > 1) us += double(splits) * double(taps * L.K) * 8.0 / kBytesPerUs + 3.0;
                consider(bn, int(splits), false, us);
            }
        if (bn == 64 || split == WgradSplit::Sliced) continue;
        const int64_t runs = wgrad_runs(L, bn, sms);
        const int64_t per = (tiles * ktiles + runs - 1) / runs;
        const int64_t finished = (tiles + runs - 1) / runs, spanned = (ktiles + per - 1) / per;
        consider(bn, 1, true, 1.15 * double(per) * tile_us + double(finished + 1) * kWaveUs + double(spanned - 1) * kPartialUs);
    }
    // (The balanced split asked for where no width has it: the slices.)
    if (best_bn == 0) return wgrad_plan(L, sms, only_bn, WgradSplit::Sliced);
    return best_balanced ? wgrad_balanced_of(L, best_bn, sms) : wgrad_plan_of(L, best_bn, best_splits);
}

bool pointwise_prefers_implicit(const ConvLayer& L, int sms, bool into_view) {
    return (into_view || L.K <= 128) && positions_of(L) >= int64_t(128) * sms;
}

int64_t tma_padded_channels(const ConvLayer& L) {
    const int64_t c64 = (L.C + 63) / 64 * 64;
    if (L.C % 8 != 0 || c64 == L.C || 3 * c64 > 4 * L.C || dtype_size(L.dtype) != 2 ||
        c64 * 2 > kFoldPositionMaxBytes)
        return 0;
    return c64;
}

double pad_copy_us(const ConvLayer& L, int64_t channels) {
    constexpr double kBytesPerUs = 3.0e6;
    return double(L.N * L.image[0] * L.image[1] * L.image[2] * (L.C + 2 * channels)) * double(dtype_size(L.dtype)) /
           kBytesPerUs;
}

} // namespace kiln::gemm
