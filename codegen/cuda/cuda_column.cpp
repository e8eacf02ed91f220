// Column reductions (cuda_codegen.hpp): column_width parallel points x the slices of the reduced
// points that fill a block of kColumnThreads; when the parallel points alone would not fill the GPU, the reduced points are split
// into chunks reduced by blocks of their own, combined in order by the last block to finish (few chunks) or a second entry.
#include "codegen/cuda/cuda_emitter.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace kiln::codegen::detail {

bool column_splittable(const kir::Kernel& k) {
    if (k.blocks.empty() || !k.blocks[0].loop) return false;
    bool later = false;
    for (size_t bi = 1; bi < k.blocks.size(); ++bi) later = later || k.blocks[bi].loop;
    return !later || !column_folds(k).empty();   // (column_folds: only when every later Loop block folds)
}

void Emitter::emit_column_folded_block(size_t bi, const std::vector<detail::RowFold>& folds, const std::string& guard) {
    const kir::Block& b = k_.blocks[bi];
    declare_acc_results(b);
    if (!guard.empty()) open(fmt::format("if ({})", guard));
    open("");
    for (const detail::RowFold& f : folds) {
        if (f.block != (int)bi) continue;
        // k's instructions (column_folds: results, parameters and arithmetic), in order
        open("");
        for (int id : detail::shift_chain(k_, f.shift))
            line("const {} {} = {};", ctype(k_.instrs[id].type), v(id), expr(k_.instrs[id]));
        line("{0} = mo{1}{3}_q + mo{1}{3}_c * ((mo{1}{3}_m - {2}) * (mo{1}{3}_m - {2}));", acc(f.accum), f.accum, v(f.shift),
             col_);
        close();
    }
    close();
    if (!guard.empty()) close();
}

void Emitter::emit_column_kernel() {
    emit_column_entry(0);
    if (const int v = detail::column_vector_width(k_)) emit_column_entry(v);
    if (column_splittable(k_)) emit_column_final_kernel();
}

// Loads of Loop block `b` that vary along the reduced points: issued a step ahead of the
// arithmetic (emit_column_entry).
std::vector<size_t> Emitter::column_step_loads(const kir::Block& b) const {
    std::vector<size_t> pre;
    for (int id : b.instrs) {
        const kir::Instr& in = k_.instrs[id];
        if (in.op != Op::Load || std::find(pre.begin(), pre.end(), (size_t)in.index) != pre.end()) continue;
        if (detail::varies_along_reduced(k_, (size_t)in.index)) pre.push_back((size_t)in.index);
    }
    return pre;
}

