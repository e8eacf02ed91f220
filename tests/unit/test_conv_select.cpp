// The implicit-GEMM convolution kernels' plans (kernels/cuda/conv_select.hpp), checked on the
// host: pure functions of the layer and the SM count, so the choices that the H200's benchmark
// runs measured are pinned here without a GPU.
#include "tests/support/catch.hpp"

#include "kernels/cuda/conv_params.hpp"
#include "kernels/cuda/conv_select.hpp"
#include "kernels/cuda/gemm_select.hpp"

#include <string>

using namespace kiln;
using namespace kiln::gemm;

namespace {

constexpr int kSms = 132;   // an H100 / H200

ConvLayer layer2d(int64_t N, int64_t C, int64_t K, int64_t hw, int64_t rs, int64_t pad, int64_t stride) {
    return conv_layer(DType::Float16, N, C, K, {1, hw, hw}, {1, rs, rs}, {0, pad, pad}, {stride, stride, stride});
}

// The entry fprop launches for L as conv_fprop_kernel decides it on kSms SMs: the patches by TMA
// where C is a multiple of 64 (the seeds' windows all fit the descriptor), the walk where it can
// run (TMA, K a multiple of 8, more tiles than SMs), the 192- and 256-wide ones over more than 128
// channels, the transposed one (plain rows of the layer's dtype, as the benchmark's) at most 64.
std::string fprop_entry(const ConvLayer& L) {
    const bool tma = L.C % 64 == 0;
    const bool walk = tma && L.K % 8 == 0 && walk_fits_tiles(L, tile_of(L, L.K <= 64 ? 64 : 128), kSms);
    const bool wide = tma && L.K % 8 == 0 && L.K > 128 && walk_fits_tiles(L, tile_of(L, 256), kSms) &&
                      walk_fits_tiles(L, tile_of(L, 192), kSms);
    return describe(L, fprop_plan(L, kSms, tma, walk, wide, true, tma && L.K % 8 == 0));
}

struct Chosen {
    const char* layer;
    int64_t N, C, K, hw, rs, pad, stride;
    const char* fprop;
    const char* update;
};

} // namespace

