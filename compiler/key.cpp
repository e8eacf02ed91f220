#include "compiler/key.hpp"

#include "compiler/kernel_text.hpp"

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
    std::string s = "kiln " KILN_VERSION "|";
    s += target;
    s += '|';
    s += kernel_text(k);
    return s;
}

std::string kernel_name_for(const std::string& material) {
    return fmt::format("kiln_{:016x}", fnv1a64(material.data(), material.size()));
}

} // namespace kiln
