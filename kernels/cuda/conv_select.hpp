// The implicit-GEMM convolution kernels' plans as pure functions of the layer and the SM count:
// fprop's tile and walk (fprop_plan) and the weight gradient's tile and split (wgrad_plan), by
// cost models fitted to the H200's kernel times. conv_cuda.cpp asks them for every launch (and
// KILN_AUTOTUNE times their candidates); tests/unit/test_conv_select.cpp checks their choices
// for the seeds' layers without a GPU.
#pragma once
#include <kiln/conv.hpp>

#include <cstdint>
#include <string>

namespace kiln::gemm {

// The implicit GEMM's rows (output positions N M P Q) and its reduction (filter taps T R S C).
int64_t positions_of(const ConvLayer& L);
int64_t taps_of(const ConvLayer& L);

// Whether fprop's kernels take L's patches in halves of 32 channels (sm90/conv_fprop.cuh, the
// `_h` entries): C a multiple of 32 but not of 64, which k-tiles of 64 channels of one tap would
// pad. Those kernels: the one-tile ones and the 256-wide walk on the persistent kernel (into
// plain rows); fprop_plan takes no other walk for such a layer.
bool channel_halves(const ConvLayer& L);
// Whether the walk of the bn-wide tile has a kernel for L's patches (plain_rows as walk_for's):
// every walk but of the 96-wide tile (one tile a block only), and over channel_halves layers only
// the 256-wide persistent one into plain rows.
bool walk_has_kernel(const ConvLayer& L, int bn, bool plain_rows);
// Whether the 96-wide one-tile kernel may run L: 65-96 output channels, the patches by TMA
// (patches_by_tma), not in halves (it has no `_h` entry).
bool tile_96_suits(const ConvLayer& L, bool patches_by_tma);

// The tile: 128 output positions x BN output channels, as many stages as fit beside it; the
// 64-wide one with 4 stages, two blocks an SM, so that one's pipeline fill and epilogue overlap
// the other's multiplies (its tiles are short: 9 k-tiles for 3x3 over 64 channels). The 96-wide
// one (6 stages, one tile a block, not in halves) for 65-96 channels; the 192-wide tile only walks
// (its `entry`, a one-tile kernel's name, is never launched).
struct ConvTile {
    int bn = 0, stages = 0, smem = 0;
    std::string entry;
};
ConvTile tile_of(const ConvLayer& L, int bn);

// The mma.sync fprop's tile (sm80/conv_mma.cuh, every GPU but sm_90): 128 positions x 64
// channels where K <= 64 (a wider tile would leave half its columns idle), else 128, 4 stages.
ConvTile mma_tile(const ConvLayer& L);

// How fprop runs a layer: the tile, and whether a block per SM walks the tiles (conv_walk.cuh)
// instead of one tile a block; or (`transposed`) the walk with the roles exchanged
// (conv_walk_t.cuh: 64 or 128 channels x 256 positions a tile).
struct FpropPlan {
    ConvTile tile;
    bool walk = false;
    double us = 0;   // the model's estimate (0: not modelled, the 64-wide tile of K <= 64)
    bool transposed = false;
};

// The plan by a cost model (conv_select.cpp), on `sms` SMs, the patches brought by TMA or
// gathered, the walk considered where walk_possible (of the 64-wide tile where K <= 64, else of
// the 128-wide one) and the 192- and 256-wide walks where wide_walk_possible (plain_rows as
// walk_for's). The transposed walk where transposed_possible (its host conditions: patches by
// TMA, plain 16-bit rows of the layer's dtype, no histogram), 33-128 channels and a wave of its
// 256-position tiles: at most 64 channels always, 65-128 where the model prefers it; else at
// most 64 channels the 64-wide tile.
FpropPlan fprop_plan(const ConvLayer& L, int sms, bool patches_by_tma, bool walk_possible, bool wide_walk_possible = false,
                     bool plain_rows = true, bool transposed_possible = false);
// Whether the transposed walk suits L by the rule above (not its host conditions).
bool transposed_suits(const ConvLayer& L, int sms);

// The widest one-tile kernel fprop_plan may choose for L (whose stages must fit in shared
// memory; the walk's buffers are checked where it would run).
ConvTile widest_tile(const ConvLayer& L);

// The walk's tile (conv_walk.cuh): the one-tile kernel's width with fewer stages (6, 5, 4 and 3
// for 64, 128, 192 and 256), its staged results and each consumer's bias for two tiles past them. The
// 256-wide tile into plain rows of C of the layer's dtype walks on the GEMM's persistent kernel
// instead (conv_persistent.cuh, `persistent`): 4 stages, its results stored part by part while
// the next tile multiplies.
struct WalkTile {
    int stages = 0, smem = 0;
    bool persistent = false;
    std::string entry;
};
// Whether tile t's walk can run L: more tiles than SMs (the launch also needs the patches by
// TMA, the register epilogue and room for the walk's buffers; the walks wider than 128 no histogram).
bool walk_fits_tiles(const ConvLayer& L, const ConvTile& t, int sms);
// (column_sums: the entry that adds the channel sums, the 256-wide walk's own; plain_rows: C's
// rows are plain, not a strided gradient's grouped rows, and C has the layer's dtype.)
WalkTile walk_for(const ConvLayer& L, const ConvTile& t, bool column_sums = false, bool plain_rows = true);
// The transposed walk's kernel: up to 64 channels one consumer, 4 stages of the filter's 64 rows
// and 256 positions' patches, the staged 256 x 64 tile of O past them; up to 128 two consumers,
// 3 stages of 128 rows and 256 positions, 256 x 128 staged.
WalkTile walk_t_for(const ConvLayer& L);

// The entry a plan launches (with column_sums: adding the channel sums; plain_rows as walk_for's).
std::string describe(const ConvLayer& L, const FpropPlan& plan, bool column_sums = false, bool plain_rows = true);

// A strided gradient's phases in one walk (conv_walk.cuh, the phased entries): a block takes an
// item (a tile of one phase's output) and multiplies its tile of every phase in turn. `L`: any
// phase's layer (they share output positions and channels); `taps`: the phases' filter taps
// summed (the k-tiles an item multiplies, with L.C channels each); `phases`: how many. The width
// (128, or 256 over more than 128 output channels) by the walk's model: items per SM x (the
// item's k-tiles x a k-tile's time + a tile's fixed cost per phase), the walk's terms into
// grouped rows (fprop_plan). smem: the walk's (walk_for, grouped rows).
struct PhasedWalk {
    int bn = 0, stages = 0, smem = 0;
    double us = 0;
    std::string entry;
};
PhasedWalk phased_walk(const ConvLayer& L, int64_t taps, int phases, int sms);

// The weight gradient's tile width, stages and split: slices of the output positions (their
// float32 planes added by the GEMM's reduction kernel), or the balanced split (`runs` > 0: every
// tile's k-tiles in one sequence cut into that many equal runs, a block an SM; 128 and 256
// wide).
struct WgradPlan {
    int bn = 0, stages = 0, smem = 0, splits = 1, runs = 0;
    std::string entry;
};
WgradPlan wgrad_plan_of(const ConvLayer& L, int bn, int splits);
WgradPlan wgrad_balanced_of(const ConvLayer& L, int bn, int sms);
std::string describe(const WgradPlan& w);
// How a caller limits the weight gradient's plans (KILN_CONV_KERNEL=balanced / sliced).
enum class WgradSplit { Any, Balanced, Sliced };
// The model's cheapest plan on `sms` SMs, over every width, or of width only_bn.
WgradPlan wgrad_plan(const ConvLayer& L, int sms, int only_bn = 0, WgradSplit split = WgradSplit::Any);

// The GEMM's selector has no tile narrower than 128 columns that walks its tiles, and a
// pointwise layer's product has one to a few k-tiles a tile: its output channels at most 128
// run faster on the implicit kernel's 64- and 128-wide tiles (ResNet-50's 64-channel 1x1
// layers at 56x56 on the H200: 0.084 ms against the GEMM's 0.126; 256 channels into 128, 0.17
// against 0.23), while at 256 and more the GEMM's wide tiles win (64 into 256: 0.22 against
// 0.16). Under a wave of row tiles both are a launch or two. Whether the implicit kernel
// should multiply pointwise layer L (a fprop, or a pointwise gradient as a convolution) on
// `sms` SMs. into_view: L is a strided 1x1's gradient, which the implicit kernel stores into
// the gradient's strided view while the GEMM's product is copied there after it, so any width
// takes it (ResNet-50's 1x1 stride-2 layers into 256-1024 channels).
bool pointwise_prefers_implicit(const ConvLayer& L, int sms, bool into_view = false);

// A layer whose channels are a multiple of 8 but not of 64 (Overfeat's second layer, 96) runs
// over its channels padded with zeros to the next multiple of 64, whose patches TMA brings
// whole, where that adds at most a third to the taps (16-bit, a position's padded channels
// within the fold's staging): those channels, or 0 where it does not. The update pads wherever
// its kernel then takes the layer; fprop only where the cost model puts the padded layer and
// pad_copy_us under the layer itself, whose patches the kernels gather 16 bytes at a time
// (a 256-wide tile gathering Overfeat's 38 k-tiles, about 190 us on the H200, against 50 by
// TMA padded, about 140); never where channel_halves, whose patches TMA brings in halves (no
// k-tile of padding: the padded layer would only add taps and the copy).
int64_t tma_padded_channels(const ConvLayer& L);
// The copy that pads L's image to `channels`: the padded image written, then read again, and
// the image read, at HBM's pace.
double pad_copy_us(const ConvLayer& L, int64_t channels);

} // namespace kiln::gemm
