// The CPU backend's disk cache: a kernel compiled by one JIT (or Context) is loaded, not compiled,
// by the next one on the same directory and computes the same bits; a damaged entry, or an
// entry that is valid but holds no loadable object, is compiled again and replaced; another
// CPU model or feature set is another entry; several JITs storing one object at once leave a
// correct cache. Each test case has a cache directory of its own (ScopedCacheDir).
#include "tests/support/catch.hpp"
#include "tests/support/cache_dir.hpp"
#include "tests/unit/llvm/cpu_support.hpp"

#include <kiln/kiln.hpp>

#include "runtime/cache/disk_cache.hpp"
#include "runtime/cache/entry_format.hpp"
#include "runtime/cache/file_io.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

using namespace kiln;
using namespace kiln::test;
namespace fs = std::filesystem;

namespace {

kir::Kernel axpy_kernel(const std::string& name) {
    KernelBuilder kb(name, "P");
    int o = kb.buffer(DType::Float32, {SK::One}, true);
    int x = kb.buffer(DType::Float32, {SK::One});
    int y = kb.buffer(DType::Float32, {SK::One});
    kb.loop();
    kb.store(o, kb.op(Op::Add, CT::F32, kb.op(Op::Mul, CT::F32, kb.paramf(0), kb.op(Op::Exp, CT::F32, kb.load(x))),
                      kb.load(y)));
    return kb.kernel();
}

// o = p * exp(x) + y over n points: the JIT's result, checked against the same formula in C++.
std::vector<float> run_axpy(cpu::CpuJit& jit, const cpu::CpuKernel* k, int64_t n = 1000) {
    auto x = random_floats((size_t)n, -2, 2, 11), y = random_floats((size_t)n, -1, 1, 12);
    std::vector<float> o((size_t)n);
    Launch l({n});
    l.buffer(o.data(), {1}).buffer(x.data(), {1}).buffer(y.data(), {1}).fparam(1.5f);
    jit.launch(k, l.args);
    for (int64_t i = 0; i < n; ++i) CHECK(near_rel(o[i], 1.5 * std::exp((double)x[i]) + y[i], 1e-5));
    return o;
}

cpu::CpuJitOptions in(const std::string& dir, std::optional<cpu::CpuTarget> target = std::nullopt) {
    cpu::CpuJitOptions o;
    o.num_threads = 1;
    o.cache_dir = dir;
    o.target = std::move(target);
    return o;
}

int count_entries(const std::string& dir) {
    int n = 0;
    for (auto& e : fs::recursive_directory_iterator(dir)) n += e.path().extension() == ".bin";
    return n;
}

std::vector<char> file_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void put_bytes(const std::string& path, const std::vector<char>& b) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(b.data(), (std::streamsize)b.size());
}

} // namespace

TEST_CASE("cpu disk cache: a kernel compiled in one context is loaded, not compiled, in the next") {
    ScopedCacheDir dir;
    std::vector<float> host(256 * 300);
    for (size_t i = 0; i < host.size(); ++i) host[i] = std::sin(0.37f * (float)i) * 3.0f + 1.0f;
    // The example's expressions: row reductions, a broadcast back, an elementwise chain with
    // libm calls, and a full reduction (two entry points).
    auto run_all = [&](Context& ctx) {
        Tensor A = ctx.array(host, {256, 300});
        Tensor v = ctx.empty({256, 1}), bn = ctx.empty({256, 300}), ch = ctx.empty({256, 300}), s = ctx.empty({1, 1});
        v[all] = mean(square(A - mean(A, 1)), 1);
        bn[all] = reciprocal(sqrt(var(A, 1) + 0.001)) * (A - mean(A, 1));
        ch[all] = tanh(A * 0.5) * exp(-square(A)) + sig(A);
        s[all] = sum(absolute(A));
        std::vector<float> out;
        for (Tensor* t : {&v, &bn, &ch, &s}) {
            std::vector<float> r = t->to_vector<float>();
            out.insert(out.end(), r.begin(), r.end());
        }
        return out;
    };
    std::vector<float> first;
    uint64_t compiled = 0;
    {
        Context ctx(ContextOptions{"cpu"});
        first = run_all(ctx);
        compiled = ctx.counters().compiles;
        CHECK(compiled >= 4);
        CHECK(ctx.counters().disk_hits == 0);
    }
    CHECK(count_entries(dir.path()) == (int)compiled);
    Context again(ContextOptions{"cpu"});
    std::vector<float> second = run_all(again);
    CHECK(again.counters().compiles == 0);
    CHECK(again.counters().compile_ms == 0);
    CHECK(again.counters().disk_hits == compiled);
    // The same machine code: the same bits, not merely close ones.
    REQUIRE(second.size() == first.size());
    CHECK(std::memcmp(second.data(), first.data(), first.size() * sizeof(float)) == 0);
    // A new plan of the same kernels (another size) is a memory hit now.
    Tensor B = again.array(std::vector<float>(64 * 7, 0.5f), {64, 7}), C = again.empty({64, 7});
    C[all] = tanh(B * 0.5) * exp(-square(B)) + sig(B);
    CHECK(again.counters().disk_hits == compiled);
    CHECK(again.counters().compiles == 0);
}

