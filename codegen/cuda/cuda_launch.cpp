// The host side of the CUDA kernels: which kernel shape a Kernel gets, how its arguments are
// packed, and how each launch is configured for the sizes at hand (cuda_codegen.hpp documents
// the conventions; the device side is cuda_codegen.cpp).
#include "codegen/cuda/cuda_codegen.hpp"
#include "codegen/cuda/cuda_internal.hpp"

#include "ir/error.hpp"

#include <fmt/format.h>

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

// How far G threads of a row in blocks of `block` threads reach (the row entry's module).
CudaReach row_reach(int64_t g, int64_t block) {
    return g <= 32 ? CudaReach::Warp : g <= block ? CudaReach::Block : CudaReach::Cluster;
}

CudaLaunch launch_of(std::string entry, uint32_t grid, uint32_t block, uint32_t cluster, int param) {
    CudaLaunch l;
    l.entry = std::move(entry);
    l.grid = grid;
    l.block = block;
    l.cluster = cluster;
    l.param = param;
    return l;
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

namespace {
// Whether instructions x and y compute the same value at the same point: the same operation on
// the same leaves (loads, parameters, constants) through the same arithmetic.
bool same_value(const kir::Kernel& k, int x, int y) {
    if (x == y) return true;
    if (x < 0 || y < 0) return false;
    const kir::Instr& a = k.instrs[x];
    const kir::Instr& b = k.instrs[y];
    if (a.op != b.op || a.type != b.type || a.index != b.index || a.aux != b.aux || a.iimm != b.iimm ||
        std::memcmp(&a.fimm, &b.fimm, sizeof(a.fimm)) != 0)
        return false;
    if (a.op == kir::Op::Gather || a.op == kir::Op::Coord || a.op == kir::Op::LinearId || a.op == kir::Op::AccResult)
        return false;
    for (int i = 0; i < 3; ++i)
        if (!same_value(k, a.a[i], b.a[i])) return false;
    return true;
}
} // namespace

namespace {
// k's first Loop block (-1: none) and the buffers it loads.
int first_loop(const kir::Kernel& k, std::vector<bool>& loads) {
    loads.assign(k.buffers.size(), false);
    for (size_t bi = 0; bi < k.blocks.size(); ++bi) {
        if (!k.blocks[bi].loop) continue;
        for (int id : k.blocks[bi].instrs)
            if (k.instrs[id].op == kir::Op::Load) loads[k.instrs[id].index] = true;
        return (int)bi;
    }
    return -1;
}

// The folds a reduction kernel's passes after its first Loop block (`first`, which loads
// `first_loads`) allow (row_folds' kinds), whatever its shape; every accumulator of a block
// folds or none does.
std::vector<RowFold> candidate_folds(const kir::Kernel& k, int first, const std::vector<bool>& first_loads) {
    using kir::Op;
    std::vector<RowFold> out;
    for (size_t bi = first + 1; bi < k.blocks.size(); ++bi) {
        const kir::Block& b = k.blocks[bi];
        if (!b.loop || !b.stores.empty() || b.accums.empty()) continue;
        std::vector<bool> in_block(k.instrs.size(), false);
        for (int id : b.instrs) in_block[id] = true;
        // Row-varying: depends on a load, a coordinate or a gather; acc-free: no accumulator result.
        std::vector<char> varying(k.instrs.size(), 0), acc(k.instrs.size(), 0);
        for (int id : b.instrs) {
            const kir::Instr& in = k.instrs[id];
            varying[id] = in.op == Op::Load || in.op == Op::Gather || in.op == Op::Coord || in.op == Op::LinearId;
            acc[id] = in.op == Op::AccResult;
            for (int o : in.a)
                if (o >= 0) varying[id] |= varying[o], acc[id] |= acc[o];
        }
        std::vector<RowFold> folds;
        for (int ai : b.accums) {
            const kir::Accum& ac = k.accums[ai];
            if (ac.kind != kir::AccKind::Sum || ac.type != ComputeType::F32) break;
            const kir::Instr& f = k.instrs[ac.value];
            RowFold fold;
            int dev = -1;   // the instruction of v - k
            if (f.op == Op::Mul && f.a[0] == f.a[1]) fold.kind = RowFold::Moments, dev = f.a[0];
            else if (f.op == Op::Exp && f.type == ComputeType::F32) fold.kind = RowFold::ExpSum, dev = f.a[0];
            else break;
            const kir::Instr& d = k.instrs[dev];
            if (d.op != Op::Sub || d.type != ComputeType::F32) break;
            int v = -1, s = -1;
            for (int side = 0; side < 2; ++side)
                if (varying[d.a[side]] && !acc[d.a[side]] && !varying[d.a[1 - side]]) v = d.a[side], s = d.a[1 - side];
            if (v < 0) break;
            // v's instructions: loads of buffers the first pass reads, arithmetic, parameters.
            std::vector<bool> need(k.instrs.size(), false);
            need[v] = true;
            bool ok = true;
            for (auto it = b.instrs.rbegin(); it != b.instrs.rend(); ++it) {
                if (!need[*it]) continue;
                const kir::Instr& in = k.instrs[*it];
                if (in.op == Op::Gather || in.op == Op::Coord || in.op == Op::LinearId || in.op == Op::AccResult ||
                    (in.op == Op::Load && !first_loads[in.index]))
                    ok = false;
                for (int o : in.a) {
                    if (o < 0) continue;
                    if (!in_block[o]) ok = false;
                    else need[o] = true;
                }
            }
            if (!ok) break;
            fold.block = (int)bi, fold.accum = ai, fold.value = v, fold.shift = s;
            for (int id : b.instrs)
                if (need[id]) fold.chain.push_back(id);
            const kir::AccKind twin = fold.kind == RowFold::ExpSum ? kir::AccKind::Max : kir::AccKind::Sum;
            for (int fa : k.blocks[first].accums) {
                const kir::Accum& m = k.accums[fa];
                if (m.kind == twin && m.type == ComputeType::F32 && same_value(k, m.value, v)) fold.shared = fa;
            }
            // A sum of exponentials only as softmax has it, exp(v - max(v)) with that max the first
            // pass's: then k is the fold's own m, and every special value (-inf, +inf, NaN rows)
            // comes out as the two rounds would give it.
            if (fold.kind == RowFold::ExpSum &&
                (d.a[0] != v || fold.shared < 0 || k.instrs[s].op != Op::AccResult || k.instrs[s].index != fold.shared))
                break;
            folds.push_back(std::move(fold));
        }
        if (folds.size() == b.accums.size()) out.insert(out.end(), folds.begin(), folds.end());
    }
    // An accumulator shared by two folds is taken by the first.
    for (size_t i = 0; i < out.size(); ++i)
        for (size_t j = 0; j < i; ++j)
            if (out[i].shared >= 0 && out[i].shared == out[j].shared) out[i].shared = -1;
    return out;
}
} // namespace

std::vector<RowFold> row_folds(const kir::Kernel& k) {
    using kir::Op;
    if (k.full_reduce || cuda_shape(k) != CudaShape::Row) return {};
    std::vector<bool> first_loads;
    const int first = first_loop(k, first_loads);
    if (first < 0) return {};
    std::vector<RowFold> out = candidate_folds(k, first, first_loads);
    // Moments that save no round only where the fold leaves one pass over the row: when a
    // later pass reads the row again it is kept in shared memory, the pass folded away costs
    // little, and the first pass's extra arithmetic between its loads costs more.
    const std::vector<bool> folded = folded_blocks(k, out);
    bool reread = false;
    for (size_t bi = first + 1; bi < k.blocks.size(); ++bi) {
        if (!k.blocks[bi].loop || folded[bi]) continue;
        for (int id : k.blocks[bi].instrs)
            if (k.instrs[id].op == Op::Load && first_loads[k.instrs[id].index]) reread = true;
    }
    if (!reread) return out;
    // Without those moment folds, their blocks are passes again: every accumulator of a block
    // folds or none does. A fold that shares the mean's sum is kept in every dtype: its one
    // round for mean and variance saves more than the first pass's extra arithmetic costs.
    std::vector<bool> has_moments(k.blocks.size(), false);
    for (const RowFold& f : out)
        has_moments[f.block] = has_moments[f.block] || (f.kind == RowFold::Moments && f.shared < 0);
    std::vector<RowFold> kept;
    for (RowFold& f : out)
        if (!has_moments[f.block]) kept.push_back(std::move(f));
    return kept;
}

std::vector<bool> folded_blocks(const kir::Kernel& k, const std::vector<RowFold>& folds) {
    std::vector<bool> folded(k.blocks.size(), false);
    for (const RowFold& f : folds) folded[f.block] = true;
    return folded;
}

std::vector<int> shift_chain(const kir::Kernel& k, int shift) {
    std::vector<bool> need(k.instrs.size(), false);
    need[shift] = true;
    for (int id = shift; id >= 0; --id)
        if (need[id])
            for (int o : k.instrs[id].a)
                if (o >= 0) need[o] = true;
    std::vector<int> chain;
    for (int id = 0; id <= shift; ++id)
        if (need[id]) chain.push_back(id);
    return chain;
}

std::vector<RowFold> column_folds(const kir::Kernel& k) {
    if (k.full_reduce || cuda_shape(k) != CudaShape::Column || k.blocks.empty() || !k.blocks[0].loop) return {};
    std::vector<bool> first_loads;
    std::vector<RowFold> out = candidate_folds(k, first_loop(k, first_loads), first_loads);
    for (const RowFold& f : out) {
        if (f.kind != RowFold::Moments) return {};
        // k from the first pass's results and parameters alone: computed once per column.
        for (int id : shift_chain(k, f.shift))
            if (k.instrs[id].op == kir::Op::Load || k.instrs[id].op == kir::Op::Gather) return {};
    }
    const std::vector<bool> folded = folded_blocks(k, out);
    for (size_t bi = 1; bi < k.blocks.size(); ++bi)
        if (k.blocks[bi].loop && !folded[bi]) return {};
    return out;
}

bool varies_along_reduced(const kir::Kernel& k, size_t buf) {
    for (int d = 0; d < k.rank; ++d)
        if (k.reduced[d] && k.buffers[buf].layout[d] != kir::StrideKind::Zero) return true;
    return false;
}

int innermost_parallel_dim(const kir::Kernel& k) {
    int q = -1;
    for (int d = 0; d < k.rank; ++d)
        if (!k.reduced[d]) q = d;
    return q;
}

std::vector<int> row_cache_slots(const kir::Kernel& k) { return row_cache_slots(k, row_folds(k)); }

std::vector<int> row_cache_slots(const kir::Kernel& k, const std::vector<RowFold>& folds) {
    std::vector<int> passes(k.buffers.size(), 0);
    const std::vector<bool> folded = folded_blocks(k, folds);
    for (size_t bi = 0; bi < k.blocks.size(); ++bi) {
        const kir::Block& b = k.blocks[bi];
        if (!b.loop || folded[bi]) continue;
        std::vector<bool> seen(k.buffers.size(), false);
        for (int id : b.instrs)
            if (k.instrs[id].op == kir::Op::Load) seen[k.instrs[id].index] = true;
        for (size_t i = 0; i < seen.size(); ++i) passes[i] += seen[i];
    }
    // A buffer the same along every reduced dim is read once per row, not cached.
    std::vector<int> slot(k.buffers.size(), -1);
    int next = 0;
    for (size_t i = 0; i < passes.size(); ++i)
        if (passes[i] >= 2 && varies_along_reduced(k, i)) slot[i] = next++;
    return slot;
}

bool row_later_reads_memory(const kir::Kernel& k, const std::vector<int>& slot, int64_t nr) {
    return row_later_reads_memory(k, slot, row_folds(k), nr);
}

bool row_later_reads_memory(const kir::Kernel& k, const std::vector<int>& slot, const std::vector<RowFold>& folds,
                            int64_t nr) {
    const std::vector<bool> folded = folded_blocks(k, folds);
    std::vector<bool> counted(k.buffers.size(), false);
    bool first = true;
    int64_t bytes = 0;
    for (size_t bi = 0; bi < k.blocks.size(); ++bi) {
        const kir::Block& b = k.blocks[bi];
        if (!b.loop || folded[bi]) continue;
        if (!first)
            for (int id : b.instrs) {
                const int buf = k.instrs[id].index;
                if (k.instrs[id].op != kir::Op::Load || slot[buf] >= 0 || counted[buf] ||
                    !varies_along_reduced(k, (size_t)buf))
                    continue;
                counted[buf] = true;
                for (int d = 0; d < k.rank; ++d)
                    if (!k.reduced[d] && k.buffers[buf].layout[d] != kir::StrideKind::Zero) return true;
                bytes += (int64_t)dtype_size(k.buffers[buf].dtype);
            }
        first = false;
    }
    return bytes * nr >= (32 << 10);
}

int column_width(const kir::Kernel& k) {
    size_t narrowest = 4;
    for (const kir::Block& b : k.blocks)
        if (b.loop)
            for (int id : b.instrs)
                if (k.instrs[id].op == kir::Op::Load) narrowest = std::min(narrowest, dtype_size(k.buffers[k.instrs[id].index].dtype));
    return 32 * (int)(4 / narrowest);
}

int column_vector_width(const kir::Kernel& k) {
    if (cuda_shape(k) != CudaShape::Column || has_wide(k)) return 0;
    const int q = innermost_parallel_dim(k);
    if (q < 0) return 0;
    for (const kir::Buffer& b : k.buffers)
        if (b.layout[q] != kir::StrideKind::One && b.layout[q] != kir::StrideKind::Zero) return 0;
    size_t widest = 0;
    for (const kir::Block& b : k.blocks) {
        if (b.loop && !b.stores.empty()) return 0;
        for (int id : b.instrs) {
            const kir::Instr& in = k.instrs[id];
            if (in.op == kir::Op::Gather || in.op == kir::Op::Coord || in.op == kir::Op::LinearId) return 0;
            if (!b.loop || in.op != kir::Op::Load || k.buffers[in.index].layout[q] != kir::StrideKind::One) continue;
            if (varies_along_reduced(k, (size_t)in.index)) widest = std::max(widest, dtype_size(k.buffers[in.index].dtype));
        }
    }
    return widest ? (int)std::min<size_t>(16 / widest, 8) : 0;
}

int row_vector_width(const kir::Kernel& k) {
    int rdim = -1, nreduced = 0;
    for (int d = 0; d < k.rank; ++d)
        if (k.reduced[d]) rdim = d, ++nreduced;
    if (nreduced != 1 || has_wide(k)) return 1;
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

bool row_register_entry(const kir::Kernel& k) {
    if (k.full_reduce || cuda_shape(k) != CudaShape::Row) return false;
    const std::vector<RowFold> folds = row_folds(k);
    return row_register_entry(k, row_cache_slots(k, folds));
}

bool row_register_entry(const kir::Kernel& k, const std::vector<int>& slot) {
    const int v = row_vector_width(k);
    if (v < 2 || k.full_reduce || cuda_shape(k) != CudaShape::Row) return false;
    int rdim = 0;
    while (!k.reduced[rdim]) ++rdim;
    size_t bytes = 0;   // of a group of every cached buffer
    for (size_t b = 0; b < slot.size(); ++b) {
        if (slot[b] < 0) continue;
        if (k.buffers[b].layout[rdim] != kir::StrideKind::One || group_words(k.buffers[b].dtype, v).words == 0) return false;
        bytes += (size_t)v * dtype_size(k.buffers[b].dtype);
    }
    return bytes > 0 && bytes <= 32;
}

int row_register_blocks(const kir::Kernel& k, const std::vector<int>& slot) {
    const int v = row_vector_width(k);
    size_t bytes = 0;
    for (size_t b = 0; b < slot.size(); ++b)
        if (slot[b] >= 0) bytes += (size_t)v * dtype_size(k.buffers[b].dtype);
    int streams = 0;   // other buffers read along the row, once for each pass that reads them
    for (const kir::Block& b : k.blocks)
        if (b.loop) {
            std::vector<bool> seen(k.buffers.size(), false);
            for (int id : b.instrs) {
                const kir::Instr& in = k.instrs[id];
                if (in.op != kir::Op::Load || slot[in.index] >= 0 || seen[in.index] || !varies_along_reduced(k, (size_t)in.index))
                    continue;
                seen[in.index] = true;
                ++streams;
            }
        }
    return bytes <= 16 && streams <= 1 ? 3 : 2;
}

bool has_wide(const kir::Kernel& k) {
    for (const kir::Buffer& b : k.buffers)
        if (is_wide(b.dtype) || b.dtype == DType::Int16 || b.dtype == DType::UInt16) return true;
    for (const kir::Instr& in : k.instrs)
        if (is_wide(in.type)) return true;
    return false;
}

int acc_record_slot(const kir::Kernel& k) {
    for (const kir::Accum& a : k.accums)
        if (is_wide(a.type)) return 16;
    return 8;
}

int elementwise_vector_width(const kir::Kernel& k) {
    if (k.rank < 1 || has_wide(k)) return 1;
    const int inner = k.rank - 1;
    std::vector<bool> used(k.buffers.size(), false), stored(k.buffers.size(), false);
    for (const kir::Instr& in : k.instrs) {
        if (in.op == kir::Op::Gather || in.op == kir::Op::Coord) return 1;
        if (in.op == kir::Op::Load) used[in.index] = true;
    }
    for (const kir::Block& b : k.blocks)
        for (const kir::Store& st : b.stores) used[st.buffer] = stored[st.buffer] = true;
    size_t widest = 0, narrowest = 16;
    for (size_t b = 0; b < k.buffers.size(); ++b) {
        if (!used[b]) continue;
        const kir::StrideKind l = k.buffers[b].layout[inner];
        if (l == kir::StrideKind::Any) return 1;
        // (Rank 1: a stored scalar, the grid's one element. Past rank 1 a store broadcast along
        // the innermost axis has no word to write.)
        if (l == kir::StrideKind::Zero && stored[b] && k.rank > 1) return 1;
        if (l == kir::StrideKind::One) {
            widest = std::max(widest, dtype_size(k.buffers[b].dtype));
            narrowest = std::min(narrowest, dtype_size(k.buffers[b].dtype));
            // (Another axis of stride 1 would start words off their boundaries.)
            for (int d = 0; d < inner; ++d)
                if (k.buffers[b].layout[d] == kir::StrideKind::One) return 1;
        }
    }
    if (widest == 0 && k.rank > 1) return 1;
    if (widest == 0) return 16;
    // 16 bytes of the narrowest buffer a thread (float16 activations take 8 elements beside
    // float32 per-channel vectors, which take two words), up to 32 bytes of the widest.
    return (int)std::min(16 / narrowest, 32 / widest);
}

size_t row_cache_bytes(const kir::Kernel& k, const std::vector<int>& slot, int64_t elements) {
    size_t total = 0;
    for (size_t b = 0; b < slot.size(); ++b)
        if (slot[b] >= 0) total += align_up((size_t)elements * dtype_size(k.buffers[b].dtype), 16);
    return total;
}

} // namespace detail

bool cuda_launch_aligned(const kir::Kernel& k, const kir::LaunchArgs& a, const CudaLaunch& l) {
    const int64_t v = l.aligned_width;
    const bool row = cuda_shape(k) == CudaShape::Row;
    int q = detail::innermost_parallel_dim(k);
    if (row)
        for (int d = 0; d < k.rank; ++d)
            if (k.reduced[d]) q = d;
    if (v < 2 || q < 0 || a.sizes[q] % v) return false;
    // The register entry's thread holds kRowRegisterGroups groups of the row at most.
    if (row && a.sizes[q] > (int64_t)detail::kRowRegisterGroups * l.aligned_param * v) return false;
    for (size_t b = 0; b < k.buffers.size(); ++b) {
        if (k.buffers[b].layout[q] != kir::StrideKind::One) continue;
        if ((uintptr_t)a.buffers[b] % (v * dtype_size(k.buffers[b].dtype))) return false;
        for (int d = 0; d < k.rank; ++d)
            if (d != q && a.sizes[d] > 1 && a.strides[b * k.rank + d] % v) return false;
    }
    return true;
}

size_t cuda_hist_shared_bytes(const kir::Kernel& k) {
    return 4 * (size_t)k.hist.bins;
}

CudaArgsLayout cuda_args_layout(const kir::Kernel& k) {
    const size_t r = std::max(k.rank, 1), nb = k.buffers.size(), s = std::max<size_t>(nb * k.rank, 1);
    CudaArgsLayout l;
    l.sizes = 0;
    l.buffers = 8 * r;
    l.strides = l.buffers + 8 * nb;
    l.fparams = l.strides + 8 * s;
    l.iparams = l.fparams + 4 * std::max(k.num_fparams, 1);
    l.total = align_up(l.iparams + 4 * std::max(k.num_iparams, 1), 8);
    if (k.hist.bins > 0) {
        l.hist = l.total;
        l.total += 8;
    }
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
    if (k.hist.bins > 0) {
        KILN_CHECK_INTERNAL(a.hist != nullptr, "pack_cuda_args: {} counts a histogram, but the launch gives no counters",
                            k.name);
        put(l.hist, &a.hist, 8);
    }
}

bool cuda_offsets_fit_32(const kir::Kernel& k, const kir::LaunchArgs& a) {
    if (a.sizes.size() != (size_t)k.rank || a.strides.size() != k.buffers.size() * k.rank) return false;   // not known
    for (size_t b = 0; b < k.buffers.size(); ++b) {
        int64_t reach = 0;
        for (int d = 0; d < k.rank; ++d) {
            const kir::StrideKind l = k.buffers[b].layout[d];
            if (l == kir::StrideKind::Zero || a.sizes[d] <= 1) continue;
            const int64_t st = l == kir::StrideKind::One ? 1 : a.strides[b * k.rank + d];
            if (st > INT32_MAX || st < -INT32_MAX || a.sizes[d] > INT32_MAX) return false;
            reach += (a.sizes[d] - 1) * (st < 0 ? -st : st);   // each factor < 2^31: no overflow
            if (reach > INT32_MAX) return false;
        }
    }
    return true;
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
        plan.scratch_bytes = (size_t)parts * detail::acc_record_slot(k) * k.accums.size();
        plan.counters = 1;   // the blocks that have recorded their parts
        plan.launches = {launch_of(k.name, (uint32_t)parts, kCudaBlockSize, 1, (int)parts)};
        break;
    }
    case CudaShape::Row: {
        // Threads per row G (a power of two): few, so that each thread walks a long stretch of
        // the row with its loads in flight all along, and the reduction across the row's threads
        // (shuffles, and past a warp block barriers) is paid by much work. Nothing cached: 64
        // groups of V of the widest loaded element per thread. Cached: 8 groups while that keeps
        // G within a warp, else 16 (the block barriers then cost more than a longer stretch),
        // unless a later pass also waits on memory (row_later_reads_memory: a residual, or a
        // norm's weights of 32 KiB or more): with 2 to 4 groups of it in flight per thread (the
        // pass's steps, cuda_row.cpp), more threads hide its latency.
        // At least 2 threads (a warp's loads then cover whole 32-byte sectors); more while fewer
        // than 512 threads per multiprocessor would run (few short rows). Past a block, a
        // cluster (sm_90) of blocks of kCudaBlockSize threads, up to kCudaPortableCluster of them.
        // The shared-memory row cache of the passes after the first is used when a block's part
        // of it leaves room for a second block on the multiprocessor, grown into a larger
        // cluster if need be, up to the device's max_cluster (16 on sm_90: a float32 row of
        // 256 Ki elements is then read from memory once instead of once a pass); otherwise
        // every pass reads the row from memory, which L2 mostly serves, in at most a portable
        // cluster (each block sends its partial to every block of the cluster).
        const int64_t v = detail::row_vector_width(k);
        const int64_t busy = (int64_t)dev.multiprocessors * 512;
        auto threads_for = [&](int64_t groups) { return pow2_ceil((nr + groups * v - 1) / (groups * v)); };
        auto block_of = [](int64_t g) -> int64_t { return g <= kCudaBlockSize || g > kCudaMaxRowBlock ? kCudaBlockSize : g; };
        // G doubled, up to `limit` (a block) and the row, while the rows' threads leave the GPU idle.
        auto widened = [&](int64_t g, int64_t limit = kCudaMaxRowBlock) {
            while (g < limit && g < pow2_ceil(nr) && np * g < busy) g *= 2;
            return g;
        };
        // (Rows of no elements count as one: their launch still stores a result per row.)
        if (dev.small_rows && np * std::max<int64_t>(nr, 1) <= kCudaSmallRowElements && cuda_offsets_fit_32(k, a)) {
            // The small entry: G as for a row without cache, up to a block; no dynamic shared
            // memory, no register entry (nor the walks of the kernel that plan those). Within a
            // warp while a lane walks at most kCudaSmallLaneElements: the launch takes the same few
            // microseconds, and the warp's module, without the block-wide reduction step, compiles
            // in about a sixth less time.
            const int64_t g = widened(
                std::min<int64_t>(std::max<int64_t>(threads_for(64), std::min<int64_t>(2, pow2_ceil(nr))),
                                  kCudaMaxRowBlock),
                nr <= 32 * kCudaSmallLaneElements ? 32 : kCudaMaxRowBlock);
            const int64_t block = block_of(g), rows_per_block = block / g;
            plan.threads_per_row = (int)g;
            CudaLaunch l = launch_of(k.name + "_s", np ? clamp_grid((np + rows_per_block - 1) / rows_per_block, 1) : 0,
                                     (uint32_t)block, 1, (int)g);
            l.reach = row_reach(g, block);
            plan.launches = {l};
            plan.offsets_32 = true;
            break;
        }
        const std::vector<detail::RowFold> folds = detail::row_folds(k);   // once: it walks the kernel
        const std::vector<int> slot = detail::row_cache_slots(k, folds);
        const bool caches = detail::row_cache_bytes(k, slot, 1) > 0;
        const int64_t portable_g = dev.sm >= 90 ? (int64_t)kCudaBlockSize * kCudaPortableCluster : kCudaMaxRowBlock;
        const int64_t max_g = dev.sm < 90                          ? kCudaMaxRowBlock
                              : dev.max_cluster >= kCudaMaxCluster ? (int64_t)kCudaBlockSize * kCudaMaxCluster
                                                                   : portable_g;
        int64_t g = threads_for(caches ? 8 : 64);
        if (caches && g > 32 && !detail::row_later_reads_memory(k, slot, folds, nr)) g = threads_for(16);
        g = widened(std::min(std::max(g, std::min<int64_t>(2, pow2_ceil((nr + v - 1) / v))), portable_g));
        auto cache_bytes = [&](int64_t g) {
            return detail::row_cache_bytes(k, slot, block_of(g) * ((nr + g * v - 1) / (g * v) * v));
        };
        // (Less a histogram's counters, which the block keeps in shared memory too.)
        const size_t cache_room = dev.max_shared / 2 - cuda_hist_shared_bytes(k);
        while (caches && cache_bytes(g) > cache_room && g < max_g) g *= 2;
        if (caches && cache_bytes(g) > cache_room) g = std::min(g, portable_g);   // not cached after all
        const int64_t block = block_of(g);
        const int64_t cluster = g > block ? g / block : 1;
        const int64_t rows_per_block = g < block ? block / g : 1;
        plan.threads_per_row = (int)g;
        CudaLaunch l = launch_of(k.name, np ? clamp_grid((np + rows_per_block - 1) / rows_per_block * cluster, cluster) : 0,
                                 (uint32_t)block, (uint32_t)cluster, (int)g);
        l.shared_bytes = caches && cache_bytes(g) <= cache_room ? cache_bytes(g) : 0;
        l.reach = row_reach(g, block);
        // Clusters stay resident and walk the rows: one wave of those the GPU holds at once,
        // rather than a cluster launched per row (a cluster's blocks are placed together, on one
        // GPC, which costs more than a block's start).
        if (cluster > 1) l.max_waves = 1;
        // Aligned rows that fit kRowRegisterGroups groups a thread within a block take the
        // register entry: G for that many groups (at least 2 threads when the row has 2 groups,
        // more while few rows would fill the GPU, up to the row's groups rounded up to a power of
        // two). The block: kCudaBlockSize threads, or G's for an entry of 3 blocks a
        // multiprocessor (row_register_blocks), up to kCudaMaxRowBlock. Past that, the
        // shared-memory entry's longer stretches per thread measured faster.
        if (nr > 0 && detail::row_register_entry(k, slot)) {
            const int64_t groups = (nr + v - 1) / v;
            int64_t gr = std::max<int64_t>(std::min<int64_t>(2, pow2_ceil(groups)), threads_for(detail::kRowRegisterGroups));
            while (gr < kCudaBlockSize && gr < pow2_ceil(groups) && np * gr < busy) gr *= 2;
            // From registers a folded sum of exponentials (softmax) takes a round of its own
            // after the max's; past a warp a round costs block barriers, which the fold's one
            // combined round saves, so such rows keep the shared-memory entry there.
            const bool expsum = std::any_of(folds.begin(), folds.end(),
                                            [](const detail::RowFold& f) { return f.kind == detail::RowFold::ExpSum; });
            const int64_t widest = detail::row_register_blocks(k, slot) > 2 ? kCudaMaxRowBlock : kCudaBlockSize;
            if (gr <= (expsum ? 32 : widest)) {
                const int64_t rblock = std::max<int64_t>(kCudaBlockSize, gr), rows = rblock / gr;
                l.aligned_entry = k.name + "_r";
                l.aligned_width = (int)v;
                l.aligned_grid = np ? clamp_grid((np + rows - 1) / rows, 1) : 0;
                l.aligned_block = (uint32_t)rblock;
                l.aligned_param = (int)gr;
                l.aligned_reach = row_reach(gr, rblock);
            }
        }
        plan.launches = {l};
        break;
    }
    case CudaShape::Column: {
        const int64_t width = detail::column_width(k);
        const int64_t pblocks = (np + width - 1) / width;
        int64_t chunks = 1;
        if (detail::column_splittable(k) && np > 0)
            chunks = std::max<int64_t>(1, std::min((detail::kColumnTargetBlocks + pblocks - 1) / pblocks,
                                                   nr / detail::kColumnMinChunk));
        const uint32_t block = (uint32_t)detail::kColumnThreads;
        plan.launches = {launch_of(k.name, np ? clamp_grid(pblocks * chunks, chunks) : 0, block, 1, (int)chunks)};
        if (const int v = detail::column_vector_width(k)) {
            CudaLaunch& l = plan.launches[0];
            l.aligned_entry = k.name + "_v";
            l.aligned_width = v;
            l.aligned_grid = l.grid, l.aligned_block = l.block, l.aligned_param = l.param;
        }
        if (chunks > 1) {
            plan.scratch_bytes = (size_t)(np * chunks) * detail::acc_record_slot(k) * k.accums.size();
            if (chunks <= detail::kColumnCombineChunks) {
                plan.counters = (size_t)pblocks;   // a column block's chunks recorded so far
            } else {
                const int64_t warps_per_block = kCudaBlockSize / 32;   // the final entry: a warp per column
                plan.launches.push_back(launch_of(k.name + "_final",
                                                  clamp_grid((np + warps_per_block - 1) / warps_per_block, 1),
                                                  kCudaBlockSize, 1, (int)chunks));
            }
        }
        break;
    }
    case CudaShape::Elementwise: {
        // A thread per vector of the vector path where the sizes and strides let it run (bases
        // permitting: the kernel checks those), so that no block starts with nothing to do, up to
        // kGridStrideWaves waves of resident blocks (max_waves: the backend applies it); the
        // grid-stride loops cover the rest.
        int64_t v = detail::elementwise_vector_width(k);
        if (v > 1 && k.rank > 1) {
            const int inner = k.rank - 1;
            bool words = a.sizes[inner] % v == 0;
            for (size_t b = 0; b < k.buffers.size() && words; ++b)
                if (k.buffers[b].layout[inner] == kir::StrideKind::One)
                    for (int d = 0; d < inner; ++d)
                        if (k.buffers[b].layout[d] == kir::StrideKind::Any &&
                            (b * k.rank + d >= a.strides.size() || a.strides[b * k.rank + d] % v))
                            words = false;
            if (!words) v = 1;
        }
        const int64_t items = (np + v - 1) / v;
        plan.launches = {launch_of(k.name, clamp_grid((items + kCudaBlockSize - 1) / kCudaBlockSize, 1), kCudaBlockSize, 1, 0)};
        plan.launches[0].max_waves = kGridStrideWaves;
        break;
    }
    }
    return plan;
}

std::string describe(const CudaLaunchPlan& plan) {
    std::string out = plan.threads_per_row ? fmt::format("{} threads a row", plan.threads_per_row) : std::string();
    if (plan.scratch_bytes)
        out += fmt::format("{}{} partials, {} bytes of scratch", out.empty() ? "" : "; ", plan.num_partials, plan.scratch_bytes);
    if (plan.counters) out += fmt::format("{}{} counters", out.empty() ? "" : "; ", plan.counters);
    for (const CudaLaunch& l : plan.launches) {
        out += fmt::format("{}{}: {} blocks of {}", out.empty() ? "" : "; ", l.entry, l.grid, l.block);
        if (l.cluster > 1) out += fmt::format(", clusters of {}", l.cluster);
        if (l.shared_bytes) out += fmt::format(", {} bytes of shared memory", l.shared_bytes);
        if (l.max_waves) out += fmt::format(", at most {} waves", l.max_waves);
        out += fmt::format(", param {}", l.param);
        if (!l.aligned_entry.empty())
            out += fmt::format(" (aligned: {}, {} blocks of {}, param {})", l.aligned_entry, l.aligned_grid, l.aligned_block,
                               l.aligned_param);
    }
    return out;
}

} // namespace kiln::codegen