TEST_CASE("conv plans: the seeds' layers take the tiles, walks and splits measured on the H200") {
    // (the float16 run of conv.py at 3023e35 / bc9c9f7 / ab49882: docs/conv_layers.md; the
    // balanced split's against the slices' in the run of 2026-12-04; the 256-wide walk, on the
    // GEMM's persistent kernel, from kernel times of every candidate on an H100, 2026-12-06; the
    // 192-wide walk for AlexNet's 192 and 384 channels and the transposed walk for ResNet-50's
    // 64-channel 3x3 from the H100's run of 2026-12-07: 0.99x and 1.00x cuDNN, from 0.62x and 0.78x;
    // the 128-wide transposed walk from the H100's of 2026-12-07, forced beside the default)
    const char* const BALANCED = "kiln_conv_wgrad_bal_f16_256_s4 balanced over 132";
    const Chosen layers[] = {
        {"alexnet conv2", 128, 64, 192, 27, 5, 2, 1, "kiln_conv_fprop_walk_f16_192_s4", "kiln_conv_wgrad_f16_256_s4 split 10"},
        {"alexnet conv3", 128, 192, 384, 13, 3, 1, 1, "kiln_conv_fprop_walk_f16_192_s4", "kiln_conv_wgrad_f16_128_s6 split 3"},
        {"alexnet conv4", 128, 384, 256, 13, 3, 1, 1, "kiln_conv_fprop_f16_128_s6", "kiln_conv_wgrad_f16_256_s4 split 4"},
        {"overfeat conv3", 128, 256, 512, 12, 3, 1, 1, "kiln_conv_fprop_pers_f16_256_s4", "kiln_conv_wgrad_f16_256_s4 split 3"},
        {"overfeat conv4", 128, 512, 1024, 12, 3, 1, 1, "kiln_conv_fprop_pers_f16_256_s4", BALANCED},
        {"overfeat conv5", 128, 1024, 1024, 12, 3, 1, 1, "kiln_conv_fprop_pers_f16_256_s4", BALANCED},
        {"vgg_a conv2", 64, 64, 128, 112, 3, 1, 1, "kiln_conv_fprop_walkt_f16_128_s3", "kiln_conv_wgrad_f16_128_s6 split 26"},
        {"vgg_a conv3", 64, 128, 256, 56, 3, 1, 1, "kiln_conv_fprop_pers_f16_256_s4", "kiln_conv_wgrad_f16_256_s4 split 14"},
        {"vgg_a conv6", 64, 512, 512, 28, 3, 1, 1, "kiln_conv_fprop_pers_f16_256_s4", BALANCED},
        {"vgg_a conv7", 64, 512, 512, 14, 3, 1, 1, "kiln_conv_fprop_f16_128_s6", BALANCED},
        {"resnet50 s2_3x3", 256, 64, 64, 56, 3, 1, 1, "kiln_conv_fprop_walkt_f16_64_s4", "kiln_conv_wgrad_f16_64_s8 split 26"},
        {"resnet50 s3_3x3s2", 256, 128, 128, 56, 3, 1, 2, "kiln_conv_fprop_walkt_f16_128_s3", "kiln_conv_wgrad_f16_128_s6 split 14"},
        {"resnet50 s3_proj", 256, 256, 512, 56, 1, 0, 2, "kiln_conv_fprop_pers_f16_256_s4", "kiln_conv_wgrad_f16_256_s4 split 33"},
        {"resnet50 s4_3x3s2", 256, 256, 256, 28, 3, 1, 2, "kiln_conv_fprop_pers_f16_256_s4", "kiln_conv_wgrad_f16_256_s4 split 7"},
        {"resnet50 s4_proj", 256, 512, 1024, 28, 1, 0, 2, "kiln_conv_fprop_pers_f16_256_s4", "kiln_conv_wgrad_f16_256_s4 split 8"},
        {"resnet50 s5_3x3s2", 256, 512, 512, 14, 3, 1, 2, "kiln_conv_fprop_f16_128_s6", BALANCED},
        {"resnet50 s5_proj", 256, 1024, 2048, 14, 1, 0, 2, "kiln_conv_fprop_pers_f16_256_s4", "kiln_conv_wgrad_f16_128_s6"},
        {"resnet50 s5_3x3", 256, 512, 512, 7, 3, 1, 1, "kiln_conv_fprop_f16_128_s6", BALANCED},
    };
    for (const Chosen& c : layers) {
        const ConvLayer L = layer2d(c.N, c.C, c.K, c.hw, c.rs, c.pad, c.stride);
        INFO(c.layer << ": " << L.str());
        CHECK(fprop_entry(L) == c.fprop);
        CHECK(describe(wgrad_plan(L, kSms)) == c.update);
    }
}

