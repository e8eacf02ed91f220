// Row reductions (cuda_codegen.hpp): G threads per row, the row kept in shared memory by the first
// pass, 16-byte loads of aligned rows. Also the P-point pieces the column kernel shares.
#include "codegen/cuda/cuda_emitter.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace kiln::codegen::detail {

void Emitter::emit_reduce_scratch(bool row) {
    bool f = false, i = false;
    for (auto& a : k_.accums) (a.type == CT::F32 ? f : i) = true;
    const int n = row ? 32 : detail::kColumnWidth * detail::kColumnSlices;
    if (f) line("__shared__ float kiln_svf[{}];", n);
    if (i) line("__shared__ int kiln_svi[{}];", n);
    line("__shared__ int kiln_sp[{}];", n);
    if (row) {
        if (f) line("__shared__ float kiln_cvf;");
        if (i) line("__shared__ int kiln_cvi;");
        line("__shared__ int kiln_cp;");
    }
}

// Loop block `bi` at R point `ri`, element `j` of this thread: loads of cached buffers go
// through the row cache (stored by their first pass, read by the later ones).
void Emitter::emit_row_element(size_t bi, const std::vector<int>& slot, const std::vector<int>& first_use,
                               const std::string& j) {
    const kir::Block& b = k_.blocks[bi];
    scope_ = Scope::RLoop;
    emit_coords(rdims_, "ri", needed_coords(block_uses_[bi], rdims_, true), "tr");
    emit_rloop_offsets(block_uses_[bi]);
    for (size_t buf = 0; buf < k_.buffers.size(); ++buf) {
        if (slot[buf] < 0 || !block_uses_[bi].buffers[buf]) continue;
        const DType t = k_.buffers[buf].dtype;
        const std::string mem = load_expr(t, fmt::format("b{}[{}]", buf, offset((int)buf)));
        const char* ct = ctype(compute_type(t));
        const std::string& pre = preloaded_.empty() ? std::string() : preloaded_[buf];
        if (!pre.empty()) {
            line("const {} l{} = {};", ct, buf, pre);
            if (first_use[buf] == (int)bi) line("if (cached) x{0}[{1} * row_threads] = l{0};", buf, j);
        } else if (first_use[buf] == (int)bi) {
            line("const {} l{} = {};", ct, buf, mem);
            line("if (cached) x{0}[{1} * row_threads] = l{0};", buf, j);
        } else {
            line("const {0} l{1} = cached ? x{1}[{2} * row_threads] : {3};", ct, buf, j, mem);
        }
        load_override_[buf] = fmt::format("l{}", buf);
    }
    for (size_t buf = 0; buf < preloaded_.size(); ++buf)
        if (slot[buf] < 0 && !preloaded_[buf].empty()) load_override_[buf] = preloaded_[buf];
    emit_instrs(b);
    add_to_acc_states(b, "(int)ri");
    emit_stores(b);
    load_override_.assign(k_.buffers.size(), "");
    scope_ = Scope::PPoint;
}

// The R index of this thread's element `j` (see row_vector_width).
std::string Emitter::row_index(const std::string& j) const {
    const int v = row_vector_width();
    if (v == 1) return fmt::format("({}) * G + t", j);
    int s = 0;
    while ((1 << s) < v) ++s;
    return fmt::format("((({0}) >> {1}) * G + t) * {2} + (({0}) & {3})", j, s, v, v - 1);
}

// Per P point `pi`: the coordinates and the buffers' P offsets.
void Emitter::emit_ppoint_setup() {
    scope_ = Scope::PPoint;
    emit_coords(pdims_, "pi", needed_coords(all_uses_, pdims_, true), "tp");
    emit_pbase_offsets();
}

// A Point block: every thread computes it (later blocks may read its values); the threads
// for which `who` holds store.
void Emitter::emit_point_block(const kir::Block& b, const std::string& who) {
    emit_instrs(b);
    if (b.stores.empty()) return;
    open(fmt::format("if ({})", who));
    emit_stores(b);
    close();
}

int Emitter::first_loop_block() const {
    for (size_t bi = 0; bi < k_.blocks.size(); ++bi)
        if (k_.blocks[bi].loop) return (int)bi;
    return -1;
}

