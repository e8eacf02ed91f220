// The differential test's runner: one graph built, assigned (in a child process unless on a
// GPU), read back and compared with the reference; the counters of a run; the run of many.
#pragma once
#include "tests/differential/generator.hpp"
#include "tests/differential/nvrtc_worker.hpp"

namespace {

// ======================================================================================
// One graph: build, assign, compare
// ======================================================================================

// Counters of a run. They live in memory shared with the child processes that run the graphs
// (see the test case), so plain integers only.
struct Totals {
    int64_t graphs, failed, elements, skipped, nan_checked;
    int64_t by_kind[6];
    int64_t rand_graphs, strided_dst, cast_dst, broadcast_dst, with_reduction;
    int64_t nvrtc_over_cap, nvrtc_compiled, nvrtc_failed, distinct_kernels;
    int64_t next;     // index of the next graph to run
    int64_t current;  // index of the graph running now, -1 between graphs
    int64_t crashed;
    int64_t jit_compiles;
    double jit_ms, nvrtc_ms;
    // coverage, over the nodes of every checked graph
    int64_t op_count[kNumOps];
    int64_t composite[4];
    int64_t dtype_count[7];
    int64_t rank_count[5];
    int64_t weak_float, weak_int, typed_scalar, strided_leaves, keepdims_false, all_axes;
};

struct Env {
    int64_t count = 2000;
    int64_t first = 0;  // the first graph's index: graphs [first, count) run
    std::optional<uint64_t> seed;
    int64_t nvrtc_max = INT64_MAX;  // every distinct kernel is compiled for sm_80 and sm_90
    bool verbose = false;
    bool fork = true;
};

Env read_env() {
    Env e;
    if (const char* s = std::getenv("KILN_FUZZ_COUNT")) e.count = std::atoll(s);
    if (const char* s = std::getenv("KILN_FUZZ_FIRST")) e.first = std::max<int64_t>(0, std::atoll(s));
    if (const char* s = std::getenv("KILN_FUZZ_SEED")) e.seed = std::strtoull(s, nullptr, 10);
    if (const char* s = std::getenv("KILN_FUZZ_NVRTC_MAX")) e.nvrtc_max = std::atoll(s);
    if (const char* s = std::getenv("KILN_FUZZ_VERBOSE")) e.verbose = std::atoi(s) != 0;
    // A process that has initialised CUDA cannot use it in a forked child: GPU runs stay in-process.
    if (test_device().rfind("cuda", 0) == 0) e.fork = false;
    if (const char* s = std::getenv("KILN_FUZZ_FORK")) e.fork = std::atoi(s) != 0;
    return e;
}

// The destination: a view into a base tensor whose other elements must survive the assignment.
struct Dst {
    Tensor base, view;
    ViewSpec spec;
    DType dtype;
    std::vector<double> before;  // base contents before the assignment (when prefilled)
    bool prefilled = false;
    std::string desc;
};

std::vector<double> read_back(const Tensor& t) {
    std::vector<double> out((size_t)t.size());
    if (isf(t.dtype())) {
        std::vector<float> f((size_t)t.size());
        t.copy_to_host(f.data(), DType::Float32);
        for (size_t i = 0; i < f.size(); ++i) out[i] = f[i];
    } else {
        std::vector<int32_t> v((size_t)t.size());
        t.copy_to_host(v.data(), DType::Int32);
        for (size_t i = 0; i < v.size(); ++i) out[i] = v[i];
    }
    return out;
}

struct GraphResult {
    bool ok = true;
    std::string log;
};

class Runner {
public:
    kiln::Context& ctx;
    Totals& tot;
    NvrtcWorker* nvrtc;
    const Env& env;
    std::set<std::string> keys;  // kernels already sent to NVRTC

    Runner(kiln::Context& c, Totals& t, NvrtcWorker* w, const Env& e) : ctx(c), tot(t), nvrtc(w), env(e) {}