TEST_CASE("conv plans: the rules behind them") {
    // Up to 64 output channels: the 64-wide tile, not modelled; its walk over short k-loops (9
    // k-tiles: ResNet-50's s2_3x3; 1: its s2_1x1a) where the walk can run, one tile a block, two
    // blocks an SM, over long k-loops (18: VGG-A's conv2 backward, 128 channels into 64).
    const ConvLayer narrow = layer2d(256, 64, 64, 56, 3, 1, 1);
    const FpropPlan p64 = fprop_plan(narrow, kSms, true, true);
    CHECK(p64.tile.bn == 64);
    CHECK(p64.walk);
    CHECK(p64.us == 0);
    CHECK(describe(narrow, p64) == "kiln_conv_fprop_walk_f16_64_s6");
    CHECK(fprop_plan(layer2d(256, 64, 64, 56, 1, 0, 1), kSms, true, true).walk);
    CHECK(!fprop_plan(narrow, kSms, true, false).walk);
    const FpropPlan long_k = fprop_plan(layer2d(64, 128, 64, 112, 3, 1, 1), kSms, true, true);
    CHECK(long_k.tile.bn == 64);
    CHECK(!long_k.walk);
    CHECK(describe(narrow, fprop_plan(narrow, kSms, true, false)) == "kiln_conv_fprop_f16_64_s4");
    // The transposed walk (64 channels x 256 positions a tile) where it can run, over 32 to 64
    // channels and at least a wave of its tiles (ResNet-50's 64-channel layers at 56x56: 3136).
    const FpropPlan t64 = fprop_plan(narrow, kSms, true, true, false, true, true);
    CHECK(t64.transposed);
    CHECK(describe(narrow, t64) == "kiln_conv_fprop_walkt_f16_64_s4");
    CHECK(transposed_suits(layer2d(256, 64, 40, 56, 1, 0, 1), kSms));
    CHECK(!fprop_plan(narrow, kSms, true, true, false, true, false).transposed);
    CHECK(!fprop_plan(layer2d(256, 64, 32, 56, 3, 1, 1), kSms, true, true, false, true, true).transposed);
    CHECK(!fprop_plan(layer2d(2, 64, 64, 56, 3, 1, 1), kSms, true, true, false, true, true).transposed);   // 25 tiles
    CHECK(!fprop_plan(layer2d(256, 64, 128, 56, 3, 1, 1), kSms, true, true, true, true, false).transposed);
    const WalkTile wt = walk_t_for(layer2d(2, 64, 64, 8, 3, 1, 1));
    CHECK(wt.entry == "kiln_conv_fprop_walkt_f16_64_s4");
    CHECK(wt.smem == 4 * (64 * 128 + 256 * 128) + 256 * 128 + 1024);
    CHECK(wt.smem <= 227 * 1024);
    const WalkTile wt2 = walk_t_for(layer2d(2, 64, 128, 8, 3, 1, 1));   // two consumers, 3 stages
    CHECK(wt2.entry == "kiln_conv_fprop_walkt_f16_128_s3");
    CHECK(wt2.smem == 3 * (128 * 128 + 256 * 128) + 2 * 256 * 128 + 1024);
    CHECK(wt2.smem <= 227 * 1024);
    // Over 65-128 channels the 128-wide transposed walk where the model prefers it: ResNet-50's
    // 128-channel 3x3 (6 rounds of 784 tiles, 18 k-tiles: 96 us against the 128-wide walk's 108)
    // and its gradient into 128 channels from 512 (8 k-tiles); not over 2 rounds of 144 tiles,
    // where the 128-wide walk's 3 of 288 cost less, nor past 128 channels.
    const ConvLayer s3 = layer2d(256, 128, 128, 28, 3, 1, 1), s3b = layer2d(256, 512, 128, 28, 1, 0, 1);
    const FpropPlan t128 = fprop_plan(s3, kSms, true, true, true, true, true);
    CHECK(t128.transposed);
    CHECK(t128.tile.bn == 128);
    CHECK(t128.us == Approx(6 * (18 * 0.8 + 1.6)));
    CHECK(describe(s3, t128) == "kiln_conv_fprop_walkt_f16_128_s3");
    CHECK(fprop_plan(s3b, kSms, true, true, true, true, true).transposed);
    CHECK(!fprop_plan(s3, kSms, true, true, true, true, false).transposed);
    const ConvLayer few = layer2d(47, 64, 128, 28, 3, 1, 1);
    CHECK(transposed_suits(few, kSms));
    CHECK(!fprop_plan(few, kSms, true, true, true, true, true).transposed);
    CHECK(fprop_plan(few, kSms, true, true, true, true, true).walk);
    CHECK(!transposed_suits(layer2d(256, 64, 192, 56, 3, 1, 1), kSms));
    // The walk only where it may run, over more tiles than SMs.
    const ConvLayer vgg2 = layer2d(64, 64, 128, 112, 3, 1, 1);
    CHECK(fprop_plan(vgg2, kSms, true, true).walk);
    CHECK(!fprop_plan(vgg2, kSms, true, false).walk);
    CHECK(walk_fits_tiles(vgg2, tile_of(vgg2, 128), kSms));
    CHECK(walk_fits_tiles(vgg2, tile_of(vgg2, 256), kSms));
    CHECK(fprop_plan(vgg2, kSms, true, true, false).tile.bn == 128);
    // The 256-wide walk where the model says so: many rows over 36 k-tiles (ResNet-50's s4_3x3,
    // 3 rounds of 392 tiles), not over 72 k-tiles in 2 rounds of 196 tiles (its s5_3x3: the
    // one-tile 128-wide kernel's 3 rounds cost less), nor where it cannot run.
    const ConvLayer s4 = layer2d(256, 256, 256, 14, 3, 1, 1), s5 = layer2d(256, 512, 512, 7, 3, 1, 1);
    CHECK(describe(s4, fprop_plan(s4, kSms, true, true, true)) == "kiln_conv_fprop_pers_f16_256_s4");
    CHECK(describe(s4, fprop_plan(s4, kSms, true, true, false)) == "kiln_conv_fprop_f16_256_s4");
    CHECK(describe(s5, fprop_plan(s5, kSms, true, true, true)) == "kiln_conv_fprop_f16_128_s6");
    // The 192-wide walk where 192 or 384 channels would leave a 128- or 256-wide tile partly
    // empty (AlexNet's conv3 gradient: 384 channels into 192, 2 rounds of 169 tiles against 3 of
    // 338 128-wide ones), not over 256 or 512 channels (no tile past them), nor where the wider
    // walks cannot run or the channels fill less than half of it.
    const ConvLayer a3b = layer2d(128, 384, 192, 13, 3, 1, 1);
    const FpropPlan mid = fprop_plan(a3b, kSms, true, true, true);
    CHECK(describe(a3b, mid) == "kiln_conv_fprop_walk_f16_192_s4");
    CHECK(mid.us == Approx(2 * (54 * 0.55 + 2.2)));
    CHECK(fprop_plan(a3b, kSms, true, true, false).tile.bn != 192);
    CHECK(fprop_plan(s4, kSms, true, true, true).tile.bn == 256);
    CHECK(fprop_plan(layer2d(128, 256, 512, 12, 3, 1, 1), kSms, true, true, true).tile.bn == 256);
    CHECK(fprop_plan(layer2d(256, 64, 96, 56, 3, 1, 1), kSms, true, true, true).tile.bn != 192);
    CHECK(!walk_fits_tiles(layer2d(2, 64, 128, 8, 3, 1, 1), tile_of(vgg2, 128), kSms));   // one tile
    // Gathered patches cost more per k-tile than TMA's: Overfeat's conv2 over its 96 channels
    // gathered, against the same layer padded to 128 by TMA (fewer microseconds despite a third
    // more taps: what the padding to 64 channels weighs).
    const ConvLayer gathered = layer2d(128, 96, 256, 24, 5, 0, 1), padded = layer2d(128, 128, 256, 24, 5, 0, 1);
    const FpropPlan g = fprop_plan(gathered, kSms, false, false), t = fprop_plan(padded, kSms, true, true);
    CHECK(g.tile.bn == 256);
    CHECK(t.us < g.us);
    CHECK(g.us > 0);
    // The tiles' shared memory and entries.
    CHECK(tile_of(vgg2, 128).entry == "kiln_conv_fprop_f16_128_s6");
    CHECK(tile_of(vgg2, 128).smem == 6 * (128 * 128 + 128 * 128) + 128 * 4 + 1024);
    CHECK(walk_for(vgg2, tile_of(vgg2, 64)).entry == "kiln_conv_fprop_walk_f16_64_s6");
    // The walk's stages, staged results (16-bit rows of BN + 8), each consumer's bias for two
    // tiles and the barriers' 1 KB fit an SM's 227 KB with the channel sums.
    for (int bn : {64, 128, 192, 256}) {
        const WalkTile w = walk_for(vgg2, tile_of(vgg2, bn), false, bn != 256);
        CHECK(!w.persistent);
        CHECK(w.stages == (bn == 64 ? 6 : bn == 128 ? 5 : bn == 192 ? 4 : 3));
        CHECK(w.smem == w.stages * (128 * 128 + bn * 128) + 128 * (bn + 8) * 2 + 4 * bn * 4 + 1024);
        CHECK(w.smem + (bn <= 128 ? conv_col_sum_bytes(bn) : 0) <= 227 * 1024);
    }
    // The 192-wide walk adds the channel sums in its plain entry (tested at run time, as the
    // narrower ones); into grouped rows too.
    CHECK(walk_for(vgg2, tile_of(vgg2, 192), true).entry == "kiln_conv_fprop_walk_f16_192_s4");
    CHECK(walk_for(vgg2, tile_of(vgg2, 192), true, false).entry == "kiln_conv_fprop_walk_f16_192_s4");
    // The 256-wide tile into plain rows of the layer's dtype walks on the GEMM's persistent
    // kernel (4 stages, its shared memory exactly the GEMM's, within 227 KB); a strided
    // gradient's grouped rows on the walk's own 3 stages.
    const WalkTile pers = walk_for(vgg2, tile_of(vgg2, 256));
    CHECK(pers.persistent);
    CHECK(pers.stages == 4);
    CHECK(pers.smem == persistent_smem(128, 256));
    CHECK(pers.smem <= 227 * 1024);
    CHECK(pers.entry == "kiln_conv_fprop_pers_f16_256_s4");
    CHECK(walk_for(vgg2, tile_of(vgg2, 256), true).entry == "kiln_conv_fprop_pers_f16_256_s4_cols");
    CHECK(walk_for(vgg2, tile_of(vgg2, 256), false, false).entry == "kiln_conv_fprop_walk_f16_256_s3");
    // Into grouped rows the 256-wide walk is that 3-stage kernel, which the model prices higher.
    const ConvLayer wide = layer2d(64, 512, 512, 28, 3, 1, 1);
    CHECK(fprop_plan(wide, kSms, true, true, true, false).us > fprop_plan(wide, kSms, true, true, true, true).us);
    CHECK(walk_for(vgg2, tile_of(vgg2, 256), true, false).entry == "kiln_conv_fprop_walk_f16_256_s3_bsum");
    CHECK(walk_for(vgg2, tile_of(vgg2, 128), true).entry == "kiln_conv_fprop_walk_f16_128_s5");
    CHECK(widest_tile(layer2d(2, 64, 300, 8, 3, 1, 1)).bn == 256);
    CHECK(widest_tile(narrow).bn == 64);
    // The update: a width of its own when asked, and no split where one wave already fills it.
    CHECK(wgrad_plan(vgg2, kSms, 64).bn == 64);
    CHECK(wgrad_plan(layer2d(256, 1024, 2048, 14, 1, 0, 2), kSms).splits == 1);
    // The balanced split where few runs share a tile and the slices would leave a last wave part
    // empty (VGG's conv7: 72 tiles of 196 k-tiles, 3 slices = 216 blocks), not where many runs
    // would share one (VGG's conv2: 5 tiles over 132 runs, its partials read one by one).
    const ConvLayer vgg7 = layer2d(64, 512, 512, 14, 3, 1, 1);
    CHECK(wgrad_plan(vgg7, kSms).runs == kSms);
    CHECK(wgrad_plan(vgg2, kSms).runs == 0);
    CHECK(wgrad_plan(vgg2, kSms, 0, WgradSplit::Balanced).runs == kSms);
    CHECK(wgrad_plan(vgg7, kSms, 0, WgradSplit::Sliced).splits == 3);
    CHECK(wgrad_plan(vgg7, kSms, 0, WgradSplit::Sliced).runs == 0);
    // No balanced split of the 64-wide tile: asked for, the slices; and never more runs than k-tiles.
    CHECK(wgrad_plan(narrow, kSms, 0, WgradSplit::Balanced).runs == 0);
    CHECK(wgrad_plan(narrow, kSms, 0, WgradSplit::Balanced).bn == 64);
    const ConvLayer tiny = layer2d(1, 128, 256, 8, 1, 0, 1);   // one 128 x 256 tile of one k-tile
    CHECK(wgrad_balanced_of(tiny, 256, kSms).runs == 1);
    CHECK(wgrad_balanced_of(tiny, 128, kSms).runs == 2);
    CHECK(describe(wgrad_balanced_of(vgg7, 128, kSms)) == "kiln_conv_wgrad_bal_f16_128_s6 balanced over 132");
    CHECK(positions_of(vgg2) == 64 * 112 * 112);
    CHECK(taps_of(vgg2) == 9 * 64);
}

