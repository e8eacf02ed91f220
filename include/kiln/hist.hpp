// Numerics histograms (the seeds' hist_bins / hist_offset / set_hist_buffers / dump_hist_data):
// how the magnitudes of a tensor's values spread over powers of two, to check that 16-bit
// activations and gradients stay inside float16's range. hist(x, tag) counts x's values by
// round(log2|x|) into a new slot of the context's histogram buffer named `tag`; bin i holds the
// values whose rounded log2 is offset + i, the first and last bins also everything below and
// above (0 and NaN fall in the first). Nothing is counted unless hist is called, so a program
// that does not use it pays nothing.
#pragma once
#include <kiln/context.hpp>
#include <kiln/tensor.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

// What dump_hist_data returns: one row of `bins` counts per hist() call since the last dump, in
// call order, and the tag of each row.
struct HistData {
    Tensor counts;                   // (rows, bins) int32 on the context's device
    std::vector<std::string> tags;   // per row
};

// Counts x's values (float32, float16 or bfloat16, any layout) into a new slot named `tag`
// and returns the slot, a (1, bins) int32 tensor. A tag used again takes a new slot.
KILN_API Tensor hist(const Tensor& x, const std::string& tag);

// The bins and their offset for the slots from now on (neon's defaults: 64 bins from 2^-48);
// discards the slots taken so far. bins: 1..4096.
KILN_API void set_hist_buffers(Context& ctx, int64_t bins = 64, int64_t offset = -48);
KILN_API int hist_bins(Context& ctx);
KILN_API int hist_offset(Context& ctx);

// The slots taken since the last dump (or set_hist_buffers), which it discards.
KILN_API HistData dump_hist_data(Context& ctx);

// Named tensors: x's memory gets the tag (neon's tensor names); "" removes it. While the context
// counts named tensors (set_hist_named; off by default), every call that writes into a tagged
// memory (an assignment, a GEMM, a convolution, a layer) counts the tensor it wrote, as
// hist(written, tag) would: on CUDA an assignment's kernels, and a product's or convolution's
// where its kernel stores through the general GEMM epilogue, count the values as they store
// them; other calls count their output after their own work (one more read of it)
// (docs/neon.md lists which). Off, a call pays one flag test.
KILN_API void set_hist_tag(const Tensor& x, const std::string& tag);
KILN_API std::string hist_tag(const Tensor& x);
KILN_API void set_hist_named(Context& ctx, bool on);
KILN_API bool hist_named(Context& ctx);

} // namespace kiln