    Dst make_dst(Gen& g, Rng& rng, const RP& root, bool allow_cast = true) {
        Dst d;
        Shape s = root->shape;
        if (rng.chance(0.15) && count(s) * 3 <= 8192) {  // assign broadcasts the result
            for (auto& x : s)
                if (x == 1 && rng.chance(0.6)) x = rng.pick<int64_t>({2, 3, 5});
            if (s.size() < 4 && rng.chance(0.4)) s.insert(s.begin(), rng.pick<int64_t>({1, 2, 3}));
            if (count(s) > 8192) s = root->shape;
        }
        d.dtype = root->dtype;
        if (allow_cast && rng.chance(0.25)) {
            d.dtype = rng.pick(kAllDTypes);
            if (is16(d.dtype) && Gen::maxabs(root) > 6e4) d.dtype = DType::Float32;
        }
        double m = rng.uni();
        bool strided = m < 0.35;
        d.spec = make_view(rng, s, strided, 30000);
        if (strided || m < 0.5) {
            std::vector<double> base((size_t)count(d.spec.base));
            for (auto& x : base) x = g.leaf_value(d.dtype, 0);
            d.base = g.upload(base, d.spec.base, d.dtype);
            d.before = base;
            d.prefilled = true;
        } else {
            d.base = ctx.empty(d.spec.base, d.dtype);  // never written before the assignment
        }
        d.view = apply_view(d.base, d.spec);
        d.desc = std::string(dname(d.dtype)) + " " + shape_s(s) + " " + d.spec.desc + (d.prefilled ? "" : " (empty())");
        return d;
    }

    // Expected contents of the destination's base after `dst = root`.
    bool compare(const RP& root, const Dst& d, const std::vector<double>& got, std::string& log) {
        const Shape& ds = d.view.shape();
        auto m = bmap(root->shape, ds);
        std::vector<int64_t> pos(got.size(), -1);
        for (size_t i = 0; i < d.spec.map.size(); ++i) pos[d.spec.map[i]] = (int64_t)i;
        const bool red = root->reduction;
        double rtol = 0, atol = 0;
        switch (d.dtype) {
        case DType::Float32: rtol = red ? 1e-4 : 1e-5; atol = 1e-37; break;
        case DType::Float16: rtol = red ? 4e-3 : 2e-3; atol = 0x1p-24; break;
        case DType::BFloat16: rtol = red ? 2.4e-2 : 1.6e-2; atol = 1e-37; break;
        default: break;
        }
        int bad = 0;
        int64_t skipped_here = 0;
        for (size_t b = 0; b < got.size(); ++b) {
            double g = got[b];
            if (pos[b] < 0) {
                if (d.prefilled && !(g == d.before[b] || (std::isnan(g) && std::isnan(d.before[b])))) {
                    if (bad++ < 8)
                        log += "  element outside the destination view, base index " + std::to_string(b) + ": was " +
                               std::to_string(d.before[b]) + ", now " + std::to_string(g) + "\n";
                }
                continue;
            }
            int64_t i = pos[b];
            X x = root->at(m[i]);
            ++tot.elements;
            bool fail = false;
            double exp, tol = 0;
            if (isf(d.dtype)) {
                exp = round_float(d.dtype, x.v);
                if (x.u) { ++tot.skipped; ++skipped_here; continue; }
                if (std::isnan(exp)) { ++tot.nan_checked; fail = !std::isnan(g); }
                else if (std::isinf(exp)) fail = g != exp;
                else {
                    tol = atol + rtol * std::fabs(exp) + kTolFactor * x.e;
                    fail = !(std::fabs(g - exp) <= tol);
                }
            } else {
                X c = convert(x, root->dtype, d.dtype);
                exp = c.v;
                if (c.u) { ++tot.skipped; ++skipped_here; continue; }
                fail = g != exp;
            }
            if (fail && bad++ < 8) {
                char buf[320];
                std::snprintf(buf, sizeof buf, "  at %s: got %.9g, expected %.9g (reference %.17g, bound %.3g, tol %.3g)\n",
                              idx_s(i, ds).c_str(), g, exp, x.v, x.e, tol);
                log += buf;
            }
        }
        if (bad > 8) log += "  ... " + std::to_string(bad) + " mismatching elements in all\n";
        if (skipped_here && env.verbose) log += "  " + std::to_string(skipped_here) + " elements skipped as unstable\n";
        return bad == 0;
    }