// A strided gradient's phases in one walk (phased_walk): the width by the walk's model over items
// that cost every phase's taps. ResNet-50's strided 3x3 gradients, as their phases' layers (E's
// positions, K and C exchanged): 128 output channels take the 128-wide walk (the 256-wide tile
// would be half empty); 256 channels at 14x14 the 256-wide one (392 items, 3 rounds, against 784
// and 6); 512 at 7x7 the 128-wide one (392 items over 3 rounds beside 196 over 2 of the 256-wide
// tile's dearer k-tiles and tiles).
TEST_CASE("conv plans: a strided gradient's phases in one walk") {
    const auto phase = [](int64_t C, int64_t K, int64_t hw) {
        return conv_layer(DType::Float16, 256, K, C, {1, hw, hw}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1});
    };
    const PhasedWalk s3 = phased_walk(phase(128, 128, 28), 9, 4, kSms);
    CHECK(s3.entry == "kiln_conv_dgrad_phases_f16_128_s5");
    CHECK(s3.bn == 128);
    CHECK(s3.smem == walk_for(phase(128, 128, 28), tile_of(phase(128, 128, 28), 128), false, false).smem);
    const PhasedWalk s4 = phased_walk(phase(256, 256, 14), 9, 4, kSms);
    CHECK(s4.entry == "kiln_conv_dgrad_phases_f16_256_s3");
    CHECK(s4.us == Approx(3 * (36 * 0.68 + 4 * 3.0)));
    const PhasedWalk s5 = phased_walk(phase(512, 512, 7), 9, 4, kSms);
    CHECK(s5.entry == "kiln_conv_dgrad_phases_f16_128_s5");
    CHECK(s5.us == Approx(3 * (72 * 0.43 + 4 * 1.26)));
    // bfloat16's entries; fewer SMs, more rounds.
    const ConvLayer b = conv_layer(DType::BFloat16, 256, 256, 256, {1, 14, 14}, {1, 3, 3}, {0, 1, 1}, {1, 1, 1});
    CHECK(phased_walk(b, 9, 4, kSms).entry == "kiln_conv_dgrad_phases_bf16_256_s3");
    CHECK(phased_walk(b, 9, 4, 66).us > phased_walk(b, 9, 4, kSms).us);
}