TEST_CASE("cpu disk cache: a JIT on the same directory loads what another stored; the object links in it") {
    ScopedCacheDir dir;
    const kir::Kernel k = axpy_kernel("kiln_disk_axpy");
    std::vector<float> a, b;
    {
        cpu::CpuJit jit(in(dir.path()));
        a = run_axpy(jit, jit.compile(k, "disk-axpy"));
        CHECK(jit.counters().compiles == 1);
        REQUIRE(jit.disk_cache() != nullptr);
        CHECK(jit.disk_cache()->stats().writes == 1);
        CHECK(fs::exists(jit.disk_cache()->path_for(jit.disk_key(k, "disk-axpy"))));
    }
    cpu::CpuJit jit(in(dir.path()));
    const cpu::CpuKernel* loaded = jit.compile(k, "disk-axpy");
    CHECK(jit.counters().compiles == 0);
    CHECK(jit.counters().disk_hits == 1);
    b = run_axpy(jit, loaded);
    CHECK(a == b);
    CHECK(jit.compile(k, "disk-axpy") == loaded);   // then from memory
    CHECK(jit.counters().memory_hits == 1);
    // Another key is another entry, even for the same kernel and name.
    jit.compile(k, "disk-axpy-2");
    CHECK(jit.counters().compiles == 1);
    // With the disk cache off nothing is read or written.
    cpu::CpuJitOptions off = in(dir.path());
    off.disk_cache = false;
    cpu::CpuJit memory_only(off);
    CHECK(memory_only.disk_cache() == nullptr);
    memory_only.compile(k, "disk-axpy");
    CHECK(memory_only.counters().compiles == 1);
    CHECK(memory_only.counters().disk_hits == 0);
}

TEST_CASE("cpu disk cache: a damaged or truncated entry is rejected, compiled again and replaced") {
    ScopedCacheDir dir;
    const kir::Kernel k = axpy_kernel("kiln_damaged_axpy");
    std::string path;
    {
        cpu::CpuJit jit(in(dir.path()));
        jit.compile(k, "damaged");
        path = jit.disk_cache()->path_for(jit.disk_key(k, "damaged"));
    }
    const std::vector<char> good = file_bytes(path);
    REQUIRE(good.size() > 256);
    SECTION("a flipped byte in the object") {
        std::vector<char> bad = good;
        bad[bad.size() - 100] ^= 0x5a;
        put_bytes(path, bad);
    }
    SECTION("truncated") {
        put_bytes(path, std::vector<char>(good.begin(), good.begin() + (std::ptrdiff_t)good.size() / 2));
    }
    cpu::CpuJit jit(in(dir.path()));
    run_axpy(jit, jit.compile(k, "damaged"));
    CHECK(jit.counters().compiles == 1);
    CHECK(jit.counters().disk_hits == 0);
    CHECK(jit.disk_cache()->stats().rejected == 1);
    // The compile replaced the file with a good entry.
    cpu::CpuJit next(in(dir.path()));
    run_axpy(next, next.compile(k, "damaged"));
    CHECK(next.counters().disk_hits == 1);
    CHECK(next.counters().compiles == 0);
}

TEST_CASE("cpu disk cache: a valid entry that holds no loadable object is compiled again and replaced") {
    ScopedCacheDir dir;
    const kir::Kernel k = axpy_kernel("kiln_not_an_object");
    cpu::CpuJit probe(in(dir.path()));
    const cache::DiskCacheKey key = probe.disk_key(k, "not-an-object");
    {
        // Correct header and checksum, but the "object" is text: it passes the entry's checks
        // and fails only when the JIT links it.
        cache::DiskCache writer(cache::DiskCacheOptions{dir.path(), ""});
        const std::string junk = "this is not an ELF object file";
        writer.store(key, std::vector<char>(junk.begin(), junk.end()));
    }
    cpu::CpuJit jit(in(dir.path()));
    run_axpy(jit, jit.compile(k, "not-an-object"));
    CHECK(jit.counters().compiles == 1);
    CHECK(jit.counters().disk_hits == 0);
    cpu::CpuJit next(in(dir.path()));
    run_axpy(next, next.compile(k, "not-an-object"));
    CHECK(next.counters().disk_hits == 1);
}

