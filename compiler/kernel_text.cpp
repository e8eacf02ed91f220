#include "compiler/kernel_text.hpp"

#include "compiler/kernel_check.hpp"
#include "ir/error.hpp"

#include <fmt/format.h>

#include <charconv>
#include <cstring>

namespace kiln {

namespace {

// Integers appended with to_chars: a plan for a new shape keys every stage it lowers, and
// formatting each field through fmt made the key the larger half of lowering's time.
struct TextOut {
    std::string s;
    TextOut& operator<<(const char* t) { s += t; return *this; }
    TextOut& operator<<(char c) { s += c; return *this; }
    TextOut& operator<<(long long v) {
        char b[24];
        s.append(b, std::to_chars(b, b + sizeof b, v).ptr);
        return *this;
    }
    TextOut& operator<<(int v) { return *this << (long long)v; }
    TextOut& operator<<(uint32_t v) { return *this << (long long)v; }
    TextOut& operator<<(uint64_t v) {
        char b[24];
        s.append(b, std::to_chars(b, b + sizeof b, v).ptr);
        return *this;
    }
};

} // namespace

std::string kernel_text(const kir::Kernel& k) {
    TextOut o;
    o.s.reserve(64 + 40 * k.instrs.size() + 16 * k.blocks.size());
    o << "rank " << k.rank << "|red";
    for (bool r : k.reduced) o << (r ? '1' : '0');
    o << (k.full_reduce ? "|full" : "|part");
    for (auto& b : k.buffers) {
        o << "|buf " << (int)b.dtype << (b.output ? 'o' : 'i') << (b.hist ? "h:" : ":");
        for (auto l : b.layout) o << "01x"[(int)l];
    }
    o << "|fp " << k.num_fparams << "|ip " << k.num_iparams;
    for (auto& in : k.instrs) {
        // The immediate's bits: a float's for every type but f64 (whose immediates are doubles).
        uint64_t fbits;
        if (in.type == ComputeType::F64) std::memcpy(&fbits, &in.fimm, 8);
        else fbits = kir::f32_bits(in.fimm);
        o << '|' << (int)in.op << ',' << (int)in.type << ',' << in.a[0] << ',' << in.a[1] << ',' << in.a[2] << ','
          << in.index << ',' << in.aux << ',' << fbits << ',' << (long long)in.iimm;
    }
    for (auto& a : k.accums) o << "|acc " << (int)a.kind << ',' << (int)a.type << ',' << a.value;
    for (auto& b : k.blocks) {
        o << "|blk " << (b.loop ? 'L' : 'P') << ':';
        for (int i : b.instrs) o << i << ',';
        o << ';';
        for (int a : b.accums) o << a << ',';
        o << ';';
        for (auto& st : b.stores) o << st.buffer << '=' << st.value << ',';
    }
    if (k.hist.bins) o << "|hist " << k.hist.bins << ',' << k.hist.offset;
    return std::move(o.s);
}

namespace {

// A cursor over the text; every failure names the offset and what was expected.
struct Reader {
    std::string_view s;
    size_t pos = 0;

