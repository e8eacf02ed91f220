// The host side of the CUDA kernels: which kernel shape a Kernel gets, how its arguments are
// packed, and how each launch is configured for the sizes at hand (cuda_codegen.hpp documents
// the conventions; the device side is cuda_codegen.cpp).
#include "codegen/cuda/cuda_codegen.hpp"
#include "codegen/cuda/cuda_internal.hpp"

#include "ir/error.hpp"

#include <algorithm>
#include <cstring>

namespace kiln::codegen {

namespace {

int64_t product_of(const kir::Kernel& k, const kir::LaunchArgs& a, bool reduced) {
    int64_t n = 1;
    for (int d = 0; d < k.rank; ++d)
        if (k.reduced[d] == reduced) n *= a.sizes[d];
    return n;
}

size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

int64_t pow2_ceil(int64_t x) {
    int64_t p = 1;
    while (p < x) p *= 2;
    return p;
}

uint32_t clamp_grid(int64_t blocks, int64_t multiple) {
    const int64_t cap = kCudaMaxGrid / multiple * multiple;
    return (uint32_t)std::min(blocks, cap);
}

} // namespace

const char* cuda_shape_name(CudaShape s) {
    switch (s) {
    case CudaShape::Elementwise: return "elementwise";
    case CudaShape::Row: return "row reduction";
    case CudaShape::Column: return "column reduction";
    case CudaShape::Full: return "full reduction";
    }
    return "?";
}

// A reduction is a column reduction when walking its parallel points, not its reduced ones,
// is what reads memory contiguously.
CudaShape cuda_shape(const kir::Kernel& k) {
    if (k.full_reduce) return CudaShape::Full;
    if (!k.has_reduction()) return CudaShape::Elementwise;
    bool along_p = false, along_r = false;
    for (const kir::Buffer& b : k.buffers)
        for (int d = 0; d < k.rank; ++d)
            if (b.layout[d] == kir::StrideKind::One) (k.reduced[d] ? along_r : along_p) = true;
    return along_p && !along_r ? CudaShape::Column : CudaShape::Row;
}

namespace detail {

std::vector<int> row_cache_slots(const kir::Kernel& k) {
    std::vector<int> passes(k.buffers.size(), 0);
    for (const kir::Block& b : k.blocks) {
        if (!b.loop) continue;
        std::vector<bool> seen(k.buffers.size(), false);
        for (int id : b.instrs)
            if (k.instrs[id].op == kir::Op::Load) seen[k.instrs[id].index] = true;
        for (size_t i = 0; i < seen.size(); ++i) passes[i] += seen[i];
    }
    std::vector<int> slot(k.buffers.size(), -1);
    int next = 0;
    for (size_t i = 0; i < passes.size(); ++i)
        if (passes[i] >= 2) slot[i] = next++;
    return slot;
}

int row_vector_width(const kir::Kernel& k) {
    int rdim = -1, nreduced = 0;
    for (int d = 0; d < k.rank; ++d)
        if (k.reduced[d]) rdim = d, ++nreduced;
    if (nreduced != 1) return 1;
    size_t widest = 0;
    for (const kir::Block& b : k.blocks) {
        if (!b.loop) continue;
        for (int id : b.instrs) {
            const kir::Instr& in = k.instrs[id];
            if (in.op == kir::Op::Load && k.buffers[in.index].layout[rdim] == kir::StrideKind::One)
                widest = std::max(widest, dtype_size(k.buffers[in.index].dtype));
        }
    }
    return widest ? (int)(16 / widest) : 1;
}

int row_cache_slot_count(const kir::Kernel& k) {
    int n = 0;
    for (int s : row_cache_slots(k)) n += s >= 0;
    return n;
}

} // namespace detail

CudaArgsLayout cuda_args_layout(const kir::Kernel& k) {
    const size_t r = std::max(k.rank, 1), nb = k.buffers.size(), s = std::max<size_t>(nb * k.rank, 1);
    CudaArgsLayout l;
    l.sizes = 0;
    l.buffers = 8 * r;
    l.strides = l.buffers + 8 * nb;
    l.fparams = l.strides + 8 * s;
    l.iparams = l.fparams + 4 * std::max(k.num_fparams, 1);
    l.total = align_up(l.iparams + 4 * std::max(k.num_iparams, 1), 8);
    return l;
}

std::vector<uint8_t> pack_cuda_args(const kir::Kernel& k, const kir::LaunchArgs& a) {
    std::vector<uint8_t> bytes;
    pack_cuda_args(k, a, bytes);
    return bytes;
}

void pack_cuda_args(const kir::Kernel& k, const kir::LaunchArgs& a, std::vector<uint8_t>& bytes) {
    const size_t nb = k.buffers.size();
    KILN_CHECK_INTERNAL(a.sizes.size() == (size_t)k.rank && a.buffers.size() == nb &&
                            a.strides.size() == nb * k.rank && a.fparams.size() == (size_t)k.num_fparams &&
                            a.iparams.size() == (size_t)k.num_iparams,
                        "pack_cuda_args: launch arguments of {} do not match it (sizes {}/{}, buffers {}/{}, "
                        "strides {}/{}, fparams {}/{}, iparams {}/{})",
                        k.name, a.sizes.size(), k.rank, a.buffers.size(), nb, a.strides.size(), nb * k.rank,
                        a.fparams.size(), k.num_fparams, a.iparams.size(), k.num_iparams);
    static_assert(sizeof(void*) == 8, "the Args layout assumes 64-bit device pointers");
    const CudaArgsLayout l = cuda_args_layout(k);
    bytes.assign(l.total, 0);
    auto put = [&](size_t off, const void* src, size_t n) {
        if (n) std::memcpy(bytes.data() + off, src, n);
    };
    put(l.sizes, a.sizes.data(), 8 * a.sizes.size());
    put(l.buffers, a.buffers.data(), 8 * a.buffers.size());
    put(l.strides, a.strides.data(), 8 * a.strides.size());
    put(l.fparams, a.fparams.data(), 4 * a.fparams.size());
    put(l.iparams, a.iparams.data(), 4 * a.iparams.size());
}

CudaLaunchPlan plan_cuda_launch(const kir::Kernel& k, const kir::LaunchArgs& a, const CudaDeviceCaps& dev) {
    KILN_CHECK_INTERNAL(a.sizes.size() == (size_t)k.rank, "plan_cuda_launch: {} sizes for rank {}", a.sizes.size(),
                        k.rank);
    CudaLaunchPlan plan;
    const int64_t np = product_of(k, a, false), nr = product_of(k, a, true);
    switch (cuda_shape(k)) {
    case CudaShape::Full: {
        const int64_t parts = std::clamp<int64_t>((nr + kCudaPointsPerPartial - 1) / kCudaPointsPerPartial, 1,
                                                  kCudaMaxPartials);
        plan.num_partials = (int)parts;
        plan.scratch_bytes = (size_t)parts * 8 * k.accums.size();
        plan.launches = {{k.name + "_partial", (uint32_t)parts, kCudaBlockSize, 1, (int)parts, 0},
                         {k.name + "_final", 1, kCudaBlockSize, 1, (int)parts, 0}};
        break;
    }
    case CudaShape::Row: {
        // About 32 elements per thread; more threads while the GPU would otherwise idle (few
        // short rows); a cluster of blocks (sm_90) for long rows, and as many as it takes for
        // the row to fit the shared-memory cache of the passes after the first.
        const int64_t slots = detail::row_cache_slot_count(k);
        const int64_t max_g = (int64_t)kCudaMaxRowBlock * (dev.sm >= 90 ? kCudaMaxCluster : 1);
        const int64_t busy = (int64_t)dev.multiprocessors * 1024;
        int64_t g = std::min(pow2_ceil((nr + 31) / 32), max_g);
        while (g < kCudaMaxRowBlock && g < pow2_ceil(nr) && np * g < busy) g *= 2;
        const int64_t v = detail::row_vector_width(k);
        auto cache_bytes = [&](int64_t g) {
            const int64_t block = std::max<int64_t>(std::min<int64_t>(g, kCudaMaxRowBlock), kCudaBlockSize);
            return (size_t)(slots * block * ((nr + g * v - 1) / (g * v) * v) * 4);
        };
        while (slots && cache_bytes(g) > dev.max_shared && g < max_g) g *= 2;
        const int64_t block = g >= kCudaBlockSize ? std::min<int64_t>(g, kCudaMaxRowBlock) : kCudaBlockSize;
        const int64_t cluster = g > block ? g / block : 1;
        const int64_t rows_per_block = g < block ? block / g : 1;
        plan.threads_per_row = (int)g;
        CudaLaunch l{k.name, np ? clamp_grid((np + rows_per_block - 1) / rows_per_block * cluster, cluster) : 0,
                     (uint32_t)block, (uint32_t)cluster, (int)g};
        // Too long even for a whole cluster: every pass reads the row from memory.
        l.shared_bytes = cache_bytes(g) <= dev.max_shared ? cache_bytes(g) : 0;
        plan.launches = {l};
        break;
    }
    case CudaShape::Column: {
        const int64_t width = detail::kColumnWidth;
        plan.launches = {{k.name, clamp_grid((np + width - 1) / width, 1),
                          (uint32_t)(detail::kColumnWidth * detail::kColumnSlices), 1, 0, 0}};
        break;
    }
    case CudaShape::Elementwise:
        plan.launches = {{k.name, clamp_grid((np + kCudaBlockSize - 1) / kCudaBlockSize, 1), kCudaBlockSize, 1, 0, 0}};
        break;
    }
    return plan;
}

} // namespace kiln::codegen