    void compile_cuda(const Expr& e, const Tensor& dst, uint64_t seed, std::string& log, bool& ok) {
        try {
            kiln::CompiledAssignment ca = kiln::compile_assignment(e.node(), dst.view(), "sm_90");
            for (auto& ls : ca.stages) {
                if (!keys.insert(ls.key).second) continue;
                ++tot.distinct_kernels;
                // Manifests store kernels as text: every kernel must come back from it whole.
                kiln::kir::Kernel back = kiln::parse_kernel_text(kiln::kernel_text(ls.kernel));
                if (kiln::key_material(back, "sm_90") != ls.key) {
                    ok = false;
                    log += "  kernel text round trip changed the kernel's key\n";
                }
                if (tot.distinct_kernels > env.nvrtc_max) { ++tot.nvrtc_over_cap; continue; }
#ifdef KILN_DIFF_NVRTC
                auto src = kiln::codegen::emit_cuda(ls.kernel);
                nvrtc->submit(NvrtcJob{src.code, ls.kernel.name, seed, e.str()});
#else
                (void)seed;
                (void)nvrtc;
#endif
            }
        } catch (const std::exception& ex) {
            ok = false;
            log += std::string("  compile_assignment/emit_cuda for sm_90 threw: ") + ex.what() + "\n";
        }
    }

    GraphResult run(uint64_t seed) {
        GraphResult res;
        if (env.verbose) {
            std::printf("-- seed %llu\n", (unsigned long long)seed);
            std::fflush(stdout);
        }
        Rng rng(seed);
        Gen g(ctx, rng);
        g.main = rng.pick(kAllDTypes);
        g.max_ops = (int)rng.range(3, 12);
        double kr = rng.uni();
        Kind kind = kr < 0.70 ? Kind::Random : kr < 0.78 ? Kind::Template : kr < 0.84 ? Kind::InPlace
                  : kr < 0.88 ? Kind::Overlap : kr < 0.93 ? Kind::Special : Kind::Focus;
        ++tot.by_kind[(int)kind];
        Built root;
        std::optional<Dst> dst;
        try {
            switch (kind) {
            case Kind::Random: {
                Shape T = g.random_shape();
                root = g.gen(T, (int)rng.range(1, 4));
                break;
            }
            case Kind::Template: root = build_template(g, rng); break;
            case Kind::Special: {
                g.special = true;
                g.main = rng.pick({DType::Float32, DType::Float32, DType::Float16, DType::BFloat16});
                Shape T = g.random_shape(3, 512);
                root = g.gen(T, (int)rng.range(1, 3));
                break;
            }
            case Kind::Focus: {
                Shape T = g.random_shape(3, 2048);
                double r = rng.uni();
                if (r < 0.35 && !T.empty()) root = g.gen_onehot(T, 2);
                else if (r < 0.7) root = g.gen_take(T, 2);
                else {
                    Built x = g.make_rand(T);
                    Built y = g.gen(T, 2);
                    root = g.apply_binary(rng.pick({Op::Add, Op::Mul, Op::Lt}), x, y);
                    if (rng.chance(0.3) && !T.empty()) root = g.mean(root, 0, 0, true);
                }
                break;
            }
            case Kind::InPlace: case Kind::Overlap: dst = build_aliasing(g, rng, kind, root); break;
            }
        } catch (const kiln::Error& ex) {
            res.ok = false;
            res.log += std::string("  kiln::Error while building the expression: ") + ex.what() + "\n";
        } catch (const std::exception& ex) {
            res.ok = false;
            res.log += std::string("  exception while building the expression: ") + ex.what() + "\n";
        }
        if (res.ok && !g.mismatch.empty()) {
            res.ok = false;
            res.log += "  dtype/shape disagreement: " + g.mismatch + "\n";
        }
        if (!res.ok) return finish(seed, kind, g, root, dst, res);
        if (!dst) dst = make_dst(g, rng, root.r);
        tot.rand_graphs += g.rand_used;
        tot.strided_dst += !dst->spec.slices.empty() || !dst->spec.perm.empty();
        tot.cast_dst += dst->dtype != root.r->dtype;
        tot.broadcast_dst += dst->view.shape() != root.r->shape;
        tot.with_reduction += root.r->reduction;
        count_coverage(root.r, g);

        if (env.verbose) {
            std::printf("about to assign into %s:\n%s", dst->desc.c_str(), root.e.str().c_str());
            std::fflush(stdout);
        }
        if (env.nvrtc_max > 0) compile_cuda(root.e, dst->view, seed, res.log, res.ok);
        try {
            if (g.rand_used) ctx.seed(g.ctx_seed);
            if (rng.chance(0.5)) dst->view.assign(root.e);
            else dst->view[kiln::all] = root.e;  // nervanagpu's spelling, dst[:] = expr
        } catch (const std::exception& ex) {
            res.ok = false;
            res.log += std::string("  assignment threw: ") + ex.what() + "\n";
            return finish(seed, kind, g, root, dst, res);
        }
        try {
            std::vector<double> got = read_back(dst->base);
            if (!compare(root.r, *dst, got, res.log)) res.ok = false;
        } catch (const std::exception& ex) {
            res.ok = false;
            res.log += std::string("  reading the result threw: ") + ex.what() + "\n";
        }
        return finish(seed, kind, g, root, dst, res);
    }