// vec = 0: entry NAME, one parallel point per thread. vec = V > 1: entry NAME_v, V adjacent
// points of the innermost parallel dim q per thread (detail::column_vector_width), a buffer
// contiguous along q read V elements at a time; every per-point name carries the suffix _c<c>
// (col_), and the launch guarantees whole, aligned groups (cuda_launch_aligned).
void Emitter::emit_column_entry(int vec) {
    const int width = detail::column_width(k_), per = vec ? vec : 1, across = width / per;
    const int slices = detail::kColumnThreads / across;
    const bool split = column_splittable(k_);
    const std::vector<detail::RowFold> folds = detail::column_folds(k_);
    const std::vector<bool> folded = detail::folded_blocks(k_, folds);
    const int q = detail::innermost_parallel_dim(k_);
    auto along_q = [&](size_t b) { return q >= 0 && k_.buffers[b].layout[q] == StrideKind::One; };
    auto per_column = [&](auto&& emit) {
        for (int c = 0; c < per; ++c) {
            col_ = vec ? fmt::format("_c{}", c) : "";
            emit(c);
        }
        col_.clear();
    };
    line("");
    open_kernel(vec ? k_.name + "_v" : k_.name, width * slices / per, vec ? detail::kColumnVectorBlocks : 0, split);
    emit_buffer_pointers(all_uses_);
    emit_reduce_scratch(false, per);
    if (split) line("__shared__ bool kiln_last;");
    if (!folds.empty()) line("__shared__ float kiln_smc[{0}], kiln_smm[{0}], kiln_smq[{0}];", 256 * per + 256);
    if (!split) line("(void)scratch; (void)param;");
    line("const long long np = {};", product(pdims_));
    line("const long long nr = {};", product(rdims_));
    line("const int column = (int)(threadIdx.x & {}), slice = (int)(threadIdx.x / {});", across - 1, across);
    if (split) {
        // param = the chunks S; block b reduces chunk b % S of column block b / S.
        line("const int chunks = param;");
        line("const int chunk = (int)(blockIdx.x % chunks);");
        line("const long long per_chunk = (nr + chunks - 1) / chunks;");
        line("const long long rbegin = chunk * per_chunk;");
        line("const long long rend = rbegin + per_chunk < nr ? rbegin + per_chunk : nr;");
        line("#pragma unroll 1");
        open(fmt::format("for (long long p0 = (long long)(blockIdx.x / chunks) * {0}; p0 < np; "
                         "p0 += (long long)(gridDim.x / chunks) * {0})",
                         width));
    } else {
        line("const long long rbegin = 0, rend = nr;");
        line("#pragma unroll 1");
        open(fmt::format("for (long long p0 = (long long)blockIdx.x * {0}; p0 < np; p0 += (long long)gridDim.x * {0})",
                         width));
    }
    line("const bool live = p0 + column * {} < np;", per);
    line("const long long pi = live ? p0 + column * {} : p0;", per);
    emit_ppoint_setup();
    if (vec)
        per_column([&](int c) {
            for (size_t b = 0; b < k_.buffers.size(); ++b)
                if (all_uses_.buffers[b] && !offset_terms((int)b, pdims_).empty())
                    line("const long long pb{}{} = pb{}{};", b, col_, b, along_q(b) ? fmt::format(" + {}", c) : "");
        });
    // The folds' running moments of each column: count, mean, M2.
    per_column([&](int) {
        for (const detail::RowFold& f : folds) line("float mo{0}{1}_c = 0.0f, mo{0}{1}_m = 0.0f, mo{0}{1}_q = 0.0f;", f.accum, col_);
    });
    for (size_t bi = 0; bi < k_.blocks.size(); ++bi) {
        const kir::Block& b = k_.blocks[bi];
        if (folded[bi]) {
            per_column([&](int) { emit_column_folded_block(bi, folds, split ? "chunks == 1" : ""); });
            continue;
        }
        if (!b.loop) {
            if (split) open("if (chunks == 1)");
            per_column([&](int) { emit_point_block(b, "live && slice == 0"); });
            if (split) close();
            continue;
        }
        if (bi == 0) folds_now_ = folds;
        // A step's values of the folds, grouped (mv arrays), their sum added to the shared
        // accumulators with them (emit_moments_step).
        auto begin_grouped = [&](int n) {
            per_column([&](int) {
                for (const detail::RowFold& f : folds_now_) line("float mv{}{}[{}];", f.accum, col_, n);
            });
            step_summed_.assign(k_.accums.size(), false);
            for (const detail::RowFold& f : folds_now_)
                if (f.shared >= 0) step_summed_[f.shared] = true;
            folds_grouped_ = true;
        };
        auto end_grouped = [&](int n) {
            folds_grouped_ = false;
            step_summed_.clear();
            per_column([&](int) {
                for (const detail::RowFold& f : folds_now_) emit_moments_step(f, n);
            });
        };
        per_column([&](int) { declare_acc_results(b); });
        open("");
        per_column([&](int) { init_acc_states(b); });
        // Steps of `unroll` points of the slice, every load of a step issued before any
        // arithmetic, so that that many loads of a thread are in flight at once (a warp's
        // 128-byte float32 loads reach the copy bandwidth only with 8 outstanding; left to the
        // compiler, an unrolled loop adds each value as it arrives and waits after two or three
        // loads). The vector entry's loads are 16 bytes: 4 steps are as many bytes in flight.
        const std::vector<size_t> pre = column_step_loads(b);
        const int unroll = vec ? 4 : 8;
        line("long long rj = live ? rbegin + slice : rend;");
        // One step of n points: the loads, then each point's arithmetic.
        auto step = [&](int n) {
            for (size_t buf : pre) {
                const DType t = k_.buffers[buf].dtype;
                if (vec && along_q(buf)) line("{} m{}[{}];", word_type(t, per), buf, n);
                else line("{} m{}[{}];", storage_type(t), buf, n);
            }
            line("#pragma unroll");
            open(fmt::format("for (int u = 0; u < {}; ++u)", n));
            line("const long long ri = rj + u * {};", slices);
            scope_ = Scope::RLoop;
            emit_coords(rdims_, "ri", needed_coords(block_uses_[bi], rdims_, true), "tr");
            emit_rloop_offsets(block_uses_[bi]);
            for (size_t buf : pre) {
                if (vec && along_q(buf))
                    line("m{0}[u] = *(const {1}*)(b{0} + {2});", buf, word_type(k_.buffers[buf].dtype, per), offset((int)buf));
                else line("m{0}[u] = b{0}[{1}];", buf, offset((int)buf));
            }
            scope_ = Scope::PPoint;
            close();
            if (!folds_now_.empty()) begin_grouped(n);
            if (vec) {
                line("#pragma unroll");
                open(fmt::format("for (int u = 0; u < {}; ++u)", n));
                line("const long long ri = rj + u * {};", slices);
                for (size_t buf : pre) {
                    const DType t = k_.buffers[buf].dtype;
                    if (!along_q(buf)) {
                        line("const {} e{} = {};", ctype(compute_type(t)), buf, load_expr(t, fmt::format("m{}[u]", buf)));
                        continue;
                    }
                    line("{} e{}[{}];", ctype(compute_type(t)), buf, per);
                    emit_unpack(t, per, fmt::format("m{}[u]", buf), fmt::format("e{}", buf), 0,
                                needs_exact_load(buf, (int)bi) ? Unpack::Tested : Unpack::Hardware);
                }
                per_column([&](int c) {
                    open("");
                    for (size_t buf : pre)
                        load_override_[buf] = along_q(buf) ? fmt::format("e{}[{}]", buf, c) : fmt::format("e{}", buf);
                    emit_rloop_body(bi);
                    load_override_.assign(k_.buffers.size(), "");
                    close();
                });
                close();
                if (!folds_now_.empty()) end_grouped(n);
                return;
            }
            // float16 widens by the hardware's conversion unless the step holds a NaN (whose
            // payload only the exact conversion keeps): one test per step, two copies of it.
            std::string nan_test;
            for (size_t buf : pre)
                if (k_.buffers[buf].dtype == DType::Float16 && needs_exact_load(buf, (int)bi)) {
                    if (nan_test.empty()) line("unsigned step_nan = 0;");
                    line("#pragma unroll");
                    line("for (int u = 0; u < {}; ++u) step_nan |= ((unsigned)m{}[u] & 0x7fffu) + 0x3ffu;", n, buf);
                    nan_test = "(step_nan & 0x8000u) == 0";
                }
            auto compute = [&](bool hardware) {
                line("#pragma unroll");
                open(fmt::format("for (int u = 0; u < {}; ++u)", n));
                line("const long long ri = rj + u * {};", slices);
                for (size_t buf : pre) {
                    const DType t = k_.buffers[buf].dtype;
                    const std::string m = fmt::format("m{}[u]", buf);
                    const bool hw = t == DType::Float16 && (hardware || !needs_exact_load(buf, (int)bi));
                    load_override_[buf] = hw ? fmt::format("kiln_f16_to_f32_hw({})", m) : load_expr(t, m);
                }
                emit_rloop_body(bi);
                load_override_.assign(k_.buffers.size(), "");
                close();
            };
            if (nan_test.empty()) {
                compute(false);
            } else {
                open(fmt::format("if ({})", nan_test));
                compute(true);
                close();
                open("else");
                compute(false);
                close();
            }
            if (!folds_now_.empty()) end_grouped(n);
        };
        if (!pre.empty()) {
            line("#pragma unroll 1");
            open(fmt::format("for (; rj + {} < rend; rj += {})", (unroll - 1) * slices, unroll * slices));
            step(unroll);
            close();
        }
        line("#pragma unroll 1");
        if (vec) {
            open(fmt::format("for (; rj < rend; rj += {})", slices));
            step(1);
            close();
        } else {
            open(fmt::format("for (long long ri = rj; ri < rend; ri += {})", slices));
            emit_rloop_body(bi);
            close();
        }
        for (int ai : b.accums) {
            const kir::Accum& ac = k_.accums[ai];
            const std::string sv = fmt::format("kiln_sv{}", acc_suffix(ac.type));
            if (!vec) {
                line("kiln_column_reduce<{0}, {1}>({2}_v, {2}_p, {3}, kiln_sp);", acc_struct(ac), across, acc(ai), sv);
                continue;
            }
            std::string vs, ps;
            per_column([&](int c) {
                vs += fmt::format("{}{}_v", c ? ", " : "", acc(ai));
                ps += fmt::format("{}{}_p", c ? ", " : "", acc(ai));
            });
            open("");
            line("{} rv[{}] = {{{}}};", ctype(ac.type), per, vs);
            line("int rp[{}] = {{{}}};", per, ps);
            line("kiln_column_reduce_v<{}, {}, {}, {}>(rv, rp, {}, kiln_sp);", acc_struct(ac), across, per,
                 is_arg(ac.kind) ? "true" : "false", sv);
            per_column([&](int c) { line("{0}_v = rv[{1}], {0}_p = rp[{1}];", acc(ai), c); });
            close();
        }
        // The folds' moments across the block's slices, then (split) into the chunk's record:
        // the mean and M2 in the folded accumulator's slot.
        const int slot = detail::acc_record_slot(k_);
        for (const detail::RowFold& f : folds_now_) {
            open("");
            std::string cs, ms, qs;
            per_column([&](int c) {
                cs += fmt::format("{}mo{}{}_c", c ? ", " : "", f.accum, col_);
                ms += fmt::format("{}mo{}{}_m", c ? ", " : "", f.accum, col_);
                qs += fmt::format("{}mo{}{}_q", c ? ", " : "", f.accum, col_);
            });
            line("float rc[{0}] = {{{1}}}, rm[{0}] = {{{2}}}, rq[{0}] = {{{3}}};", per, cs, ms, qs);
            line("kiln_column_reduce_moments<{}, {}>(rc, rm, rq, kiln_smc, kiln_smm, kiln_smq);", across, per);
            per_column([&](int c) { line("mo{0}{1}_c = rc[{2}], mo{0}{1}_m = rm[{2}], mo{0}{1}_q = rq[{2}];", f.accum, col_, c); });
            close();
        }
        if (split) {
            // Record (column, chunk) of the scratch (acc_record_slot).
            open("if (chunks > 1 && live && slice == 0)");
            per_column([&](int c) {
                open("");
                line("unsigned char* const rec = scratch + ((pi + {}) * chunks + chunk) * {};", c, record_bytes());
                store_acc_record(b);
                for (const detail::RowFold& f : folds_now_)
                    line("*(float*)(rec + {0}) = mo{2}{3}_m, *(float*)(rec + {1}) = mo{2}{3}_q;", slot * f.accum,
                         slot * f.accum + slot / 2, f.accum, col_);
                close();
            });
            close();
        }
        folds_now_.clear();
        per_column([&](int) { set_acc_results(b); });
        close();
    }
    if (split) {
        // Few chunks: the block that counts its column block's last chunk combines them
        // (emit_column_combine), so no second launch waits on this one.
        open(fmt::format("if (chunks > 1 && chunks <= {})", detail::kColumnCombineChunks));
        emit_last_arrival(fmt::format("counters + p0 / {}", width), "(unsigned)chunks");
        open("if (kiln_last)");
        emit_column_combine(width);
        close();
        close();
    }
    close();
    close_kernel();
}