    [[noreturn]] void fail_at(const char* expected) const {
        fail(Error::Kind::Value, "kernel text: expected {} at offset {} (\"{}\")", expected, pos, excerpt());
    }
    [[noreturn]] void too_many(const char* what, int limit) const {
        fail(Error::Kind::Value, "kernel text: more than {} {} at offset {} (\"{}\"); no kernel kiln writes has that many",
             limit, what, pos, excerpt());
    }
    // Up to 24 characters from the cursor, control and non-ASCII bytes escaped.
    std::string excerpt() const {
        std::string out;
        for (char c : s.substr(pos, 24)) {
            if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') out += c;
            else out += fmt::format("\\x{:02x}", (unsigned char)c);
        }
        return out;
    }
    bool at_end() const { return pos >= s.size(); }
    bool peek(std::string_view lit) const { return s.substr(pos, lit.size()) == lit; }
    void expect(std::string_view lit) {
        if (!peek(lit)) fail_at(fmt::format("'{}'", lit).c_str());
        pos += lit.size();
    }
    bool accept(std::string_view lit) {
        if (!peek(lit)) return false;
        pos += lit.size();
        return true;
    }
    template <class T>
    T number() {
        T v{};
        auto [p, ec] = std::from_chars(s.data() + pos, s.data() + s.size(), v);
        if (ec != std::errc()) fail_at("a number");
        pos = (size_t)(p - s.data());
        return v;
    }
    template <class E>
    E enum_value(int last, const char* what) {
        const size_t at = pos;
        int v = number<int>();
        if (v < 0 || v > last) {
            pos = at;
            fail_at(what);
        }
        return (E)v;
    }
    // A count in 0..limit.
    int count(const char* what, int limit) {
        const size_t at = pos;
        const int64_t v = number<int64_t>();
        if (v < 0 || v > limit) {
            pos = at;
            fail(Error::Kind::Value, "kernel text: {} {} at offset {} (\"{}\"); a kernel has 0 to {}", v, what, pos, excerpt(),
                 limit);
        }
        return (int)v;
    }
    // "a,b,c," up to the terminator (not consumed): at most `limit` entries (each names a
    // different one of `limit` things).
    std::vector<int> list(char terminator, size_t limit, const char* what) {
        std::vector<int> out;
        while (!at_end() && s[pos] != terminator && s[pos] != '|') {
            if (out.size() == limit) too_many(what, (int)limit);
            out.push_back(number<int>());
            expect(",");
        }
        return out;
    }
};

} // namespace

kir::Kernel parse_kernel_text(std::string_view text) {
    if (text.size() > kMaxKernelTextLength)
        fail(Error::Kind::Value, "kernel text: {} bytes; a kernel's text has at most {} (no kernel kiln writes is near that)",
             text.size(), kMaxKernelTextLength);
    Reader r{text};
    kir::Kernel k;
    r.expect("rank ");
    k.rank = r.count("dimensions", kMaxKernelRank);
    r.expect("|red");
    while ((r.peek("0") || r.peek("1")) && (int)k.reduced.size() <= k.rank) k.reduced.push_back(text[r.pos++] == '1');
    if ((int)k.reduced.size() != k.rank) r.fail_at(fmt::format("{} reduced flags (0 or 1), one per dimension", k.rank).c_str());
    r.expect("|");
    if (r.accept("full")) k.full_reduce = true;
    else r.expect("part");
    while (r.accept("|buf ")) {
        if ((int)k.buffers.size() == kMaxKernelBuffers) r.too_many("buffers", kMaxKernelBuffers);
        kir::Buffer b;
        b.dtype = r.enum_value<DType>(kNumDTypes - 1, fmt::format("a dtype (0..{})", kNumDTypes - 1).c_str());
        if (r.accept("o")) b.output = true;
        else r.expect("i");
        if (r.accept("h")) b.hist = true;
        r.expect(":");
        while (!r.at_end() && text[r.pos] != '|' && (int)b.layout.size() <= k.rank) {
            const char c = text[r.pos++];
            if (c == '0') b.layout.push_back(kir::StrideKind::Zero);
            else if (c == '1') b.layout.push_back(kir::StrideKind::One);
            else if (c == 'x') b.layout.push_back(kir::StrideKind::Any);
            else { --r.pos; r.fail_at("a stride kind (0, 1, x)"); }
        }
        if ((int)b.layout.size() != k.rank) r.fail_at(fmt::format("{} stride kinds, one per dimension", k.rank).c_str());
        k.buffers.push_back(std::move(b));
    }
    r.expect("|fp ");
    k.num_fparams = r.count("float parameters", kMaxKernelParams);
    r.expect("|ip ");
    k.num_iparams = r.count("integer parameters", kMaxKernelParams);
    const int last_op = (int)kir::kLastOp;
    while (r.peek("|") && !r.peek("|acc ") && !r.peek("|blk ")) {
        if ((int)k.instrs.size() == kMaxKernelInstrs) r.too_many("instructions", kMaxKernelInstrs);
        r.expect("|");
        kir::Instr in{kir::Op::ConstF, ComputeType::F32};
        in.op = r.enum_value<kir::Op>(last_op, fmt::format("an instruction op (0..{})", last_op).c_str());
        r.expect(",");
        in.type = r.enum_value<ComputeType>(kNumComputeTypes - 1, "a compute type (0 f32, 1 i32, 2 f64, 3 i64)");
        for (int i = 0; i < 3; ++i) {
            r.expect(",");
            in.a[i] = r.number<int>();
        }
        r.expect(",");
        in.index = r.number<int>();
        r.expect(",");
        in.aux = r.number<int>();
        r.expect(",");
        if (in.type == ComputeType::F64) {
            const uint64_t fbits = r.number<uint64_t>();
            std::memcpy(&in.fimm, &fbits, 8);
        } else {
            in.fimm = kir::from_f32_bits(r.number<uint32_t>());
        }
        r.expect(",");
        in.iimm = r.number<int64_t>();
        k.instrs.push_back(in);
    }
    while (r.accept("|acc ")) {
        if ((int)k.accums.size() == kMaxKernelAccums) r.too_many("accumulators", kMaxKernelAccums);
        kir::Accum a{};
        a.kind = r.enum_value<kir::AccKind>((int)kir::kLastAccKind, "an accumulator kind (0..5)");
        r.expect(",");
        a.type = r.enum_value<ComputeType>(kNumComputeTypes - 1, "a compute type (0 f32, 1 i32, 2 f64, 3 i64)");
        r.expect(",");
        a.value = r.number<int>();
        k.accums.push_back(a);
    }
    while (r.accept("|blk ")) {
        if ((int)k.blocks.size() == kMaxKernelBlocks) r.too_many("blocks", kMaxKernelBlocks);
        kir::Block b;
        if (r.accept("P")) b.loop = false;
        else r.expect("L");
        r.expect(":");
        b.instrs = r.list(';', k.instrs.size(), "instructions in a block");
        r.expect(";");
        b.accums = r.list(';', k.accums.size(), "accumulators in a block");
        r.expect(";");
        while (!r.at_end() && text[r.pos] != '|') {
            if ((int)b.stores.size() == kMaxKernelBuffers) r.too_many("stores in a block", kMaxKernelBuffers);
            kir::Store st{};
            st.buffer = r.number<int>();
            r.expect("=");
            st.value = r.number<int>();
            r.expect(",");
            b.stores.push_back(st);
        }
        k.blocks.push_back(std::move(b));
    }
    if (r.accept("|hist ")) {
        k.hist.bins = r.number<int>();
        r.expect(",");
        k.hist.offset = r.number<int>();
    }
    if (!r.at_end()) r.fail_at("'|acc ', '|blk ', '|hist ' or the end of the kernel");
    if (k.blocks.empty()) r.fail_at("at least one block ('|blk')");
    if (std::string problem = kir::kernel_problem(k); !problem.empty())
        fail(Error::Kind::Value, "kernel text: {}", problem);
    return k;
}

} // namespace kiln
