#include "compiler/key.hpp"

#include <fmt/format.h>

#include <cstring>

#ifndef KILN_VERSION
#define KILN_VERSION "dev"
#endif

namespace kiln {

uint64_t fnv1a64(const void* data, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

std::string key_material(const kir::Kernel& k, const std::string& target) {
    std::string s = fmt::format("kiln {}|{}|rank {}|red", KILN_VERSION, target, k.rank);
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

std::string kernel_name_for(const std::string& material) {
    return fmt::format("kiln_{:016x}", fnv1a64(material.data(), material.size()));
}

} // namespace kiln
