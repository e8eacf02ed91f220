// Fuzzing every parser of outside input (harness: fuzz.hpp): kernel text (then what a warm-up
// does with a kernel it accepts: its key, CUDA C and LLVM IR), manifest lines (then their
// kernel text), cache entry files (the header checks and the disk cache's load) and environment
// values. The valid inputs mutated are real: kernels lowered from expressions of every kind,
// the manifest lines and cache entries kiln writes for them.
#include "tests/fuzz/fuzz.hpp"
#include "tests/support/catch.hpp"
#include "tests/support/sample_kernels.hpp"

#include "codegen/cuda/cuda_codegen.hpp"
#include "compiler/env.hpp"
#include "compiler/kernel_text.hpp"
#include "compiler/key.hpp"
#include "ir/error.hpp"
#include "runtime/cache/disk_cache.hpp"
#include "runtime/cache/entry_format.hpp"
#include "runtime/manifest_line.hpp"
#include "tests/support/cache_dir.hpp"
#ifdef KILN_HAVE_LLVM
#include "codegen/llvm/llvm_codegen.hpp"
#endif

#include <filesystem>
#include <fstream>
#include <stdexcept>

using namespace kiln;

namespace {

constexpr size_t kMiB = size_t(1) << 20;

std::vector<std::string> sample_texts() {
    std::vector<std::string> out;
    for (const kir::Kernel& k : test::sample_kernels()) out.push_back(kernel_text(k));
    return out;
}

// What kiln-warmup does with a kernel it read: its key and name, CUDA C, LLVM IR. None of it may
// throw for a kernel the reader accepted.
void compile_like_warmup(kir::Kernel k) {
    const std::string text = kernel_text(k);
    if (kernel_text(parse_kernel_text(text)) != text) throw std::logic_error("the kernel text changed on a round trip");
    k.name = kernel_name_for(key_material(k, "sm_90"));
    codegen::emit_cuda(k);
#ifdef KILN_HAVE_LLVM
    llvm::LLVMContext ctx;
    codegen::emit_llvm(k, ctx);
#endif
}

} // namespace

TEST_CASE("fuzz: kernel text") {
    fuzz::run_target({"kernel text", sample_texts(), "0123456789-,|:;=LPoix rankedfulbpcg", "kernel text: ", 64 * kMiB,
                      100000, [](const std::string& in) {
                          compile_like_warmup(parse_kernel_text(in));
                          return true;
                      }});
}

TEST_CASE("fuzz: manifest lines") {
    std::vector<std::string> seeds;
    for (const std::string& text : sample_texts()) {
        seeds.push_back(manifest_line_json({kManifestFormat, "0.1.0", "cuda", "sm_90", "kiln_0123456789abcdef", text}));
        seeds.push_back(fmt::format(R"({{"format": 1, "kiln": "0.1.0", "backend": "\u0063pu", "target": "cpu-x86_64-avx2", )"
                                    R"("name": "kiln_0", "kernel": "{}"}})",
                                    text));
    }
    fuzz::run_target({"manifest lines", seeds, "{}[]\":, \\u0123456789abcdefnrtl|-.eE", "m.jsonl:3: ", 64 * kMiB, 100000,
                      [](const std::string& in) {
                          const ManifestLine l = parse_manifest_line(in, "m.jsonl", 3);
                          try {
                              parse_kernel_text(l.kernel);   // as kiln-warmup reads a line
                          } catch (const Error& e) {
                              throw Error(std::string("m.jsonl:3: ") + e.what());
                          }
                          return true;
                      }});
}

TEST_CASE("fuzz: cache entry files") {
    test::ScopedCacheDir dir;
    cache::DiskCache disk(cache::DiskCacheOptions{dir.path(), "0.1.0"});
    const std::string text = sample_texts()[1];
    const std::vector<char> binary(text.begin(), text.end());
    const cache::DiskCacheKey key = cache::cuda_kernel_key("kiln 0.1.0|sm_90|" + text, "// source", "sm_90", "nvrtc 13.0");
    const cache::EntryIdentity id{"0.1.0", key.toolchain, key.arch, key.material};
    std::vector<std::string> seeds;
    for (const std::vector<char>& bin : {binary, std::vector<char>{}, std::vector<char>(300, '\x7f')}) {
        const std::vector<char> header = cache::serialize_header(id, bin);
        seeds.push_back(std::string(header.begin(), header.end()) + std::string(bin.begin(), bin.end()));
    }
    const std::string path = disk.path_for(key);
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    int64_t n = 0;
    fuzz::run_target({"cache entry files", seeds, std::string("KILNCACH\x01\x00\xff", 11), "cache entries never throw",
                      16 * kMiB, 20000, [&](const std::string& in) {
                          const std::span<const char> file(in.data(), in.size());
                          const cache::ParsedEntry e = cache::parse_entry(file);
                          if (e.check == cache::EntryCheck::Ok &&
                              (e.binary_offset + e.binary_size != in.size() || e.binary_offset < cache::kFixedHeaderSize))
                              throw std::logic_error("parse_entry's fields do not cover the file");
                          const cache::ParsedEntry v = cache::verify_entry(file, id);
                          // The disk cache's load of the same bytes: the kernel's binary or a miss.
                          if (n++ % 4 == 0) {
                              std::ofstream(path, std::ios::binary | std::ios::trunc).write(in.data(), (std::streamsize)in.size());
                              const auto loaded = disk.load(key);
                              if (loaded && (v.check != cache::EntryCheck::Ok ||
                                             *loaded != std::vector<char>(in.begin() + (std::ptrdiff_t)v.binary_offset, in.end())))
                                  throw std::logic_error("the disk cache loaded an entry verify_entry refuses");
                          }
                          return v.check == cache::EntryCheck::Ok;
                      }});
}

TEST_CASE("fuzz: environment values") {
    auto check = [](const auto& p, std::string_view var) {
        if (p.value.has_value() == !p.problem.empty()) throw std::logic_error("a value and a problem, or neither");
        if (!p.value && (p.problem.rfind(std::string(var) + "='", 0) != 0 || p.problem.find("; valid: ") == std::string::npos))
            throw std::logic_error("a problem that does not name the variable and the valid values: " + p.problem);
        return p.value.has_value();
    };
    fuzz::run_target({"environment values", {"error", "warn", "info", "debug", "0", "1", "true", "off", "8", "4096"},
                      "0123456789-+ xyesnotrufalwigdbc", "environment parsers never throw", 1 * kMiB, 50000,
                      [&](const std::string& in) {
                          bool any = check(env::parse_choice("KILN_LOG", in, {"error", "warn", "info", "debug"}), "KILN_LOG");
                          any |= check(env::parse_integer("KILN_NUM_THREADS", in, 1, 4096), "KILN_NUM_THREADS");
                          any |= check(env::parse_flag("KILN_PDL", in), "KILN_PDL");
                          return any;
                      }});
}
