// The seeds' expressions on the default backend, checked against plain loops:
//   variance     mean(square(A - mean(A, axis=1)), axis=1)
//   batch norm   reciprocal(sqrt(var(A, axis=1) + eps)) * (A - mean(A, axis=1))
// plus a fused elementwise chain and a full reduction. Each compiles to one kernel per stage (or
// loads it from the disk kernel cache, when an earlier run stored it); the second call of each
// reuses the cached plan.
#include <kiln/kiln.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace {

double max_rel_err(const std::vector<float>& got, const std::vector<double>& ref) {
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i)
        worst = std::max(worst, std::abs(got[i] - ref[i]) / (1.0 + std::abs(ref[i])));  // relative, absolute near 0
    return worst;
}

template <typename F>
double time_ms(F f, int reps = 5) {
    f();  // warm-up: compiles on first use
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) f();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
}

int run() {
    using namespace kiln;
    Context ctx;
    const int64_t M = 512, N = 1024;
    const double eps = 0.001;
    std::mt19937 gen(42);
    std::normal_distribution<float> dist(1.0f, 2.0f);
    std::vector<float> host(M * N);
    for (auto& x : host) x = dist(gen);
    Tensor A = ctx.array(host, {M, N});

    // Reference by plain loops, in double.
    std::vector<double> mean_ref(M), var_ref(M), bn_ref(M * N), chain_ref(M * N);
    double total_ref = 0;
    for (int64_t i = 0; i < M; ++i) {
        double s = 0, ss = 0;
        for (int64_t j = 0; j < N; ++j) s += host[i * N + j];
        mean_ref[i] = s / N;
        for (int64_t j = 0; j < N; ++j) ss += (host[i * N + j] - mean_ref[i]) * (host[i * N + j] - mean_ref[i]);
        var_ref[i] = ss / N;
        for (int64_t j = 0; j < N; ++j) {
            double x = host[i * N + j];
            bn_ref[i * N + j] = (x - mean_ref[i]) / std::sqrt(var_ref[i] + eps);
            chain_ref[i * N + j] = std::tanh(x * 0.5) * std::exp(-x * x) + 1.0 / (1.0 + std::exp(-x));
            total_ref += std::abs(x);
        }
    }

    Tensor var_out = ctx.empty({M, 1});
    Tensor bn_out = ctx.empty({M, N});
    Tensor chain_out = ctx.empty({M, N});
    Tensor total_out = ctx.empty({1, 1});

    double t_var = time_ms([&] { var_out[all] = mean(square(A - mean(A, 1)), 1); });
    double t_bn = time_ms([&] { bn_out[all] = reciprocal(sqrt(var(A, 1) + eps)) * (A - mean(A, 1)); });
    double t_chain = time_ms([&] { chain_out[all] = tanh(A * 0.5) * exp(-square(A)) + sig(A); });
    double t_total = time_ms([&] { total_out[all] = sum(absolute(A)); });

    double e_var = max_rel_err(var_out.to_vector<float>(), var_ref);
    double e_bn = max_rel_err(bn_out.to_vector<float>(), bn_ref);
    double e_chain = max_rel_err(chain_out.to_vector<float>(), chain_ref);
    double e_total = max_rel_err(total_out.to_vector<float>(), {total_ref});

    std::printf("kiln on %s, A = %lld x %lld float32\n", ctx.device_name().c_str(), (long long)M, (long long)N);
    std::printf("%-14s %12s %12s %8s\n", "expression", "ms/call", "max rel err", "check");
    auto row = [](const char* name, double ms, double err, double tol) {
        std::printf("%-14s %12.3f %12.2e %8s\n", name, ms, err, err <= tol ? "ok" : "FAILED");
        return err <= tol;
    };
    bool ok = row("variance", t_var, e_var, 1e-4);
    ok &= row("batch norm", t_bn, e_bn, 1e-4);
    ok &= row("fused chain", t_chain, e_chain, 1e-5);
    ok &= row("full sum|A|", t_total, e_total, 1e-4);
    Counters c = ctx.counters();
    std::printf("kernels compiled: %llu (%.1f ms), loaded from the disk cache: %llu, memory cache hits: %llu\n",
                (unsigned long long)c.compiles, c.compile_ms, (unsigned long long)c.disk_hits,
                (unsigned long long)c.memory_hits);
    std::printf("%s\n", ok ? "all results match the reference" : "MISMATCH");
    return ok ? 0 : 1;
}

}  // namespace

// A kiln error (a bad KILN_* value, a device that cannot be used) is a message and exit status 2.
int main() {
    try {
        return run();
    } catch (const kiln::Error& e) {
        std::fprintf(stderr, "kiln-example: %s\n", e.what());
        return 2;
    }
}
