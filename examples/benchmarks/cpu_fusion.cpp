// kiln's CPU backend against an unfused C++ evaluation that makes one pass per operation with
// a temporary for each result — what NumPy does — on the seeds' expressions.
// Prints a table and writes JSON (argv[1], default cpu_fusion.json): the machine, its hardware
// threads, the method and one object per case.
#include <kiln/kiln.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using Vec = std::vector<float>;

double median_ms(const std::function<void()>& f, int reps) {
    f();
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        f();
        t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

// ---- the unfused baseline: one pass, one temporary per operation
Vec row_mean(const Vec& a, int64_t M, int64_t N) {
    Vec s(M);
    for (int64_t i = 0; i < M; ++i) {
        float acc = 0;
        for (int64_t j = 0; j < N; ++j) acc += a[i * N + j];
        s[i] = acc;
    }
    Vec m(M);
    for (int64_t i = 0; i < M; ++i) m[i] = s[i] * (1.0f / N);
    return m;
}
Vec sub_bcast(const Vec& a, const Vec& m, int64_t M, int64_t N) {
    Vec o(M * N);
    for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) o[i * N + j] = a[i * N + j] - m[i];
    return o;
}
Vec square(const Vec& a) { Vec o(a.size()); for (size_t i = 0; i < a.size(); ++i) o[i] = a[i] * a[i]; return o; }
Vec unfused_var(const Vec& a, int64_t M, int64_t N) { return row_mean(square(sub_bcast(a, row_mean(a, M, N), M, N)), M, N); }
Vec unfused_bn(const Vec& a, int64_t M, int64_t N, float eps) {
    Vec v = unfused_var(a, M, N);
    Vec ve(M), sq(M), rc(M);
    for (int64_t i = 0; i < M; ++i) ve[i] = v[i] + eps;
    for (int64_t i = 0; i < M; ++i) sq[i] = std::sqrt(ve[i]);
    for (int64_t i = 0; i < M; ++i) rc[i] = 1.0f / sq[i];
    Vec d = sub_bcast(a, row_mean(a, M, N), M, N);
    Vec o(M * N);
    for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) o[i * N + j] = rc[i] * d[i * N + j];
    return o;
}
Vec unfused_chain(const Vec& a) {  // tanh(a*0.5) * exp(-square(a)) + sig(a)
    size_t n = a.size();
    Vec h(n), t(n), s(n), ng(n), e(n), p(n), na(n), en(n), d(n), sg(n), o(n);
    for (size_t i = 0; i < n; ++i) h[i] = a[i] * 0.5f;
    for (size_t i = 0; i < n; ++i) t[i] = std::tanh(h[i]);
    for (size_t i = 0; i < n; ++i) s[i] = a[i] * a[i];
    for (size_t i = 0; i < n; ++i) ng[i] = -s[i];
    for (size_t i = 0; i < n; ++i) e[i] = std::exp(ng[i]);
    for (size_t i = 0; i < n; ++i) p[i] = t[i] * e[i];
    for (size_t i = 0; i < n; ++i) na[i] = -a[i];
    for (size_t i = 0; i < n; ++i) en[i] = std::exp(na[i]);
    for (size_t i = 0; i < n; ++i) d[i] = 1.0f + en[i];
    for (size_t i = 0; i < n; ++i) sg[i] = 1.0f / d[i];
    for (size_t i = 0; i < n; ++i) o[i] = p[i] + sg[i];
    return o;
}

}  // namespace

int main(int argc, char** argv) {
    using namespace kiln;
    const char* json_path = argc > 1 ? argv[1] : "cpu_fusion.json";
    Context ctx;
    const float eps = 0.001f;
    struct Size { int64_t M, N; };
    const Size sizes[] = {{128, 32}, {1024, 1024}, {4096, 4096}};
    std::printf("kiln CPU backend vs unfused one-pass-per-op C++ (hardware threads: %u)\n",
                std::thread::hardware_concurrency());
    std::printf("%-12s %-12s %12s %12s %8s\n", "expression", "shape", "kiln ms", "unfused ms", "speedup");
    std::string json = "[";
    std::mt19937 gen(7);
    std::uniform_real_distribution<float> dist(-2.0f, 3.0f);
    for (auto [M, N] : sizes) {
        Vec host(M * N);
        for (auto& x : host) x = dist(gen);
        Tensor A = ctx.array(host, {M, N});
        Tensor col = ctx.empty({M, 1}), full = ctx.empty({M, N});
        int reps = M * N >= (1 << 22) ? 5 : 21;
        struct Case { const char* name; std::function<void()> k, u; };
        Case cases[] = {
            {"variance", [&] { col[all] = mean(square(A - mean(A, 1)), 1); }, [&] { auto r = unfused_var(host, M, N); (void)r; }},
            {"batchnorm", [&] { full[all] = reciprocal(sqrt(var(A, 1) + eps)) * (A - mean(A, 1)); },
             [&] { auto r = unfused_bn(host, M, N, eps); (void)r; }},
            {"chain", [&] { full[all] = tanh(A * 0.5) * exp(-square(A)) + sig(A); }, [&] { auto r = unfused_chain(host); (void)r; }},
        };
        for (auto& c : cases) {
            double tk = median_ms(c.k, reps), tu = median_ms(c.u, reps);
            std::string shape = std::to_string(M) + "x" + std::to_string(N);
            std::printf("%-12s %-12s %12.3f %12.3f %7.1fx\n", c.name, shape.c_str(), tk, tu, tu / tk);
            json += (json.size() > 1 ? "," : "") + std::string("{\"expr\":\"") + c.name + "\",\"M\":" + std::to_string(M) +
                    ",\"N\":" + std::to_string(N) + ",\"kiln_ms\":" + std::to_string(tk) + ",\"unfused_ms\":" + std::to_string(tu) + "}";
        }
    }
    json += "]";
    std::string model = "unknown CPU";
    std::ifstream cpuinfo("/proc/cpuinfo");
    for (std::string line; std::getline(cpuinfo, line);)
        if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
            model = line.substr(line.find(':') + 2);
            break;
        }
    for (char& ch : model)
        if (ch == '"' || ch == '\\') ch = ' ';
    json = "{\"machine\":\"" + model + "\",\"hardware_threads\":" + std::to_string(std::thread::hardware_concurrency()) +
           ",\"method\":\"host clock around one call, median of 21 calls (5 at 4096x4096) after one warm-up call that "
           "compiles\",\"cases\":" + json + "}\n";
    if (FILE* f = std::fopen(json_path, "w")) {
        std::fputs(json.c_str(), f);
        std::fclose(f);
    }
    std::printf("json: %s\n", json_path);
    return 0;
}