// Record (column, c) of the scratch folded into the accumulators' states and the folds'
// moments (a chunk's count: its rows), read past L1: other blocks of this launch wrote it.
void Emitter::fold_column_record(const std::string& column, const std::vector<detail::RowFold>& folds) {
    const int slot = detail::acc_record_slot(k_);
    line("const unsigned char* const rec = scratch + ({} * chunks + c) * {};", column, record_bytes());
    fold_acc_record(k_.blocks[0]);
    if (!folds.empty()) {
        line("const long long r0 = c * per_chunk < nr ? c * per_chunk : nr;");
        line("const float rows = (float)((r0 + per_chunk < nr ? r0 + per_chunk : nr) - r0);");
    }
    for (const detail::RowFold& f : folds)
        line("kiln_moments_merge(mo{0}_c, mo{0}_m, mo{0}_q, rows, __ldcg((const float*)(rec + {1})), "
             "__ldcg((const float*)(rec + {2})));",
             f.accum, slot * f.accum, slot * f.accum + slot / 2);
}

// The column block's `width` columns from p0, T = kColumnThreads / width threads side by side
// a column: thread s of a column folds the column's records s, s + T, ... in chunk order (at
// most kColumnCombineChunks of them: a thread's reads in flight at once), the column's threads
// combine in a fixed tree (the same records always give the same result, whichever block
// combines them), then the column's first thread runs the Point blocks. A column past np reads
// the last column's records and stores nothing, so that every lane of a warp takes part in the
// shuffles.
void Emitter::emit_column_combine(int width) {
    const kir::Block& loop = k_.blocks[0];
    const std::vector<detail::RowFold> folds = detail::column_folds(k_);
    const int threads = detail::kColumnThreads / width;
    line("const int sub = (int)(threadIdx.x & {});", threads - 1);
    line("const long long pi = p0 + (long long)(threadIdx.x / {});", threads);
    line("const long long pr = pi < np ? pi : np - 1;");
    init_acc_states(loop);
    for (const detail::RowFold& f : folds) line("float mo{0}_c = 0.0f, mo{0}_m = 0.0f, mo{0}_q = 0.0f;", f.accum);
    line("#pragma unroll 4");
    open(fmt::format("for (int i = 0; i < {}; ++i)", (detail::kColumnCombineChunks + threads - 1) / threads));
    line("const int c = sub + i * {};", threads);
    open("if (c < chunks)");
    fold_column_record("pr", folds);
    close();
    close();
    for (int ai : loop.accums) line("kiln_group_reduce<{}, {}>(acc{}_v, acc{}_p);", acc_struct(k_.accums[ai]), threads, ai, ai);
    for (const detail::RowFold& f : folds)
        line("{{ float unused = 0.0f; kiln_moments_butterfly<false>(mo{0}_c, mo{0}_m, mo{0}_q, unused, {1}); }}", f.accum,
             threads);
    open("if (pi < np)");
    emit_ppoint_setup();
    declare_acc_results(loop);
    set_acc_results(loop);
    const std::vector<bool> folded = detail::folded_blocks(k_, folds);
    for (size_t bi = 1; bi < k_.blocks.size(); ++bi) {
        if (folded[bi]) emit_column_folded_block(bi, folds, "");
        else emit_point_block(k_.blocks[bi], "sub == 0");
    }
    close();
}

