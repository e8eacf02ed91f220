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

// The tile: 128 output positions x BN output channels, as many stages as fit beside it; the
// 64-wide one with 4 stages, two blocks an SM, so that one's pipeline fill and epilogue overlap
// the other's multiplies (its tiles are short: 9 k-tiles for 3x3 over 64 channels).
struct ConvTile {
    int bn = 0, stages = 0, smem = 0;
    std::string entry;
};
ConvTile tile_of(const ConvLayer& L, int bn);

// How fprop runs a layer: the tile, and whether a block per SM walks the tiles (conv_walk.cuh)
// instead of one tile a block.
struct FpropPlan {
    ConvTile tile;
    bool walk = false;
    double us = 0;   // the model's estimate (0: not modelled, the 64-wide tile of K <= 64)
};

// The plan by a cost model (conv_select.cpp), on `sms` SMs, the patches brought by TMA or
// gathered, the walk considered where walk_possible.
FpropPlan fprop_plan(const ConvLayer& L, int sms, bool patches_by_tma, bool walk_possible);

// The widest one-tile kernel fprop_plan may choose for L (whose stages must fit in shared
// memory; the walk's buffers are checked where it would run).
ConvTile widest_tile(const ConvLayer& L);

// The walk's tile (conv_walk.cuh): the one-tile kernel's width (64 or 128: the 256-wide
// accumulators and the walk's state spilled) with fewer stages, its staged results and the
// bias past them.
struct WalkTile {
    int stages = 0, smem = 0;
    std::string entry;
};
// Whether tile t's walk can run L: more tiles than SMs and a tile 64 or 128 wide (the launch
// also needs the patches by TMA, the register epilogue and room for the walk's buffers).
bool walk_fits_tiles(const ConvLayer& L, const ConvTile& t, int sms);
WalkTile walk_for(const ConvLayer& L, const ConvTile& t);

// The entry a plan launches.
std::string describe(const ConvLayer& L, const FpropPlan& plan);

// The weight gradient's tile width, stages and split (slices of the output positions, their
// float32 planes added by the GEMM's reduction kernel).
struct WgradPlan {
    int bn = 0, stages = 0, smem = 0, splits = 1;
    std::string entry;
};
WgradPlan wgrad_plan_of(const ConvLayer& L, int bn, int splits);
std::string describe(const WgradPlan& w);
// The model's cheapest plan on `sms` SMs, over every width, or of width only_bn.
WgradPlan wgrad_plan(const ConvLayer& L, int sms, int only_bn = 0);

} // namespace kiln::gemm
