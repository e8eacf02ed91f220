// Row reductions (cuda_codegen.hpp): G threads per row, the row kept by the first pass in shared
// memory or, for aligned rows, in registers (the entry NAME_r), 16-byte loads and stores over the
// row's aligned body; for small launches the entry NAME_s, element by element. Also the P-point
// pieces the column kernel shares.
#include "codegen/cuda/cuda_emitter.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace kiln::codegen::detail {

void Emitter::emit_reduce_scratch(bool row, int per_thread, bool folds, bool cluster) {
    declare_acc_scratch(row ? 32 : detail::kColumnThreads * per_thread);
    bool moments = false, expsum = false;
    if (row && folds)
        for (const detail::RowFold& f : detail::row_folds(k_)) (f.kind == detail::RowFold::Moments ? moments : expsum) = true;
    if (moments) {
        line("__shared__ float kiln_smc[32], kiln_smm[32], kiln_smq[32], kiln_sms[32];");
    }
    if (expsum) {
        line("__shared__ float kiln_sem[32], kiln_ses[32];");
    }
    if (row && cluster) line("__shared__ kiln_cx kiln_x;   // the cluster's exchange");
}

// Loop block `bi` at R point `ri`, element `j` of this thread: loads of cached buffers go
// through the row cache (stored by their first pass, read by the later ones) unless already
// loaded as part of a group (preloaded_); stores go to store_to_ where it is set.
void Emitter::emit_row_element(size_t bi, const std::vector<int>& slot, const std::vector<int>& first_use,
                               const std::string& j) {
    const kir::Block& b = k_.blocks[bi];
    scope_ = Scope::RLoop;
    emit_coords(rdims_, "ri", needed_coords(block_uses_[bi], rdims_, true), "tr");
    emit_rloop_offsets(block_uses_[bi]);
    const bool grouped = !preloaded_.empty();
    for (size_t buf = 0; buf < k_.buffers.size(); ++buf) {
        if (grouped && !preloaded_[buf].empty()) {
            load_override_[buf] = preloaded_[buf];
            continue;
        }
        if (slot[buf] < 0 || !block_uses_[bi].buffers[buf]) continue;
        const DType t = k_.buffers[buf].dtype;
        const std::string mem = fmt::format("b{}[{}]", buf, offset((int)buf));
        const std::string at = fmt::format("x{}[{}]", buf, cache_index(j));
        if (first_use[buf] == (int)bi) {
            line("const {} m{} = {};", storage_type(t), buf, mem);
            line("if (cached) {} = m{};", at, buf);
            line("const {} l{} = {};", ctype(compute_type(t)), buf, load_expr(t, fmt::format("m{}", buf)));
        } else {
            line("const {} l{} = {};", ctype(compute_type(t)), buf,
                 load_expr(t, fmt::format("(cached ? {} : {})", at, mem)));
        }
        load_override_[buf] = fmt::format("l{}", buf);
    }
    emit_instrs(b);
    emit_fold_values();
    add_to_acc_states(b, "(int)ri");
    emit_stores(b);
    load_override_.assign(k_.buffers.size(), "");
    scope_ = Scope::PPoint;
}

// The folds' values (folds_now_) at this point, from their instructions: into the step's
// arrays mv (folds_grouped_), else added to the running moments or sum of exponentials. Names
// carry the column suffix col_ (column kernels' vector entries).
void Emitter::emit_fold_values() {
    std::vector<int> chain;   // the folds' values' instructions, each once, in order
    for (const detail::RowFold& f : folds_now_) chain.insert(chain.end(), f.chain.begin(), f.chain.end());
    std::sort(chain.begin(), chain.end());
    chain.erase(std::unique(chain.begin(), chain.end()), chain.end());
    for (int id : chain) line("const {} {} = {};", ctype(k_.instrs[id].type), v(id), expr(k_.instrs[id]));
    for (const detail::RowFold& f : folds_now_) {
        if (folds_grouped_) line("mv{}{}[u] = {};", f.accum, col_, v(f.value));
        else if (f.kind == detail::RowFold::Moments)
            line("kiln_moments_merge(mo{0}{2}_c, mo{0}{2}_m, mo{0}{2}_q, 1.0f, {1}, 0.0f);", f.accum, v(f.value), col_);
        else line("kiln_lse_add<{2}>(se{0}_m, se{0}_s, {1});", f.accum, v(f.value), fast_exp());
    }
}

// A step's n values of Moments fold f (mv<f>[n]) as one group: its mean, the squared deviations
// from it, merged into the running moments; their sum added to the shared accumulator's state.
void Emitter::emit_moments_step(const detail::RowFold& f, int n) {
    open("");
    line("float s = 0.0f, q = 0.0f;");
    line("#pragma unroll");
    line("for (int u = 0; u < {}; ++u) s += mv{}{}[u];", n, f.accum, col_);
    if (f.shared >= 0) line("{}_v += s;", acc(f.shared));
    line("const float mean = s * {};", float_literal(1.0f / (float)n));
    line("#pragma unroll");
    line("for (int u = 0; u < {0}; ++u) q = fmaf(mv{1}{2}[u] - mean, mv{1}{2}[u] - mean, q);", n, f.accum, col_);
    line("kiln_moments_merge(mo{0}{2}_c, mo{0}{2}_m, mo{0}{2}_q, {1}.0f, mean, q);", f.accum, n, col_);
    close();
}