TEST_CASE("conv plans: pointwise layers on the implicit kernel, channels padded for TMA") {
    // At most 128 output channels over a wave of 128-row tiles: ResNet-50's 64-channel 1x1 at
    // 56x56 (fprop, and its gradient as the convolution into 64), 256 into 128; not into 256, nor
    // a handful of rows.
    CHECK(pointwise_prefers_implicit(layer2d(256, 64, 64, 56, 1, 0, 1), kSms));
    CHECK(pointwise_prefers_implicit(layer2d(256, 256, 64, 56, 1, 0, 1), kSms));
    CHECK(pointwise_prefers_implicit(layer2d(256, 256, 128, 56, 1, 0, 1), kSms));
    CHECK(!pointwise_prefers_implicit(layer2d(256, 64, 256, 56, 1, 0, 1), kSms));
    CHECK(!pointwise_prefers_implicit(layer2d(2, 64, 64, 8, 1, 0, 1), kSms));
    CHECK(pointwise_prefers_implicit(layer2d(2, 64, 64, 8, 1, 0, 1), 1));   // a wave of one SM
    // Into a strided gradient's view, any width (ResNet-50's s3_proj gradient: 512 into 256 at
    // 28x28), but not a handful of rows.
    CHECK(pointwise_prefers_implicit(layer2d(256, 512, 256, 28, 1, 0, 1), kSms, true));
    CHECK(pointwise_prefers_implicit(layer2d(256, 1024, 512, 14, 1, 0, 1), kSms, true));
    CHECK(!pointwise_prefers_implicit(layer2d(2, 512, 256, 8, 1, 0, 1), kSms, true));
    // Channels to the next multiple of 64 where that adds at most a third.
    CHECK(tma_padded_channels(layer2d(128, 96, 256, 24, 5, 0, 1)) == 128);
    CHECK(tma_padded_channels(layer2d(2, 160, 72, 9, 3, 1, 1)) == 192);
    CHECK(tma_padded_channels(layer2d(2, 136, 72, 9, 3, 1, 1)) == 0);   // 192 is 41% more
    CHECK(tma_padded_channels(layer2d(2, 40, 96, 9, 3, 1, 1)) == 0);
    CHECK(tma_padded_channels(layer2d(2, 64, 96, 9, 3, 1, 1)) == 0);    // already TMA's
    CHECK(tma_padded_channels(layer2d(2, 3, 96, 9, 3, 1, 1)) == 0);     // not a multiple of 8
    CHECK(tma_padded_channels(layer2d(1, 6152, 72, 3, 3, 1, 1)) == 0);  // past the fold's staging
    CHECK(tma_padded_channels(conv_layer(DType::Float32, 2, 96, 64, {1, 9, 9}, {1, 3, 3}, {0, 1, 1})) == 0);
    // Overfeat's conv2: the padded layer by TMA and its copy under the gathered one.
    const ConvLayer L = layer2d(128, 96, 256, 24, 5, 0, 1), P = layer2d(128, 128, 256, 24, 5, 0, 1);
    const double gathered = fprop_plan(L, kSms, false, false).us;
    const double padded = fprop_plan(P, kSms, true, walk_fits_tiles(P, tile_of(P, 128), kSms)).us;
    CHECK(pad_copy_us(L, 128) > 0);
    CHECK(padded + pad_copy_us(L, 128) < gathered);
}

