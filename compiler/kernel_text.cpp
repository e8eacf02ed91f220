#include "compiler/kernel_text.hpp"

#include "ir/error.hpp"

#include <fmt/format.h>

#include <charconv>
#include <cstring>

namespace kiln {

std::string kernel_text(const kir::Kernel& k) {
    std::string s = fmt::format("rank {}|red", k.rank);
    for (bool r : k.reduced) s += r ? '1' : '0';
    s += k.full_reduce ? "|full" : "|part";
    for (auto& b : k.buffers) {
        s += fmt::format("|buf {}{}:", (int)b.dtype, b.output ? "o" : "i");
        for (auto l : b.layout) s += "01x"[(int)l];
    }
    s += fmt::format("|fp {}|ip {}", k.num_fparams, k.num_iparams);
    for (auto& in : k.instrs) {
        uint32_t fbits;
        std::memcpy(&fbits, &in.fimm, 4);
        s += fmt::format("|{},{},{},{},{},{},{},{},{}", (int)in.op, (int)in.type, in.a[0], in.a[1], in.a[2], in.index,
                         in.aux, fbits, in.iimm);
    }
    for (auto& a : k.accums) s += fmt::format("|acc {},{},{}", (int)a.kind, (int)a.type, a.value);
    for (auto& b : k.blocks) {
        s += fmt::format("|blk {}:", b.loop ? 'L' : 'P');
        for (int i : b.instrs) s += fmt::format("{},", i);
        s += ";";
        for (int a : b.accums) s += fmt::format("{},", a);
        s += ";";
        for (auto& st : b.stores) s += fmt::format("{}={},", st.buffer, st.value);
    }
    return s;
}

namespace {

// A cursor over the text; every failure names the offset and what was expected.
struct Reader {
    std::string_view s;
    size_t pos = 0;

    [[noreturn]] void fail_at(const char* expected) const {
        fail(Error::Kind::Value, "kernel text: expected {} at offset {} (\"{}\")", expected, pos,
             std::string(s.substr(pos, 24)));
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
        int v = number<int>();
        if (v < 0 || v > last) fail_at(what);
        return (E)v;
    }
    // "a,b,c," up to the terminator (not consumed)
    std::vector<int> list(char terminator) {
        std::vector<int> out;
        while (!at_end() && s[pos] != terminator && s[pos] != '|') {
            out.push_back(number<int>());
            expect(",");
        }
        return out;
    }
};

} // namespace

kir::Kernel parse_kernel_text(std::string_view text) {
    Reader r{text};
    kir::Kernel k;
    r.expect("rank ");
    k.rank = r.number<int>();
    if (k.rank < 0 || k.rank > 64) r.fail_at("a rank in 0..64");
    r.expect("|red");
    while (r.peek("0") || r.peek("1")) k.reduced.push_back(text[r.pos++] == '1');
    if ((int)k.reduced.size() != k.rank) r.fail_at("one reduced flag per dimension");
    r.expect("|");
    if (r.accept("full")) k.full_reduce = true;
    else r.expect("part");
    while (r.accept("|buf ")) {
        kir::Buffer b;
        b.dtype = r.enum_value<DType>(kNumDTypes - 1, "a dtype");
        if (r.accept("o")) b.output = true;
        else r.expect("i");
        r.expect(":");
        while (!r.at_end() && text[r.pos] != '|') {
            const char c = text[r.pos++];
            if (c == '0') b.layout.push_back(kir::StrideKind::Zero);
            else if (c == '1') b.layout.push_back(kir::StrideKind::One);
            else if (c == 'x') b.layout.push_back(kir::StrideKind::Any);
            else { --r.pos; r.fail_at("a stride kind (0, 1, x)"); }
        }
        if ((int)b.layout.size() != k.rank) r.fail_at("one stride kind per dimension");
        k.buffers.push_back(std::move(b));
    }
    r.expect("|fp ");
    k.num_fparams = r.number<int>();
    r.expect("|ip ");
    k.num_iparams = r.number<int>();
    const int last_op = (int)kir::kLastOp;
    while (r.peek("|") && !r.peek("|acc ") && !r.peek("|blk ")) {
        r.expect("|");
        kir::Instr in{kir::Op::ConstF, ComputeType::F32};
        in.op = r.enum_value<kir::Op>(last_op, "an instruction op");
        r.expect(",");
        in.type = r.enum_value<ComputeType>(1, "a compute type");
        for (int i = 0; i < 3; ++i) {
            r.expect(",");
            in.a[i] = r.number<int>();
        }
        r.expect(",");
        in.index = r.number<int>();
        r.expect(",");
        in.aux = r.number<int>();
        r.expect(",");
        uint32_t fbits = r.number<uint32_t>();
        std::memcpy(&in.fimm, &fbits, 4);
        r.expect(",");
        in.iimm = r.number<int32_t>();
        k.instrs.push_back(in);
    }
    const int n = (int)k.instrs.size();
    auto check_id = [&](int id, const char* what) {
        if (id < 0 || id >= n) r.fail_at(what);
    };
    for (int i = 0; i < n; ++i)
        for (int a : k.instrs[i].a)
            if (a != -1 && (a < 0 || a >= i)) r.fail_at("operands that are earlier instructions");
    while (r.accept("|acc ")) {
        kir::Accum a{};
        a.kind = r.enum_value<kir::AccKind>((int)kir::AccKind::ArgMin, "an accumulator kind");
        r.expect(",");
        a.type = r.enum_value<ComputeType>(1, "a compute type");
        r.expect(",");
        a.value = r.number<int>();
        check_id(a.value, "an accumulated instruction id");
        k.accums.push_back(a);
    }
    while (r.accept("|blk ")) {
        kir::Block b;
        if (r.accept("P")) b.loop = false;
        else r.expect("L");
        r.expect(":");
        b.instrs = r.list(';');
        for (int i : b.instrs) check_id(i, "a block instruction id");
        r.expect(";");
        b.accums = r.list(';');
        for (int a : b.accums)
            if (a < 0 || a >= (int)k.accums.size()) r.fail_at("an accumulator index");
        r.expect(";");
        while (!r.at_end() && text[r.pos] != '|') {
            kir::Store st{};
            st.buffer = r.number<int>();
            if (st.buffer < 0 || st.buffer >= (int)k.buffers.size()) r.fail_at("a buffer index");
            r.expect("=");
            st.value = r.number<int>();
            check_id(st.value, "a stored instruction id");
            r.expect(",");
            b.stores.push_back(st);
        }
        k.blocks.push_back(std::move(b));
    }
    if (!r.at_end()) r.fail_at("the end of the kernel");
    if (k.blocks.empty()) r.fail_at("at least one block ('|blk')");
    return k;
}

} // namespace kiln
