// Serialising and checking cache entries (layout in entry_format.hpp). Reading goes through
// explicit little-endian decoding with every length checked against the buffer before use, so
// no file content can make it read out of bounds.
#include "runtime/cache/entry_format.hpp"

#include "ir/error.hpp"

#include <algorithm>
#include <cstring>

namespace kiln::cache {

namespace {

// Writes v as `width` little-endian bytes at out[offset]; callers size `out` first.
void put_le(std::vector<char>& out, size_t offset, int width, uint64_t v) {
    for (int i = 0; i < width; ++i) out[offset + static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
}

// Callers guarantee offset + width <= file.size().
uint32_t get_u32(std::span<const char> file, size_t offset) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t(static_cast<unsigned char>(file[offset + i])) << (8 * i);
    return v;
}

uint64_t get_u64(std::span<const char> file, size_t offset) {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t(static_cast<unsigned char>(file[offset + i])) << (8 * i);
    return v;
}

} // namespace

void Fnv1a64::add_u64(uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>((v >> (8 * i)) & 0xff);
    add(b, 8);
}

uint64_t checksum(std::span<const char> binary) {
    Fnv1a64 h;
    h.add(binary.data(), binary.size());
    return h.value();
}

const char* describe(EntryCheck c) {
    switch (c) {
    case EntryCheck::Ok: return "valid";
    case EntryCheck::Truncated: return "truncated";
    case EntryCheck::BadMagic: return "not a kiln cache file (bad magic)";
    case EntryCheck::BadFormatVersion: return "another cache format version";
    case EntryCheck::FieldTooLarge: return "a header field is out of range";
    case EntryCheck::TrailingBytes: return "longer than its header says";
    case EntryCheck::KilnVersionMismatch: return "written by another kiln version";
    case EntryCheck::ToolchainMismatch: return "compiled by another toolchain version or options";
    case EntryCheck::ArchMismatch: return "compiled for another arch";
    case EntryCheck::MaterialMismatch: return "holds another key (hash collision)";
    case EntryCheck::ChecksumMismatch: return "the binary's checksum does not match";
    }
    return "unknown";
}

bool entry_fits(const EntryIdentity& id, size_t binary_size) {
    return id.kiln_version.size() <= kMaxLabelLength && id.toolchain.size() <= kMaxLabelLength &&
           id.arch.size() <= kMaxLabelLength && id.material.size() <= kMaxMaterialLength && binary_size <= kMaxBinarySize;
}

std::vector<char> serialize_header(const EntryIdentity& id, std::span<const char> binary) {
    KILN_CHECK_INTERNAL(entry_fits(id, binary.size()),
                        "cache entry over the format's limits (labels {}/{}/{} bytes, material {} bytes, binary {} bytes)",
                        id.kiln_version.size(), id.toolchain.size(), id.arch.size(), id.material.size(), binary.size());
    const std::string_view labels[] = {id.kiln_version, id.toolchain, id.arch, id.material};
    size_t size = kFixedHeaderSize;
    for (std::string_view l : labels) size += l.size();
    std::vector<char> out(size);
    std::memcpy(out.data(), kMagic, sizeof kMagic);
    put_le(out, kOffsetFormatVersion, 4, kFormatVersion);
    put_le(out, kOffsetKilnVersionLength, 4, id.kiln_version.size());
    put_le(out, kOffsetToolchainLength, 4, id.toolchain.size());
    put_le(out, kOffsetArchLength, 4, id.arch.size());
    put_le(out, kOffsetMaterialLength, 8, id.material.size());
    put_le(out, kOffsetBinarySize, 8, binary.size());
    put_le(out, kOffsetChecksum, 8, checksum(binary));
    size_t at = kFixedHeaderSize;
    for (std::string_view l : labels) {
        if (!l.empty()) std::memcpy(out.data() + at, l.data(), l.size());
        at += l.size();
    }
    return out;
}

namespace {
// The fixed header's verdict and lengths (valid where check is Ok).
struct Head {
    EntryCheck check = EntryCheck::Truncated;
    uint64_t kiln_len = 0, tool_len = 0, arch_len = 0, material_len = 0, binary_size = 0;
};
Head read_head(std::span<const char> head, uint64_t file_size) {
    Head h;
    const uint64_t have = std::min<uint64_t>(head.size(), file_size);
    if (have == 0) return h;   // Truncated
    // A prefix of the magic is a truncated file; anything else is not ours.
    const size_t magic_bytes = static_cast<size_t>(std::min<uint64_t>(have, sizeof kMagic));
    if (std::memcmp(head.data(), kMagic, magic_bytes) != 0) {
        h.check = EntryCheck::BadMagic;
        return h;
    }
    if (have < kOffsetFormatVersion + 4) return h;
    // The format version comes right after the magic in every version, so it is read before
    // anything whose position a future version might change.
    if (get_u32(head, kOffsetFormatVersion) != kFormatVersion) {
        h.check = EntryCheck::BadFormatVersion;
        return h;
    }
    if (have < kFixedHeaderSize) return h;
    h.kiln_len = get_u32(head, kOffsetKilnVersionLength);
    h.tool_len = get_u32(head, kOffsetToolchainLength);
    h.arch_len = get_u32(head, kOffsetArchLength);
    h.material_len = get_u64(head, kOffsetMaterialLength);
    h.binary_size = get_u64(head, kOffsetBinarySize);
    if (h.kiln_len > kMaxLabelLength || h.tool_len > kMaxLabelLength || h.arch_len > kMaxLabelLength ||
        h.material_len > kMaxMaterialLength || h.binary_size > kMaxBinarySize) {
        h.check = EntryCheck::FieldTooLarge;
        return h;
    }
    // Each term is bounded above, so the sum cannot overflow 64 bits.
    const uint64_t expected = kFixedHeaderSize + h.kiln_len + h.tool_len + h.arch_len + h.material_len + h.binary_size;
    h.check = file_size < expected ? EntryCheck::Truncated : file_size > expected ? EntryCheck::TrailingBytes : EntryCheck::Ok;
    return h;
}
} // namespace

EntryCheck check_head(std::span<const char> head, uint64_t file_size) { return read_head(head, file_size).check; }

ParsedEntry parse_entry(std::span<const char> file) {
    ParsedEntry e;
    const Head h = read_head(file, file.size());
    e.check = h.check;
    if (e.check != EntryCheck::Ok) return e;
    size_t at = kFixedHeaderSize;
    auto take = [&](uint64_t n) {
        std::string_view s(file.data() + at, static_cast<size_t>(n));
        at += static_cast<size_t>(n);
        return s;
    };
    e.id.kiln_version = take(h.kiln_len);
    e.id.toolchain = take(h.tool_len);
    e.id.arch = take(h.arch_len);
    e.id.material = take(h.material_len);
    e.checksum = get_u64(file, kOffsetChecksum);
    e.binary_offset = at;
    e.binary_size = static_cast<size_t>(h.binary_size);
    e.check = EntryCheck::Ok;
    return e;
}

ParsedEntry verify_entry(std::span<const char> file, const EntryIdentity& expected) {
    ParsedEntry e = parse_entry(file);
    if (e.check != EntryCheck::Ok) return e;
    if (e.id.kiln_version != expected.kiln_version)
        e.check = EntryCheck::KilnVersionMismatch;
    else if (e.id.toolchain != expected.toolchain)
        e.check = EntryCheck::ToolchainMismatch;
    else if (e.id.arch != expected.arch)
        e.check = EntryCheck::ArchMismatch;
    else if (e.id.material != expected.material)
        e.check = EntryCheck::MaterialMismatch;
    else if (checksum(file.subspan(e.binary_offset, e.binary_size)) != e.checksum)
        e.check = EntryCheck::ChecksumMismatch;
    return e;
}

} // namespace kiln::cache