TEST_CASE("conv plans: channels a multiple of 32 but not of 64 take their patches in halves") {
    CHECK(channel_halves(layer2d(2, 96, 64, 9, 3, 1, 1)));
    CHECK(channel_halves(layer2d(2, 32, 64, 9, 3, 1, 1)));
    CHECK(channel_halves(layer2d(2, 160, 64, 9, 3, 1, 1)));
    CHECK(!channel_halves(layer2d(2, 64, 64, 9, 3, 1, 1)));
    CHECK(!channel_halves(layer2d(2, 128, 64, 9, 3, 1, 1)));
    CHECK(!channel_halves(layer2d(2, 40, 64, 9, 3, 1, 1)));
    // Overfeat's conv2: 38 k-tiles by TMA on the 256-wide persistent walk (the `_h` entries),
    // under the layer padded to 128 channels (50 k-tiles) and its copy.
    const ConvLayer L = layer2d(128, 96, 256, 24, 5, 0, 1), P = layer2d(128, 128, 256, 24, 5, 0, 1);
    const FpropPlan h = fprop_plan(L, kSms, true, true, true);
    CHECK(describe(L, h) == "kiln_conv_fprop_pers_h_f16_256_s4");
    CHECK(describe(L, h, true) == "kiln_conv_fprop_pers_h_f16_256_s4_cols");
    CHECK(h.us + 1 < fprop_plan(P, kSms, true, true, true).us + pad_copy_us(L, 128));
    CHECK(tile_of(L, 128).entry == "kiln_conv_fprop_h_f16_128_s6");
    CHECK(tile_of(conv_layer(DType::BFloat16, 2, 96, 64, {1, 9, 9}, {1, 3, 3}, {0, 1, 1}), 64).entry ==
          "kiln_conv_fprop_h_bf16_64_s4");
    // No other walk, transposed or not, has halves: one tile a block there, and the persistent
    // walk only into plain rows.
    for (int64_t k : {48, 96, 128, 192, 256, 384}) {
        const ConvLayer M = layer2d(256, 96, k, 28, 3, 1, 1);
        for (bool plain : {true, false}) {
            const FpropPlan x = fprop_plan(M, kSms, true, true, true, plain, true);
            INFO(M.str() << " plain " << plain << ": " << describe(M, x, false, plain));
            CHECK(!x.transposed);
            CHECK((!x.walk || (x.tile.bn == 256 && plain)));
            CHECK(describe(M, x, false, plain).find("_h_") != std::string::npos);
        }
    }
}

