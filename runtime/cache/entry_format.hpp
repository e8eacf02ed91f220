// The bytes of one disk-cache entry, and their verification. A file is trusted only when every
// field matches what the reader would have compiled: the full key material (not only its hash,
// so a hash collision is a miss, never a wrong kernel), the arch, the toolchain and kiln
// versions, and the binary's checksum. Anything else — a truncated, corrupted, foreign or
// older file — is a miss that says why.
//
// Layout (little-endian integers):
//   magic "KILNKC01" (8) | u32 format | u32 kiln_len | u32 toolchain_len | u32 arch_len |
//   u64 material_len | u64 binary_len | u64 binary_fnv1a |
//   kiln version | toolchain | arch | material | binary
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::cache {

inline constexpr uint32_t kEntryFormat = 1;

struct EntryFields {
    std::string kiln_version, toolchain, arch, material;
};

uint64_t fnv1a(std::string_view bytes, uint64_t h = 0xcbf29ce484222325ull);

std::vector<char> encode_entry(const EntryFields& f, const std::vector<char>& binary);

// The binary when `file` is a complete entry for exactly `expect`; else empty and `why` says
// what did not match.
bool decode_entry(const std::vector<char>& file, const EntryFields& expect, std::vector<char>* binary, std::string* why);

} // namespace kiln::cache