    void count_coverage(const RP& root, const Gen& g) {
        std::set<int> seen;
        std::function<void(const RP&)> walk = [&](const RP& n) {
            if (!seen.insert(n->id).second) return;
            for (auto& k : n->kids) walk(k);
            ++tot.op_count[(int)n->op];
            ++tot.dtype_count[(int)n->dtype];
            ++tot.rank_count[std::min<size_t>(n->shape.size(), 4)];
            if (n->op == Op::Scalar) {
                if (!n->weak) ++tot.typed_scalar;
                else if (n->dtype == DType::Float32) ++tot.weak_float;
                else ++tot.weak_int;
            }
            if (n->op == Op::Leaf && n->attr != "contiguous") ++tot.strided_leaves;
            if (n->attr.find("keepdims=false") != std::string::npos) ++tot.keepdims_false;
            if (n->attr.find("axis=all") != std::string::npos) ++tot.all_axes;
        };
        walk(root);
        for (int i = 0; i < 4; ++i) tot.composite[i] += g.composite[i];
    }

    GraphResult finish(uint64_t seed, Kind kind, Gen& g, const Built& root, const std::optional<Dst>& dst, GraphResult res) {
        ++tot.graphs;
        if (res.ok && !env.verbose) return res;
        std::string s;
        s += std::string(res.ok ? "graph" : "FAILED graph") + " seed " + std::to_string(seed) + " (" + kind_name(kind) +
             ", replay with KILN_FUZZ_SEED=" + std::to_string(seed) + ")\n";
        s += res.log;
        if (root.e.valid()) s += "kiln expression:\n" + root.e.str();
        if (root.r) s += "reference:\n" + ref_str(root.r);
        s += "leaves:\n";
        for (auto& l : g.leaves) s += "  " + l + "\n";
        if (dst) s += "destination: " + dst->desc + "\n";
        if (!res.ok) ++tot.failed;
        std::printf("%s\n", s.c_str());
        std::fflush(stdout);
        return res;
    }

