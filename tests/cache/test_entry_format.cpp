// The cache file format on byte buffers: the documented layout, and that every kind of damage
// is reported as its own check (and never read out of bounds).
#include "tests/support/catch.hpp"

#include "compiler/key.hpp"
#include "ir/error.hpp"
#include "runtime/cache/entry_format.hpp"
#include "tests/cache/cache_test_support.hpp"

#include <cstring>
#include <random>
#include <string>

using namespace kiln::cache;
using kiln::cache::test::make_binary;

namespace {

const EntryIdentity kId{"0.1.0", "nvrtc 12.4", "sm_90", "kiln 0.1.0|sm_90|rank 1|add f32 f32 -> f32"};

std::vector<char> entry(const EntryIdentity& id, const std::vector<char>& binary) {
    std::vector<char> f = serialize_header(id, binary);
    f.insert(f.end(), binary.begin(), binary.end());
    return f;
}

uint64_t le(const std::vector<char>& f, size_t offset, int width) {
    uint64_t v = 0;
    for (int i = 0; i < width; ++i) v |= uint64_t(static_cast<unsigned char>(f[offset + static_cast<size_t>(i)])) << (8 * i);
    return v;
}

void put_le(std::vector<char>& f, size_t offset, int width, uint64_t v) {
    for (int i = 0; i < width; ++i) f[offset + static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
}

} // namespace

TEST_CASE("FNV-1a 64 matches the reference vectors and kiln::fnv1a64") {
    auto h = [](std::string_view s) {
        Fnv1a64 f;
        f.add(s);
        return f.value();
    };
    CHECK(h("") == 0xcbf29ce484222325ull);
    CHECK(h("a") == 0xaf63dc4c8601ec8cull);
    CHECK(h("foobar") == 0x85944171f73967e8ull);
    const std::string s = "kiln 0.1.0|sm_90|rank 1";
    CHECK(h(s) == kiln::fnv1a64(s.data(), s.size()));
    Fnv1a64 pieces;
    pieces.add(std::string_view("foo"));
    pieces.add(std::string_view("bar"));
    CHECK(pieces.value() == h("foobar"));
}

TEST_CASE("an entry is laid out as documented") {
    const std::vector<char> bin = make_binary(3, 0, 100);
    const std::vector<char> f = entry(kId, bin);
    const size_t labels = kId.kiln_version.size() + kId.toolchain.size() + kId.arch.size() + kId.material.size();
    REQUIRE(f.size() == kFixedHeaderSize + labels + bin.size());
    CHECK(std::memcmp(f.data(), "KILNCACH", 8) == 0);
    CHECK(le(f, kOffsetFormatVersion, 4) == kFormatVersion);
    CHECK(le(f, kOffsetKilnVersionLength, 4) == kId.kiln_version.size());
    CHECK(le(f, kOffsetToolchainLength, 4) == kId.toolchain.size());
    CHECK(le(f, kOffsetArchLength, 4) == kId.arch.size());
    CHECK(le(f, kOffsetMaterialLength, 8) == kId.material.size());
    CHECK(le(f, kOffsetBinarySize, 8) == bin.size());
    CHECK(le(f, kOffsetChecksum, 8) == checksum(bin));
    const std::string strings(f.data() + kFixedHeaderSize, labels);
    CHECK(strings == std::string(kId.kiln_version) + std::string(kId.toolchain) + std::string(kId.arch) + std::string(kId.material));
    CHECK(std::vector<char>(f.end() - static_cast<std::ptrdiff_t>(bin.size()), f.end()) == bin);

    const ParsedEntry p = verify_entry(f, kId);
    REQUIRE(p.check == EntryCheck::Ok);
    CHECK(p.id.material == kId.material);
    CHECK(p.id.arch == kId.arch);
    CHECK(p.binary_offset == kFixedHeaderSize + labels);
    CHECK(p.binary_size == bin.size());
}

TEST_CASE("an empty binary is a valid entry") {
    const std::vector<char> f = entry(kId, {});
    const ParsedEntry p = verify_entry(f, kId);
    CHECK(p.check == EntryCheck::Ok);
    CHECK(p.binary_size == 0);
    CHECK(p.binary_offset == f.size());
}

TEST_CASE("the fixed header and the size alone give every structural verdict") {
    const std::vector<char> bin = make_binary(2, 0, 300);
    const std::vector<char> good = entry(kId, bin);
    std::vector<std::vector<char>> files = {good};
    for (size_t n : {size_t(0), size_t(1), size_t(5), size_t(8), size_t(11), size_t(12), kFixedHeaderSize - 1,
                     kFixedHeaderSize, kFixedHeaderSize + 7, good.size() - 1})
        files.emplace_back(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
    auto changed = [&](auto&& change) {
        std::vector<char> f = good;
        change(f);
        files.push_back(f);
    };
    changed([](std::vector<char>& f) { f[0] = 'X'; });
    changed([](std::vector<char>& f) { put_le(f, kOffsetFormatVersion, 4, kFormatVersion + 1); });
    changed([](std::vector<char>& f) { put_le(f, kOffsetMaterialLength, 8, uint64_t(1) << 63); });
    changed([&](std::vector<char>& f) { put_le(f, kOffsetBinarySize, 8, bin.size() + 1); });
    changed([](std::vector<char>& f) { f.push_back(0); });
    for (const std::vector<char>& f : files) {
        INFO("a file of " << f.size() << " bytes");
        const std::span<const char> head(f.data(), std::min(f.size(), kFixedHeaderSize));
        CHECK(check_head(head, f.size()) == parse_entry(f).check);
    }
    CHECK(check_head(std::span<const char>(good.data(), kFixedHeaderSize), good.size()) == EntryCheck::Ok);
    CHECK(check_head(std::span<const char>(good.data(), kFixedHeaderSize), uint64_t(1) << 40) == EntryCheck::TrailingBytes);
}

TEST_CASE("each kind of damage is reported as its own check") {
    const std::vector<char> bin = make_binary(1, 0, 300);
    const std::vector<char> good = entry(kId, bin);
    REQUIRE(verify_entry(good, kId).check == EntryCheck::Ok);
    auto with = [&](auto&& change) {
        std::vector<char> f = good;
        change(f);
        return verify_entry(f, kId).check;
    };
    CHECK(with([](std::vector<char>& f) { f[0] = 'X'; }) == EntryCheck::BadMagic);
    CHECK(with([](std::vector<char>& f) { f.resize(3); f[2] = 'x'; }) == EntryCheck::BadMagic);
    CHECK(with([](std::vector<char>& f) { put_le(f, kOffsetFormatVersion, 4, kFormatVersion + 1); }) ==
          EntryCheck::BadFormatVersion);
    CHECK(with([](std::vector<char>& f) { put_le(f, kOffsetFormatVersion, 4, 0); }) == EntryCheck::BadFormatVersion);
    CHECK(with([](std::vector<char>& f) { put_le(f, kOffsetMaterialLength, 8, uint64_t(1) << 63); }) ==
          EntryCheck::FieldTooLarge);
    CHECK(with([](std::vector<char>& f) { put_le(f, kOffsetBinarySize, 8, ~uint64_t(0)); }) == EntryCheck::FieldTooLarge);
    CHECK(with([](std::vector<char>& f) { put_le(f, kOffsetArchLength, 4, 0xffffffffu); }) == EntryCheck::FieldTooLarge);
    CHECK(with([](std::vector<char>& f) { f.push_back(0); }) == EntryCheck::TrailingBytes);
    CHECK(with([](std::vector<char>& f) { f.back() ^= 1; }) == EntryCheck::ChecksumMismatch);
    CHECK(with([](std::vector<char>& f) { f[kOffsetChecksum] ^= 1; }) == EntryCheck::ChecksumMismatch);

    auto other = [&](EntryIdentity id) { return verify_entry(entry(id, bin), kId).check; };
    CHECK(other({"0.2.0", kId.toolchain, kId.arch, kId.material}) == EntryCheck::KilnVersionMismatch);
    CHECK(other({kId.kiln_version, "nvrtc 13.0", kId.arch, kId.material}) == EntryCheck::ToolchainMismatch);
    CHECK(other({kId.kiln_version, kId.toolchain, "sm_80", kId.material}) == EntryCheck::ArchMismatch);
    CHECK(other({kId.kiln_version, kId.toolchain, kId.arch, "kiln 0.1.0|sm_90|rank 1|add f32 f32 -> f16"}) ==
          EntryCheck::MaterialMismatch);
    // Only a prefix of the expected material: the full material is compared, not a prefix.
    CHECK(other({kId.kiln_version, kId.toolchain, kId.arch, kId.material.substr(0, 10)}) == EntryCheck::MaterialMismatch);
    for (EntryCheck c : {EntryCheck::Ok, EntryCheck::Truncated, EntryCheck::MaterialMismatch, EntryCheck::ChecksumMismatch})
        CHECK(std::string(describe(c)).size() > 3);
}

TEST_CASE("every truncation of an entry is reported as truncated") {
    const std::vector<char> good = entry(kId, make_binary(2, 0, 64));
    for (size_t n = 0; n < good.size(); ++n) {
        INFO("first " << n << " of " << good.size() << " bytes");
        const std::vector<char> f(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
        CHECK(verify_entry(f, kId).check == EntryCheck::Truncated);
    }
}

TEST_CASE("changing any single byte of an entry makes it fail its checks") {
    const std::vector<char> good = entry(kId, make_binary(4, 0, 80));
    int accepted = 0;
    for (size_t i = 0; i < good.size(); ++i)
        for (int bit : {0x01, 0x80}) {
            std::vector<char> f = good;
            f[i] = static_cast<char>(f[i] ^ bit);
            if (verify_entry(f, kId).check == EntryCheck::Ok) {
                ++accepted;
                UNSCOPED_INFO("accepted with byte " << i << " ^ " << bit);
            }
        }
    CHECK(accepted == 0);
}

TEST_CASE("random bytes never parse as an entry nor read out of bounds") {
    std::mt19937_64 rng(12345);
    const std::vector<char> good = entry(kId, make_binary(5, 0, 40));
    int ok = 0;
    for (int iter = 0; iter < 3000; ++iter) {
        std::vector<char> f(rng() % 200);
        for (char& c : f) c = static_cast<char>(rng());
        // Half of them start like a real entry, so the length fields are what is random.
        if (iter % 2 && f.size() >= 12) std::memcpy(f.data(), good.data(), 12);
        // Storage exactly the file's size, so a sanitiser would catch a read past its end.
        const ParsedEntry p = verify_entry(f, kId);
        if (p.check == EntryCheck::Ok) ++ok;
        if (p.check == EntryCheck::Ok || parse_entry(f).check == EntryCheck::Ok) {
            const ParsedEntry q = parse_entry(f);
            CHECK(q.binary_offset + q.binary_size == f.size());
        }
    }
    CHECK(ok == 0);
}

TEST_CASE("fields beyond the format's limits are not written") {
    const std::string huge_label(kMaxLabelLength + 1, 'v');
    const EntryIdentity too_long{huge_label, kId.toolchain, kId.arch, kId.material};
    CHECK_FALSE(entry_fits(too_long, 10));
    CHECK(entry_fits(kId, 10));
    CHECK_FALSE(entry_fits(kId, kMaxBinarySize + 1));
    const std::vector<char> bin(10);
    CHECK_THROWS_AS(serialize_header(too_long, bin), kiln::InternalError);
}
