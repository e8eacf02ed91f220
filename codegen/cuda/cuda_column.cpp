// Column reductions (cuda_codegen.hpp): column_width parallel points x the slices of the reduced
// points that fill a block of kColumnThreads; when the parallel points alone would not fill the GPU, the reduced points are split
// into chunks reduced by blocks of their own, and a second entry combines the chunks in order.
#include "codegen/cuda/cuda_emitter.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace kiln::codegen::detail {

bool column_splittable(const kir::Kernel& k) {
    if (k.blocks.empty() || !k.blocks[0].loop) return false;
    for (size_t bi = 1; bi < k.blocks.size(); ++bi)
        if (k.blocks[bi].loop) return false;
    return true;
}

void Emitter::emit_column_kernel() {
    const int width = detail::column_width(k_), slices = detail::kColumnThreads / width;
    const bool split = column_splittable(k_);
    line("");
    open_kernel(k_.name, width * slices);
    emit_buffer_pointers(all_uses_);
    emit_reduce_scratch(false);
    if (!split) line("(void)scratch; (void)param;");
    line("const long long np = {};", product(pdims_));
    line("const long long nr = {};", product(rdims_));
    line("const int column = (int)(threadIdx.x & {}), slice = (int)(threadIdx.x / {});", width - 1, width);
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
    line("const bool live = p0 + column < np;");
    line("const long long pi = live ? p0 + column : p0;");
    emit_ppoint_setup();
    for (size_t bi = 0; bi < k_.blocks.size(); ++bi) {
        const kir::Block& b = k_.blocks[bi];
        if (!b.loop) {
            if (split) open("if (chunks == 1)");
            emit_point_block(b, "live && slice == 0");
            if (split) close();
            continue;
        }
        declare_acc_results(b);
        open("");
        init_acc_states(b);
        // Steps of 8 points of the slice, every load of a step issued before any arithmetic, so
        // that 8 loads of a thread are in flight at once (a warp's 128-byte float32 loads reach
        // the copy bandwidth only with that many outstanding; left to the compiler, an unrolled
        // loop adds each value as it arrives and waits after two or three loads).
        const int unroll = 8;
        std::vector<size_t> pre;
        for (int id : b.instrs) {
            const kir::Instr& in = k_.instrs[id];
            if (in.op != Op::Load || std::find(pre.begin(), pre.end(), (size_t)in.index) != pre.end()) continue;
            bool varies = false;
            for (int d : rdims_) varies = varies || k_.buffers[in.index].layout[d] != StrideKind::Zero;
            if (varies) pre.push_back((size_t)in.index);
        }
        line("long long rj = live ? rbegin + slice : rend;");
        if (!pre.empty()) {
            line("#pragma unroll 1");
            open(fmt::format("for (; rj + {} < rend; rj += {})", (unroll - 1) * slices, unroll * slices));
            for (size_t buf : pre) line("{} m{}[{}];", storage_type(k_.buffers[buf].dtype), buf, unroll);
            line("#pragma unroll");
            open(fmt::format("for (int u = 0; u < {}; ++u)", unroll));
            line("const long long ri = rj + u * {};", slices);
            scope_ = Scope::RLoop;
            emit_coords(rdims_, "ri", needed_coords(block_uses_[bi], rdims_, true), "tr");
            emit_rloop_offsets(block_uses_[bi]);
            for (size_t buf : pre) line("m{0}[u] = b{0}[{1}];", buf, offset((int)buf));
            scope_ = Scope::PPoint;
            close();
            // float16 widens by the hardware's conversion unless the step holds a NaN (whose
            // payload only the exact conversion keeps): one test per step, two copies of it.
            std::string nan_test;
            for (size_t buf : pre)
                if (k_.buffers[buf].dtype == DType::Float16) {
                    if (nan_test.empty()) line("unsigned step_nan = 0;");
                    line("#pragma unroll");
                    line("for (int u = 0; u < {}; ++u) step_nan |= ((unsigned)m{}[u] & 0x7fffu) + 0x3ffu;", unroll, buf);
                    nan_test = "(step_nan & 0x8000u) == 0";
                }
            auto compute = [&](bool hardware) {
                line("#pragma unroll");
                open(fmt::format("for (int u = 0; u < {}; ++u)", unroll));
                line("const long long ri = rj + u * {};", slices);
                for (size_t buf : pre) {
                    const DType t = k_.buffers[buf].dtype;
                    const std::string m = fmt::format("m{}[u]", buf);
                    load_override_[buf] = hardware && t == DType::Float16 ? fmt::format("kiln_f16_to_f32_hw({})", m)
                                                                          : load_expr(t, m);
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
            close();
        }
        line("#pragma unroll 1");
        open(fmt::format("for (long long ri = rj; ri < rend; ri += {})", slices));
        emit_rloop_body(bi);
        close();
        for (int ai : b.accums) {
            const kir::Accum& ac = k_.accums[ai];
            line("kiln_column_reduce<{0}, {3}>(acc{1}_v, acc{1}_p, kiln_sv{2}, kiln_sp);", acc_struct(ac), ai,
                 ac.type == CT::F32 ? "f" : "i", width);
        }
        if (split) {
            // Record (column, chunk) of the scratch: accumulator i at byte 8 * i.
            open("if (chunks > 1 && live && slice == 0)");
            line("unsigned char* const rec = scratch + ((p0 + column) * chunks + chunk) * {};", record_bytes());
            store_acc_record(b);
            close();
        }
        set_acc_results(b);
        close();
    }
    close();
    close();
    if (split) emit_column_final_kernel();
}

// A warp per column: lane l folds the column's chunk records l, l + 32, ... in chunk order,
// the warp combines its lanes in a fixed tree (so the same records always give the same
// result, and a long list of chunks is read 32 records at a time), then runs the Point blocks.
void Emitter::emit_column_final_kernel() {
    const kir::Block& loop = k_.blocks[0];
    line("");
    open_kernel(k_.name + "_final", kCudaBlockSize);
    emit_buffer_pointers(all_uses_);
    line("const int chunks = param;");
    line("const long long np = {};", product(pdims_));
    line("const int lane = (int)(threadIdx.x & 31);");
    line("const long long warps = (long long)gridDim.x * (blockDim.x / 32);");
    line("#pragma unroll 1");
    open("for (long long pi = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32; pi < np; pi += warps)");
    emit_ppoint_setup();
    declare_acc_results(loop);
    open("");
    init_acc_states(loop);
    line("#pragma unroll 4");
    open("for (int c = lane; c < chunks; c += 32)");
    line("const unsigned char* const rec = scratch + (pi * chunks + c) * {};", record_bytes());
    fold_acc_record(loop);
    close();
    for (int ai : loop.accums) {
        line("kiln_warp_reduce<{0}>(acc{1}_v, acc{1}_p);", acc_struct(k_.accums[ai]), ai);
        line("acc{0}_v = __shfl_sync(0xffffffffu, acc{0}_v, 0);", ai);
        line("acc{0}_p = __shfl_sync(0xffffffffu, acc{0}_p, 0);", ai);
    }
    set_acc_results(loop);
    close();
    for (size_t bi = 1; bi < k_.blocks.size(); ++bi) emit_point_block(k_.blocks[bi], "lane == 0");
    close();
    close();
}

} // namespace kiln::codegen::detail
