// Numerics histograms in the store path (kir::Hist): the lowering marks the destination of a
// counted assignment, the kernel text keeps the mark, the CUDA renderer counts every store of
// it in a block histogram that NVRTC compiles for sm_80 and sm_90, and the counters' pointer
// follows the Args struct.
#include "tests/support/catch.hpp"
#include "tests/support/views.hpp"

#include <kiln/kiln.hpp>

#include "codegen/cuda/cuda_codegen.hpp"
#include "compiler/kernel_check.hpp"
#include "compiler/kernel_text.hpp"
#include "compiler/pipeline.hpp"
#include "ir/error.hpp"
#include "runtime/cuda/nvrtc.hpp"
#include "tests/unit/cuda/sample_kernels.hpp"

#include <fmt/format.h>

#include <cstring>
#include <string>

using namespace kiln;

namespace {

size_t occurrences(const std::string& s, const std::string& what) {
    size_t n = 0;
    for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
    return n;
}

void require_compiles(const std::string& what, const std::string& code) {
#ifdef KILN_HAVE_NVRTC
    for (int sm : {80, 90}) {
        cuda::NvrtcResult r = cuda::nvrtc_compile(code, what + ".cu", sm);
        if (!r.ok) FAIL(fmt::format("{} failed for sm_{}:\n{}\n---- source ----\n{}", what, sm, r.log, code));
    }
#else
    (void)what, (void)code;
#endif
}

// The stage of `dst = e` that writes dst, lowered with a histogram of 64 bins from 2^-48.
kir::Kernel counted(const Expr& e, const View& dst) {
    LowerOptions o;
    o.hist = {64, -48};
    CompiledAssignment ca = compile_assignment(e.node(), dst, "sm_90", o);
    return ca.stages.back().kernel;
}

} // namespace

TEST_CASE("hist store path: the lowering marks the destination, not temporaries or integer outputs") {
    const View x = test::host_view({64, 1000}, DType::Float16);
    kir::Kernel k = counted(softmax(leaf(x), 1), test::host_view({64, 1000}, DType::Float16));
    CHECK(k.hist.bins == 64);
    CHECK(k.hist.offset == -48);
    REQUIRE(k.buffers[0].output);
    CHECK(k.buffers[0].hist);
    for (size_t b = 1; b < k.buffers.size(); ++b) CHECK(!k.buffers[b].hist);
    // A destination of integers is not counted.
    kir::Kernel i = counted(cast(leaf(x), DType::Int32), test::host_view({64, 1000}, DType::Int32));
    CHECK(i.hist.bins == 0);
    CHECK(!i.buffers[0].hist);
    // Without the option nothing changes: same text as before the option existed.
    CompiledAssignment plain = compile_assignment(softmax(leaf(x), 1).node(), test::host_view({64, 1000}, DType::Float16), "sm_90");
    CHECK(kernel_text(plain.stages.back().kernel).find("hist") == std::string::npos);
    CHECK(codegen::emit_cuda(plain.stages.back().kernel).code.find("kiln_hist") == std::string::npos);
}

TEST_CASE("hist store path: every kernel shape counts each store once and compiles with NVRTC") {
    const View a = test::host_view({256, 3000}, DType::Float16), b = test::host_view({256, 3000}, DType::Float32);
    const View v = test::host_view({1 << 20}, DType::BFloat16);
    View bt = b;   // b transposed
    bt.shape = {3000, 256};
    bt.strides = {1, 3000};
    struct Case {
        const char* name;
        Expr e;
        View dst;
        size_t counts;   // kiln_hist_count calls in the source
    };
    const Case cases[] = {
        // Row: softmax's last pass stores through the 16-byte packing and element by element.
        {"row_softmax_f16", softmax(leaf(a), 1), test::host_view({256, 3000}, DType::Float16), 0},
        // Row reduction: one value per row.
        {"row_sum", sum(leaf(b), 1), test::host_view({256}, DType::Float32), 0},
        // Column and full reductions; an elementwise kernel with its 16-byte vector path.
        {"column_sum", sum(leaf(b), 0), test::host_view({3000}, DType::Float32), 0},
        {"full_sum", sum(leaf(v)), test::host_view({}, DType::BFloat16), 0},
        {"elementwise_bf16", tanh(leaf(v)) * 2.0, test::host_view({1 << 20}, DType::BFloat16), 0},
        {"elementwise_strided", exp(leaf(bt)), test::host_view({3000, 256}, DType::Float32), 0},
    };
    for (const Case& c : cases) {
        INFO(c.name);
        kir::Kernel k = counted(c.e, c.dst);
        REQUIRE(k.hist.bins == 64);
        const std::string src = codegen::emit_cuda(k).code;
        CHECK(src.find("unsigned* hist;") != std::string::npos);
        // Each entry point zeroes its block's counts, and adds them to the launch's at its end.
        const size_t entries = occurrences(src, "extern \"C\" __global__");
        CHECK(occurrences(src, "__shared__ unsigned kiln_hist[64];") == entries);
        CHECK(occurrences(src, "if (kiln_hist[i]) atomicAdd(a.hist + i, kiln_hist[i]);") == entries);
        CHECK(occurrences(src, "kiln_hist_count<64, -48>(kiln_hist, ") >= 1);
        const DType t = c.dst.dtype;
        if (t == DType::Float16) CHECK(src.find("kiln_hist_count<64, -48>(kiln_hist, kiln_f16_to_f32_hw(kiln_f32_to_f16(") != std::string::npos);
        if (t == DType::BFloat16) CHECK(src.find("kiln_hist_count<64, -48>(kiln_hist, kiln_bf16_to_f32(kiln_f32_to_bf16(") != std::string::npos);
        require_compiles(c.name, src);
    }
    // The sample kernels, their float outputs counted (every shape, every store form).
    for (auto& [name, k0] : test::sample_kernels()) {
        kir::Kernel k = k0;
        for (kir::Buffer& buf : k.buffers)
            if (buf.output && is_float(buf.dtype) && buf.dtype != DType::Float64) buf.hist = true, k.hist = {16, -8};
        if (!k.hist.bins) continue;
        INFO(name);
        require_compiles(std::string("hist_") + name, codegen::emit_cuda(k).code);
    }
}