TEST_CASE("conv plans: 65-96 output channels take the 96-wide tile where its k-tiles cost less") {
    // Overfeat's conv2 gradient (E's 256 channels into 96 by TMA, 100 k-tiles, 5 rounds of 576
    // tiles): 5 x (100 x 0.29 + 2.6) us against the 128-wide tile's 202, its walk's 221 and the
    // transposed walk's 3 rounds of 288 tiles (245).
    const ConvLayer o2b = layer2d(128, 256, 96, 20, 5, 4, 1);
    const FpropPlan p = fprop_plan(o2b, kSms, true, true, true, true, true);
    CHECK(describe(o2b, p) == "kiln_conv_fprop_f16_96_s6");
    CHECK(!p.walk);
    CHECK(!p.transposed);
    CHECK(p.us == Approx(5 * (100 * 0.29 + 2.6)));
    CHECK(describe(o2b, p, true) == "kiln_conv_fprop_f16_96_s6");   // (it adds the channel sums itself)
    const ConvTile t = tile_of(o2b, 96);
    CHECK(t.stages == 6);
    CHECK(t.smem == 6 * (128 * 128 + 96 * 128) + 96 * 4 + 1024);
    CHECK(t.smem + conv_col_sum_bytes(96) <= 227 * 1024);
    CHECK(tile_of(conv_layer(DType::BFloat16, 2, 64, 80, {1, 9, 9}, {1, 3, 3}, {0, 1, 1}), 96).entry ==
          "kiln_conv_fprop_bf16_96_s6");
    // No walk of it: KILN_CONV_KERNEL=walk and the tuner keep it one tile a block.
    CHECK(!walk_has_kernel(o2b, 96, true));
    CHECK(walk_has_kernel(o2b, 128, true));
    // 65-96 channels only, the patches by TMA, not in halves.
    CHECK(tile_96_suits(o2b, true));
    CHECK(!tile_96_suits(o2b, false));
    CHECK(!tile_96_suits(layer2d(128, 96, 96, 20, 5, 4, 1), true));
    for (int64_t k : {72, 80, 88, 96}) CHECK(fprop_plan(layer2d(128, 256, k, 20, 5, 4, 1), kSms, true, true).tile.bn == 96);
    CHECK(fprop_plan(layer2d(128, 256, 97, 20, 5, 4, 1), kSms, true, true).tile.bn != 96);
    CHECK(fprop_plan(layer2d(128, 256, 64, 20, 5, 4, 1), kSms, true, true).tile.bn == 64);
    CHECK(fprop_plan(o2b, kSms, false, false).tile.bn != 96);
    CHECK(fprop_plan(layer2d(128, 96, 96, 20, 5, 4, 1), kSms, true, true).tile.bn != 96);   // halves
    // Where the walk's fixed cost a third wins over short k-loops (9 k-tiles, 3 rounds of 294
    // row tiles), the 128-wide walk stays.
    const ConvLayer short_k = layer2d(48, 64, 72, 28, 3, 1, 1);
    CHECK(describe(short_k, fprop_plan(short_k, kSms, true, true)) == "kiln_conv_fprop_walk_f16_128_s5");
    CHECK(describe(short_k, fprop_plan(short_k, kSms, true, false)) == "kiln_conv_fprop_f16_96_s6");
}