// Where element `j` of this thread sits in its row's slice of a buffer's cache region (the
// pointer x<b> already points at this thread's first element): groups of V elements, the
// row's threads' groups side by side, so that a group moves to and from shared memory in
// one access and a warp's accesses are contiguous.
std::string Emitter::cache_index(const std::string& j) const {
    const int v = row_vector_width();
    if (v == 1) return fmt::format("({}) * row_threads", j);
    return fmt::format("((({0}) >> {1}) * row_threads) * {2} + (({0}) & {3})", j, row_vector_shift(), v, v - 1);
}

// The R index of this thread's element `j` (see row_vector_width).
std::string Emitter::row_index(const std::string& j) const {
    const int v = row_vector_width();
    if (v == 1) return fmt::format("({}) * G + t", j);
    return fmt::format("((({0}) >> {1}) * G + t) * {2} + (({0}) & {3})", j, row_vector_shift(), v, v - 1);
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

// Instructions of Loop block `b` whose value is the same at every R point of a row (nothing R
// dependent feeds them: parameters, constants, earlier accumulators, loads broadcast along R):
// computed once per row, before the loop.
std::vector<int> Emitter::row_invariant(const kir::Block& b) const {
    std::vector<bool> varying(k_.instrs.size(), false);
    std::vector<int> out;
    for (int id : b.instrs) {
        const kir::Instr& in = k_.instrs[id];
        bool var = in.op == Op::Gather || in.op == Op::LinearId || (in.op == Op::Coord && k_.reduced[in.index]);
        if (in.op == Op::Load) var = var || detail::varies_along_reduced(k_, (size_t)in.index);
        for (int o : in.a) var = var || (o >= 0 && varying[o]);
        varying[id] = var;
        if (!var) out.push_back(id);
    }
    return out;
}


void Emitter::emit_row_kernel(RowEntry entry) {
    const bool registers = entry == RowEntry::Registers, small = entry == RowEntry::Small;
    // The small entry keeps nothing: no row cache (a later pass reads the row again, from L1 or
    // L2), no folds (a variance or a softmax's denominator takes a round of its own).
    const std::vector<int> slot = small ? std::vector<int>(k_.buffers.size(), -1) : detail::row_cache_slots(k_);
    std::vector<detail::RowFold> folds = detail::row_folds(k_);
    // A sum of exponentials' exp, used by nothing but accumulators, flushes tiny terms (the
    // register entry's round of its own; the fold's helpers do the same).
    sum_exp_.assign(k_.instrs.size(), false);
    std::vector<bool> exp_sums(k_.accums.size(), false);
    for (const detail::RowFold& f : folds)
        if (f.kind == detail::RowFold::ExpSum) sum_exp_[k_.accums[f.accum].value] = exp_sums[f.accum] = true;
    for (size_t ai = 0; ai < k_.accums.size(); ++ai)
        if (!exp_sums[ai]) sum_exp_[k_.accums[ai].value] = false;
    for (const kir::Instr& in : k_.instrs)
        for (int o : in.a)
            if (o >= 0) sum_exp_[o] = false;
    for (const kir::Block& b : k_.blocks)
        for (const kir::Store& st : b.stores) sum_exp_[st.value] = false;
    // From registers a variance takes a second round over them rather than the first pass's
    // moments, whose merges a group at a time cost more than the round (row_register_entry).
    if (registers || small) folds.clear();
    const std::vector<bool> folded = detail::folded_blocks(k_, folds);
    from_fold_.assign(k_.accums.size(), false);
    for (const detail::RowFold& f : folds)
        if (f.kind == detail::RowFold::ExpSum && f.shared >= 0) from_fold_[f.shared] = true;
    int nslots = 0;
    for (int sl : slot) nslots += sl >= 0;
    std::vector<int> first_use(k_.buffers.size(), -1);
    for (size_t bi = 0; bi < k_.blocks.size(); ++bi)
        if (!folded[bi])
        for (int id : k_.blocks[bi].instrs)
            if (k_.instrs[id].op == Op::Load && slot[k_.instrs[id].index] >= 0 && first_use[k_.instrs[id].index] < 0)
                first_use[k_.instrs[id].index] = (int)bi;
    line("");
    // The reach this entry is compiled for: the reductions' template argument (CudaReach's
    // value) drops the steps past it. The register and small entries never run in a cluster.
    const CudaReach reach =
        (registers || small) && module_.reach == CudaReach::Cluster ? CudaReach::Block : module_.reach;
    // Two blocks of the largest size per multiprocessor (64 registers a thread): a row's
    // latency (load, reduce, pass again) is hidden only by other rows in flight. The register
    // entry's rows past a warp: row_register_blocks.
    open_kernel(registers ? k_.name + "_r" : small ? k_.name + "_s" : k_.name, kCudaMaxRowBlock,
                registers && reach == CudaReach::Block ? detail::row_register_blocks(k_, slot) : 2);
    const bool cluster = reach == CudaReach::Cluster;
    const int levels = (int)reach;
    const char* xarg = cluster ? "&kiln_x" : "nullptr";
    emit_buffer_pointers(all_uses_);
    emit_reduce_scratch(true, 1, !folds.empty(), cluster);
    if (entry == RowEntry::Shared) line("extern __shared__ uint4 kiln_row_cache[];");
    line("(void)scratch;");
    // G, the block and the cluster are powers of two: the geometry below is shifts and masks,
    // no divisions (a block pays this once per launch, and most blocks reduce one row).
    line("const int G = param;   // threads per row, a power of two");
    line("const int gs = __ffs(G) - 1;");
    // The small entry's launches keep every offset within 32 bits (plan_cuda_launch checks).
    narrow_ = small;
    const char* ix = index_type();
    line("const {} np = {};", ix, product(pdims_));
    line("const {} nr = {};", ix, product(rdims_));
    line("const int nthreads = (int)blockDim.x;");
    line("const int ns = __ffs(nthreads) - 1;");
    line("const int rs = gs < ns ? gs : ns;");
    if (cluster) {
        line("const int cs = gs - rs;   // log2 of the cluster size (blocks per row)");
        line("if (cs > 0) kiln_cx_init(&kiln_x);");
    } else {
        line("const int cs = 0;   // no cluster: G is at most a block");
    }
    line("unsigned xround = 0;   // the cluster exchanges so far");
    line("const int rows_per_block = nthreads >> rs;");
    line("const int row_threads = 1 << rs;   // threads of one row in this block");
    line("const int group = (int)threadIdx.x >> rs;");
    line("const int lane = (int)threadIdx.x & (row_threads - 1);");
    line("const int t = ((int)(blockIdx.x & ((1u << cs) - 1)) << ns) | lane;");
    const int vw = row_vector_width();
    const int vs = row_vector_shift();
    if (entry == RowEntry::Shared) {
        line("const long long per_thread = ((nr + ((long long)G << {0}) - 1) >> (gs + {0})) << {0};", vs);
        line("const long long full = (nr >> (gs + {0})) << {0};   // elements every thread of a row has", vs);
    }
    if (nslots > 0 && !registers) {
        // Each cached buffer has a region of `region` elements of its dtype (16-byte aligned);
        // a row's slice of it holds its threads' elements (cache_index).
        line("const long long slice = per_thread * row_threads;");
        line("const long long region = slice * rows_per_block;");
        std::vector<size_t> order(k_.buffers.size());
        for (size_t b = 0; b < order.size(); ++b) order[b] = b;
        std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return slot[x] < slot[y]; });
        std::string at = "0";
        for (size_t b : order) {
            if (slot[b] < 0) continue;
            const char* st = storage_type(k_.buffers[b].dtype);
            line("{0}* const x{1} = ({0}*)((unsigned char*)kiln_row_cache + {2}) + group * slice + lane * {3};", st, b,
                 at, vw);
            line("const unsigned xs{0} = (unsigned)__cvta_generic_to_shared(kiln_row_cache) + (unsigned)({1}) + "
                 "(unsigned)(group * slice + lane * {2}) * {3}u;",
                 b, at, vw, dtype_size(k_.buffers[b].dtype));
            at = fmt::format("{} + ((region * {} + 15) & ~15LL)", at, dtype_size(k_.buffers[b].dtype));
        }
        line("const bool cached = (unsigned long long)kiln_dynamic_smem_size() >= (unsigned long long)({});", at);
    }
    line("#pragma unroll 1");
    open(fmt::format("for ({0} row0 = ({0})(blockIdx.x >> cs) * rows_per_block; row0 < np; "
                     "row0 += ({0})(gridDim.x >> cs) * rows_per_block)",
                     ix));
    // A group past the last row still takes part in the barriers; it reads row0's P point.
    line("const bool live = row0 + group < np;");
    line("const {} pi = live ? row0 + group : row0;", ix);
    emit_ppoint_setup();
    const int shift = vs;
    // The row's phase h: elements before the anchor buffer's first group boundary (the first
    // buffer a pass moves in groups). Every pass maps slot r (row_index) to element r + h,
    // wrapped past the row's end, so that the groups of an aligned body start on 16-byte
    // boundaries whatever the row's start; the cache, indexed by slot, agrees across passes.
    auto vector_buffer = [&](size_t buf) {
        return vw > 1 && k_.buffers[buf].layout[rdims_[0]] == StrideKind::One &&
               group_words(k_.buffers[buf].dtype, vw).words > 0;
    };
    // The anchor is the first buffer stored in groups, else the first loaded: a store must be in
    // phase to go in groups. A load laid out as the anchor is expected in phase too (a row and
    // its result); any other load, such as a norm's weight vector, out of phase with most rows
    // whenever the row length is not a multiple of V, reads the two aligned words around its
    // group and shifts them (kiln_ldg_shift).
    int anchor = -1;
    for (const kir::Block& b : k_.blocks)
        if (b.loop)
            for (const kir::Store& st : b.stores)
                if (anchor < 0 && vector_buffer(st.buffer)) anchor = st.buffer;
    for (const kir::Block& b : k_.blocks) {
        if (!b.loop) continue;
        for (int id : b.instrs)
            if (anchor < 0 && k_.instrs[id].op == Op::Load && vector_buffer(k_.instrs[id].index))
                anchor = k_.instrs[id].index;
    }
    auto element_of = [&](size_t buf) {   // the element index of buffer buf's row start
        return fmt::format("((unsigned long long)(b{} + {}) >> {})", buf, offset((int)buf),
                           dtype_size(k_.buffers[buf].dtype) == 4 ? 2 : dtype_size(k_.buffers[buf].dtype) == 2 ? 1 : 0);
    };
    auto shifted = [&](size_t buf) {
        return anchor >= 0 && (k_.buffers[buf].layout != k_.buffers[anchor].layout ||
                               dtype_size(k_.buffers[buf].dtype) != dtype_size(k_.buffers[anchor].dtype));
    };
    if (small) {
        // (Element by element from slot 0: no phase.)
    } else if (registers) {
        // The launch gives aligned rows of whole groups, at most kRowRegisterGroups a thread: no
        // phase, no shifts, no elements outside the groups.
        KILN_CHECK_INTERNAL(anchor >= 0, "emit_cuda: {}'s register entry has no buffer read in groups", k_.name);
        line("const int h = 0;");
        for (size_t buf = 0; buf < k_.buffers.size(); ++buf) {
            if (slot[buf] < 0) continue;
            const GroupWords gw = group_words(k_.buffers[buf].dtype, vw);
            for (int w = 0; w < gw.words; ++w)
                line("{} rg{}_{}[{}];   // the thread's groups of the row", word_type(k_.buffers[buf].dtype, gw.per_word),
                     buf, w, detail::kRowRegisterGroups);
        }
    } else if (anchor >= 0) {
        // (0 for a row shorter than its phase: no body, and slot r + h must wrap at most once.)
        line("const int h0 = (int)((0ULL - {}) & {});", element_of(anchor), vw - 1);
        line("const int h = h0 < nr ? h0 : 0;");
        line("const long long fullh = nr > h ? ((nr - h) >> (gs + {0})) << {0} : 0;   // slots of the aligned body", vs);
    } else {
        line("const int h = 0;");
        line("const long long fullh = full;");
    }
    for (const detail::RowFold& f : folds) {
        if (f.kind == detail::RowFold::Moments) line("float mo{0}_c = 0.0f, mo{0}_m = 0.0f, mo{0}_q = 0.0f;", f.accum);
        else line("float se{0}_m = __uint_as_float(0xff800000u), se{0}_s = 0.0f;", f.accum);
    }
    for (size_t bi = 0; bi < k_.blocks.size(); ++bi) {
        const kir::Block& b = k_.blocks[bi];
        if (!b.loop) {
            emit_point_block(b, "live && t == 0");
            continue;
        }
        if (folded[bi]) {
            // Sum of (v - k)^2 = M2 + n (mean - k)^2, from the first pass's moments of v; sum of
            // exp(v - k) = s exp(m - k), from its running max m and sum s (0 for an empty row,
            // whose m is -inf).
            declare_acc_results(b);
            open("");
            for (int id : row_invariant(b)) line("const {} {} = {};", ctype(k_.instrs[id].type), v(id), expr(k_.instrs[id]));
            for (const detail::RowFold& f : folds) {
                if (f.block != (int)bi) continue;
                if (f.kind == detail::RowFold::Moments)
                    line("acc{0} = mo{0}_q + mo{0}_c * ((mo{0}_m - {1}) * (mo{0}_m - {1}));", f.accum, v(f.shift));
                else
                    line("acc{0} = nr > 0 ? se{0}_s * kiln_exp_sel<{2}>(se{0}_m - {1}) : 0.0f;", f.accum, v(f.shift),
                         fast_exp());
            }
            close();
            continue;
        }
        folds_now_.clear();
        if ((int)bi == first_loop_block()) folds_now_ = folds;
        declare_acc_results(b);
        open("");
        const std::vector<int> invariant = row_invariant(b);
        for (int id : invariant) line("const {} {} = {};", ctype(k_.instrs[id].type), v(id), expr(k_.instrs[id]));
        hoisted_.assign(k_.instrs.size(), false);
        for (int id : invariant) hoisted_[id] = true;
        init_acc_states(b);
        // Groups of V consecutive elements move with one load or store per buffer over the
        // row's aligned body: the loads the pass makes from memory (the first pass: every
        // buffer it reads) and every store.
        const bool first = (int)bi == first_loop_block();
        std::vector<size_t> vec_loads, vec_stores;
        if (anchor >= 0) {
            std::vector<bool> loaded(k_.buffers.size(), false);
            for (int id : b.instrs)
                if (k_.instrs[id].op == Op::Load) loaded[k_.instrs[id].index] = true;
            for (size_t buf = 0; buf < k_.buffers.size(); ++buf)
                if (loaded[buf] && vector_buffer(buf)) vec_loads.push_back(buf);
            for (const kir::Store& st : b.stores)
                if (vector_buffer(st.buffer)) vec_stores.push_back(st.buffer);
        }
        // Groups a step keeps in flight: 4 in the first pass; in a later one 4 where it reads one
        // buffer from memory besides the row cache (a norm's weight: its loads then wait on L2 as
        // the first pass's wait on DRAM), else 2 (the cache alone; two such buffers' 4 groups
        // take registers the entry does not have).
        int memory_reads = 0;
        for (size_t buf : vec_loads) memory_reads += slot[buf] < 0;
        const int groups = first || memory_reads == 1 ? 4 : 2;
        const int step = vw > 1 ? std::min(32, groups * vw) : first ? 16 : 4;
        if (entry == RowEntry::Shared) line("long long j = 0;");
        open("if (live)");
        if (!small && (registers || !vec_loads.empty() || !vec_stores.empty())) {
            // The pass goes in groups when every buffer it stores in groups has the anchor's phase
            // and no pointer is off its element size. A load out of phase shifts by s<b> bytes.
            std::string same;
            std::vector<size_t> moved = vec_loads;
            moved.insert(moved.end(), vec_stores.begin(), vec_stores.end());
            for (size_t buf : moved) {
                const size_t size = dtype_size(k_.buffers[buf].dtype);
                const bool load = std::find(vec_loads.begin(), vec_loads.end(), buf) != vec_loads.end();
                if (!load || !shifted(buf))
                    same += fmt::format("{}(({} + h) & {})", same.empty() ? "" : " | ", element_of(buf), vw - 1);
                if (size > 1)   // a pointer off its element size
                    same += fmt::format("{}((unsigned long long)(b{} + {}) & {})", same.empty() ? "" : " | ", buf,
                                        offset((int)buf), size - 1);
            }
            if (!registers) line("const bool aligned = ({}) == 0;", same.empty() ? "0" : same);
            std::string any_shift;
            for (size_t buf : vec_loads)
                if (!registers && shifted(buf)) {
                    any_shift += fmt::format("{}s{}", any_shift.empty() ? "" : " | ", buf);
                    const size_t size = dtype_size(k_.buffers[buf].dtype);
                    const GroupWords gw = group_words(k_.buffers[buf].dtype, vw);
                    line("const unsigned s{} = (unsigned)(((unsigned long long)(b{} + {}) + (unsigned long long)h * {}) & "
                         "{});",
                         buf, buf, offset((int)buf), size, (size_t)gw.per_word * size - 1);
                }
            // Steps of `n` elements: several groups, so that their loads are in flight at once, then
            // single groups for what is left of the aligned body, the last round's included.
            auto vector_loop = [&](int n, bool uniform, bool shifting) {
                if (registers) {   // each of the thread's groups, unrolled: g indexes the registers
                    line("#pragma unroll");
                    open(fmt::format("for (int g = 0; g < {}; ++g)", detail::kRowRegisterGroups));
                    line("const long long j = (long long)g << {};", shift);
                    open(fmt::format("if ((((long long)g * G + t) << {}) < nr)", shift));
                } else {
                    // The step's first group: its element index in the row (q) and its word in a
                    // cache region (qs, in groups), carried from step to step.
                    open("");
                    line("long long q = ((j >> {}) * G + t) * {} + h;", shift, vw);
                    line("unsigned qs = (unsigned)(j >> {}) * (unsigned)row_threads;", shift);
                    line("#pragma unroll 1");
                    if (uniform) open(fmt::format("for (; aligned && j + {0} <= fullh; j += {0})", n));
                    else   // this thread's next group, if it lies in the body (the last round of a row)
                        open(fmt::format("for (; aligned && j < per_thread && ((((j >> {0}) * G + t) + 1) << {0}) + h <= "
                                         "nr; j += {1})",
                                         shift, vw));
                }
                preloaded_.assign(k_.buffers.size(), "");
                store_to_.assign(k_.buffers.size(), "");
                if (registers) {
                    line("const long long q = (((long long)g * G + t) << {}) + h;", shift);
                    line("const unsigned qs = (unsigned)g * (unsigned)row_threads;");
                }
                // The address of word w of group g (of this step) of buffer buf: group g of the
                // step lies g row strides of groups past the first.
                auto word_at = [&](size_t buf, int g, int w, const GroupWords& gw) {
                    const std::string at = g ? fmt::format("q + {} * ((long long)G << {})", g, shift) : "q";
                    return fmt::format("b{} + {} + {}{}", buf, offset((int)buf), at,
                                       w ? fmt::format(" + {}", w * gw.per_word) : "");
                };
                // The step's words holding instruction id's values when id loads a 16-bit float
                // buffer that this step moves in words, two values a 32-bit word, in element order
                // (a C initializer list); "" otherwise.
                auto packed_words = [&](int id, int n) -> std::string {
                    const kir::Instr& in = k_.instrs[id];
                    if (in.op != Op::Load || std::find(vec_loads.begin(), vec_loads.end(), (size_t)in.index) == vec_loads.end())
                        return "";
                    const DType t = k_.buffers[in.index].dtype;
                    const GroupWords gw = group_words(t, vw);
                    if ((t != DType::Float16 && t != DType::BFloat16) || gw.words == 0 || gw.per_word % 2) return "";
                    static const char* const part[] = {".x", ".y", ".z", ".w"};
                    std::string list;
                    for (int g = 0; g < n / vw; ++g)
                        for (int w = 0; w < gw.words; ++w)
                            for (int l = 0; l < gw.per_word / 2; ++l)
                                list += fmt::format("{}w{}_{}_{}{}", list.empty() ? "" : ", ", in.index, g, w,
                                                    gw.per_word == 2 ? "" : part[l]);
                    return list;
                };
                // The step after its loads: the words to floats, the elements, the stores.
                auto step_body = [&](Unpack mode) {
                    for (size_t buf : vec_loads) {
                        const DType t = k_.buffers[buf].dtype;
                        const GroupWords gw = group_words(t, vw);
                        line("{} e{}[{}];", ctype(compute_type(t)), buf, n);
                        const Unpack m = needs_exact_load(buf, (int)bi) ? mode : Unpack::Hardware;
                        for (int g = 0; g < n / vw; ++g)
                            for (int w = 0; w < gw.words; ++w)
                                emit_unpack(t, gw.per_word, fmt::format("w{}_{}_{}", buf, g, w), fmt::format("e{}", buf),
                                            g * vw + w * gw.per_word, m);
                        preloaded_[buf] = fmt::format("e{}[u]", buf);
                    }
                    for (size_t buf : vec_stores) {
                        line("{} r{}[{}];", ctype(compute_type(k_.buffers[buf].dtype)), buf, n);
                        store_to_[buf] = fmt::format("r{}[u]", buf);
                    }
                    for (const detail::RowFold& f : folds_now_) line("float mv{}[{}];", f.accum, n);
                    step_summed_.assign(k_.accums.size(), false);
                    for (const detail::RowFold& f : folds_now_)
                        if (f.kind == detail::RowFold::Moments && f.shared >= 0) step_summed_[f.shared] = true;
                    step_arg_.assign(k_.accums.size(), false);
                    step_words_.assign(k_.accums.size(), "");
                    for (int ai : b.accums)
                        if (stepped(k_.accums[ai].kind) && k_.accums[ai].type == CT::F32 &&
                            (from_fold_.empty() || !from_fold_[ai]) && !step_summed_[ai]) {
                            step_arg_[ai] = true;
                            step_words_[ai] = packed_words(k_.accums[ai].value, n);
                            if (step_floats(ai)) line("float av{}[{}];", ai, n);
                        }
                    folds_grouped_ = in_order_ = true;
                    line("#pragma unroll");
                    open(fmt::format("for (int u = 0; u < {}; ++u)", n));
                    line("const long long ri = q + (u / {1}) * ((long long)G << {0}) + u % {1};", shift, vw);
                    emit_row_element(bi, slot, first_use, "(j + u)");
                    close();
                    folds_grouped_ = in_order_ = false;
                    step_summed_.clear();
                    for (int ai : b.accums)
                        if (step_arg_[ai]) {
                            // A value loaded as this step's 16-bit words: its extreme from the words.
                            const std::string& words = step_words_[ai];
                            const bool bf = !words.empty() &&
                                            k_.buffers[k_.instrs[k_.accums[ai].value].index].dtype == DType::BFloat16;
                            if (!words.empty())
                                line("const unsigned pw{}[{}] = {{{}}};", ai, n / 2, words);
                            if (is_arg(k_.accums[ai].kind) && words.empty())
                                line("kiln_arg_step<{0}, {1}, {2}>(acc{3}_v, acc{3}_p, av{3}, q, (long long)G << {4});",
                                     acc_struct(k_.accums[ai]), n, vw, ai, shift);
                            else if (is_arg(k_.accums[ai].kind))
                                line("kiln_arg_step16<{0}, {1}, {2}, {5}, {6}>(acc{3}_v, acc{3}_p, pw{3}, q, (long long)G << {4});",
                                     acc_struct(k_.accums[ai]), n, vw, ai, shift, bf ? "true" : "false", n / 2);
                            else if (words.empty())
                                line("kiln_ext_step<{0}, {1}>(acc{2}_v, acc{2}_p, av{2});", acc_struct(k_.accums[ai]), n, ai);
                            else
                                line("kiln_ext_step16<{0}, {1}, {3}, {4}>(acc{2}_v, acc{2}_p, av{2}, pw{2});",
                                     acc_struct(k_.accums[ai]), n, ai, bf ? "true" : "false", n / 2);
                        }
                    step_arg_.clear();
                    step_words_.clear();
                    // The step's values as one group: its mean, the squared deviations from it, merged;
                    // or its max, the sum of exponentials about it, merged.
                    for (const detail::RowFold& f : folds_now_) {
                        if (f.kind == detail::RowFold::ExpSum) {
                            line("kiln_lse_step<{0}, {1}>(se{2}_m, se{2}_s, mv{2});", fast_exp(), n, f.accum);
                            continue;
                        }
                        emit_moments_step(f, n);
                    }
                    for (size_t buf : vec_stores) {
                        const DType t = k_.buffers[buf].dtype;
                        const GroupWords gw = group_words(t, vw);
                        for (int g = 0; g < n / vw; ++g)
                            for (int w = 0; w < gw.words; ++w) {
                                const std::string word = fmt::format("s{}_{}_{}", buf, g, w);
                                line("{} {} = {{}};", word_type(t, gw.per_word), word);
                                emit_pack(t, gw.per_word, word, fmt::format("r{}", buf), g * vw + w * gw.per_word,
                                          needs_exact_store(buf, (int)bi));
                                line("kiln_stg({}, {});", word_at(buf, g, w, gw), word);
                            }
                    }
                };
                for (size_t buf : vec_loads) {
                    const DType t = k_.buffers[buf].dtype;
                    const GroupWords gw = group_words(t, vw);
                    const char* wt = word_type(t, gw.per_word);
                    for (int g = 0; g < n / vw; ++g)
                        for (int w = 0; w < gw.words; ++w) {
                            const std::string mem =
                                !shifting || !shifted(buf) ? fmt::format("*(const {}*)({})", wt, word_at(buf, g, w, gw))
                                : dtype_size(t) == 4       ? fmt::format("kiln_ldg_words<{}>({})", wt, word_at(buf, g, w, gw))
                                                           : fmt::format("kiln_ldg_shift<{}>({}, s{})", wt, word_at(buf, g, w, gw), buf);
                            const std::string addr =
                                fmt::format("xs{} + (qs{}) * {} + {}", buf, g ? fmt::format(" + {} * (unsigned)row_threads", g) : "",
                                            vw * dtype_size(t), w * gw.per_word * dtype_size(t));
                            if (slot[buf] < 0) {
                                line("const {} w{}_{}_{} = {};", wt, buf, g, w, mem);
                            } else if (registers) {   // loaded before the pass on first use
                                line("const {} w{}_{}_{} = rg{}_{}[g];", wt, buf, g, w, buf, w);
                            } else if (first_use[buf] == (int)bi) {
                                line("const {} w{}_{}_{} = {};", wt, buf, g, w, mem);
                                line("if (cached) kiln_sts({}, w{}_{}_{});", addr, buf, g, w);
                            } else {
                                line("const {} w{}_{}_{} = cached ? kiln_lds<{}>({}) : {};", wt, buf, g, w, wt, addr,
                                     mem);
                            }
                        }
                }
                // A float16 NaN needs the exact conversion, which a branch per group would have to
                // finish before any use, every group's floats live at once. One test of the whole
                // step instead chooses between two copies of the step: the hardware's conversions,
                // which the compiler moves to each use, or the exact ones.
                std::string any_nan;
                const GroupWords hw = group_words(DType::Float16, vw);
                for (size_t buf : vec_loads)
                    if (k_.buffers[buf].dtype == DType::Float16 && needs_exact_load(buf, (int)bi))
                        for (int g = 0; g < n / vw; ++g)
                            for (int w = 0; w < hw.words; ++w)
                                for (int l = 0; l < hw.per_word; l += 2) {
                                    int shift16 = 0;
                                    const std::string word = fmt::format("w{}_{}_{}", buf, g, w);
                                    any_nan += fmt::format("{}kiln_f16x2_nan({})", any_nan.empty() ? "" : " | ",
                                                           word_part(DType::Float16, hw.per_word, word, l, &shift16));
                                }
                if (!any_nan.empty()) {
                    line("const unsigned step_nan = {};", any_nan);
                    open("if (step_nan == 0)");
                    step_body(Unpack::Hardware);
                    close();
                    open("else");
                    step_body(Unpack::Exact);
                    close();
                } else {
                    step_body(Unpack::Tested);
                }
                preloaded_.clear();
                store_to_.clear();
                if (!registers) {
                    line("q += (long long)G * {};", n);
                    line("qs += {}u * (unsigned)row_threads;", n / vw);
                }
                close();
                close();   // the registers' group test, or the steps' scope
            };
            // Rows whose vectors are all in phase (every row when the row length is a multiple of
            // V) run a copy of the loops without the shifts; the shifting copy goes a group at a
            // time (its two words per load would otherwise spill) unless every buffer it shifts
            // has 4-byte elements, which it reads one by one (kiln_ldg_words) and steps as the
            // copy in phase does.
            bool words_only = true;
            for (size_t buf : vec_loads)
                if (shifted(buf) && dtype_size(k_.buffers[buf].dtype) != 4) words_only = false;
            auto vector_loops = [&](bool shifting) {
                if (step > vw && (!shifting || words_only)) vector_loop(step, true, shifting);
                vector_loop(vw, false, shifting);
            };
            if (registers) {
                // The pass that reads a cached buffer first loads all of the thread's groups of it
                // at once, then works through them.
                bool fresh = false;
                for (size_t buf : vec_loads) fresh = fresh || (slot[buf] >= 0 && first_use[buf] == (int)bi);
                if (fresh) {
                    line("#pragma unroll");
                    open(fmt::format("for (int g = 0; g < {}; ++g)", detail::kRowRegisterGroups));
                    open(fmt::format("if ((((long long)g * G + t) << {}) < nr)", shift));
                    for (size_t buf : vec_loads) {
                        if (slot[buf] < 0 || first_use[buf] != (int)bi) continue;
                        const GroupWords gw = group_words(k_.buffers[buf].dtype, vw);
                        for (int w = 0; w < gw.words; ++w)
                            line("rg{0}_{1}[g] = *(const {2}*)(b{0} + {3} + ((long long)g * G + t) * {4} + {5});", buf, w,
                                 word_type(k_.buffers[buf].dtype, gw.per_word), offset((int)buf), vw, w * gw.per_word);
                    }
                    close();
                    close();
                }
                vector_loop(vw, false, false);
            } else if (any_shift.empty()) {
                vector_loops(false);
            } else {
                open(fmt::format("if (({}) == 0)", any_shift));
                vector_loops(false);
                close();
                open("else");
                vector_loops(true);
                close();
            }
        }
        // Slots the grouped path did not take (a pass out of phase, the end of the body) go
        // element by element; slot r is element r + h, wrapped. Rows in registers have none.
        if (registers) {
            close();   // live
        } else if (small) {
            // Thread t takes elements t, t + G, ...: a warp's loads are contiguous.
            line("#pragma unroll 1");
            open(fmt::format("for ({} ri = t; ri < nr; ri += G)", ix));
            emit_row_element(bi, slot, first_use, "ri");
            close();
            close();   // live
        } else {
            const int scalar_step = vec_loads.empty() && vec_stores.empty() ? step : 4;
            line("#pragma unroll 1");
            open(fmt::format("for (; j + {0} <= full; j += {0})", scalar_step));
            line("#pragma unroll");
            open(fmt::format("for (int u = 0; u < {}; ++u)", scalar_step));
            line("const long long rslot = {} + h;", row_index("j + u"));
            line("const long long ri = rslot >= nr ? rslot - nr : rslot;");
            emit_row_element(bi, slot, first_use, "(j + u)");
            close();
            close();
            close();
            // A thread's slots grow with j: the first past the row ends its part of the pass (the
            // threads past the row's last group would otherwise walk their empty slots to per_thread).
            line("#pragma unroll 1");
            open("for (; j < per_thread; ++j)");
            line("const long long rslot = {};", row_index("j"));
            line("if (!live || rslot >= nr) break;");
            line("const long long ri = rslot + h >= nr ? rslot + h - nr : rslot + h;");
            emit_row_element(bi, slot, first_use, "j");
            close();
        }
        hoisted_.clear();
        std::vector<bool> shared(k_.accums.size(), false);
        for (const detail::RowFold& f : folds_now_)
            if (f.shared >= 0) shared[f.shared] = true;
        for (int ai : b.accums) {
            const kir::Accum& ac = k_.accums[ai];
            if (!shared[ai])
                line("kiln_row_reduce<{0}, {3}>(acc{1}_v, acc{1}_p, G, kiln_sv{2}, kiln_sp, {4}, xround);",
                     acc_struct(ac), ai, acc_suffix(ac.type), levels, xarg);
        }
        for (const detail::RowFold& f : folds_now_) {
            if (f.kind == detail::RowFold::ExpSum) {
                line("kiln_row_reduce_lse<{1}, {2}>(se{0}_m, se{0}_s, G, kiln_sem, kiln_ses, {3}, xround);", f.accum,
                     fast_exp(), levels, xarg);
                if (f.shared >= 0) line("acc{}_v = se{}_m;   // the max of the same values", f.shared, f.accum);
                continue;
            }
            open("");
            if (f.shared < 0) line("float unused = 0.0f;");
            line("kiln_row_reduce_moments<{1}, {3}>(mo{0}_c, mo{0}_m, mo{0}_q, {2}, G, kiln_smc, kiln_smm, kiln_smq, "
                 "kiln_sms, {4}, xround);",
                 f.accum, f.shared >= 0 ? "true" : "false", f.shared >= 0 ? fmt::format("acc{}_v", f.shared) : "unused",
                 levels, xarg);
            close();
        }
        folds_now_.clear();
        set_acc_results(b);
        close();
    }
    close();   // rows
    from_fold_.clear();
    if (cluster) line("if (cs > 0) kiln_cluster_sync();   // no block leaves while its last words are on their way");
    close_kernel();
    narrow_ = false;
}

} // namespace kiln::codegen::detail
