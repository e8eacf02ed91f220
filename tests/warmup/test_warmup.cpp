// kiln-warmup end to end, without a GPU.
// CUDA: the main example's stages lowered for sm_90 are recorded into a manifest, the tool warms
// a fresh cache for sm_80 and sm_90, and every stage is then a hit under the key the CUDA backend
// looks up. Then: a second run finds everything cached, --check reports missing and damaged
// entries, --prune evicts, bad manifests are refused, and two warm-ups on one directory at once
// both succeed.
// CPU: the example program itself records a manifest on the CPU backend, the tool warms a fresh
// cache with --arch cpu, and the example then runs under KILN_ASSERT_NO_COMPILE with no compile;
// kernels recorded on a CUDA context warm for the CPU too; --check and --prune see CPU entries;
// two processes storing the same objects at once leave a correct cache.
#include "tests/support/catch.hpp"

#include <fmt/format.h>
#include <kiln/kiln.hpp>

#include "codegen/cuda/cuda_codegen.hpp"
#include "compiler/kernel_text.hpp"
#include "compiler/key.hpp"
#include "compiler/pipeline.hpp"
#include "runtime/cache/disk_cache.hpp"
#include "runtime/cache/file_io.hpp"
#include "runtime/cuda/nvrtc.hpp"
#include "runtime/host_target.hpp"
#include "runtime/manifest.hpp"
#include "runtime/manifest_line.hpp"
#include "tests/support/cache_dir.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sys/stat.h>
#include <sys/wait.h>
#include <set>
#include <thread>
#include <unistd.h>

namespace fs = std::filesystem;
using namespace kiln;