void Emitter::emit_row_kernel() {
    const std::vector<int> slot = detail::row_cache_slots(k_);
    const int nslots = detail::row_cache_slot_count(k_);
    std::vector<int> first_use(k_.buffers.size(), -1);
    for (size_t bi = 0; bi < k_.blocks.size(); ++bi)
        for (int id : k_.blocks[bi].instrs)
            if (k_.instrs[id].op == Op::Load && slot[k_.instrs[id].index] >= 0 && first_use[k_.instrs[id].index] < 0)
                first_use[k_.instrs[id].index] = (int)bi;
    line("");
    open_kernel(k_.name, kCudaMaxRowBlock);
    emit_buffer_pointers(all_uses_);
    emit_reduce_scratch(true);
    line("extern __shared__ float kiln_row_cache[];");
    line("(void)scratch;");
    line("const int G = param;   // threads per row, a power of two");
    line("const long long np = {};", product(pdims_));
    line("const long long nr = {};", product(rdims_));
    line("const int nthreads = (int)blockDim.x;");
    line("const int blocks_per_row = G > nthreads ? G / nthreads : 1;   // the cluster size");
    line("const int rows_per_block = G < nthreads ? nthreads / G : 1;");
    line("const int row_threads = G < nthreads ? G : nthreads;   // threads of one row in this block");
    line("const int group = (int)threadIdx.x / G;");
    line("const int lane = (int)threadIdx.x % row_threads;");
    line("const int t = (int)(blockIdx.x % blocks_per_row) * nthreads + lane;");
    const int vw = row_vector_width();
    line("const long long per_thread = (nr + (long long)G * {0} - 1) / ((long long)G * {0}) * {0};", vw);
    line("const long long full = nr / ((long long)G * {0}) * {0};   // elements every thread of a row has", vw);
    if (nslots > 0) {
        // Element j of this thread sits at [j * row_threads + lane] of its row's slice: each
        // thread reads back only what it wrote, so no barrier is needed.
        line("const long long slice = per_thread * row_threads;");
        line("const bool cached = (unsigned long long)kiln_dynamic_smem_size() >= "
             "(unsigned long long){} * rows_per_block * slice * 4;",
             nslots);
        for (size_t b = 0; b < k_.buffers.size(); ++b)
            if (slot[b] >= 0)
                line("{0}* const x{1} = ({0}*)kiln_row_cache + ((long long){2} * rows_per_block + group) * slice + lane;",
                     ctype(compute_type(k_.buffers[b].dtype)), b, slot[b]);
    }
    line("#pragma unroll 1");
    open("for (long long row0 = (long long)(blockIdx.x / blocks_per_row) * rows_per_block; row0 < np; "
         "row0 += (long long)(gridDim.x / blocks_per_row) * rows_per_block)");
    // A group past the last row still takes part in the barriers; it reads row0's P point.
    line("const bool live = row0 + group < np;");
    line("const long long pi = live ? row0 + group : row0;");
    emit_ppoint_setup();
    for (size_t bi = 0; bi < k_.blocks.size(); ++bi) {
        const kir::Block& b = k_.blocks[bi];
        if (!b.loop) {
            emit_point_block(b, "live && t == 0");
            continue;
        }
        declare_acc_results(b);
        open("");
        init_acc_states(b);
        // Several elements per step without bounds checks (their loads can all be in flight
        // at once: sixteen in the first pass, which reads memory), then the rest one by one.
        const bool first = (int)bi == first_loop_block();
        const int step = first ? 16 : 4;
        // The first pass loads each aligned row's groups with 16-byte loads.
        std::vector<size_t> vec_bufs;
        if (first && vw > 1)
            for (size_t buf = 0; buf < k_.buffers.size(); ++buf) {
                bool loaded = false;
                for (int id : b.instrs) loaded = loaded || (k_.instrs[id].op == Op::Load && k_.instrs[id].index == (int)buf);
                if (loaded && k_.buffers[buf].layout[rdims_[0]] == StrideKind::One &&
                    dtype_size(k_.buffers[buf].dtype) * vw == 16)
                    vec_bufs.push_back(buf);
            }
        line("long long j = 0;");
        open("if (live)");
        if (!vec_bufs.empty()) {
            std::string mis;
            for (size_t buf : vec_bufs)
                mis += fmt::format("{}(unsigned long long)(b{} + {})", mis.empty() ? "" : " | ", buf, offset((int)buf));
            line("const bool aligned = (({}) & 15) == 0;", mis);
            line("#pragma unroll 1");
            open(fmt::format("for (; aligned && j + {0} <= full; j += {0})", step));
            preloaded_.assign(k_.buffers.size(), "");
            for (size_t buf : vec_bufs) {
                const DType t = k_.buffers[buf].dtype;
                for (int g = 0; g < step / vw; ++g)
                    line("const uint4 w{0}_{1} = *(const uint4*)(b{0} + {2} + (((j >> {3}) + {1}) * G + t) * {4});", buf, g,
                         offset((int)buf), vw == 4 ? 2 : vw == 8 ? 3 : 4, vw);
                line("{} e{}[{}];", ctype(compute_type(t)), buf, step);
                for (int u = 0; u < step; ++u)
                    line("e{}[{}] = {};", buf, u,
                         load_expr(t, word_element(t, vw, fmt::format("w{}_{}", buf, u / vw), u % vw)));
                preloaded_[buf] = fmt::format("e{}[u]", buf);
            }
            line("#pragma unroll");
            open(fmt::format("for (int u = 0; u < {}; ++u)", step));
            line("const long long ri = {};", row_index("j + u"));
            emit_row_element(bi, slot, first_use, "(j + u)");
            preloaded_.clear();
            close();
            close();
        }
        line("#pragma unroll 1");
        open(fmt::format("for (; j + {0} <= full; j += {0})", step));
        line("#pragma unroll");
        open(fmt::format("for (int u = 0; u < {}; ++u)", step));
        line("const long long ri = {};", row_index("j + u"));
        emit_row_element(bi, slot, first_use, "(j + u)");
        close();
        close();
        close();
        line("#pragma unroll 1");
        open("for (; j < per_thread; ++j)");
        line("const long long ri = {};", row_index("j"));
        open("if (live && ri < nr)");
        emit_row_element(bi, slot, first_use, "j");
        close();
        close();
        for (int ai : b.accums) {
            const kir::Accum& ac = k_.accums[ai];
            const char* sfx = ac.type == CT::F32 ? "f" : "i";
            line("kiln_row_reduce<{0}>(acc{1}_v, acc{1}_p, G, kiln_sv{2}, kiln_sp, &kiln_cv{2}, &kiln_cp);",
                 acc_struct(ac), ai, sfx);
        }
        set_acc_results(b);
        close();
    }
    close();   // rows
    close();
}

} // namespace kiln::codegen::detail
