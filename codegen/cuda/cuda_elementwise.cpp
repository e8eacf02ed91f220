// Elementwise kernels (cuda_codegen.hpp): grid-stride, with a 16-byte vector path for contiguous
// rank-1 kernels.
#include "codegen/cuda/cuda_emitter.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace kiln::codegen::detail {

void Emitter::emit_elementwise_kernel() {
    line("");
    open_kernel(k_.name, kCudaBlockSize);
    emit_buffer_pointers(all_uses_);
    if (vectorisable()) emit_vector_path();
    std::vector<int> all;
    for (int d = 0; d < k_.rank; ++d) all.push_back(d);
    line("const long long n = {};", product(all));
    open(fmt::format("for (long long i = {}(long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; "
                     "i += (long long)gridDim.x * blockDim.x)",
                     vectorisable() ? "start + " : ""));
    scope_ = Scope::Elementwise;
    emit_coords(all, "i", needed_coords(all_uses_, all, false), "t");
    for (size_t b = 0; b < k_.buffers.size(); ++b) {
        if (!all_uses_.buffers[b]) continue;
        std::string e = offset_terms((int)b, all);
        line("const long long o{} = {};", b, e.empty() ? "0" : e);
    }
    // With no reduced dim a Loop block runs once and its accumulators see one point.
    for (const kir::Block& b : k_.blocks) {
        if (!b.loop) {
            emit_instrs(b);
            emit_stores(b);
            continue;
        }
        declare_acc_results(b);
        open("");
        init_acc_states(b);
        emit_instrs(b);
        add_to_acc_states(b, "0");
        emit_stores(b);
        set_acc_results(b);
        close();
    }
    close();
    close();
}

// Rank 1, every buffer contiguous or a broadcast scalar, no gathers or coordinates.
bool Emitter::vectorisable() const {
    if (k_.rank != 1) return false;
    for (size_t b = 0; b < k_.buffers.size(); ++b)
        if (all_uses_.buffers[b] && k_.buffers[b].layout[0] == StrideKind::Any) return false;
    for (const kir::Instr& in : k_.instrs)
        if (in.op == Op::Gather || in.op == Op::Coord) return false;
    return true;
}

// Elements per thread on the vector path: 16 bytes of the widest contiguous buffer.
int Emitter::vector_width() const {
    size_t widest = 1;
    for (size_t b = 0; b < k_.buffers.size(); ++b)
        if (all_uses_.buffers[b] && k_.buffers[b].layout[0] == StrideKind::One)
            widest = std::max(widest, dtype_size(k_.buffers[b].dtype));
    return widest >= 4 ? 4 : widest == 2 ? 8 : 16;
}

// A word holding `n` elements of `t` (4, 8 or 16 bytes), the expression of element `lane` of
// word w, and the statement replacing it with storage value v.
const char* Emitter::word_type(DType t, int n) {
    const size_t bytes = n * dtype_size(t);
    return bytes == 16 ? "uint4" : bytes == 8 ? "uint2" : "unsigned";
}

std::string Emitter::word_part(DType t, int n, const std::string& w, int lane, int* shift) {
    const size_t es = dtype_size(t), byte = lane * es;
    *shift = (int)(byte % 4) * 8;
    return n * es == 4 ? w : fmt::format("{}.{}", w, "xyzw"[byte / 4]);
}

std::string Emitter::word_element(DType t, int n, const std::string& w, int lane) {
    int shift = 0;
    const std::string part = word_part(t, n, w, lane, &shift);
    switch (dtype_size(t)) {
    case 4: return t == DType::Float32 ? fmt::format("__uint_as_float({})", part) : fmt::format("(int){}", part);
    case 2: return fmt::format("(unsigned short)({} >> {})", part, shift);
    default: return fmt::format("(unsigned char)({} >> {})", part, shift);
    }
}

