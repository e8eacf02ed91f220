#include "runtime/cache/entry_format.hpp"

#include <fmt/format.h>

#include <cstring>

namespace kiln::cache {

namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'K', 'C', '0', '1'};
constexpr size_t kFixed = 8 + 4 * 4 + 8 * 3;

template <typename T>
void put(std::vector<char>& out, T v) {
    for (size_t i = 0; i < sizeof(T); ++i) out.push_back((char)((uint64_t)v >> (8 * i)));
}

template <typename T>
T get(const char* p) {
    uint64_t v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) v |= (uint64_t)(unsigned char)p[i] << (8 * i);
    return (T)v;
}

} // namespace

uint64_t fnv1a(std::string_view bytes, uint64_t h) {
    for (unsigned char c : bytes) {
        h ^= c;
        h *= 0x100000001b3ull;
    }
    return h;
}

std::vector<char> encode_entry(const EntryFields& f, const std::vector<char>& binary) {
    std::vector<char> out(kMagic, kMagic + 8);
    out.reserve(kFixed + f.kiln_version.size() + f.toolchain.size() + f.arch.size() + f.material.size() + binary.size());
    put<uint32_t>(out, kEntryFormat);
    put<uint32_t>(out, (uint32_t)f.kiln_version.size());
    put<uint32_t>(out, (uint32_t)f.toolchain.size());
    put<uint32_t>(out, (uint32_t)f.arch.size());
    put<uint64_t>(out, f.material.size());
    put<uint64_t>(out, binary.size());
    put<uint64_t>(out, fnv1a(std::string_view(binary.data(), binary.size())));
    for (const std::string* s : {&f.kiln_version, &f.toolchain, &f.arch, &f.material}) out.insert(out.end(), s->begin(), s->end());
    out.insert(out.end(), binary.begin(), binary.end());
    return out;
}

bool decode_entry(const std::vector<char>& file, const EntryFields& expect, std::vector<char>* binary, std::string* why) {
    binary->clear();
    auto reject = [&](std::string reason) {
        *why = std::move(reason);
        return false;
    };
    if (file.size() < kFixed) return reject(fmt::format("truncated header ({} bytes)", file.size()));
    if (std::memcmp(file.data(), kMagic, 8) != 0) return reject("not a kiln cache entry (bad magic)");
    const char* p = file.data() + 8;
    const uint32_t format = get<uint32_t>(p), kiln_len = get<uint32_t>(p + 4), tool_len = get<uint32_t>(p + 8),
                   arch_len = get<uint32_t>(p + 12);
    const uint64_t material_len = get<uint64_t>(p + 16), binary_len = get<uint64_t>(p + 24), sum = get<uint64_t>(p + 32);
    if (format != kEntryFormat) return reject(fmt::format("entry format {} (this kiln reads {})", format, kEntryFormat));
    // Lengths are checked against the file before anything is read through them.
    const uint64_t body = (uint64_t)kiln_len + tool_len + arch_len;
    if (material_len > file.size() || binary_len > file.size() || kFixed + body + material_len + binary_len != file.size())
        return reject(fmt::format("truncated or padded ({} bytes for the lengths its header gives)", file.size()));
    const char* s = file.data() + kFixed;
    auto field = [&](uint64_t n) {
        std::string_view v(s, n);
        s += n;
        return v;
    };
    const std::string_view kiln = field(kiln_len), tool = field(tool_len), arch = field(arch_len), material = field(material_len);
    if (kiln != expect.kiln_version) return reject(fmt::format("written by kiln {} (this is {})", kiln, expect.kiln_version));
    if (tool != expect.toolchain) return reject(fmt::format("compiled by {} (this is {})", tool, expect.toolchain));
    if (arch != expect.arch) return reject(fmt::format("compiled for {} (this is {})", arch, expect.arch));
    if (material != expect.material) return reject("another kernel's entry (same hash, different key)");
    const std::string_view bin(s, binary_len);
    if (fnv1a(bin) != sum) return reject("checksum mismatch (corrupted binary)");
    binary->assign(bin.begin(), bin.end());
    return true;
}

} // namespace kiln::cache
