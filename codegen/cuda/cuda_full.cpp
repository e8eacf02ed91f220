// Full reductions (cuda_codegen.hpp): partial records per chunk, then the last block to finish combines them in order.
#include "codegen/cuda/cuda_emitter.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace kiln::codegen::detail {

namespace {
// Groups of 16 bytes, or single points, a thread of a full reduction's partial kernel has in
// flight at once.
constexpr int kFullGroupsInFlight = 4;
constexpr int kFullPointsInFlight = 8;
} // namespace

// Elements per group of a full reduction's partial kernel: 16 bytes of the widest buffer its
// loop block loads, when the domain is rank 1 and every buffer the block touches is contiguous
// or a broadcast scalar (and nothing reads coordinates, no value is 64-bit); else 1.
int Emitter::full_vector_width() const {
    if (k_.rank != 1 || has_wide(k_)) return 1;
    size_t widest = 0;
    for (int id : k_.blocks[0].instrs) {
        const kir::Instr& in = k_.instrs[id];
        if (in.op == Op::Gather || in.op == Op::Coord || in.op == Op::LinearId) return 1;
        if (in.op == Op::Load && k_.buffers[in.index].layout[0] == StrideKind::One)
            widest = std::max(widest, dtype_size(k_.buffers[in.index].dtype));
    }
    for (size_t buf = 0; buf < k_.buffers.size(); ++buf)
        if (block_uses_[0].buffers[buf] && k_.buffers[buf].layout[0] == StrideKind::Any) return 1;
    if (!k_.blocks[0].stores.empty()) return 1;
    return widest ? (int)(16 / widest) : 1;
}