// More than kColumnCombineChunks chunks (fewer column blocks): entry NAME_final, a warp per
// column, over the GPU: lane l folds the column's chunk records l, l + 32, ... in chunk order,
// the warp combines its lanes in a fixed tree (so the same records always give the same
// result, and a long list of chunks is read 32 records at a time), then runs the Point blocks.
void Emitter::emit_column_final_kernel() {
    const kir::Block& loop = k_.blocks[0];
    line("");
    const std::vector<detail::RowFold> folds = detail::column_folds(k_);
    open_kernel(k_.name + "_final", kCudaBlockSize);
    emit_buffer_pointers(all_uses_);
    line("const int chunks = param;");
    line("const long long np = {};", product(pdims_));
    if (!folds.empty()) {
        line("const long long nr = {};", product(rdims_));
        line("const long long per_chunk = (nr + chunks - 1) / chunks;");
    }
    line("const int lane = (int)(threadIdx.x & 31);");
    line("const long long warps = (long long)gridDim.x * (blockDim.x / 32);");
    line("#pragma unroll 1");
    open("for (long long pi = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32; pi < np; pi += warps)");
    emit_ppoint_setup();
    declare_acc_results(loop);
    for (const detail::RowFold& f : folds) line("float mo{0}_c = 0.0f, mo{0}_m = 0.0f, mo{0}_q = 0.0f;", f.accum);
    open("");
    init_acc_states(loop);
    line("#pragma unroll 4");
    open("for (int c = lane; c < chunks; c += 32)");
    fold_column_record("pi", folds);
    close();
    for (int ai : loop.accums) {
        line("kiln_warp_reduce<{0}>(acc{1}_v, acc{1}_p);", acc_struct(k_.accums[ai]), ai);
        line("acc{0}_v = __shfl_sync(0xffffffffu, acc{0}_v, 0);", ai);
        line("acc{0}_p = __shfl_sync(0xffffffffu, acc{0}_p, 0);", ai);
    }
    // The lanes' moments in a fixed butterfly: every lane ends with the same.
    for (const detail::RowFold& f : folds)
        line("{{ float unused = 0.0f; kiln_moments_butterfly<false>(mo{0}_c, mo{0}_m, mo{0}_q, unused, 32); }}", f.accum);
    set_acc_results(loop);
    close();
    const std::vector<bool> folded = detail::folded_blocks(k_, folds);
    for (size_t bi = 1; bi < k_.blocks.size(); ++bi) {
        if (folded[bi]) emit_column_folded_block(bi, folds, "");
        else emit_point_block(k_.blocks[bi], "lane == 0");
    }
    close();
    close_kernel();
}

} // namespace kiln::codegen::detail
