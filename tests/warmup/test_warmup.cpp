// kiln-warmup end to end, without a GPU: the main example's stages lowered for sm_90 are recorded
// into a manifest, the tool warms a fresh cache for sm_80 and sm_90, and every stage is then a
// hit under the key the CUDA backend looks up. Then: a second run finds everything cached,
// --check reports missing and damaged entries, --prune evicts, bad manifests are refused, and
// two warm-ups on one directory at once both succeed.
#include "tests/support/catch.hpp"

#include <kiln/kiln.hpp>

#include "codegen/cuda/cuda_codegen.hpp"
#include "compiler/key.hpp"
#include "compiler/pipeline.hpp"
#include "runtime/cache/disk_cache.hpp"
#include "runtime/cuda/nvrtc.hpp"
#include "runtime/manifest.hpp"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
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

Run run(const std::string& args) {
    std::string cmd = tool() + " " + args + " 2>&1";
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

struct RecordedStage {
    kir::Kernel kernel;
    std::string key;  // for sm_90, as the runtime computes it
};

// The main example's assignments (variance, batch norm, an elementwise chain, a full
// reduction), lowered for sm_90 without running them.
std::vector<RecordedStage> example_stages() {
    Context ctx(ContextOptions{"cpu"});
    Tensor A = ctx.array(std::vector<float>(512 * 64, 0.5f), {512, 64});
    Tensor C = ctx.empty({512, 1}), B = ctx.empty({512, 64}), S = ctx.empty({});
    std::vector<std::pair<Tensor*, Expr>> work = {
        {&C, mean(square(A - mean(A, 1)), 1)},
        {&B, reciprocal(sqrt(var(A, 1) + 0.001)) * (A - mean(A, 1))},
        {&B, tanh(A * 0.5 + 1.0) * sig(A)},
        {&S, sum(A * A)},
    };
    std::vector<RecordedStage> out;
    std::set<std::string> seen;
    for (auto& [dst, e] : work) {
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

cache::DiskCacheKey runtime_key(const RecordedStage& s, const std::string& arch) {
    kir::Kernel k = s.kernel;
    std::string key = arch == "sm_90" ? s.key : key_material(k, arch);
    k.name = kernel_name_for(key);
    return cache::cuda_kernel_key(key, codegen::emit_cuda(k).code, arch, cuda::nvrtc_version());
}

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
        for (const RecordedStage& s : stages)
            for (const char* arch : {"sm_80", "sm_90"}) {
                INFO(s.kernel.name << " " << arch);
                CHECK(disk.load(runtime_key(s, arch)).has_value());
            }
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

    // --prune 0 evicts everything.
    r = run(fmt::format("--cache-dir {} --prune 0", dir));
    CHECK(r.status == 0);
    CHECK(r.out.find(fmt::format("pruned {} entries", stages.size() * 2)) != std::string::npos);
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
    CHECK(r.out.find("cannot read manifest /nonexistent/manifest.jsonl") != std::string::npos);
    std::remove(bad.c_str());
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