std::string Emitter::word_store(DType t, int n, const std::string& w, int lane, const std::string& v) {
    int shift = 0;
    const std::string part = word_part(t, n, w, lane, &shift);
    switch (dtype_size(t)) {
    case 4:
        return fmt::format("{} = {};", part,
                           t == DType::Float32 ? fmt::format("__float_as_uint({})", v) : fmt::format("(unsigned)({})", v));
    case 2: return fmt::format("{0} = ({0} & ~(0xffffu << {1})) | ((unsigned)({2}) << {1});", part, shift, v);
    default: return fmt::format("{0} = ({0} & ~(0xffu << {1})) | ((unsigned)({2}) << {1});", part, shift, v);
    }
}

// n elements per thread with one load and one store of up to 16 bytes per contiguous
// buffer, when every contiguous buffer is aligned for it; the scalar loop does the rest.
void Emitter::emit_vector_path() {
    const int n = vector_width();
    std::string misaligned;
    for (size_t b = 0; b < k_.buffers.size(); ++b) {
        if (!all_uses_.buffers[b] || k_.buffers[b].layout[0] != StrideKind::One) continue;
        misaligned += fmt::format("{}((unsigned long long)b{} & {})", misaligned.empty() ? "" : " | ", b,
                                  n * dtype_size(k_.buffers[b].dtype) - 1);
    }
    line("long long start = 0;");
    open(fmt::format("if (({}) == 0)", misaligned.empty() ? "0" : misaligned));
    line("const long long nv = a.sizes[0] / {};", n);
    open("for (long long q = (long long)blockIdx.x * blockDim.x + threadIdx.x; q < nv; "
         "q += (long long)gridDim.x * blockDim.x)");
    std::vector<bool> stored(k_.buffers.size(), false);
    for (const kir::Block& b : k_.blocks)
        for (auto& st : b.stores) stored[st.buffer] = true;
    for (size_t b = 0; b < k_.buffers.size(); ++b) {
        if (!all_uses_.buffers[b] || k_.buffers[b].layout[0] != StrideKind::One) continue;
        const char* wt = word_type(k_.buffers[b].dtype, n);
        if (stored[b]) line("{} w{} = {{}};", wt, b);
        else line("const {0} w{1} = ((const {0}*)b{1})[q];", wt, b);
    }
    scope_ = Scope::Elementwise;
    for (int lane = 0; lane < n; ++lane) {
        open("");
        line("const long long i = {} * q + {};", n, lane);
        for (size_t b = 0; b < k_.buffers.size(); ++b) {
            if (!all_uses_.buffers[b]) continue;
            if (k_.buffers[b].layout[0] == StrideKind::Zero) line("const long long o{} = 0;", b);
            else if (!stored[b]) load_override_[b] = load_expr(k_.buffers[b].dtype, word_element(k_.buffers[b].dtype, n, fmt::format("w{}", b), lane));
        }
        for (const kir::Block& b : k_.blocks) {
            if (b.loop) {
                declare_acc_results(b);
                open("");
                init_acc_states(b);
            }
            emit_instrs(b);
            if (b.loop) add_to_acc_states(b, "0");
            for (auto& st : b.stores) {
                const DType t = k_.buffers[st.buffer].dtype;
                if (k_.buffers[st.buffer].layout[0] == StrideKind::Zero) {
                    line("b{}[0] = {};", st.buffer, store_value(t, v(st.value)));
                } else {
                    line("{}", word_store(t, n, fmt::format("w{}", st.buffer), lane, store_value(t, v(st.value))));
                }
            }
            if (b.loop) {
                set_acc_results(b);
                close();
            }
        }
        load_override_.assign(k_.buffers.size(), "");
        close();
    }
    for (size_t b = 0; b < k_.buffers.size(); ++b)
        if (stored[b] && k_.buffers[b].layout[0] == StrideKind::One)
            line("(({}*)b{})[q] = w{};", word_type(k_.buffers[b].dtype, n), b, b);
    close();
    line("start = nv * {};", n);
    close();
}

} // namespace kiln::codegen::detail