TEST_CASE("hist store path: kernel text keeps the histogram; the checks refuse a malformed one") {
    kir::Kernel k = counted(exp(leaf(test::host_view({100}))), test::host_view({100}));
    const std::string text = kernel_text(k);
    CHECK(text.find("|buf 0oh:") != std::string::npos);
    CHECK(text.size() > 12);
    CHECK(text.substr(text.size() - 12) == "|hist 64,-48");
    kir::Kernel back = parse_kernel_text(text);
    CHECK(back.hist.bins == 64);
    CHECK(back.hist.offset == -48);
    CHECK(back.buffers[0].hist);
    CHECK(kernel_text(back) == text);

    kir::Kernel input = k;
    input.buffers[1].hist = true;
    CHECK(kir::kernel_problem(input).find("buf1 (input float32) is counted into the histogram; only float32 and 16-bit float outputs are") !=
          std::string::npos);
    kir::Kernel none = k;
    none.hist = {};
    CHECK(kir::kernel_problem(none).find("buf0 is counted into the histogram, but the kernel has none") != std::string::npos);
    kir::Kernel big = k;
    big.hist.bins = 5000;
    CHECK(kir::kernel_problem(big).find("histogram of 5000 bins from 2^-48; valid: 0 to 4096 bins") != std::string::npos);
    CHECK_THROWS_WITH(parse_kernel_text(text.substr(0, text.size() - 6) + "9999,0"),
                      Catch::Matchers::Contains("histogram of 9999 bins"));
}

TEST_CASE("hist store path: the counters' pointer follows the Args struct, and a launch must give it") {
    kir::Kernel k = counted(exp(leaf(test::host_view({100}))), test::host_view({100}));
    const codegen::CudaArgsLayout l = codegen::cuda_args_layout(k);
    kir::Kernel plain = k;
    plain.hist = {};
    plain.buffers[0].hist = false;
    const codegen::CudaArgsLayout p = codegen::cuda_args_layout(plain);
    CHECK(l.hist == p.total);
    // The block's counters, in static shared memory.
    CHECK(codegen::cuda_hist_shared_bytes(k) == 64 * 4);
    CHECK(codegen::cuda_hist_shared_bytes(plain) == 0);
    CHECK(l.total == p.total + 8);
    kir::LaunchArgs a;
    a.sizes = {100};
    int x0, x1, counters;
    a.buffers = {&x0, &x1};
    a.strides = {1, 1};
    CHECK_THROWS_AS(codegen::pack_cuda_args(k, a), InternalError);
    a.hist = &counters;
    std::vector<uint8_t> bytes = codegen::pack_cuda_args(k, a);
    REQUIRE(bytes.size() == l.total);
    void* at = nullptr;
    std::memcpy(&at, bytes.data() + l.hist, 8);
    CHECK(at == (void*)&counters);
#ifdef KILN_HAVE_NVRTC
    // The device struct agrees: a probe reading a.hist loads it at that offset.
    std::string code = codegen::emit_cuda(k).code +
                       "extern \"C\" __global__ void kiln_hist_probe(const Args a, unsigned** out) { out[0] = a.hist; }\n";
    cuda::NvrtcResult r = cuda::nvrtc_compile(code, "hist_probe.cu", 90, /*want_cubin=*/false);
    REQUIRE(r.ok);
    const std::string ptx(r.binary.begin(), r.binary.end());
    CHECK(ptx.find(fmt::format("[kiln_hist_probe_param_0+{}]", l.hist)) != std::string::npos);
#endif
}