void Emitter::emit_full_kernel() {
    const kir::Block& b = k_.blocks[0];
    line("");
    open_kernel(k_.name, kCudaBlockSize, 1, true);
    line("unsigned char* const partials = scratch;");
    line("const int num_partials = param;");
    emit_buffer_pointers(all_uses_);
    emit_scratch();
    line("__shared__ bool kiln_last;");
    line("const long long nr = {};", product(rdims_));
    // Chunks of whole groups of V elements (below), so that every chunk starts aligned.
    const int vw = full_vector_width();
    line("const long long chunk = ((nr + num_partials - 1) / num_partials + {0}) / {1} * {1};", vw - 1, vw);
    line("#pragma unroll 1");
    open("for (int part = blockIdx.x; part < num_partials; part += gridDim.x)");
    scope_ = Scope::PPoint;
    line("const long long rbegin = (long long)part * chunk;");
    line("const long long rend = rbegin + chunk < nr ? rbegin + chunk : nr;");
    init_acc_states(b);
    line("long long rrest = rbegin;");
    if (vw > 1) {
        // A contiguous rank-1 reduction reads aligned data in groups of V elements per thread,
        // one load per buffer and group.
        std::vector<size_t> vec;
        std::string mis;
        for (size_t buf = 0; buf < k_.buffers.size(); ++buf)
            if (block_uses_[0].buffers[buf] && k_.buffers[buf].layout[0] == StrideKind::One) {
                vec.push_back(buf);
                mis += fmt::format("{}(unsigned long long)b{}", mis.empty() ? "" : " | ", buf);
            }
        open(fmt::format("if ((({}) & 15) == 0)", mis));
        line("const long long groups = (rend - rbegin) / {};", vw);
        // Group q + g * blockDim.x of the thread, its values folded in order.
        auto group = [&](int g) {
            const std::string at = g ? fmt::format("(q + {} * (long long)blockDim.x)", g) : "q";
            for (size_t buf : vec) {
                const DType t = k_.buffers[buf].dtype;
                line("{} e{}_{}[{}];", ctype(compute_type(t)), buf, g, vw);
                emit_unpack(t, vw, fmt::format("w{}_{}", buf, g), fmt::format("e{}_{}", buf, g), 0,
                            needs_exact_load(buf, 0) ? Unpack::Tested : Unpack::Hardware);
            }
            for (int u = 0; u < vw; ++u) {
                open("");
                line("const long long ri = rbegin + {} * {} + {};", at, vw, u);
                for (size_t buf : vec) load_override_[buf] = fmt::format("e{}_{}[{}]", buf, g, u);
                emit_rloop_body(0);
                load_override_.assign(k_.buffers.size(), "");
                close();
            }
        };
        auto loads = [&](int n) {
            for (int g = 0; g < n; ++g)
                for (size_t buf : vec) {
                    const char* wt = word_type(k_.buffers[buf].dtype, vw);
                    line("const {0} w{1}_{3} = *(const {0}*)(b{1} + rbegin + {4} * {2});", wt, buf, vw, g,
                         g ? fmt::format("(q + {} * (long long)blockDim.x)", g) : "q");
                }
        };
        // kFullGroupsInFlight groups a thread loaded before any is folded (a loop unrolled by the
        // compiler tests its bound between copies, so their loads would wait on each other), then
        // the rest one at a time: the same groups in the same order either way.
        line("long long q = threadIdx.x;");
        line("#pragma unroll 1");
        open(fmt::format("for (; q + {} * (long long)blockDim.x < groups; q += {} * (long long)blockDim.x)",
                         kFullGroupsInFlight - 1, kFullGroupsInFlight));
        loads(kFullGroupsInFlight);
        for (int g = 0; g < kFullGroupsInFlight; ++g) group(g);
        close();
        line("#pragma unroll 1");
        open("for (; q < groups; q += blockDim.x)");
        loads(1);
        group(0);
        close();
        line("rrest = rbegin + groups * {};", vw);
        close();
    }
    // The rest element by element: kFullPointsInFlight points a thread in straight-line copies
    // (no bound test between them, so their loads are in flight at once), then one at a time.
    // Past rank 1 the thread keeps its point's coordinates (k<d>) and steps them by blockDim.x's
    // digits in the domain's radix (s<d>), a carry a dim, instead of dividing each point's
    // index by the sizes (64-bit divisions, some hundred instructions a point).
    const std::vector<bool> need = needed_coords(block_uses_[0], rdims_, true);
    const bool walk = rdims_.size() > 1 && std::any_of(rdims_.begin(), rdims_.end(), [&](int d) { return need[d]; });
    line("long long r0 = rrest + threadIdx.x;");
    if (walk) {
        auto digits = [&](const std::string& lin, const char* name) {
            std::string cur = lin;
            for (size_t j = rdims_.size(); j-- > 0;) {
                const int d = rdims_[j];
                if (j == 0) {
                    line("{}{} = {};", name, d, cur);
                    break;
                }
                line("{}{} = {} % {};", name, d, cur, size(d));
                cur = fmt::format("({} / {})", cur, size(d));
            }
        };
        for (int d : rdims_) line("long long k{0} = 0, s{0} = 0;", d);
        open("if (nr > 0)");   // (every size then at least 1)
        digits("r0", "k");
        digits("(long long)blockDim.x", "s");
        close();
    }
    auto point = [&](const std::string& ri) {
        open("");
        line("const long long ri = {};", ri);
        emit_rloop_body(0, walk);
        close();
        if (!walk) return;
        // The next point: the digits added from the innermost dim out, each carry at most one.
        open("");
        for (size_t j = rdims_.size(); j-- > 0;) {
            const int d = rdims_[j];
            line("k{0} += s{0}{1};", d, j + 1 < rdims_.size() ? fmt::format(" + carry{}", rdims_[j + 1]) : "");
            if (j == 0) break;   // the outermost digit takes the rest: no carry out of it
            line("const long long carry{0} = k{0} >= {1};", d, size(d));
            line("if (carry{0}) k{0} -= {1};", d, size(d));
        }
        close();
    };
    line("#pragma unroll 1");
    open(fmt::format("for (; r0 + {} * (long long)blockDim.x < rend; r0 += {} * (long long)blockDim.x)",
                     kFullPointsInFlight - 1, kFullPointsInFlight));
    for (int u = 0; u < kFullPointsInFlight; ++u) point(fmt::format("r0 + {} * (long long)blockDim.x", u));
    close();
    line("#pragma unroll 1");
    open("for (; r0 < rend; r0 += blockDim.x)");
    point("r0");
    close();
    block_reduce_acc_states(b);
    open("if (threadIdx.x == 0)");
    line("unsigned char* const rec = partials + (long long)part * {};", record_bytes());
    store_acc_record(b);
    close();
    close();
    emit_full_combine();
    close_kernel();
}

// The block that counts the grid's last arrival (kiln_arrive on counters[0], which it then sets
// back to zero for the next launch) combines the records, so no second launch waits on the
// first: thread t folds records t, t + blockDim.x, ... in order, then the block combines the
// threads in a fixed tree, so the same partials always give the same result, whichever block
// was last.
void Emitter::emit_full_combine() {
    const kir::Block& loop = k_.blocks[0];
    const kir::Block& point = k_.blocks[1];
    emit_last_arrival("counters", "gridDim.x");
    line("if (!kiln_last) return;");
    scope_ = Scope::PPoint;
    declare_acc_results(loop);
    init_acc_states(loop);
    line("#pragma unroll 1");
    open("for (int j = threadIdx.x; j < num_partials; j += blockDim.x)");
    line("const unsigned char* const rec = partials + (long long)j * {};", record_bytes());
    fold_acc_record(loop);
    close();
    block_reduce_acc_states(loop);
    set_acc_results(loop);
    emit_instrs(point);
    if (!point.stores.empty()) {
        open("if (threadIdx.x == 0)");
        emit_stores(point);
        close();
    }
}

} // namespace kiln::codegen::detail
