// kiln/math_functions.def's float functions through every path that evaluates them: the kernel-IR
// interpreter and constant folding give the C library's float result bit for bit, the CPU JIT
// within 4 ulps (LLVM may call the vector math library's variant of a function in a vectorised
// loop); integer operands compute in float32, 16-bit floats keep
// their dtype; the CUDA renderer prints the C function (NVRTC compiles it: the differential suite).
#include "tests/support/catch.hpp"
#include "tests/support/views.hpp"

#include <kiln/kiln.hpp>

#include "codegen/cuda/cuda_codegen.hpp"
#include "compiler/canonicalise.hpp"
#include "compiler/pipeline.hpp"
#include "ir/node.hpp"
#include "runtime/kir_interpreter.hpp"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

using namespace kiln;

namespace {

struct MathFn {
    const char* name;
    Expr (*build)(const Expr&);
    float (*host)(float);
    const char* c_function;
    OpKind op;
};

const std::vector<MathFn>& math_functions() {
    static const std::vector<MathFn> fns = {
#define KILN_MATH(K, name, c_function, host) \
    {#name, kiln::name, [](float x) { return (float)host(x); }, #c_function, OpKind::K},
#include <kiln/math_functions.def>
#undef KILN_MATH
    };
    return fns;
}

// Values inside every function's domain (log1p and log10 need positive ones), signs mixed.
std::vector<float> inputs(bool positive) {
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> d(positive ? 0.01f : -6.0f, 6.0f);
    std::vector<float> v(257);
    for (float& x : v) x = d(rng);
    v[0] = positive ? 1e-6f : 0.0f;
    return v;
}

bool positive_domain(const std::string& name) { return name == "log1p" || name == "log10"; }

} // namespace

// Units in the last place between two finite floats of one sign.
static int64_t ulps(float a, float b) {
    int32_t ia, ib;
    std::memcpy(&ia, &a, 4);
    std::memcpy(&ib, &b, 4);
    if ((ia < 0) != (ib < 0)) return a == b ? 0 : INT64_MAX;
    return ia > ib ? (int64_t)ia - ib : (int64_t)ib - ia;
}

TEST_CASE("math functions: the interpreter gives the C library's float result, the CPU JIT within 4 ulps") {
    Context ctx(ContextOptions{"cpu"});
    for (const MathFn& f : math_functions()) {
        INFO(f.name);
        const std::vector<float> x = inputs(positive_domain(f.name));
        Tensor a = ctx.array(x, {(int64_t)x.size()});
        Tensor out = ctx.eval(f.build(a));
        CHECK(out.dtype() == DType::Float32);
        const std::vector<float> got = out.to_vector<float>();

        // The interpreter, through the same lowering.
        std::vector<float> interp(x.size());
        View dst = out.view();
        CompiledAssignment ca = compile_assignment(f.build(a).node(), dst, "interpreter");
        REQUIRE(ca.stages.size() == 1);
        LoweredStage& st = ca.stages[0];
        for (size_t b = 0; b < st.sources.size(); ++b) {
            const View& v = st.sources[b].view;
            st.args.buffers[b] = b == 0 ? (void*)interp.data()
                                        : static_cast<char*>(v.storage->data) + v.offset * (int64_t)dtype_size(v.dtype);
        }
        interpret(st.kernel, st.args);

        for (size_t i = 0; i < x.size(); ++i) {
            const float want = f.host(x[i]);
            REQUIRE(ulps(got[i], want) <= 4);
            REQUIRE(std::memcmp(&interp[i], &want, 4) == 0);
        }
    }
}

TEST_CASE("math functions: dtypes, folding and the names the renderers print") {
    Context ctx(ContextOptions{"cpu"});
    for (const MathFn& f : math_functions()) {
        INFO(f.name);
        CHECK(std::string(opkind_name(f.op)) == f.name);
        Tensor i = ctx.array(std::vector<int32_t>{1, 2, 3}, {3});
        CHECK(f.build(i).dtype() == DType::Float32);
        Tensor h = ctx.array(std::vector<float>{0.25f, 0.5f}, {2}, DType::Float16);
        CHECK(f.build(h).dtype() == DType::Float16);
        CHECK(std::fabs(ctx.eval(f.build(h)).to_vector<float>()[1] - f.host(0.5f)) <= 1e-3f * (1 + std::fabs(f.host(0.5f))));

        // A function of a constant folds to the constant, computed on the host.
        NodePtr folded = canonicalise(f.build(scalar(0.5, DType::Float32)).node());
        REQUIRE(folded->op == OpKind::Scalar);
        CHECK((float)folded->value == f.host(0.5f));

        // The CUDA renderer prints the C function; the CPU backend runs it (above).
        View dst = test::host_view({3});
        std::string src = codegen::emit_cuda(
            compile_assignment(f.build(leaf(test::host_view({3}))).node(), dst, "sm_90").stages[0].kernel).code;
        CHECK(src.find(std::string(f.c_function) + "(") != std::string::npos);
    }
}
