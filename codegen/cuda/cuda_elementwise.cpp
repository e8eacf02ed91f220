// Elementwise kernels (cuda_codegen.hpp): grid-stride, with a vector path of 16 bytes of the
// narrowest buffer where every buffer is contiguous or broadcast along the innermost axis
// (rank 1: the whole kernel).
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
    line("#pragma unroll 1");
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
    close_kernel();
}

bool Emitter::vectorisable() const { return detail::elementwise_vector_width(k_) > 1; }

int Emitter::vector_width() const { return detail::elementwise_vector_width(k_); }

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

// 16-bit floats: the paired conversions for every 32-bit part of the word, then (Tested) one
// test of all the parts for a NaN, which redoes the word with the exact conversions (the
// hardware makes every NaN the canonical one).
void Emitter::emit_unpack(DType t, int n, const std::string& w, const std::string& dst, int base, Unpack mode) {
    const bool f16 = t == DType::Float16, bf16 = t == DType::BFloat16;
    if ((!f16 && !bf16) || (f16 && mode == Unpack::Exact)) {
        for (int l = 0; l < n; ++l) line("{}[{}] = {};", dst, base + l, load_expr(t, word_element(t, n, w, l)));
        return;
    }
    std::vector<std::string> parts;
    for (int l = 0; l < n; l += 2) {
        int shift = 0;
        parts.push_back(word_part(t, n, w, l, &shift));
        line("kiln_{}x2_cvt({}, {}[{}], {}[{}]);", f16 ? "f16" : "bf16", parts.back(), dst, base + l, dst, base + l + 1);
    }
    if (bf16 || mode == Unpack::Hardware) return;   // bfloat16 widens exactly, NaNs included
    std::string any;
    for (const std::string& p : parts) any += fmt::format("{}kiln_f16x2_nan({})", any.empty() ? "" : " | ", p);
    open(fmt::format("if ({})", any));
    for (int l = 0; l < n; ++l) line("{}[{}] = {};", dst, base + l, load_expr(t, word_element(t, n, w, l)));
    close();
}

void Emitter::emit_pack(DType t, int n, const std::string& w, const std::string& src, int base, bool exact) {
    const bool f16 = t == DType::Float16, bf16 = t == DType::BFloat16;
    if (!f16 && !bf16) {
        for (int l = 0; l < n; ++l) line("{}", word_store(t, n, w, l, store_value(t, fmt::format("{}[{}]", src, base + l))));
        return;
    }
    const char* name = f16 ? "f16" : "bf16";
    std::vector<std::string> parts;
    for (int l = 0; l < n; l += 2) {
        int shift = 0;
        parts.push_back(word_part(t, n, w, l, &shift));
        line("{} = kiln_f32x2_to_{}x2_cvt({}[{}], {}[{}]);", parts.back(), name, src, base + l, src, base + l + 1);
    }
    if (!exact) return;
    // The hardware turns a NaN into the canonical one, a NaN pattern nothing else produces.
    std::string any;
    for (const std::string& p : parts) any += fmt::format("{}kiln_{}x2_nan({})", any.empty() ? "" : " | ", name, p);
    open(fmt::format("if ({})", any));
    for (int l = 0; l < n; ++l) line("{}", word_store(t, n, w, l, store_value(t, fmt::format("{}[{}]", src, base + l))));
    close();
}

namespace {

// The 16-byte words of a vector of n elements of t: 1, or 2 for float32 beside 16-bit buffers.
int words_of(DType t, int n) { return std::max(1, n * (int)dtype_size(t) / 16); }

// Word w of buffer b's vector number `vector` (one of `words`): its variable and its index
// among the buffer's words of that size.
struct VectorWord {
    std::string name, index;
};
VectorWord vector_word(size_t b, int w, int words, const std::string& vector) {
    if (words == 1) return {fmt::format("w{}", b), vector};
    return {fmt::format("w{}_{}", b, w), fmt::format("{} * {} + {}", words, vector, w)};
}

} // namespace

