// The byte layout of one kernel-cache file, and the checks a file must pass before its binary
// is trusted.
//
// Why it exists: a cache file may have been written by another kiln version, another NVRTC,
// for another arch, by a process that crashed, or it may be damaged or simply not ours. This
// file is the single place that knows the layout, so the writer and the reader cannot drift
// apart, and the checks can be tested on byte buffers without touching the disk. It does no
// I/O and never throws on file content: every malformed input maps to an EntryCheck.
//
// Layout (integers little-endian; docs/ARCHITECTURE.md has the same table):
//   offset size  field
//   0      8     magic "KILNCACH"
//   8      4     format version (kFormatVersion)
//   12     4     length of the kiln version string
//   16     4     length of the toolchain string ("nvrtc 13.0 <options>")
//   20     4     length of the arch string ("sm_90")
//   24     8     length of the key material
//   32     8     binary size
//   40     8     FNV-1a 64 of the binary
//   48     ...   kiln version, toolchain, arch, material (no terminators), then the binary
// The file's size must be exactly 48 + the four lengths + the binary size.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace kiln::cache {

inline constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'C', 'A', 'C', 'H'};
inline constexpr uint32_t kFormatVersion = 1;

// Offsets of the fixed fields (the tests build damaged files with them).
inline constexpr size_t kOffsetFormatVersion = 8;
inline constexpr size_t kOffsetKilnVersionLength = 12;
inline constexpr size_t kOffsetToolchainLength = 16;
inline constexpr size_t kOffsetArchLength = 20;
inline constexpr size_t kOffsetMaterialLength = 24;
inline constexpr size_t kOffsetBinarySize = 32;
inline constexpr size_t kOffsetChecksum = 40;
inline constexpr size_t kFixedHeaderSize = 48;

// Limits: a field beyond them is not something kiln wrote, and they bound what a reader
// accepts before comparing anything.
inline constexpr size_t kMaxLabelLength = 4096;              // kiln version, toolchain, arch
inline constexpr size_t kMaxMaterialLength = size_t(64) << 20;
inline constexpr size_t kMaxBinarySize = size_t(1) << 30;
inline constexpr size_t kMaxEntrySize = kFixedHeaderSize + 3 * kMaxLabelLength + kMaxMaterialLength + kMaxBinarySize;

// 64-bit FNV-1a, fed in pieces. Same values as kiln::fnv1a64 (compiler/key.hpp) for the same bytes.
struct Fnv1a64 {
    uint64_t h = 0xcbf29ce484222325ull;
    void add(const void* data, size_t n) {
        auto* p = static_cast<const unsigned char*>(data);
        for (size_t i = 0; i < n; ++i) {
            h ^= p[i];
            h *= 0x100000001b3ull;
        }
    }
    void add(std::string_view s) { add(s.data(), s.size()); }
    void add_u64(uint64_t v);   // as 8 little-endian bytes
    uint64_t value() const { return h; }
};

uint64_t checksum(std::span<const char> binary);

// What identifies an entry: everything in the file except the binary and its checksum.
struct EntryIdentity {
    std::string_view kiln_version;
    std::string_view toolchain;
    std::string_view arch;
    std::string_view material;
};

enum class EntryCheck {
    Ok,
    Truncated,              // shorter than its header says (or than a header)
    BadMagic,               // not a kiln cache file
    BadFormatVersion,       // another layout (older or newer kiln)
    FieldTooLarge,          // a length beyond the limits above: damaged, or not ours
    TrailingBytes,          // longer than its header says
    KilnVersionMismatch,
    ToolchainMismatch,
    ArchMismatch,
    MaterialMismatch,       // another key with the same file name (a hash collision)
    ChecksumMismatch,       // the binary was damaged
};

const char* describe(EntryCheck c);

// Whether an entry with these fields can be written (all fields within the limits).
bool entry_fits(const EntryIdentity& id, size_t binary_size);

// The bytes that precede the binary in the file. Precondition: entry_fits (else InternalError).
std::vector<char> serialize_header(const EntryIdentity& id, std::span<const char> binary);

// The structural checks that need only the file's first kFixedHeaderSize bytes (`head`: fewer
// for a shorter file) and its size: magic, format version, limits, exact size. A reader makes
// them before it reads the rest, so that a large file that is not an entry is never read whole.
EntryCheck check_head(std::span<const char> head, uint64_t file_size);

// A file split into its fields, after the structural checks (magic, format version, limits,
// exact size). The views point into the parsed buffer. The checksum is not verified here.
struct ParsedEntry {
    EntryCheck check = EntryCheck::Truncated;
    EntryIdentity id;
    uint64_t checksum = 0;
    size_t binary_offset = 0;
    size_t binary_size = 0;
};
ParsedEntry parse_entry(std::span<const char> file);

// parse_entry, then the identity compared field by field with `expected` (the full material,
// not its hash), then the binary's checksum. Ok means the binary is
// file[binary_offset, binary_offset + binary_size).
ParsedEntry verify_entry(std::span<const char> file, const EntryIdentity& expected);

} // namespace kiln::cache