TEST_CASE("conv plans: the mma.sync kernel's tile for other GPUs than sm_90") {
    // 64 channels wide up to K = 64, else 128; bfloat16 names its own entry; the 128-wide tile's
    // 4 stages (80 KiB) fit the 99 KiB an sm_86/sm_89 block may have, two blocks an A100's SM.
    const ConvTile narrow = mma_tile(layer2d(8, 64, 64, 14, 3, 1, 1));
    CHECK(narrow.entry == "kiln_conv_mma_f16_64_s4");
    CHECK(narrow.bn == 64);
    const ConvTile wide = mma_tile(layer2d(8, 64, 65, 14, 3, 1, 1));
    CHECK(wide.entry == "kiln_conv_mma_f16_128_s4");
    CHECK(wide.smem == 4 * (128 + 128) * 40 * 2);
    CHECK(wide.smem <= 99 * 1024);
    CHECK(2 * wide.smem <= 163 * 1024);
    CHECK(mma_tile(conv_layer(DType::BFloat16, 1, 8, 300, {1, 1, 9}, {1, 1, 3})).entry == "kiln_conv_mma_bf16_128_s4");
    // The epilogue's float32 tile fits where the stages are: 128 x (BN + 4) floats.
    CHECK(narrow.smem >= 128 * (64 + 4) * 4);
    CHECK(wide.smem >= 128 * (128 + 4) * 4);
}

TEST_CASE("conv plans: the gathering kernels step through every patch column in order") {
    // The mma.sync kernel's threads: a thread's first chunk (0 or 2 of a k-tile's 4), then its 2
    // chunks of each 32-column k-tile, stepping 8 columns at a time and 16 past the others'
    // chunks; each chunk must be column k's tap and channel, or past the filter from k = taps on.
    for (int32_t C : {8, 16, 24, 40, 64, 136})
        for (const auto& [T, R, S] : {std::tuple{1, 1, 1}, {1, 3, 3}, {3, 2, 5}, {1, 1, 7}}) {
            ConvShape g{};
            g.C = C, g.T = T, g.R = R, g.S = S;
            const int32_t taps = T * R * S * C, ktiles = (taps + 31) / 32;
            INFO("C " << C << ", filter " << T << "x" << R << "x" << S);
            for (int32_t first : {0, 2}) {
                PatchColumn at;
                at.advance(g, first * 8);
                int bad = 0;
                for (int32_t kt = 0; kt < ktiles; ++kt) {
                    for (int32_t j = 0; j < 2; ++j) {
                        const int32_t k = kt * 32 + (first + j) * 8, tap = k / C;
                        if (k >= taps) bad += at.t < T;
                        else bad += at.c != k % C || at.s != tap % S || at.r != tap / S % R || at.t != tap / (S * R);
                        at.advance(g, 8);
                    }
                    at.advance(g, 16);
                }
                CHECK(bad == 0);
            }
        }
}