namespace {

std::string tool() {
    const char* t = std::getenv("KILN_WARMUP");
    return t ? t : "";
}

struct Run {
    int status = -1;
    std::string out;
};

// Runs a shell command line, stdout and stderr together.
Run shell(const std::string& command) {
    std::string cmd = command + " 2>&1";
    Run r;
    FILE* p = popen(cmd.c_str(), "r");
    REQUIRE(p != nullptr);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
    int st = pclose(p);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return r;
}

Run run(const std::string& args) { return shell(tool() + " " + args); }

size_t count_in(const std::string& text, const std::string& needle) {
    size_t n = 0;
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
    return n;
}

struct RecordedStage {
    kir::Kernel kernel;
    std::string key;  // for sm_90, as the runtime computes it
};

// The main example's assignments (variance, batch norm, an elementwise chain, a full
// reduction) on tensors of one context.
struct ExampleWork {
    Tensor A, C, B, S;
    std::vector<std::pair<Tensor*, Expr>> work;
    explicit ExampleWork(Context& ctx) {
        std::vector<float> host(512 * 64);
        for (size_t i = 0; i < host.size(); ++i) host[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
        A = ctx.array(host, {512, 64});
        C = ctx.empty({512, 1}), B = ctx.empty({512, 64}), S = ctx.empty({1, 1});
        work = {
            {&C, mean(square(A - mean(A, 1)), 1)},
            {&B, reciprocal(sqrt(var(A, 1) + 0.001)) * (A - mean(A, 1))},
            {&B, tanh(A * 0.5 + 1.0) * sig(A)},
            {&S, sum(A * A)},
        };
    }
};

// The example's assignments lowered for sm_90 without running them.
std::vector<RecordedStage> example_stages() {
    Context ctx(ContextOptions{"cpu"});
    ExampleWork w(ctx);
    std::vector<RecordedStage> out;
    std::set<std::string> seen;
    for (auto& [dst, e] : w.work) {
        CompiledAssignment ca = compile_assignment(e.node(), dst->view(), "sm_90");
        for (auto& ls : ca.stages)
            if (seen.insert(ls.key).second) out.push_back({ls.kernel, ls.key});
    }
    return out;
}

std::string write_manifest(const std::vector<RecordedStage>& stages, const std::string& path) {
    std::remove(path.c_str());
    ManifestWriter w(path);
    for (const RecordedStage& s : stages) w.add(s.kernel, s.key, "cuda", "sm_90");
    return path;
}

#ifdef KILN_HAVE_NVRTC
cache::DiskCacheKey runtime_key(const RecordedStage& s, const std::string& arch) {
    kir::Kernel k = s.kernel;
    std::string key = arch == "sm_90" ? s.key : key_material(k, arch);
    k.name = kernel_name_for(key);
    // The kernel's general module (a row kernel's cluster entry; any other kernel's only one).
    return cache::cuda_kernel_key(key, codegen::emit_cuda_module(k, codegen::cuda_modules(k)[0]).code, arch,
                                  cuda::nvrtc_toolchain());
}
// A row kernel's small entry for a warp: keyed with the options it is compiled with.
cache::DiskCacheKey small_row_key(const RecordedStage& s, const std::string& arch) {
    kir::Kernel k = s.kernel;
    std::string key = arch == "sm_90" ? s.key : key_material(k, arch);
    k.name = kernel_name_for(key);
    const codegen::CudaSource src = codegen::emit_cuda_module(k, {k.name + "_s", codegen::CudaReach::Warp});
    REQUIRE(src.fast_compile);
    return cache::cuda_kernel_key(key, src.code, arch, cuda::nvrtc_toolchain(true));
}
#endif

std::string fresh_dir(const char* tag) {
    std::string d = fmt::format("/tmp/kiln-warmup-test-{}-{}", tag, (long)getpid());
    fs::remove_all(d);
    return d;
}

bool available() {
    if (tool().empty()) {
        WARN("SKIPPED: KILN_WARMUP (the tool's path) is not set; run through meson test");
        return false;
    }
    return true;
}

// The stages, their manifest and a fresh cache directory of one test; removed when it ends.
struct Workspace {
    std::vector<RecordedStage> stages = example_stages();
    std::string manifest, dir;
    explicit Workspace(const std::string& tag)
        : manifest(write_manifest(stages, fresh_dir(("m-" + tag).c_str()) + ".jsonl")),
          dir(fresh_dir(("cache-" + tag).c_str())) {}
    ~Workspace() {
        fs::remove_all(dir);
        std::remove(manifest.c_str());
    }
};

} // namespace

#ifdef KILN_HAVE_NVRTC
TEST_CASE("warm-up from a manifest makes every stage a disk hit for each arch; runs again, checks, prunes") {
    if (!available()) return;
    Workspace w("full");
    const auto& [stages, manifest, dir] = std::tie(w.stages, w.manifest, w.dir);
    REQUIRE(stages.size() >= 4);

    Run r = run(fmt::format("{} --arch sm_80,sm_90 --cache-dir {} --jobs 2", manifest, dir));
    INFO(r.out);
    REQUIRE(r.status == 0);
    CHECK(r.out.find(fmt::format("{} kernels x archs: {} compiled, 0 already cached, 0 failed", stages.size() * 2,
                                 stages.size() * 2)) != std::string::npos);
    {
        cache::DiskCache disk(cache::DiskCacheOptions{dir, ""});
        int small_rows = 0;
        for (const RecordedStage& s : stages)
            for (const char* arch : {"sm_80", "sm_90"}) {
                INFO(s.kernel.name << " " << arch);
                CHECK(disk.load(runtime_key(s, arch)).has_value());
                if (codegen::cuda_shape(s.kernel) == codegen::CudaShape::Row) {
                    ++small_rows;
                    CHECK(disk.load(small_row_key(s, arch)).has_value());
                }
            }
        CHECK(small_rows > 0);
    }
    // Again: nothing to compile; --check agrees.
    r = run(fmt::format("{} --arch sm_80,sm_90 --cache-dir {}", manifest, dir));
    CHECK(r.status == 0);
    CHECK(r.out.find(fmt::format("0 compiled, {} already cached", stages.size() * 2)) != std::string::npos);
    r = run(fmt::format("{} --arch sm_80,sm_90 --cache-dir {} --check", manifest, dir));
    CHECK(r.status == 0);
    CHECK(r.out.find(fmt::format("{} cached, 0 missing, 0 stale, 0 damaged", stages.size() * 2)) != std::string::npos);

    // Damage one entry and remove another: --check reports both and writes nothing.
    cache::DiskCache disk(cache::DiskCacheOptions{dir, ""});
    const std::string damaged = disk.path_for(runtime_key(stages[0], "sm_90"));
    const std::string removed = disk.path_for(runtime_key(stages[1], "sm_80"));
    {
        std::fstream f(damaged, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(-3, std::ios::end);
        f.write("xyz", 3);
    }
    fs::remove(removed);
    r = run(fmt::format("{} --arch sm_80,sm_90 --cache-dir {} --check", manifest, dir));
    INFO(r.out);
    CHECK(r.status == 1);
    CHECK(r.out.find("1 missing, 0 stale, 1 damaged") != std::string::npos);
    CHECK(fs::exists(damaged));
    CHECK(!fs::exists(removed));
    // The recorded arch is the default; a warm-up repairs both entries.
    r = run(fmt::format("{} --arch sm_80,sm_90 --cache-dir {}", manifest, dir));
    CHECK(r.status == 0);
    CHECK(r.out.find("2 compiled") != std::string::npos);
    r = run(fmt::format("{} --cache-dir {} --check", manifest, dir));  // sm_90 only, as recorded
    CHECK(r.status == 0);
    CHECK(r.out.find(fmt::format("{} kernels x archs: {} cached", stages.size(), stages.size())) != std::string::npos);
    // An entry grown to 1 GiB (sparse) is damaged by its header alone: --check does not read it.
    REQUIRE(::truncate(damaged.c_str(), off_t(1) << 30) == 0);
    r = run(fmt::format("{} --cache-dir {} --check", manifest, dir));
    CHECK(r.status == 1);
    CHECK(r.out.find("0 missing, 0 stale, 1 damaged") != std::string::npos);
    CHECK(r.out.find("longer than its header") != std::string::npos);
    r = run(fmt::format("{} --cache-dir {}", manifest, dir));
    CHECK(r.status == 0);
    CHECK(fs::file_size(damaged) < (size_t(1) << 20));

    // --prune 0 evicts everything: every module of every kernel, for both archs.
    size_t modules = 0;
    for (const RecordedStage& s : stages) modules += codegen::cuda_modules(s.kernel).size();
    r = run(fmt::format("--cache-dir {} --prune 0", dir));
    CHECK(r.status == 0);
    CHECK(r.out.find(fmt::format("pruned {} entries", modules * 2)) != std::string::npos);
    r = run(fmt::format("{} --cache-dir {} --check", manifest, dir));
    CHECK(r.status == 1);
}

TEST_CASE("two warm-ups at once on one cache directory both succeed and leave a correct cache") {
    if (!available()) return;
    Workspace w("concurrent");
    const auto& [stages, manifest, dir] = std::tie(w.stages, w.manifest, w.dir);
    Run a, b;
    std::thread t1([&] { a = run(fmt::format("{} --arch sm_90 --cache-dir {} --jobs 1", manifest, dir)); });
    std::thread t2([&] { b = run(fmt::format("{} --arch sm_90 --cache-dir {} --jobs 1", manifest, dir)); });
    t1.join();
    t2.join();
    INFO(a.out << "\n---\n" << b.out);
    CHECK(a.status == 0);
    CHECK(b.status == 0);
    Run c = run(fmt::format("{} --arch sm_90 --cache-dir {} --check", manifest, dir));
    CHECK(c.status == 0);
}

#endif // KILN_HAVE_NVRTC

TEST_CASE("kiln-warmup refuses bad arguments and manifests, naming the line") {
    if (!available()) return;
    const std::string bad = fresh_dir("bad") + ".jsonl";
    {
        std::ofstream f(bad);
        f << R"({"format":1,"kiln":"0.1.0","backend":"cuda","target":"sm_90","name":"x","kernel":"rank 1|red0|part"})" << "\n";
        f << R"({"format":7,"kiln":"9","backend":"cuda","target":"sm_90","name":"y","kernel":"rank 0"})" << "\n";
    }
    Run r = run(fmt::format("{} --cache-dir /tmp/kiln-warmup-unused", bad));
    CHECK(r.status == 2);
    CHECK(r.out.find(":1: kernel text: expected") != std::string::npos);
    r = run("--arch sm90 x.jsonl");
    CHECK(r.status == 2);
    CHECK(r.out.find("'sm90' is not an architecture") != std::string::npos);
    r = run("--arch native x.jsonl");
    CHECK(r.status == 2);
    r = run("/nonexistent/manifest.jsonl");
    CHECK(r.status == 2);
    CHECK(r.out.find("cannot read manifest /nonexistent/manifest.jsonl: No such file or directory") != std::string::npos);
    // Many bad lines: the first 20 named, the rest counted.
    {
        std::ofstream f(bad);
        for (int i = 0; i < 5000; ++i) f << "not json " << i << "\n";
    }
    r = run(fmt::format("{} --cache-dir /tmp/kiln-warmup-unused", bad));
    CHECK(r.status == 2);
    CHECK(r.out.find(":20: ") != std::string::npos);
    CHECK(r.out.find(":21: ") == std::string::npos);
    CHECK(r.out.find("... and 4980 more bad lines") != std::string::npos);
    CHECK(r.out.find("5000 bad manifest lines: nothing was compiled") != std::string::npos);
    std::remove(bad.c_str());
}

TEST_CASE("kiln-warmup: every bad line of a manifest is named, with what is valid, and nothing is compiled") {
    if (!available()) return;
    Workspace w("lines");
    std::vector<std::string> lines;
    {
        std::ifstream in(w.manifest);
        for (std::string l; std::getline(in, l);) lines.push_back(l);
    }
    REQUIRE(lines.size() >= 2);
    std::string huge = lines[0];
    const size_t fp = huge.find("|fp ");
    REQUIRE(fp != std::string::npos);
    huge.replace(fp, huge.find('|', fp + 1) - fp, "|fp 2147483647");
    {
        std::ofstream f(w.manifest, std::ios::trunc);
        f << lines[1] << "\n\n"                                   // 1 good, 2 blank
          << huge << "\n"                                         // 3: a count no kernel has
          << R"({"format":1,"backend":"cuda",)" << "\n"          // 4: not JSON
          << R"({"format":1,"backend":"gpu","target":"sm_90","kernel":"rank 0"})" << "\n"   // 5
          << R"({"format":7,"kiln":"9","backend":"cuda","target":"sm_90","kernel":"rank 0"})" << "\n"   // 6
          << R"(["format",1])" << "\n";                           // 7
    }
    const auto t0 = std::chrono::steady_clock::now();
    Run r = run(fmt::format("{} --cache-dir {}", w.manifest, w.dir));
    INFO(r.out);
    CHECK(r.status == 2);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
    const std::string& m = w.manifest;
    CHECK(r.out.find(m + ":3: kernel text: 2147483647 float parameters at offset") != std::string::npos);
    CHECK(r.out.find(m + ":4: bad JSON at line 4, column 30: syntax error while parsing object key") != std::string::npos);
    CHECK(r.out.find(m + ":5: unknown backend \"gpu\"; valid: cuda, cpu") != std::string::npos);
    CHECK(r.out.find(m + ":6: manifest format 7 is not one this kiln reads (it reads format 1); the line was recorded by "
                     "kiln 9") != std::string::npos);
    CHECK(r.out.find(m + ":7: the line is [\"format\",1] (array), not a JSON object") != std::string::npos);
    CHECK(r.out.find("5 bad manifest lines: nothing was compiled") != std::string::npos);
    CHECK(r.out.find(":1:") == std::string::npos);
    CHECK(!fs::exists(w.dir));
}

TEST_CASE("kiln-warmup: a manifest re-serialised by another JSON tool warms the same") {
    if (!available()) return;
    Workspace w("json");
#ifdef KILN_HAVE_LLVM
    const std::string arch = "cpu";
#else
    const std::string arch = "sm_90";
#endif
    {
        // As Python's json.dumps writes it (spaces after ':' and ','), keys in another order,
        // a \u escape.
        std::ofstream f(w.manifest, std::ios::trunc);
        for (const RecordedStage& s : w.stages)
            f << fmt::format(R"({{"kernel": "{}", "format": 1, "kiln": "0.1.0", "backend": "\u0063uda", "target": "sm_90", )"
                             R"("name": "{}"}})",
                             kernel_text(s.kernel), s.kernel.name)
              << "\n";
    }
    Run r = run(fmt::format("{} --arch {} --cache-dir {}", w.manifest, arch, w.dir));
    INFO(r.out);
    CHECK(r.status == 0);
    CHECK(r.out.find(fmt::format("{} kernels x archs: {} compiled, 0 already cached, 0 failed", w.stages.size(),
                                 w.stages.size())) != std::string::npos);
}

TEST_CASE("kiln-warmup: arguments and cache directories that cannot work are refused before any work") {
    if (!available()) return;
    Workspace w("args");
    const std::string file = w.dir + ".file";
    { std::ofstream(file) << "x"; }
    std::remove((w.dir + ".fifo").c_str());
    REQUIRE(::mkfifo((w.dir + ".fifo").c_str(), 0600) == 0);
    struct Case {
        std::string args, message;
    };
    const std::vector<Case> cases = {
        {fmt::format("{} --cache-dir {}", w.manifest, file),
         fmt::format("the cache directory {} (--cache-dir) is not a directory", file)},
        {fmt::format("{} --cache-dir {}/sub", w.manifest, file),
         fmt::format("cannot create the cache directory {}/sub (--cache-dir): Not a directory", file)},
        {fmt::format("{} --cache-dir {} --check", w.manifest, file), "is not a directory"},
        {fmt::format("--cache-dir {} --prune 0", file), "is not a directory"},
        {fmt::format("/tmp --cache-dir {}", w.dir),
         "cannot read manifest /tmp: it is a directory; a manifest is a JSON-lines file that KILN_RECORD=path writes"},
        // Files that never end or block until a writer comes: refused before they are opened.
        {fmt::format("/dev/zero --cache-dir {}", w.dir),
         "cannot read manifest /dev/zero: it is a character device, not a regular file; a manifest is a JSON-lines file "
         "that KILN_RECORD=path writes"},
        {fmt::format("{}.fifo --cache-dir {}", w.dir, w.dir),
         fmt::format("cannot read manifest {}.fifo: it is a FIFO, not a regular file", w.dir)},
        {fmt::format("{} --cache-dir ''", w.manifest), "--cache-dir: an empty path"},
        {fmt::format("{} --jobs 0", w.manifest), "--jobs 0: not a number of parallel compiles; valid: an integer from 1 to 1024"},
        {fmt::format("{} --jobs 4x", w.manifest), "--jobs 4x: not a number"},
        {fmt::format("{} --jobs 5000", w.manifest), "--jobs 5000: not a number"},
        {fmt::format("{} --prune 5X", w.manifest), "--prune 5X: not a size; valid: a number and a unit B, K, KB, KiB"},
        {fmt::format("{} --prune nan", w.manifest), "--prune nan: not a size"},
        {fmt::format("{} --prune -1G", w.manifest), "--prune -1G: not a size"},
        {fmt::format("{} --prune 1.5.2G", w.manifest), "--prune 1.5.2G: not a size"},
    };
    for (const Case& c : cases) {
        Run r = run(c.args);
        INFO(c.args << "\n" << r.out);
        CHECK(r.status == 2);
        CHECK(r.out.find(c.message) != std::string::npos);
    }
    CHECK(!fs::exists(w.dir));
    // Good sizes parse.
    Run r = run(fmt::format("--cache-dir {} --prune 1.5GiB", w.dir));
    CHECK(r.status == 0);
    std::remove(file.c_str());
    std::remove((w.dir + ".fifo").c_str());
}

#ifdef KILN_HAVE_NVRTC
TEST_CASE("kiln-warmup: --arch names only what this NVRTC compiles for, listing it") {
    if (!available()) return;
    Workspace w("nvrtc-arch");
    Run r = run(fmt::format("{} --arch sm_80,sm_1000 --cache-dir {}", w.manifest, w.dir));
    INFO(r.out);
    CHECK(r.status == 2);
    CHECK(r.out.find(fmt::format("--arch sm_1000: NVRTC {} cannot compile for it; valid: sm_", cuda::nvrtc_version())) !=
          std::string::npos);
    CHECK(r.out.find("sm_90, ") != std::string::npos);
    CHECK(r.out.find(", cpu, native") != std::string::npos);
    CHECK(!fs::exists(w.dir));
    // An arch recorded in a manifest that this NVRTC does not compile for fails once, named.
    {
        std::ofstream f(w.manifest, std::ios::trunc);
        for (const RecordedStage& s : w.stages)
            f << manifest_line_json({kManifestFormat, "0.1.0", "cuda", "sm_20", s.kernel.name, kernel_text(s.kernel)}) << "\n";
    }
    r = run(fmt::format("{} --cache-dir {}", w.manifest, w.dir));
    CHECK(r.status == 1);
    CHECK(r.out.find(fmt::format("failed: {} kernels recorded for sm_20: NVRTC {} cannot compile for sm_20 (it compiles "
                                 "for sm_",
                                 w.stages.size(), cuda::nvrtc_version())) != std::string::npos);
    CHECK(r.out.find(fmt::format("{} kernels x archs: 0 compiled, 0 already cached, {} failed", w.stages.size(),
                                 w.stages.size())) != std::string::npos);
}

TEST_CASE("kiln-warmup: a kernel the cache did not store counts as failed, not compiled") {
    if (!available()) return;
    Workspace w("unstored");
    // Every entry's subdirectory is a regular file: the disk cache cannot write there (it then
    // keeps kernels in memory, with a warning), so nothing compiled is on disk.
    cache::DiskCache disk(cache::DiskCacheOptions{w.dir, ""});
    for (const RecordedStage& s : w.stages) {
        const fs::path sub = fs::path(disk.path_for(runtime_key(s, "sm_90"))).parent_path();
        fs::create_directories(sub.parent_path());
        std::ofstream(sub.string()) << "not a directory";
    }
    Run r = run(fmt::format("{} --arch sm_90 --cache-dir {} --jobs 1", w.manifest, w.dir));
    INFO(r.out);
    CHECK(r.status == 1);
    CHECK(r.out.find(fmt::format("{} kernels x archs: 0 compiled, 0 already cached, {} failed", w.stages.size(),
                                 w.stages.size())) != std::string::npos);
    CHECK(count_in(r.out, "compiled, but not stored in the cache: ") == w.stages.size());
}

TEST_CASE("a warm-up killed part way leaves a cache that the next warm-up completes") {
    if (!available()) return;
    Workspace w("killed");
    const auto& [stages, manifest, dir] = std::tie(w.stages, w.manifest, w.dir);
    // One job, killed once it has had time for part of the work (or none of it).
    const std::string cmd = fmt::format("{} {} --arch sm_80,sm_90 --cache-dir {} --jobs 1 >/dev/null 2>&1 & pid=$!; "
                                        "sleep 0.4; kill -9 $pid; wait $pid 2>/dev/null",
                                        tool(), manifest, dir);
    CHECK(std::system(cmd.c_str()) != -1);
    Run r = run(fmt::format("{} --arch sm_80,sm_90 --cache-dir {}", manifest, dir));
    INFO(r.out);
    CHECK(r.status == 0);
    r = run(fmt::format("{} --arch sm_80,sm_90 --cache-dir {} --check", manifest, dir));
    CHECK(r.status == 0);
    CHECK(r.out.find(fmt::format("{} cached, 0 missing, 0 stale, 0 damaged", stages.size() * 2)) != std::string::npos);
}

TEST_CASE("a cache written by another kiln version is not trusted: the warm-up compiles afresh") {
    if (!available()) return;
    Workspace w("old");
    const auto& [stages, manifest, dir] = std::tie(w.stages, w.manifest, w.dir);
    {
        // An older kiln stored (here: garbage) binaries under the same kernel keys.
        cache::DiskCache old(cache::DiskCacheOptions{dir, "0.0.1-old"});
        for (const RecordedStage& s : stages) old.store(runtime_key(s, "sm_90"), std::vector<char>(64, 'x'));
    }
    Run r = run(fmt::format("{} --arch sm_90 --cache-dir {} --check", manifest, dir));
    CHECK(r.status == 1);  // nothing usable for this version
    r = run(fmt::format("{} --arch sm_90 --cache-dir {}", manifest, dir));
    INFO(r.out);
    CHECK(r.status == 0);
    CHECK(r.out.find(fmt::format("{} compiled, 0 already cached", stages.size())) != std::string::npos);
    cache::DiskCache now(cache::DiskCacheOptions{dir, ""});
    for (const RecordedStage& s : stages) {
        auto bin = now.load(runtime_key(s, "sm_90"));
        REQUIRE(bin.has_value());
        CHECK(*bin != std::vector<char>(64, 'x'));
    }
}
#endif // KILN_HAVE_NVRTC

#ifdef KILN_HAVE_LLVM
namespace {

std::string example() {
    const char* e = std::getenv("KILN_EXAMPLE");
    return e ? e : "";
}

bool example_available() {
    if (!available()) return false;
    if (example().empty()) {
        WARN("SKIPPED: KILN_EXAMPLE (the example program's path) is not set; run through meson test");
        return false;
    }
    return true;
}

// The example program on the CPU backend with the kernel cache `dir` and `env` ("NAME=value ...").
Run run_example(const std::string& dir, const std::string& env = "") {
    return shell(fmt::format("env KILN_BACKEND=cpu KILN_CACHE_DIR={} KILN_LOG=info {} {}", dir, env, example()));
}

std::vector<std::string> manifest_lines(const std::string& path) {
    std::ifstream in(path);
    std::vector<std::string> out;
    for (std::string l; std::getline(in, l);)
        if (!l.empty()) out.push_back(l);
    return out;
}

int count_entries(const std::string& dir) {
    int n = 0;
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
        n += it->path().extension() == ".bin";
    return n;
}

int count_temp_files(const std::string& dir) {
    int n = 0;
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
        n += cache::is_temp_name(it->path().filename().string());
    return n;
}

// The example's own manifest on the CPU backend, recorded into a scratch cache; removed at the end.
struct CpuWorkspace {
    std::string manifest, dir, scratch;
    size_t kernels = 0;
    explicit CpuWorkspace(const std::string& tag)
        : manifest(fresh_dir(("cpu-m-" + tag).c_str()) + ".jsonl"), dir(fresh_dir(("cpu-cache-" + tag).c_str())),
          scratch(fresh_dir(("cpu-scratch-" + tag).c_str())) {
        Run r = run_example(scratch, "KILN_RECORD=" + manifest);
        INFO(r.out);
        REQUIRE(r.status == 0);
        REQUIRE(r.out.find("all results match the reference") != std::string::npos);
        std::vector<std::string> lines = manifest_lines(manifest);
        for (const std::string& l : lines) REQUIRE(l.find("\"backend\":\"cpu\"") != std::string::npos);
        kernels = lines.size();
        REQUIRE(kernels >= 4);
    }
    ~CpuWorkspace() {
        fs::remove_all(dir);
        fs::remove_all(scratch);
        std::remove(manifest.c_str());
    }
};

} // namespace

TEST_CASE("cpu: the example's manifest warmed with --arch cpu runs under KILN_ASSERT_NO_COMPILE with no compile") {
    if (!example_available()) return;
    CpuWorkspace w("assert");
    const size_t n = w.kernels;

    // Not warmed: the asserted run fails, naming the variable (so the next part can fail too).
    Run r = run_example(w.dir, "KILN_ASSERT_NO_COMPILE=1");
    CHECK(r.status != 0);
    CHECK(r.out.find("KILN_ASSERT_NO_COMPILE is set") != std::string::npos);

    r = run(fmt::format("{} --arch cpu --cache-dir {} --jobs 2", w.manifest, w.dir));
    INFO(r.out);
    REQUIRE(r.status == 0);
    CHECK(r.out.find(fmt::format("{} kernels x archs: {} compiled, 0 already cached, 0 failed", n, n)) != std::string::npos);
    CHECK(r.out.find("CPU kernels are compiled for this host") != std::string::npos);
    CHECK(count_entries(w.dir) == (int)n);

    // The deployment: every kernel from disk, nothing compiled, every result right; the kernels
    // it loads are recorded like compiled ones.
    const std::string again = w.manifest + ".again";
    r = run_example(w.dir, "KILN_ASSERT_NO_COMPILE=1 KILN_RECORD=" + again);
    INFO(r.out);
    CHECK(r.status == 0);
    CHECK(r.out.find("all results match the reference") != std::string::npos);
    CHECK(r.out.find(fmt::format("counters (cpu): 0 compiles (0.0 ms), 0 memory hits, {} disk hits", n)) !=
          std::string::npos);
    CHECK(r.out.find(fmt::format("kernels compiled: 0 (0.0 ms), loaded from the disk cache: {}", n)) != std::string::npos);
    CHECK(manifest_lines(again).size() == n);
    std::remove(again.c_str());

    // Again: nothing to compile; the recorded arch (cpu) is the default; --check agrees.
    r = run(fmt::format("{} --cache-dir {}", w.manifest, w.dir));
    CHECK(r.status == 0);
    CHECK(r.out.find(fmt::format("{} kernels x archs: 0 compiled, {} already cached", n, n)) != std::string::npos);
    r = run(fmt::format("{} --arch cpu --cache-dir {} --check", w.manifest, w.dir));
    CHECK(r.status == 0);
    CHECK(r.out.find(fmt::format("{} cached, 0 missing, 0 stale, 0 damaged", n)) != std::string::npos);

    // Damage one object and remove another: --check reports both and writes nothing; a warm-up
    // repairs both.
    std::vector<std::string> files;
    for (auto& e : fs::recursive_directory_iterator(w.dir))
        if (e.path().extension() == ".bin") files.push_back(e.path().string());
    REQUIRE(files.size() == n);
    {
        std::fstream f(files[0], std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(-40, std::ios::end);
        f.write("xyz", 3);
    }
    fs::remove(files[1]);
    r = run(fmt::format("{} --arch cpu --cache-dir {} --check", w.manifest, w.dir));
    CHECK(r.status == 1);
    CHECK(r.out.find("1 missing, 0 stale, 1 damaged") != std::string::npos);
    CHECK(fs::exists(files[0]));
    r = run(fmt::format("{} --arch cpu --cache-dir {}", w.manifest, w.dir));
    CHECK(r.status == 0);
    CHECK(r.out.find("2 compiled") != std::string::npos);
    r = run_example(w.dir, "KILN_ASSERT_NO_COMPILE=1");
    CHECK(r.status == 0);

    // --prune counts CPU entries like any other, and only kiln's entries: other files, even
    // .bin files where an entry could be, stay.
    std::vector<std::string> foreign = {w.dir + "/weights.bin", w.dir + "/data/model.bin",
                                        w.dir + "/ab/0123456789abcdef.bin",    // not an entry's header
                                        w.dir + "/ab/ab23456789abcdef.bin",    // nor this
                                        w.dir + "/cd/ab23456789abcdef.bin"};   // a header, in the wrong directory
    {
        std::ifstream e(files[2], std::ios::binary);
        std::string entry((std::istreambuf_iterator<char>(e)), std::istreambuf_iterator<char>());
        for (size_t i = 0; i < foreign.size(); ++i) {
            fs::create_directories(fs::path(foreign[i]).parent_path());
            std::ofstream(foreign[i], std::ios::binary) << (i == 4 ? entry : "not kiln's");
        }
    }
    r = run(fmt::format("--cache-dir {} --prune 0", w.dir));
    CHECK(r.status == 0);
    CHECK(r.out.find(fmt::format("pruned {} entries", n)) != std::string::npos);
    for (const std::string& f : foreign) CHECK(fs::exists(f));
    r = run(fmt::format("{} --arch cpu --cache-dir {} --check", w.manifest, w.dir));
    CHECK(r.status == 1);
    CHECK(r.out.find(fmt::format("0 cached, {} missing", n)) != std::string::npos);
}

TEST_CASE("cpu: kernels recorded on a CUDA context warm for the CPU (the kernel text is the same)") {
    if (!available()) return;
    Workspace w("cuda-to-cpu");   // a manifest of "cuda"/"sm_90" lines
    const auto& [stages, manifest, dir] = std::tie(w.stages, w.manifest, w.dir);
    // What a CPU context lowers for the same assignments is the same kernel text.
    {
        Context ctx(ContextOptions{"cpu"});
        ExampleWork ew(ctx);
        std::set<std::string> cuda_texts, cpu_texts;
        for (const RecordedStage& s : stages) cuda_texts.insert(kernel_text(s.kernel));
        for (auto& [dst, e] : ew.work)
            for (auto& ls : compile_assignment(e.node(), dst->view(), host_target_label()).stages)
                cpu_texts.insert(kernel_text(ls.kernel));
        CHECK(cpu_texts == cuda_texts);
    }
    Run r = run(fmt::format("{} --arch native --cache-dir {}", manifest, dir));   // native includes this CPU
    INFO(r.out);
    REQUIRE(r.status == 0);
    CHECK(count_in(r.out, " for cpu") == stages.size());
    // A CPU context that may not compile runs every assignment from the warmed cache.
    test::ScopedCacheDir warmed(dir);
    ::setenv("KILN_ASSERT_NO_COMPILE", "1", 1);
    Context ctx(ContextOptions{"cpu"});
    ::unsetenv("KILN_ASSERT_NO_COMPILE");
    ExampleWork ew(ctx);
    for (auto& [dst, e] : ew.work) dst->assign(e);
    CHECK(ctx.counters().compiles == 0);
    CHECK(ctx.counters().disk_hits == stages.size());
    std::vector<float> a = ew.A.to_vector<float>(), s = ew.S.to_vector<float>();
    double ref = 0;
    for (float x : a) ref += (double)x * x;
    CHECK(std::abs(s[0] - ref) <= 1e-4 * ref);
}

TEST_CASE("cpu: processes storing the same objects at once leave a correct cache") {
    if (!example_available()) return;
    CpuWorkspace w("race");
    // Two programs compiling and storing the same kernels into one empty directory.
    Run a, b;
    std::thread t1([&] { a = run_example(w.dir); });
    std::thread t2([&] { b = run_example(w.dir); });
    t1.join();
    t2.join();
    INFO(a.out << "\n---\n" << b.out);
    CHECK(a.status == 0);
    CHECK(b.status == 0);
    CHECK(count_entries(w.dir) == (int)w.kernels);
    CHECK(count_temp_files(w.dir) == 0);
    Run c = run(fmt::format("{} --arch cpu --cache-dir {} --check", w.manifest, w.dir));
    CHECK(c.status == 0);
    c = run_example(w.dir, "KILN_ASSERT_NO_COMPILE=1");
    CHECK(c.status == 0);
    CHECK(c.out.find("counters (cpu): 0 compiles") != std::string::npos);

    // Two warm-ups at once on a fresh directory, one job each.
    fs::remove_all(w.dir);
    std::thread t3([&] { a = run(fmt::format("{} --arch cpu --cache-dir {} --jobs 1", w.manifest, w.dir)); });
    std::thread t4([&] { b = run(fmt::format("{} --arch cpu --cache-dir {} --jobs 1", w.manifest, w.dir)); });
    t3.join();
    t4.join();
    INFO(a.out << "\n---\n" << b.out);
    CHECK(a.status == 0);
    CHECK(b.status == 0);
    c = run(fmt::format("{} --arch cpu --cache-dir {} --check", w.manifest, w.dir));
    CHECK(c.status == 0);
    CHECK(count_temp_files(w.dir) == 0);
}

TEST_CASE("cpu: environment values that are not valid are warned about once each, and the program runs") {
    if (!example_available()) return;
    const std::string dir = fresh_dir("env");
    Run r = shell(fmt::format("env KILN_BACKEND=cpu KILN_CACHE_DIR={} KILN_LOG=verbose KILN_NUM_THREADS=lots "
                              "KILN_ASSERT_NO_COMPILE=maybe KILN_CACHE_FSYNC=2 {}",
                              dir, example()));
    fs::remove_all(dir);
    INFO(r.out);
    CHECK(r.status == 0);
    CHECK(r.out.find("all results match the reference") != std::string::npos);
    const char* flags = "valid: 0, 1, false, true, no, yes, off, on; it is ignored";
    CHECK(count_in(r.out, "KILN_LOG='verbose' is not understood; valid: error, warn, info, debug; it is ignored") == 1);
    CHECK(count_in(r.out, "KILN_NUM_THREADS='lots' is not understood; valid: an integer from 1 to 4096; it is ignored") == 1);
    CHECK(count_in(r.out, fmt::format("KILN_ASSERT_NO_COMPILE='maybe' is not understood; {}", flags)) == 1);
    CHECK(count_in(r.out, fmt::format("KILN_CACHE_FSYNC='2' is not understood; {}", flags)) == 1);
}
#endif // KILN_HAVE_LLVM