TEST_CASE("cpu disk cache: another CPU model or feature set is another entry and never loaded") {
    ScopedCacheDir dir;
    const kir::Kernel k = axpy_kernel("kiln_cpu_target_axpy");
    cpu::CpuJit host(in(dir.path()));
    run_axpy(host, host.compile(k, "targets"));
    CHECK(host.counters().compiles == 1);
    // A baseline x86-64 (no AVX): code this host can run, for another CPU.
    cpu::CpuJit generic(in(dir.path(), cpu::CpuTarget{"x86-64", ""}));
    CHECK(generic.cpu_name() == "x86-64");
    run_axpy(generic, generic.compile(k, "targets"));
    CHECK(generic.counters().compiles == 1);
    CHECK(generic.counters().disk_hits == 0);
    const cache::DiskCacheKey hk = host.disk_key(k, "targets"), gk = generic.disk_key(k, "targets");
    // The host's CPU name and features with one more (a feature turned off, so this host can
    // still run the code): a miss too.
    const size_t at = hk.material.find("\nfeatures ");
    REQUIRE(at != std::string::npos);
    const size_t from = at + 10, to = hk.material.find('\n', from);
    const std::string host_features = hk.material.substr(from, to - from);
    CHECK(host_features.find("+") != std::string::npos);
    cpu::CpuJit same_name(in(dir.path(), cpu::CpuTarget{host.cpu_name(), host_features + ",-avx512f"}));
    run_axpy(same_name, same_name.compile(k, "targets"));
    CHECK(same_name.counters().compiles == 1);
    CHECK(count_entries(dir.path()) == 3);

    CHECK(hk.arch == "cpu-" + host.cpu_name());
    CHECK(gk.arch == "cpu-x86-64");
    CHECK(hk.toolchain.rfind("llvm ", 0) == 0);
    CHECK(hk.material != gk.material);
    CHECK(hk.material != same_name.disk_key(k, "targets").material);
    CHECK(hk.material.find("\nfeatures ") != std::string::npos);
    CHECK(hk.material.find("\ncpu " + host.cpu_name() + "\n") != std::string::npos);

    // Each target finds its own entry.
    cpu::CpuJit generic2(in(dir.path(), cpu::CpuTarget{"x86-64", ""}));
    run_axpy(generic2, generic2.compile(k, "targets"));
    CHECK(generic2.counters().disk_hits == 1);

    // Another CPU's file at this CPU's path (as a hash collision would put it) is refused by
    // its header and compiled over.
    const std::string host_path = host.disk_cache()->path_for(hk);
    put_bytes(host_path, file_bytes(generic.disk_cache()->path_for(gk)));
    cpu::CpuJit host2(in(dir.path()));
    run_axpy(host2, host2.compile(k, "targets"));
    CHECK(host2.counters().compiles == 1);
    CHECK(host2.disk_cache()->stats().rejected == 1);
    const std::vector<char> now = file_bytes(host_path);
    const cache::ParsedEntry e = cache::parse_entry(now);
    REQUIRE(e.check == cache::EntryCheck::Ok);
    CHECK(e.id.arch == hk.arch);
}

TEST_CASE("cpu disk cache: JITs storing the same object at once leave a correct cache") {
    ScopedCacheDir dir;
    const kir::Kernel k = axpy_kernel("kiln_racing_axpy");
    std::vector<std::unique_ptr<cpu::CpuJit>> jits;
    for (int i = 0; i < 4; ++i) jits.push_back(std::make_unique<cpu::CpuJit>(in(dir.path())));
    std::vector<std::thread> threads;
    for (auto& j : jits) threads.emplace_back([&k, jit = j.get()] { jit->compile(k, "racing"); });
    for (auto& t : threads) t.join();
    uint64_t compiles = 0, hits = 0;
    for (auto& j : jits) compiles += j->counters().compiles, hits += j->counters().disk_hits;
    CHECK(compiles + hits == 4);
    CHECK(compiles >= 1);
    CHECK(count_entries(dir.path()) == 1);
    for (auto& e : fs::recursive_directory_iterator(dir.path())) CHECK_FALSE(cache::is_temp_name(e.path().filename().string()));
    cpu::CpuJit after(in(dir.path()));
    run_axpy(after, after.compile(k, "racing"));
    CHECK(after.counters().disk_hits == 1);
}