// n elements per thread with one load and one store of up to 16 bytes per contiguous
// buffer, when every contiguous buffer is aligned for it; the scalar loop does the rest.
// The vector path: words of n elements along the innermost axis, taken where every contiguous
// buffer starts on a word (and, past rank 1, where the innermost size and those buffers' other
// strides are multiples of n, so that every word lies in one row and starts on a word); else
// the scalar loop does it all. Rank 1 leaves its tail past the last whole word to the scalar
// loop (`start`). Past rank 1 a word's row is found once: its lanes share the outer coordinates.
void Emitter::emit_vector_path() {
    const int n = vector_width();
    const int inner = k_.rank - 1;
    std::string misaligned;
    for (size_t b = 0; b < k_.buffers.size(); ++b) {
        if (!all_uses_.buffers[b] || k_.buffers[b].layout[inner] != StrideKind::One) continue;
        misaligned += fmt::format("{}((unsigned long long)b{} & {})", misaligned.empty() ? "" : " | ", b,
                                  std::min<size_t>(16, n * dtype_size(k_.buffers[b].dtype)) - 1);
        for (int d = 0; d < inner; ++d)
            if (k_.buffers[b].layout[d] == StrideKind::Any)
                misaligned += fmt::format(" | (a.strides[{}] % {})", b * k_.rank + d, n);
    }
    if (inner > 0) misaligned += fmt::format("{}({} % {})", misaligned.empty() ? "" : " | ", size(inner), n);
    std::vector<int> all;
    for (int d = 0; d < k_.rank; ++d) all.push_back(d);
    line("long long start = 0;");
    open(fmt::format("if (({}) == 0)", misaligned.empty() ? "0" : misaligned));
    line("const long long nv = ({}) / {};", product(all), n);
    line("#pragma unroll 1");
    open("for (long long q = (long long)blockIdx.x * blockDim.x + threadIdx.x; q < nv; "
         "q += (long long)gridDim.x * blockDim.x)");
    std::vector<bool> stored(k_.buffers.size(), false);
    for (const kir::Block& b : k_.blocks)
        for (auto& st : b.stores) stored[st.buffer] = true;
    // Each buffer's word (contiguous) or element (broadcast) offset at the word's first lane.
    std::vector<std::string> word(k_.buffers.size());
    if (inner > 0) {
        line("const long long i0 = {} * q;", n);
        emit_coords(all, "i0", needed_coords(all_uses_, all, false), "t");
        for (size_t b = 0; b < k_.buffers.size(); ++b) {
            if (!all_uses_.buffers[b]) continue;
            const std::string e = offset_terms((int)b, all);
            line("const long long w_o{} = {};", b, e.empty() ? "0" : e);
            word[b] = fmt::format("(w_o{} / {})", b, n);
        }
    } else {
        for (size_t b = 0; b < k_.buffers.size(); ++b) word[b] = "q";
    }
    for (size_t b = 0; b < k_.buffers.size(); ++b) {
        if (!all_uses_.buffers[b] || k_.buffers[b].layout[inner] != StrideKind::One) continue;
        const DType t = k_.buffers[b].dtype;
        if (stored[b]) {
            line("{} r{}[{}];", ctype(compute_type(t)), b, n);
            continue;
        }
        // A vector of more than 16 bytes is loaded as that many 16-byte words.
        const int words = words_of(t, n), per = n / words;
        line("{} e{}[{}];", ctype(compute_type(t)), b, n);
        for (int w = 0; w < words; ++w) {
            const VectorWord vw = vector_word(b, w, words, word[b]);
            line("const {0} {1} = ((const {0}*)b{2})[{3}];", word_type(t, per), vw.name, b, vw.index);
            emit_unpack(t, per, vw.name, fmt::format("e{}", b), w * per,
                        needs_exact_load(b, -1) ? Unpack::Tested : Unpack::Hardware);
        }
    }
    scope_ = Scope::Elementwise;
    for (int lane = 0; lane < n; ++lane) {
        open("");
        line("const long long i = {} * q + {};", n, lane);
        for (size_t b = 0; b < k_.buffers.size(); ++b) {
            if (!all_uses_.buffers[b]) continue;
            if (k_.buffers[b].layout[inner] == StrideKind::Zero) line("const long long o{} = {};", b, inner > 0 ? fmt::format("w_o{}", b) : "0");
            else if (!stored[b]) load_override_[b] = fmt::format("e{}[{}]", b, lane);
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
                if (k_.buffers[st.buffer].layout[inner] == StrideKind::Zero) {
                    line("b{}[0] = {};", st.buffer, store_value(t, v(st.value)));
                } else {
                    line("r{}[{}] = {};", st.buffer, lane, v(st.value));
                }
                emit_hist_count(st.buffer, v(st.value));
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
        if (stored[b] && k_.buffers[b].layout[inner] == StrideKind::One) {
            const DType t = k_.buffers[b].dtype;
            const int words = words_of(t, n), per = n / words;
            for (int w = 0; w < words; ++w) {
                const VectorWord vw = vector_word(b, w, words, word[b]);
                line("{} {} = {{}};", word_type(t, per), vw.name);
                emit_pack(t, per, vw.name, fmt::format("r{}", b), w * per, needs_exact_store(b, -1));
                line("(({}*)b{})[{}] = {};", word_type(t, per), b, vw.index, vw.name);
            }
        }
    close();
    line("start = nv * {};", n);
    close();
}

} // namespace kiln::codegen::detail