    // ---- graph families with fixed structure
    Built build_template(Gen& g, Rng& rng) {
        DType t = rng.pick({DType::Float32, DType::Float32, DType::Float16, DType::BFloat16, DType::Int8, DType::Int32});
        int64_t R = rng.pick<int64_t>({1, 3, 7, 16, 33, 64}), C = rng.pick<int64_t>({1, 3, 17, 32, 33, 129});
        if (R * C > 4096) C = 33;
        Built A = g.leaf({R, C}, t, 0);
        const Shape rc{R, C};
        auto eps = g.weak_float(0.001);
        switch ((int)rng.range(0, 9)) {
        case 0:  // the seed's variance: mean(square(A - mean(A, 1)), 1)
            return g.mean(g.un(Op::Square, g.bin(Op::Sub, A, g.mean(A, 1, 1, true))), 1, 1, true);
        case 1: {  // batch norm: reciprocal(sqrt(var(A, 1) + eps)) * (A - mean(A, 1))
            Built v = g.var(A, 1, 1, true);
            return g.bin(Op::Mul, g.un(Op::Recip, g.un(Op::Sqrt, g.bin(Op::Add, v, eps))), g.bin(Op::Sub, A, g.mean(A, 1, 1, true)));
        }
        case 2:  // column mean subtracted, then row sums: two stages
            return g.red(Op::Sum, g.bin(Op::Sub, A, g.mean(A, 0, 0, true)), 1, 1, true);
        case 3:  // row max minus column min broadcast to (R, C)
            return g.bin(Op::Sub, g.red(Op::Max, A, 1, 1, true), g.red(Op::Min, A, 0, -2, true));
        case 4:  // a full reduction of something holding a column reduction
            return g.red(Op::Sum, g.bin(Op::Mul, g.bounded(A, 10), g.mean(g.bounded(A, 10), 0, 0, true)), -1, kiln::all_axes, true);
        case 5: {  // softmax over rows
            Built Af = isf(t) ? g.bounded(A, 8) : g.cast(g.bounded(A, 8), DType::Float32);
            Built z = g.un(Op::Exp, g.bin(Op::Sub, Af, g.red(Op::Max, Af, 1, 1, true)));
            return g.bin(Op::Div, z, g.red(Op::Sum, z, 1, 1, true));
        }
        case 6:  // normalise by the global mean, reduce over columns
            return g.red(rng.pick({Op::ArgMax, Op::Max, Op::Sum}), g.bin(Op::Sub, A, g.mean(A, -1, kiln::all_axes, true)), 0, 0,
                         rng.chance(0.5));
        case 7:  // std over rows of a row-centred matrix, no keepdims
            return g.stdev(g.bin(Op::Sub, A, g.mean(A, 1, 1, true)), 1, 1, false);
        case 8:  // var over columns of an elementwise chain, then broadcast back
            return g.bin(Op::Div, g.bin(Op::Sub, A, g.mean(A, 0, 0, true)),
                         g.un(Op::Sqrt, g.bin(Op::Add, g.var(A, 0, -2, true), g.weak_float(0.01))));
        default:  // nested reductions on one axis (postfix order: one kernel with two passes)
            (void)rc;
            return g.red(Op::Max, g.bin(Op::Sub, A, g.mean(A, 1, 1, true)), 1, 1, false);
        }
    }

    // In-place (dst is a leaf of the expression, same layout) and overlapping (dst's memory
    // read through another view) assignments.
    std::optional<Dst> build_aliasing(Gen& g, Rng& rng, Kind kind, Built& root) {
        DType t = rng.pick(kAllDTypes);
        Dst d;
        d.dtype = t;
        Shape S;
        ViewSpec dst_spec, src_spec;
        if (kind == Kind::InPlace) {
            S = g.random_shape(3, 1024);
            if (S.empty()) S = {5};
            dst_spec = make_view(rng, S, rng.chance(0.4));
            src_spec = dst_spec;
        } else {
            int which = (int)rng.range(0, 2);
            int64_t n = rng.pick<int64_t>({2, 3, 7, 16, 33});
            if (which == 0) {  // A = A.T() on a square A
                S = {n, n};
                dst_spec = make_view(rng, S, false);
                src_spec = dst_spec;
                src_spec.perm = {1, 0};
                for (int64_t i = 0; i < n; ++i)
                    for (int64_t j = 0; j < n; ++j) src_spec.map[i * n + j] = j * n + i;
                src_spec.desc = "A.T()";
            } else if (which == 1) {  // A[::-1] into A
                S = {n + 1, rng.pick<int64_t>({1, 3, 5})};
                dst_spec = make_view(rng, S, false);
                src_spec = dst_spec;
                src_spec.slices = {kiln::Slice::range(kiln::Slice::kNone, kiln::Slice::kNone, -1)};
                for (int64_t i = 0; i < S[0]; ++i)
                    for (int64_t j = 0; j < S[1]; ++j) src_spec.map[i * S[1] + j] = (S[0] - 1 - i) * S[1] + j;
                src_spec.desc = "A[::-1]";
            } else {  // A[1:] = f(A[:-1])
                Shape B = {n + 1, rng.pick<int64_t>({1, 4, 7})};
                S = {n, B[1]};
                dst_spec.base = B;
                dst_spec.slices = {kiln::Slice::range(1, kiln::Slice::kNone)};
                src_spec.base = B;
                src_spec.slices = {kiln::Slice::range(0, -1)};
                for (int64_t i = 0; i < n; ++i)
                    for (int64_t j = 0; j < B[1]; ++j) {
                        dst_spec.map.push_back((i + 1) * B[1] + j);
                        src_spec.map.push_back(i * B[1] + j);
                    }
                dst_spec.desc = "A[1:]";
                src_spec.desc = "A[:-1]";
            }
        }
        std::vector<double> base((size_t)count(dst_spec.base));
        for (auto& x : base) x = g.leaf_value(t, rng.chance(0.3) ? 1 : 0);
        base[0] = base[0] == 0 ? 1 : base[0];
        d.base = g.upload(base, dst_spec.base, t);
        d.before = base;
        d.prefilled = true;
        d.spec = dst_spec;
        d.view = apply_view(d.base, dst_spec);
        Tensor src = apply_view(d.base, src_spec);
        std::vector<double> vals(src_spec.map.size());
        for (size_t i = 0; i < vals.size(); ++i) vals[i] = base[src_spec.map[i]];
        Built L = g.chk(src.expr(), r_leaf(t, S, vals, src_spec.desc), "aliased tensor");
        g.leaves.push_back("%" + std::to_string(L.r->id) + " " + dname(t) + " " + shape_s(S) + " " + src_spec.desc +
                           " (destination's memory)");
        g.pool.push_back(L);
        g.main = rng.chance(0.6) ? t : rng.pick(kAllDTypes);
        if (rng.chance(0.25)) {
            // the seeds' canonical in-place update
            root = g.apply_binary(Op::Add, g.apply_binary(Op::Mul, L, g.weak_int(2)), g.weak_int(1));
        } else {
            root = g.gen(S, (int)rng.range(1, 3));
            if (!g.pool_used) root = g.apply_binary(rng.pick({Op::Add, Op::Mul, Op::Maximum, Op::Sub}), root, L);
        }
        // Broadcast results are fine too: the root may be smaller than S only if it broadcasts.
        d.desc = std::string(dname(t)) + " " + shape_s(S) + " " + dst_spec.desc + " (aliases " + src_spec.desc + ")";
        return d;
    }
};

// Whether the device under test can be used here.
bool test_device_usable() {
    static const std::string why_not = [] {
        try {
            kiln::Context probe(kiln::ContextOptions{test_device(), 0, DType::Float32});
            std::printf("differential: running on %s\n", probe.device_description().c_str());
            return std::string();
        } catch (const kiln::Error& e) {
            return std::string(e.what());
        }
    }();
    if (!why_not.empty()) std::printf("SKIPPED: no usable %s device: %s\n", test_device().c_str(), why_not.c_str());
    return why_not.empty();
}

uint64_t graph_seed(int64_t i) { return mix64(0x6b696c6e00000000ull + (uint64_t)i) % 100000000000ull; }

// Runs graphs tot.next, tot.next+1, ... up to `end` (or the one replayed seed) in this process.
void run_graphs(Totals& tot, const Env& env, int64_t end) {
    kiln::Context ctx(kiln::ContextOptions{test_device(), 0, DType::Float32});
    NvrtcWorker worker(&tot.nvrtc_compiled);
    Runner runner(ctx, tot, &worker, env);
    const int64_t jit_base = tot.jit_compiles;
    const double jit_ms_base = tot.jit_ms;
    if (env.seed) {
        tot.current = 0;
        runner.run(*env.seed);
    } else {
        while (tot.next < end) {
            tot.current = tot.next++;
            runner.run(graph_seed(tot.current));
            auto c = ctx.counters();  // kept up to date: a later crash of this process loses nothing
            tot.jit_compiles = jit_base + (int64_t)c.compiles;
            tot.jit_ms = jit_ms_base + c.compile_ms;
        }
    }
    tot.current = -1;
    worker.finish();
    tot.nvrtc_ms += worker.ms;
    tot.nvrtc_failed += (int64_t)worker.failures.size();
    for (auto& f : worker.failures) std::printf("%s\n", f.c_str());
    std::fflush(stdout);
}

} // namespace
