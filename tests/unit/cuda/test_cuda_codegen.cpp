// CUDA C renderer and NVRTC: every hand-built kernel is rendered and compiled for sm_80 and
// sm_90 (NVRTC needs no GPU), the Args packing matches the struct the device code declares.
#include "tests/support/catch.hpp"

#include "codegen/cuda/cuda_codegen.hpp"
#include "codegen/cuda/cuda_internal.hpp"
#include "ir/error.hpp"
#include "runtime/cuda/nvrtc.hpp"
#include "tests/unit/cuda/sample_kernels.hpp"
#include "compiler/kernel_text.hpp"
#include "compiler/key.hpp"
#include "compiler/pipeline.hpp"
#include "tests/support/views.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <sstream>
#include <string>

using namespace kiln;
using codegen::CudaSource;

namespace {

#ifdef KILN_HAVE_NVRTC
constexpr bool kHaveNvrtc = true;
#else
constexpr bool kHaveNvrtc = false;
#endif

bool contains(const std::vector<char>& bin, const std::string& s) {
    return std::search(bin.begin(), bin.end(), s.begin(), s.end()) != bin.end();
}

// Compiles for both architectures; on failure the message carries the log and the source.
void require_compiles(const std::string& what, const CudaSource& src) {
    if (!kHaveNvrtc) return;
    for (int sm : {80, 90}) {
        cuda::NvrtcResult r = cuda::nvrtc_compile(src.code, what + ".cu", sm);
        if (!r.ok) FAIL(fmt::format("{} failed for sm_{}:\n{}\n---- source ----\n{}", what, sm, r.log, src.code));
        CHECK(!r.binary.empty());
        for (const std::string& e : src.entry_points) {
            INFO(what << " sm_" << sm << " entry " << e);
            CHECK(contains(r.binary, e));   // extern "C": the symbol is the plain name
        }
    }
}

// Appends a kernel that reads the first element of each Args member and checks, in its PTX,
// the parameter's size and each load's byte offset against the host layout.
void require_device_layout(const kir::Kernel& k, const codegen::CudaArgsLayout& l) {
    if (!kHaveNvrtc) return;
    std::string code = codegen::emit_cuda(k).code;
    code += "extern \"C\" __global__ void kiln_layout_probe(const Args a, long long* out) {\n"
            "    out[0] = a.sizes[0];\n"
            "    out[1] = (long long)a.buf[0];\n"
            "    out[2] = a.strides[0];\n"
            "    out[3] = __float_as_int(a.fp[0]);\n"
            "    out[4] = a.ip[0];\n"
            "}\n";
    cuda::NvrtcResult r = cuda::nvrtc_compile(code, "layout_probe.cu", 90, /*want_cubin=*/false);
    REQUIRE(r.ok);
    std::string ptx(r.binary.begin(), r.binary.end());
    INFO(ptx);
    CHECK(ptx.find(fmt::format(".param .align 8 .b8 kiln_layout_probe_param_0[{}]", l.total)) != std::string::npos);
    CHECK(ptx.find("[kiln_layout_probe_param_0]") != std::string::npos);   // sizes at 0
    for (size_t off : {l.buffers, l.strides, l.fparams, l.iparams})
        CHECK(ptx.find(fmt::format("[kiln_layout_probe_param_0+{}]", off)) != std::string::npos);
}

} // namespace

TEST_CASE("sample kernels cover every Op and every AccKind") {
    std::set<int> ops, accs, dtypes_loaded, dtypes_stored;
    for (auto& [name, k] : test::sample_kernels()) {
        for (auto& b : k.blocks)
            for (int id : b.instrs) {
                ops.insert((int)k.instrs[id].op);
                if (k.instrs[id].op == kir::Op::Load) dtypes_loaded.insert((int)k.buffers[k.instrs[id].index].dtype);
            }
        for (auto& a : k.accums) accs.insert((int)a.kind * 2 + (a.type == ComputeType::F32));
        for (auto& b : k.blocks)
            for (auto& st : b.stores) dtypes_stored.insert((int)k.buffers[st.buffer].dtype);
    }
    for (int op = 0; op <= (int)kir::kLastOp; ++op) {
        INFO("op " << kir::op_name((kir::Op)op));
        CHECK(ops.count(op) == 1);
    }
    CHECK(accs.size() == 2 * ((size_t)kir::kLastAccKind + 1));   // every kind x {f32, i32}
    CHECK((int)dtypes_loaded.size() == kNumDTypes);
    CHECK((int)dtypes_stored.size() == kNumDTypes);
}

TEST_CASE("every sample kernel renders and compiles with NVRTC for sm_80 and sm_90") {
    for (auto& [name, k] : test::sample_kernels()) {
        SECTION(name) {
            CudaSource src = codegen::emit_cuda(k);
            CHECK(src.code.find("#include") == std::string::npos);
            CHECK_FALSE(src.fast_compile);   // the whole source (what CI compiles): as any other
            if (k.full_reduce) {
                REQUIRE(src.entry_points == std::vector<std::string>{k.name});
            } else if (codegen::cuda_shape(k) == codegen::CudaShape::Column) {
                std::vector<std::string> entries{k.name};
                if (codegen::detail::column_vector_width(k)) entries.push_back(k.name + "_v");
                if (codegen::detail::column_splittable(k)) entries.push_back(k.name + "_final");
                REQUIRE(src.entry_points == entries);
            } else if (codegen::cuda_shape(k) == codegen::CudaShape::Row && codegen::detail::row_register_entry(k)) {
                REQUIRE(src.entry_points == std::vector<std::string>{k.name, k.name + "_r", k.name + "_s"});
            } else if (codegen::cuda_shape(k) == codegen::CudaShape::Row) {
                REQUIRE(src.entry_points == std::vector<std::string>{k.name, k.name + "_s"});
            } else {
                REQUIRE(src.entry_points == std::vector<std::string>{k.name});
            }
            // Row entries: two of the largest blocks per multiprocessor; the register entry (whose
            // reach in the whole kernel's source is a block) row_register_blocks of them. A
            // column kernel's vector entry: kColumnVectorBlocks.
            for (const std::string& e : src.entry_points) {
                const bool row = codegen::cuda_shape(k) == codegen::CudaShape::Row;
                const bool column_v = codegen::cuda_shape(k) == codegen::CudaShape::Column && e == k.name + "_v";
                const int blocks = e == k.name + "_r"
                                       ? codegen::detail::row_register_blocks(k, codegen::detail::row_cache_slots(k))
                                       : 2;
                const std::string bound = row        ? fmt::format("{}, {}", codegen::kCudaMaxRowBlock, blocks)
                                          : column_v ? fmt::format("256, {}", codegen::detail::kColumnVectorBlocks)
                                                     : std::string("256");
                // Full reductions and the entries of splittable column kernels count in a fourth
                // parameter (CudaLaunchPlan::counters); the final entry does not.
                const bool counts = k.full_reduce || (codegen::cuda_shape(k) == codegen::CudaShape::Column &&
                                                      codegen::detail::column_splittable(k) && e != k.name + "_final");
                CHECK(src.code.find(fmt::format("extern \"C\" __global__ void __launch_bounds__({}) {}(const Args a, "
                                                "unsigned char* const scratch, const int param{})",
                                                bound, e, counts ? ", unsigned* const counters" : "")) != std::string::npos);
            }
            require_compiles(name, src);
        }
    }
}

TEST_CASE("a row kernel's modules: one entry each, the reductions cut to its reach, each compiles with NVRTC") {
    int rows = 0;
    for (auto& [name, k] : test::sample_kernels()) {
        const std::vector<codegen::CudaModuleId> modules = codegen::cuda_modules(k);
        if (codegen::cuda_shape(k) != codegen::CudaShape::Row) {
            // Every other kernel: one module, the whole source.
            REQUIRE(modules.size() == 1);
            CHECK(modules[0].entry.empty());
            CHECK(codegen::emit_cuda_module(k, modules[0]).code == codegen::emit_cuda(k).code);
            CHECK(codegen::cuda_module_of(k, k.name, codegen::CudaReach::Warp) == modules[0]);
            continue;
        }
        ++rows;
        SECTION(name) {
            const bool registers = codegen::detail::row_register_entry(k);
            REQUIRE(modules.size() == (registers ? 7u : 5u));
            CHECK(modules[0] == codegen::CudaModuleId{k.name, codegen::CudaReach::Cluster});
            // The small entry: a block or a warp, compiled for compile time; element by element,
            // 32-bit index arithmetic, no row cache, no folds.
            CHECK(modules[modules.size() - 2] == codegen::CudaModuleId{k.name + "_s", codegen::CudaReach::Block});
            CHECK(modules.back() == codegen::CudaModuleId{k.name + "_s", codegen::CudaReach::Warp});
            for (const codegen::CudaModuleId& m : modules) {
                const std::string label = codegen::cuda_module_label(k, m);
                INFO(label);
                CHECK(codegen::cuda_module_of(k, m.entry, m.reach) == m);
                const CudaSource src = codegen::emit_cuda_module(k, m);
                CHECK(src.entry_points == std::vector<std::string>{m.entry});
                const bool small = m.entry == k.name + "_s";
                CHECK(src.fast_compile == small);
                if (small) {
                    CHECK(src.code.find("extern __shared__ uint4 kiln_row_cache[];") == std::string::npos);
                    CHECK(src.code.find("for (int ri = t; ri < nr; ri += G)") != std::string::npos);
                    // 32-bit coordinates and offsets (a gather's data-dependent index stays 64-bit)
                    CHECK(src.code.find("const long long", src.code.find("extern \"C\"")) == std::string::npos);
                    CHECK(src.code.find("const int nr = (int)a.sizes[") != std::string::npos);
                    CHECK(src.code.find("kiln_row_reduce_moments<") == std::string::npos);
                    CHECK(src.code.find("kiln_row_reduce_lse<") == std::string::npos);
                    CHECK(src.code.find("const uint4 w") == std::string::npos);   // no 16-byte groups
                    // nor the prelude's parts for folds, grouped steps and columns (NVRTC parses them all)
                    for (const char* part : {"void kiln_moments_merge(", "void kiln_row_reduce_moments(", "void kiln_lse_merge(",
                                             "void kiln_ext_step(", "void kiln_column_reduce("}) {
                        INFO(part);
                        CHECK(src.code.find(part) == std::string::npos);
                    }
                }
                // The cluster exchange only where the reach is a cluster; the reductions' template
                // argument says the reach (0 a warp, 1 a block, 2 a cluster).
                const bool cluster = m.reach == codegen::CudaReach::Cluster;
                CHECK((src.code.find("kiln_cx_init(&kiln_x)") != std::string::npos) == cluster);
                CHECK((src.code.find("kiln_cluster_sync();   // no block leaves") != std::string::npos) == cluster);
                const char* arg = m.reach == codegen::CudaReach::Warp ? ", 0>(" : m.reach == codegen::CudaReach::Block ? ", 1>(" : ", 2>(";
                int calls = 0;
                std::istringstream lines(src.code);
                for (std::string line; std::getline(lines, line);) {
                    const size_t at = line.find_first_not_of(' ');
                    if (at == std::string::npos || at == 0 || line.compare(at, 15, "kiln_row_reduce") != 0) continue;
                    ++calls;
                    CHECK(line.find(arg) != std::string::npos);
                }
                CHECK(calls >= 1);
                if (!cluster) require_compiles(label, src);   // (the cluster entry: with emit_cuda's)
            }
        }
    }
    CHECK(rows >= 3);
    // A module the kernel does not have is refused.
    const kir::Kernel softmax = test::row_softmax_kernel();
    CHECK_THROWS_WITH(codegen::emit_cuda_module(softmax, {softmax.name + "_r", codegen::CudaReach::Cluster}),
                      Catch::Matchers::Contains("has no module " + softmax.name + "_r.cluster"));
    CHECK_THROWS_WITH(codegen::emit_cuda_module(softmax, {softmax.name + "_s", codegen::CudaReach::Cluster}),
                      Catch::Matchers::Contains("has no module " + softmax.name + "_s.cluster"));
    CHECK_THROWS_WITH(codegen::emit_cuda_module(softmax, {"kiln_other", codegen::CudaReach::Warp}),
                      Catch::Matchers::Contains("has no module kiln_other.warp"));
}

TEST_CASE("kernel text round-trips every sample kernel; malformed text is refused with its position") {
    for (auto& [name, k] : test::sample_kernels()) {
        INFO(name);
        const std::string text = kernel_text(k);
        kir::Kernel back = parse_kernel_text(text);
        CHECK(kernel_text(back) == text);
        CHECK(key_material(back, "sm_90") == key_material(k, "sm_90"));
        CHECK(codegen::emit_cuda([&] { kir::Kernel named = back; named.name = k.name; return named; }()).code ==
              codegen::emit_cuda(k).code);
    }
    const std::string good = kernel_text(test::sample_kernels().begin()->second);
    for (std::string bad : {std::string(""), std::string("rank x"), good.substr(0, good.size() / 2), good + "|junk",
                            std::string("rank 1|red1|part|buf 9o:1|fp 0|ip 0")}) {
        INFO(bad);
        try {
            parse_kernel_text(bad);
            FAIL("accepted malformed kernel text");
        } catch (const Error& e) {
            CHECK(std::string(e.what()).find("kernel text: expected") != std::string::npos);
        }
    }
}

TEST_CASE("kernel shapes follow the reduced dims and the layout") {
    using codegen::CudaShape;
    CHECK(codegen::cuda_shape(test::dtypes_kernel()) == CudaShape::Elementwise);
    CHECK(codegen::cuda_shape(test::row_softmax_kernel()) == CudaShape::Row);
    CHECK(codegen::cuda_shape(test::column_kernel()) == CudaShape::Column);
    CHECK(codegen::cuda_shape(test::full_reduce_kernel()) == CudaShape::Full);

    std::string ew = codegen::emit_cuda(test::dtypes_kernel()).code;
    CHECK(ew.find("kiln_row_reduce<") == std::string::npos);
    std::string row = codegen::emit_cuda(test::row_softmax_kernel()).code;
    CHECK(row.find("kiln_row_reduce<kiln_argmax_f, 2>") != std::string::npos);
    // A thread's grouped steps take a float arg kind's elements as one step (its extreme, then
    // the first position of it; float16 values from their words as loaded); the
    // element-by-element loops take them one by one.
    CHECK(row.find("kiln_arg_step16<kiln_argmax_f, ") != std::string::npos);
    CHECK(row.find("kiln_ext_step16<kiln_max_f, ") != std::string::npos);
    CHECK(row.find("kiln_argmax_f::add_next(acc") == std::string::npos);
    CHECK(row.find("kiln_argmax_f::add(acc") != std::string::npos);
    // A cluster's blocks exchange partials through mbarriers: a cluster barrier after their
    // initialisation and at the end, none per reduction.
    CHECK(row.find("if (cs > 0) kiln_cx_init(&kiln_x);") != std::string::npos);
    CHECK(row.find(", &kiln_x, xround);") != std::string::npos);
    CHECK(row.find("if (cs > 0) kiln_cluster_sync();") != std::string::npos);
    // Softmax's max and sum of exponentials: one round (detail::row_folds) in the shared-memory
    // entry; the register entry takes a round for each.
    const std::string shared_entry = row.substr(0, row.find("kiln_row_softmax_r("));
    const std::string register_entry = row.substr(row.find("kiln_row_softmax_r("));
    CHECK(shared_entry.find("kiln_row_reduce_lse<") != std::string::npos);
    CHECK(shared_entry.find("kiln_row_reduce<kiln_max_f, ") == std::string::npos);
    CHECK(shared_entry.find("kiln_row_reduce<kiln_sum_f, ") == std::string::npos);
    CHECK(register_entry.find("kiln_row_reduce_lse<") == std::string::npos);
    CHECK(register_entry.find("kiln_row_reduce<kiln_sum_f, 1>") != std::string::npos);
    CHECK(row.find("if (live && t == 0)") != std::string::npos);   // Point-block stores
    // The first pass keeps the row in shared memory, in its storage dtype; the later ones read
    // it from there.
    INFO(row);
    CHECK(row.find("unsigned short* const x3 = ") != std::string::npos);   // buf3 is float16
    CHECK(row.find("if (cached) x3[(((j) >> 3) * row_threads) * 8 + ((j) & 7)] = m3;") != std::string::npos);
    CHECK(row.find("if (cached) kiln_sts(xs3 + (qs) * 16 + 0, w3_0_0);") != std::string::npos);
    CHECK(row.find("const uint4 w3_0_0 = cached ? kiln_lds<uint4>(xs3 + (qs) * 16 + 0) : ") != std::string::npos);
    CHECK(row.find("const float l3 = kiln_f16_to_f32((cached ? x3[(((j) >> 3) * row_threads) * 8 + ((j) & 7)] : ") !=
          std::string::npos);
    std::string col = codegen::emit_cuda(test::column_kernel()).code;
    CHECK(col.find("kiln_column_reduce<") != std::string::npos);
    std::string full = codegen::emit_cuda(test::full_reduce_kernel()).code;
    CHECK(full.find("kiln_block_reduce<") != std::string::npos);
}

// A grouped step hands a float arg kind its values at once (kiln_arg_step: the step's extreme,
// then the first position holding it); an int32 one takes them one by one (add_next).
TEST_CASE("row kernels take a float arg, max or min reduction's grouped step at once (16-bit: from its words), an int32 one element by element") {
    for (DType t : {DType::Float16, DType::BFloat16, DType::Float32, DType::Int32}) {
        for (kir::AccKind kind : {kir::AccKind::ArgMax, kir::AccKind::ArgMin, kir::AccKind::Max, kir::AccKind::Min}) {
            const bool arg = kind == kir::AccKind::ArgMax || kind == kir::AccKind::ArgMin;
            const char* kname = kind == kir::AccKind::ArgMax ? "argmax" : kind == kir::AccKind::ArgMin ? "argmin"
                                : kind == kir::AccKind::Max    ? "max"
                                                               : "min";
            INFO(dtype_name(t) << " " << kname);
            test::KernelBuilder b("kiln_argstep", "PR");
            int x = b.input(t, "x1"), o = b.output(arg ? DType::Int32 : t, "x0");
            b.loop();
            const int acc = b.accum(kind, b.load(x));
            b.point();
            b.store(o, b.acc_result(acc));
            const CudaSource src = codegen::emit_cuda(b.kernel());
            const std::string name = std::string("kiln_") + kname + (t == DType::Int32 ? "_i" : "_f");
            // 16-bit values: the step's extreme from its words as loaded (kiln_*_step16).
            const bool half = t == DType::Float16 || t == DType::BFloat16;
            const std::string step = std::string(arg ? "kiln_arg_step" : "kiln_ext_step") + (half ? "16<" : "<");
            CHECK((src.code.find(step + name + ", ") != std::string::npos) == (t != DType::Int32));
            if (half) CHECK(src.code.find(std::string(", ") + (t == DType::BFloat16 ? "true" : "false") + ", ") != std::string::npos);
            CHECK((src.code.find(name + "::add_next(acc") != std::string::npos) == (t == DType::Int32));
            require_compiles("argstep", src);
        }
    }
}

// A sum of exponentials about the row's max holds exp(0) = 1, so terms below float's normal
// range cannot move it: with 16-bit stores its exps flush them (kiln_exp_sum_fast), in the
// register entry's round of its own as in the fold's helpers; the stored exps keep them.
TEST_CASE("row kernels flush tiny terms of a sum of exponentials about the max, and only there") {
    for (bool shared_use : {false, true}) {
        test::KernelBuilder b("kiln_rowsm", "PR");
        int out = b.output(DType::Float16, "x1"), in = b.input(DType::Float16, "x1");
        b.loop();
        int a_max = b.accum(kir::AccKind::Max, b.load(in));
        b.loop();
        int e = b.op(kir::Op::Exp, kir::ComputeType::F32,
                     b.op(kir::Op::Sub, kir::ComputeType::F32, b.load(in), b.acc_result(a_max)));
        int a_sum = b.accum(kir::AccKind::Sum, e);
        // A second sum over the same exps, scaled: the exp then has another use and no fold.
        if (shared_use) b.accum(kir::AccKind::Sum, b.op(kir::Op::Mul, kir::ComputeType::F32, e, b.constf(2.0f)));
        b.loop();
        int e2 = b.op(kir::Op::Exp, kir::ComputeType::F32,
                      b.op(kir::Op::Sub, kir::ComputeType::F32, b.load(in), b.acc_result(a_max)));
        b.store(out, b.op(kir::Op::Div, kir::ComputeType::F32, e2, b.acc_result(a_sum)));
        CudaSource src = codegen::emit_cuda(b.kernel());
        INFO(src.code);
        const std::string shared_entry = src.code.substr(0, src.code.find("kiln_rowsm_r("));
        const std::string register_entry = src.code.substr(src.code.find("kiln_rowsm_r("));
        auto count = [](const std::string& text, const std::string& what) {
            size_t n = 0;
            for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
            return n;
        };
        const std::string calls = "= kiln_exp_sum_fast(v";
        if (!shared_use) {
            CHECK(shared_entry.find("kiln_row_reduce_lse<true, 2>") != std::string::npos);
            CHECK(register_entry.find("kiln_row_reduce<kiln_sum_f, 1>") != std::string::npos);
            CHECK(count(register_entry, calls) > 0);
            CHECK(register_entry.find("kiln_exp_fast(v") != std::string::npos);   // the stored exps
        } else {
            CHECK(shared_entry.find("kiln_row_reduce_lse<") == std::string::npos);
            CHECK(count(src.code, calls) == 0);
        }
        require_compiles("rowsm", src);
    }
}

TEST_CASE("row kernels load rows 16 bytes at a time from their first group boundary") {
    for (DType dt : {DType::Float32, DType::Float16}) {
        test::KernelBuilder b("kiln_rowvec", "PR");
        int out = b.output(DType::Float32, "10"), in = b.input(dt, "x1");
        b.loop();
        int x = b.load(in);
        int acc = b.accum(kir::AccKind::Sum, x);
        b.point();
        b.store(out, b.acc_result(acc));
        const int v = dt == DType::Float32 ? 4 : 8, s = v == 4 ? 2 : 3, e = v == 4 ? 2 : 1;
        CudaSource src = codegen::emit_cuda(b.kernel());
        INFO(src.code);
        // The row's phase: elements before its first 16-byte boundary, whatever the row's start.
        CHECK(src.code.find(fmt::format("const int h0 = (int)((0ULL - ((unsigned long long)(b1 + pb1) >> {})) & {});", e,
                                        v - 1)) != std::string::npos);
        CHECK(src.code.find("const int h = h0 < nr ? h0 : 0;") != std::string::npos);
        CHECK(src.code.find(fmt::format("const bool aligned = (((((unsigned long long)(b1 + pb1) >> {}) + h) & {}) | "
                                        "((unsigned long long)(b1 + pb1) & {})) == 0;",
                                        e, v - 1, v == 4 ? 3 : 1)) != std::string::npos);
        // Steps of several groups over the aligned body, then single groups, as long as this
        // thread's next group lies in the body (the last round of a row included).
        CHECK(src.code.find(fmt::format("for (; aligned && j + {0} <= fullh; j += {0})", 4 * v)) != std::string::npos);
        CHECK(src.code.find(fmt::format("for (; aligned && j < per_thread && ((((j >> {0}) * G + t) + 1) << {0}) + h <= nr; "
                                        "j += {1})",
                                        s, v)) != std::string::npos);
        // A step's first group (q: its element of the row, qs: its group of the cache region),
        // carried from step to step; its other groups lie a row stride of groups further each.
        CHECK(src.code.find(fmt::format("long long q = ((j >> {}) * G + t) * {} + h;", s, v)) != std::string::npos);
        CHECK(src.code.find(fmt::format("q += (long long)G * {};", 4 * v)) != std::string::npos);
        CHECK(src.code.find("qs += 4u * (unsigned)row_threads;") != std::string::npos);
        CHECK(src.code.find("const uint4 w1_0_0 = *(const uint4*)(b1 + pb1 + q);") != std::string::npos);
        CHECK(src.code.find(fmt::format("const uint4 w1_1_0 = *(const uint4*)(b1 + pb1 + q + 1 * ((long long)G << {}));", s)) !=
              std::string::npos);
        CHECK(src.code.find(fmt::format("const long long ri = q + (u / {1}) * ((long long)G << {0}) + u % {1};", s, v)) !=
              std::string::npos);
        // Element by element, slot r is element r + h, wrapped past the row's end.
        CHECK(src.code.find(fmt::format("const long long rslot = (((j + u) >> {}) * G + t) * {} + ((j + u) & {}) + h;", s,
                                        v, v - 1)) != std::string::npos);
        CHECK(src.code.find("const long long ri = rslot >= nr ? rslot - nr : rslot;") != std::string::npos);
        if (dt == DType::Float16) CHECK(src.code.find("kiln_f16x2_cvt(w1_0_0.x, e1[0], e1[1]);") != std::string::npos);
        require_compiles("rowvec", src);
    }
}

TEST_CASE("row kernels read a vector out of the row's phase as shifted 16-byte words, or 4-byte elements one by one") {
    for (DType dt : {DType::Float32, DType::BFloat16}) {
        // out = x * w: x and out laid out alike (in phase), w a row vector (its own phase).
        test::KernelBuilder b("kiln_rowshift", "PR");
        int out = b.output(dt, "x1"), in = b.input(dt, "x1"), w = b.input(dt, "01");
        b.loop();
        int acc = b.accum(kir::AccKind::Sum, b.load(in));
        b.loop();
        const int sum = b.op(kir::Op::Add, kir::ComputeType::F32, b.load(w), b.acc_result(acc));
        b.store(out, b.op(kir::Op::Mul, kir::ComputeType::F32, b.load(in), sum));
        const int size = dt == DType::Float32 ? 4 : 2;
        CudaSource src = codegen::emit_cuda(b.kernel());
        INFO(src.code);
        // The store is the anchor; x is expected in its phase; w's offset from it is s2 bytes.
        CHECK(src.code.find(fmt::format("const unsigned s2 = (unsigned)(((unsigned long long)(b2 + 0) + (unsigned long long)h "
                                        "* {}) & 15);",
                                        size)) != std::string::npos);
        CHECK(src.code.find("if ((s2) == 0)") != std::string::npos);
        // 16-bit elements: the two aligned words around the group, shifted, a group a step. 4-byte
        // ones: each element on its own boundary, in steps of several groups as in phase.
        const bool words = dt == DType::Float32;
        CHECK((src.code.find("kiln_ldg_shift<uint4>(b2 + 0 + q, s2)") != std::string::npos) == !words);
        CHECK((src.code.find("kiln_ldg_words<uint4>(b2 + 0 + q)") != std::string::npos) == words);
        CHECK((src.code.find("kiln_ldg_words<uint4>(b2 + 0 + q + 3 * ((long long)G << 2))") != std::string::npos) == words);
        CHECK(src.code.find("kiln_ldg_shift<uint4>(b1") == std::string::npos);
        CHECK(src.code.find("kiln_ldg_words<uint4>(b1") == std::string::npos);
        CHECK(src.code.find("const uint4 w2_0_0 = *(const uint4*)(b2 + 0 + q);") != std::string::npos);
        require_compiles("rowshift", src);
    }
}

namespace {
// mean(x) then sum((x - mean)^2) over rows of buffer 1, optionally a third pass reading x again
// (normalised output) or a second folded sum whose shift is a parameter; first_square: the
// first pass sums x^2 instead (no sum of the same values to share).
kir::Kernel moments_kernel(bool third_pass, bool param_shift, bool first_square = false, DType xdt = DType::Float16) {
    using Op = kir::Op;
    using CT = ComputeType;
    test::KernelBuilder b("kiln_moments", "PR");
    int out = b.output(DType::Float32, third_pass ? "11" : "10"), in = b.input(xdt, "x1");
    b.loop();
    const int x0 = b.load(in);
    int s = b.accum(kir::AccKind::Sum, first_square ? b.op(Op::Mul, CT::F32, x0, x0) : x0);
    b.loop();
    const int x = b.load(in);
    const int mean = b.op(Op::Mul, CT::F32, b.acc_result(s), b.paramf(0));
    const int d = b.op(Op::Sub, CT::F32, x, mean);
    const int q = b.accum(kir::AccKind::Sum, b.op(Op::Mul, CT::F32, d, d));
    int q2 = -1;
    if (param_shift) {
        const int e = b.op(Op::Sub, CT::F32, b.paramf(1), b.op(Op::Mul, CT::F32, x, x));   // (c - x^2)^2
        q2 = b.accum(kir::AccKind::Sum, b.op(Op::Mul, CT::F32, e, e));
    }
    if (third_pass) {
        b.loop();
        const int y = b.load(in);
        b.store(out, b.op(Op::Mul, CT::F32, b.op(Op::Sub, CT::F32, y, b.acc_result(s)), b.acc_result(q)));
    } else {
        b.point();
        int r = b.acc_result(q);
        if (q2 >= 0) r = b.op(Op::Add, CT::F32, r, b.acc_result(q2));
        b.store(out, r);
    }
    return b.kernel();
}
} // namespace

TEST_CASE("a column kernel folds a sum of squared deviations into its first pass, which then splits into chunks") {
    using Op = kir::Op;
    using CT = ComputeType;
    const codegen::CudaDeviceCaps h100{90, 132};
    for (DType xdt : {DType::Float32, DType::Float16}) {
        INFO(dtype_name(xdt));
        test::KernelBuilder b("kiln_colmo", "RP");
        int out = b.output(DType::Float32, "01"), in = b.input(xdt, "x1");
        b.loop();
        int s = b.accum(kir::AccKind::Sum, b.load(in));
        b.loop();
        const int mean = b.op(Op::Mul, CT::F32, b.acc_result(s), b.paramf(0));
        const int d = b.op(Op::Sub, CT::F32, b.load(in), mean);
        const int q = b.accum(kir::AccKind::Sum, b.op(Op::Mul, CT::F32, d, d));
        b.point();
        b.store(out, b.acc_result(q));
        const kir::Kernel k = b.kernel();
        REQUIRE(codegen::cuda_shape(k) == codegen::CudaShape::Column);
        const std::vector<codegen::detail::RowFold> folds = codegen::detail::column_folds(k);
        REQUIRE(folds.size() == 1);
        CHECK(folds[0].block == 1);
        CHECK(folds[0].shared == 0);
        CHECK(codegen::detail::row_folds(k).empty());
        CHECK(codegen::detail::column_splittable(k));
        const CudaSource src = codegen::emit_cuda(k);
        INFO(src.code);
        REQUIRE(src.entry_points == std::vector<std::string>{"kiln_colmo", "kiln_colmo_v", "kiln_colmo_final"});
        const int across = codegen::detail::column_width(k), v = 16 / (int)dtype_size(xdt);
        CHECK(src.code.find(fmt::format("kiln_column_reduce_moments<{}, 1>(rc, rm, rq,", across)) != std::string::npos);
        CHECK(src.code.find(fmt::format("kiln_column_reduce_moments<{}, {}>(rc, rm, rq,", across / v, v)) != std::string::npos);
        CHECK(src.code.find("kiln_moments_merge(mo1_c, mo1_m, mo1_q, 8.0f, mean, q);") != std::string::npos);
        CHECK(src.code.find("kiln_moments_merge(mo1_c0_c, mo1_c0_m, mo1_c0_q, 4.0f, mean, q);") != std::string::npos);
        CHECK(src.code.find("acc1 = mo1_q + mo1_c * ((mo1_m - v") != std::string::npos);
        CHECK(src.code.find("kiln_moments_butterfly<false>(mo1_c, mo1_m, mo1_q, unused, 32);") != std::string::npos);
        CHECK(src.code.find("(acc1_v, acc1_p") == std::string::npos);   // no second pass
        require_compiles("colmoments", src);
        kir::LaunchArgs a;
        a.sizes = {65536, 256};
        const codegen::CudaLaunchPlan p = codegen::plan_cuda_launch(k, a, h100);
        REQUIRE(p.launches.size() == 2);
        CHECK(p.launches[0].param > 1);
        CHECK(p.launches[1].entry == "kiln_colmo_final");
        CHECK(p.counters == 0);
    }
    // k read from memory per column (a given mean): two passes, unsplit.
    test::KernelBuilder b("kiln_colmo2", "RP");
    int out = b.output(DType::Float32, "01"), in = b.input(DType::Float32, "x1"), m = b.input(DType::Float32, "01");
    b.loop();
    int s = b.accum(kir::AccKind::Sum, b.load(in));
    b.loop();
    const int d = b.op(Op::Sub, CT::F32, b.load(in), b.op(Op::Mul, CT::F32, b.acc_result(s), b.load(m)));
    const int q = b.accum(kir::AccKind::Sum, b.op(Op::Mul, CT::F32, d, d));
    b.point();
    b.store(out, b.acc_result(q));
    CHECK(codegen::detail::column_folds(b.kernel()).empty());
    CHECK_FALSE(codegen::detail::column_splittable(b.kernel()));
    require_compiles("colmoments2", codegen::emit_cuda(b.kernel()));
}

TEST_CASE("row kernels fold a sum of squared deviations into the first pass when that saves a round or a pass") {
    // Variance: the second pass becomes the first pass's moments, whose round also sums the
    // mean's values; the row needs no cache.
    kir::Kernel var = moments_kernel(false, false);
    REQUIRE(codegen::detail::row_folds(var).size() == 1);
    CHECK(codegen::detail::row_folds(var)[0].block == 1);
    CHECK(codegen::detail::row_folds(var)[0].shared == 0);
    CHECK(codegen::detail::row_cache_slots(var)[1] == -1);
    std::string src = codegen::emit_cuda(var).code;
    INFO(src);
    CHECK(src.find("kiln_moments_merge(mo1_c, mo1_m, mo1_q, 32.0f, mean, q);") != std::string::npos);
    CHECK(src.find("kiln_moments_merge(mo1_c, mo1_m, mo1_q, 1.0f, ") != std::string::npos);
    CHECK(src.find("kiln_row_reduce_moments<true, 2>(mo1_c, mo1_m, mo1_q, acc0_v, G, ") != std::string::npos);
    CHECK(src.find("acc1 = mo1_q + mo1_c * ((mo1_m - v4) * (mo1_m - v4));") != std::string::npos);   // v4: the mean
    CHECK(src.find("kiln_row_reduce<kiln_sum_f, 2>(acc1_v") == std::string::npos);   // no second round
    CHECK(src.find("kiln_row_reduce<kiln_sum_f, 2>(acc0_v") == std::string::npos);   // nor one for the mean
    require_compiles("moments", codegen::emit_cuda(var));
    // Any shift known before the pass, and a deviation computed from x: folded too.
    kir::Kernel two = moments_kernel(false, true);
    CHECK(codegen::detail::row_folds(two).size() == 2);
    require_compiles("moments2", codegen::emit_cuda(two));
    // Batch norm reads the row a third time (cached): folded, for the round it saves.
    kir::Kernel bn = moments_kernel(true, false);
    REQUIRE(codegen::detail::row_folds(bn).size() == 1);
    CHECK(codegen::detail::row_folds(bn)[0].shared == 0);
    CHECK(codegen::detail::row_cache_slots(bn)[1] == 0);
    CHECK(codegen::emit_cuda(bn).code.find("kiln_row_reduce_moments<true, 2>(mo1_c") != std::string::npos);
    require_compiles("moments_bn", codegen::emit_cuda(bn));
    // Float32 rows read a third time: folded alike.
    kir::Kernel bn32 = moments_kernel(true, false, false, DType::Float32);
    REQUIRE(codegen::detail::row_folds(bn32).size() == 1);
    CHECK(codegen::detail::row_folds(bn32)[0].shared == 0);
    require_compiles("moments_bn32", codegen::emit_cuda(bn32));
    // Read a third time with no sum of the same values to share: not folded. Read once: folded,
    // its own round.
    kir::Kernel sq3 = moments_kernel(true, false, true);
    CHECK(codegen::detail::row_folds(sq3).empty());
    CHECK(codegen::emit_cuda(sq3).code.find("kiln_row_reduce_moments<") == std::string::npos);
    kir::Kernel sq = moments_kernel(false, false, true);
    REQUIRE(codegen::detail::row_folds(sq).size() == 1);
    CHECK(codegen::detail::row_folds(sq)[0].shared == -1);
    CHECK(codegen::emit_cuda(sq).code.find("kiln_row_reduce_moments<false, 2>(mo1_c, mo1_m, mo1_q, unused, G, ") !=
          std::string::npos);
    require_compiles("moments_sq", codegen::emit_cuda(sq));
}

namespace {
// max(x) then sum(exp(v - shift)) over rows of buffer 1, then x * the sum stored (a third
// pass reading the row). shift: 0 the max, 1 a parameter, 2 the max with v = 2x (a max of
// other values than the sum's), 3 the max with the operands exchanged: exp(max - x).
kir::Kernel expsum_kernel(int shift, DType out_dtype) {
    using Op = kir::Op;
    using CT = ComputeType;
    test::KernelBuilder b("kiln_expsum", "PR");
    int out = b.output(out_dtype, "11"), in = b.input(DType::Float32, "x1");
    b.loop();
    int m = b.accum(kir::AccKind::Max, b.load(in));
    b.loop();
    int x = b.load(in);
    if (shift == 2) x = b.op(Op::Mul, CT::F32, x, b.paramf(0));
    const int k = shift == 1 ? b.paramf(1) : b.acc_result(m);
    const int s = b.accum(kir::AccKind::Sum, b.op(Op::Exp, CT::F32, shift == 3 ? b.op(Op::Sub, CT::F32, k, x)
                                                                              : b.op(Op::Sub, CT::F32, x, k)));
    b.loop();
    b.store(out, b.op(Op::Mul, CT::F32, b.load(in), b.acc_result(s)));
    return b.kernel();
}
} // namespace

TEST_CASE("row kernels keep a sum of exponentials about the row's max in the pass that finds the max") {
    // Softmax: the sum is the max's pass's running sum; the max's own round is the fold's.
    kir::Kernel sm = expsum_kernel(0, DType::Float32);
    auto folds = codegen::detail::row_folds(sm);
    REQUIRE(folds.size() == 1);
    CHECK(folds[0].kind == codegen::detail::RowFold::ExpSum);
    CHECK(folds[0].block == 1);
    CHECK(folds[0].shared == 0);
    CHECK(codegen::detail::row_cache_slots(sm)[1] == 0);   // the third pass still reads the cached row
    const std::string whole = codegen::emit_cuda(sm).code;
    const std::string src = whole.substr(0, whole.find("kiln_expsum_r("));   // the shared-memory entry
    INFO(src);
    CHECK(src.find("kiln_lse_step<false, 16>(se1_m, se1_s, mv1);") != std::string::npos);   // float32: 4 groups of 4
    CHECK(src.find("kiln_lse_add<false>(se1_m, se1_s, ") != std::string::npos);
    CHECK(src.find("kiln_row_reduce_lse<false, 2>(se1_m, se1_s, G, ") != std::string::npos);
    CHECK(src.find("acc0_v = se1_m;") != std::string::npos);
    CHECK(src.find("kiln_max_f::add(acc0_v") == std::string::npos);   // the fold's max, not kept twice
    CHECK(src.find("acc1 = nr > 0 ? se1_s * kiln_exp_sel<false>(se1_m - ") != std::string::npos);
    CHECK(src.find("kiln_row_reduce<kiln_max_f, 2>(acc0_v") == std::string::npos);   // one round for both
    CHECK(src.find("kiln_row_reduce<kiln_sum_f>(acc1_v") == std::string::npos);
    require_compiles("expsum", codegen::emit_cuda(sm));
    // Stored as float16: the kernel's exp is the approximate one, and so is the fold's.
    std::string src16 = codegen::emit_cuda(expsum_kernel(0, DType::Float16)).code;
    CHECK(src16.find("kiln_lse_step<true, ") != std::string::npos);
    CHECK(src16.find("kiln_exp_sel<true>(se1_m - ") != std::string::npos);
    require_compiles("expsum16", codegen::emit_cuda(expsum_kernel(0, DType::Float16)));
    // Only exp(v - max(v)): a shift known otherwise, the max of other values, or max(v) - v are
    // two rounds as they were (their special values would not come out alike).
    for (int shift : {1, 2, 3}) {
        INFO("shift " << shift);
        kir::Kernel other = expsum_kernel(shift, DType::Float32);
        CHECK(codegen::detail::row_folds(other).empty());
        CHECK(codegen::emit_cuda(other).code.find("kiln_row_reduce<kiln_max_f, 2>(acc0_v") != std::string::npos);
        require_compiles("expsum_other", codegen::emit_cuda(other));
    }
}

TEST_CASE("contiguous rank-1 elementwise kernels have a vector path of 16 bytes of the narrowest buffer") {
    test::KernelBuilder b("kiln_vec", "P");
    int x = b.input(DType::Float32, "1"), h = b.input(DType::Float16, "1"), s = b.input(DType::Float32, "0"),
        y = b.output(DType::Float16, "1");
    b.loop();
    int v = b.op(kir::Op::Add, kir::ComputeType::F32, b.load(x), b.load(h));
    b.store(y, b.op(kir::Op::Mul, kir::ComputeType::F32, v, b.load(s)));
    CudaSource src = codegen::emit_cuda(b.kernel());
    // Eight elements a thread: 16 bytes of the 16-bit buffers, two words of the float32 one.
    CHECK(src.code.find("const uint4 w0_0 = ((const uint4*)b0)[2 * q + 0];") != std::string::npos);
    CHECK(src.code.find("const uint4 w0_1 = ((const uint4*)b0)[2 * q + 1];") != std::string::npos);
    CHECK(src.code.find("const uint4 w1 = ((const uint4*)b1)[q];") != std::string::npos);
    CHECK(src.code.find("((uint4*)b3)[q] = w3;") != std::string::npos);
    CHECK(src.code.find("for (long long i = start + ") != std::string::npos);   // scalar tail
    require_compiles("vec", src);

    // Only 16-bit buffers: eight elements per 16-byte word.
    test::KernelBuilder c("kiln_vec16", "P");
    int hx = c.input(DType::Float16, "1"), hy = c.output(DType::BFloat16, "1");
    c.loop();
    c.store(hy, c.op(kir::Op::Neg, kir::ComputeType::F32, c.load(hx)));
    CudaSource src16 = codegen::emit_cuda(c.kernel());
    CHECK(src16.code.find("const uint4 w0 = ((const uint4*)b0)[q];") != std::string::npos);
    CHECK(src16.code.find("const long long nv = (a.sizes[0]) / 8;") != std::string::npos);
    // 16-bit floats convert two at a time: lanes 0 and 1 of the load, lanes 6 and 7 of the store.
    CHECK(src16.code.find("kiln_f16x2_cvt(w0.x, e0[0], e0[1]);") != std::string::npos);
    CHECK(src16.code.find("if (kiln_f16x2_nan(w0.x) | kiln_f16x2_nan(w0.y) | kiln_f16x2_nan(w0.z) | kiln_f16x2_nan(w0.w))") !=
          std::string::npos);
    CHECK(src16.code.find("w1.w = kiln_f32x2_to_bf16x2_cvt(r1[6], r1[7]);") != std::string::npos);
    CHECK(src16.code.find("if (kiln_bf16x2_nan(w1.x) | kiln_bf16x2_nan(w1.y) | kiln_bf16x2_nan(w1.z) | kiln_bf16x2_nan(w1.w))") !=
          std::string::npos);
    require_compiles("vec16", src16);
}

TEST_CASE("elementwise kernels past rank 1 take words along a contiguous innermost axis") {
    // y (rows x cols, any row stride) = x * c + r: x contiguous along the row, c (cols,) broadcast
    // over rows, r (rows, 1) broadcast along them, the row's word found once.
    test::KernelBuilder b("kiln_vec2d", "PP");
    int x = b.input(DType::Float16, "x1"), c = b.input(DType::Float32, "01"), r = b.input(DType::Float32, "x0"),
        y = b.output(DType::Float16, "x1");
    b.loop();
    b.store(y, b.op(kir::Op::Add, kir::ComputeType::F32, b.op(kir::Op::Mul, kir::ComputeType::F32, b.load(x), b.load(c)),
                    b.load(r)));
    CudaSource src = codegen::emit_cuda(b.kernel());
    // Words of 8 (16 bytes of the narrowest buffer, float16; two words of the float32 one): where
    // bases, row strides and the row length allow.
    CHECK(src.code.find("if ((((unsigned long long)b0 & 15) | (a.strides[0] % 8) | ((unsigned long long)b1 & 15) | "
                        "((unsigned long long)b3 & 15) | (a.strides[6] % 8) | (a.sizes[1] % 8)) == 0)") != std::string::npos);
    CHECK(src.code.find("const long long i0 = 8 * q;") != std::string::npos);
    CHECK(src.code.find("const uint4 w0 = ((const uint4*)b0)[(w_o0 / 8)];") != std::string::npos);
    CHECK(src.code.find("const uint4 w1_0 = ((const uint4*)b1)[2 * (w_o1 / 8) + 0];") != std::string::npos);
    CHECK(src.code.find("const uint4 w1_1 = ((const uint4*)b1)[2 * (w_o1 / 8) + 1];") != std::string::npos);
    CHECK(src.code.find("const long long o2 = w_o2;") != std::string::npos);   // r: one element per word
    CHECK(src.code.find("((uint4*)b3)[(w_o3 / 8)] = w3;") != std::string::npos);
    CHECK(src.code.find("for (long long i = start + ") != std::string::npos);   // the scalar loop otherwise
    require_compiles("vec2d", src);

    // No word where a buffer runs across the innermost axis (a transpose), or a store is
    // broadcast along it.
    test::KernelBuilder t("kiln_vec_t", "PP");
    int tx = t.input(DType::Float16, "1x"), ty = t.output(DType::Float16, "x1");
    t.loop();
    t.store(ty, t.load(tx));
    CHECK(codegen::emit_cuda(t.kernel()).code.find("long long start") == std::string::npos);
    require_compiles("vec_t", codegen::emit_cuda(t.kernel()));
    test::KernelBuilder z("kiln_vec_z", "PP");
    int zx = z.input(DType::Float16, "x1"), zy = z.output(DType::Float16, "x0");
    z.loop();
    z.store(zy, z.load(zx));
    CHECK(codegen::detail::elementwise_vector_width(z.kernel()) == 1);

    // The grid: a thread per word where the row length and the row strides allow words, else a
    // thread per element (the kernel's scalar loop does it all).
    const codegen::CudaDeviceCaps h100{90, 132};
    kir::LaunchArgs a;
    a.sizes = {1000, 64};
    a.strides = {64, 1, 0, 1, 1, 0, 64, 1};   // x, c, r, y: (buffer, dim)
    a.buffers.assign(4, nullptr);
    CHECK(codegen::plan_cuda_launch(b.kernel(), a, h100).launches[0].grid == (64000 / 8 + codegen::kCudaBlockSize - 1) / codegen::kCudaBlockSize);
    a.strides[0] = 66;   // x's rows 66 elements apart: no word starts a row of x
    CHECK(codegen::plan_cuda_launch(b.kernel(), a, h100).launches[0].grid == (64000 + codegen::kCudaBlockSize - 1) / codegen::kCudaBlockSize);
    a.strides[0] = 64, a.sizes = {1000, 6};
    CHECK(codegen::plan_cuda_launch(b.kernel(), a, h100).launches[0].grid == (6000 + codegen::kCudaBlockSize - 1) / codegen::kCudaBlockSize);
}

TEST_CASE("exp takes the hardware's approximation only where every store is a 16-bit float") {
    using kir::Op;
    using CT = kir::ComputeType;
    struct Case {
        std::vector<DType> outs;
        bool fast;
    };
    for (const Case& c : {Case{{DType::Float16}, true}, Case{{DType::BFloat16}, true},
                          Case{{DType::BFloat16, DType::Float16}, true}, Case{{DType::Float32}, false},
                          Case{{DType::BFloat16, DType::Float32}, false}, Case{{DType::Int32}, false}}) {
        test::KernelBuilder b("kiln_math16", "P");
        int x = b.input(DType::Float32, "1");
        std::vector<int> outs;
        for (DType t : c.outs) outs.push_back(b.output(t, "1"));
        b.loop();
        const int e = b.op(Op::Add, CT::F32, b.op(Op::Exp, CT::F32, b.load(x)),
                           b.op(Op::Add, CT::F32, b.op(Op::Exp2, CT::F32, b.load(x)), b.op(Op::Tanh, CT::F32, b.load(x))));
        for (size_t i = 0; i < outs.size(); ++i)
            b.store(outs[i], c.outs[i] == DType::Int32 ? b.op(Op::ToI32, CT::I32, e) : e);
        const std::string code = codegen::emit_cuda(b.kernel()).code;
        INFO(c.outs.size() << " outputs, the first " << dtype_name(c.outs[0]));
        CHECK((code.find("kiln_exp_fast(v") != std::string::npos) == c.fast);
        CHECK((code.find(" expf(v") != std::string::npos) == !c.fast);
        CHECK(code.find("exp2f(v") != std::string::npos);   // exp2f is the hardware's already
        CHECK(code.find("tanhf(v") != std::string::npos);   // tanh.approx would show in 1 + tanh(x)
        require_compiles("math16", codegen::emit_cuda(b.kernel()));
    }
}

TEST_CASE("16-bit NaN tests only where a payload can reach a store, a select or an extreme") {
    using kir::Op;
    using CT = kir::ComputeType;
    // op 0: x * y + x (arithmetic makes every NaN canonical); 1: where(x > 0, x, y); 2: maximum(x, y);
    // 3: a copy of x; 4: sqrt(x) - exp(y) / x, stored, and x < y, stored as an integer.
    for (int op = 0; op < 5; ++op) {
        INFO("op " << op);
        test::KernelBuilder b("kiln_nan16", "P");
        int x = b.input(DType::Float16, "1"), y = b.input(DType::Float16, "1"), o = b.output(DType::Float16, "1");
        int oi = op == 4 ? b.output(DType::Int32, "1") : -1;
        b.loop();
        const int lx = b.load(x), ly = b.load(y);
        int r = -1;
        if (op == 0) r = b.op(Op::Add, CT::F32, b.op(Op::Mul, CT::F32, lx, ly), lx);
        if (op == 1) r = b.op(Op::Select, CT::F32, b.op(Op::Gt, CT::I32, lx, b.constf(0.0f)), lx, ly);
        if (op == 2) r = b.op(Op::Maximum, CT::F32, lx, ly);
        if (op == 3) r = lx;
        if (op == 4) {
            r = b.op(Op::Sub, CT::F32, b.op(Op::Sqrt, CT::F32, lx), b.op(Op::Div, CT::F32, b.op(Op::Exp, CT::F32, ly), lx));
            b.store(oi, b.op(Op::Lt, CT::I32, lx, ly));
        }
        b.store(o, r);
        const std::string code = codegen::emit_cuda(b.kernel()).code;
        const bool tested = op == 1 || op == 2 || op == 3;
        CHECK((code.find("if (kiln_f16x2_nan(w0.x)") != std::string::npos) == tested);   // x's load
        CHECK((code.find("if (kiln_f16x2_nan(w1.x)") != std::string::npos) == (op == 1 || op == 2));   // y's
        CHECK((code.find("if (kiln_f16x2_nan(w2.x)") != std::string::npos) == tested);   // the store
        require_compiles("nan16", codegen::emit_cuda(b.kernel()));
    }
    // Row reductions: an arg reduction yields a position whatever the NaN; a max yields the NaN.
    for (kir::AccKind kind : {kir::AccKind::ArgMax, kir::AccKind::Max}) {
        test::KernelBuilder b("kiln_nanrow", "PR");
        int x = b.input(DType::Float16, "x1"), o = b.output(DType::Float32, "x0");
        b.loop();
        const int acc = b.accum(kind, b.load(x));
        b.point();
        const int r = b.acc_result(acc);
        b.store(o, kind == kir::AccKind::Max ? r : b.op(Op::ToF32, CT::F32, r));
        const std::string code = codegen::emit_cuda(b.kernel()).code;
        CHECK((code.find("step_nan") != std::string::npos) == (kind == kir::AccKind::Max));
    }
    // A max whose result only feeds arithmetic (softmax's x - max(x)): no payload reaches a store.
    for (bool stored : {false, true}) {
        INFO("max stored " << stored);
        test::KernelBuilder b("kiln_nanmax", "PR");
        int x = b.input(DType::Float16, "x1"), o = b.output(DType::Float32, "x1");
        int om = stored ? b.output(DType::Float32, "x0") : -1;
        b.loop();
        const int m = b.accum(kir::AccKind::Max, b.load(x));
        b.loop();
        b.store(o, b.op(Op::Exp, CT::F32, b.op(Op::Sub, CT::F32, b.load(x), b.acc_result(m))));
        if (stored) {
            b.point();
            b.store(om, b.acc_result(m));
        }
        const std::string code = codegen::emit_cuda(b.kernel()).code;
        CHECK((code.find("step_nan") != std::string::npos) == stored);
        require_compiles("nanmax", codegen::emit_cuda(b.kernel()));
    }
}

TEST_CASE("layout specialisation: stride-0 dims vanish, stride-1 dims need no stride argument") {
    test::KernelBuilder b("kiln_layout", "PP");
    int out = b.output(DType::Float32, "x1");
    int in = b.input(DType::Float32, "0x");
    b.loop();
    b.store(out, b.load(in));
    std::string code = codegen::emit_cuda(b.kernel()).code;
    CHECK(code.find("const long long o0 = c0 * a.strides[0] + c1;") != std::string::npos);
    CHECK(code.find("const long long o1 = c1 * a.strides[3];") != std::string::npos);
}

TEST_CASE("float constants render exactly, including non-finite values") {
    test::KernelBuilder b("kiln_consts", "P");
    int out = b.output(DType::Float32, "1");
    b.loop();
    const float vals[] = {1.0f, -0.1f, 3.4028235e38f, 1e-45f, 0.0f, -0.0f, INFINITY, -INFINITY, NAN, 16777216.0f};
    std::vector<int> ids;
    for (float v : vals) ids.push_back(b.constf(v));
    b.store(out, test::sum_all(b, ids));
    CudaSource src = codegen::emit_cuda(b.kernel());
    CHECK(src.code.find("= 1.0f;") != std::string::npos);
    CHECK(src.code.find("= -0.1f;") != std::string::npos);
    CHECK(src.code.find("= -0.0f;") != std::string::npos);
    CHECK(src.code.find("__uint_as_float(0x7f800000u)") != std::string::npos);
    CHECK(src.code.find("__uint_as_float(0xff800000u)") != std::string::npos);
    require_compiles("consts", src);
}

TEST_CASE("emit_cuda rejects malformed kernels") {
    kir::Kernel bad_name = test::scalar_kernel();
    bad_name.name = "1kernel";
    CHECK_THROWS_AS(codegen::emit_cuda(bad_name), InternalError);

    kir::Kernel bad_full = test::full_reduce_kernel();
    bad_full.blocks.push_back(bad_full.blocks.back());
    CHECK_THROWS_AS(codegen::emit_cuda(bad_full), InternalError);

    kir::Kernel bad_store = test::scalar_kernel();
    bad_store.blocks[0].stores[0].buffer = 1;   // an input
    CHECK_THROWS_AS(codegen::emit_cuda(bad_store), InternalError);

    kir::Kernel bad_type = test::scalar_kernel();
    bad_type.buffers[0].dtype = DType::Int32;   // stores an f32 value
    CHECK_THROWS_AS(codegen::emit_cuda(bad_type), InternalError);

    kir::Kernel bad_operand = test::scalar_kernel();
    bad_operand.instrs.back().a[1] = -1;   // a binary op with one operand
    CHECK_THROWS_AS(codegen::emit_cuda(bad_operand), InternalError);

    kir::Kernel bad_param = test::mean_kernel();
    bad_param.num_fparams = 0;
    CHECK_THROWS_AS(codegen::emit_cuda(bad_param), InternalError);
}

TEST_CASE("pack_cuda_args lays out sizes, buffers, strides, fparams, iparams") {
    // rank 2, 3 buffers, 2 fparams, 1 iparam
    test::KernelBuilder b("kiln_pack", "PR");
    int out = b.output(DType::Float32, "x0");
    int in0 = b.input(DType::Float32, "xx");
    b.input(DType::Int8, "0x");
    int f0 = b.fparam();
    b.fparam();
    int i0 = b.iparam();
    b.loop();
    int acc = b.accum(kir::AccKind::Sum, b.op(kir::Op::Mul, ComputeType::F32, b.load(in0), b.paramf(f0)));
    b.point();
    b.store(out, b.op(kir::Op::Add, ComputeType::F32, b.acc_result(acc),
                      b.op(kir::Op::ToF32, ComputeType::F32, b.parami(i0))));
    const kir::Kernel& k = b.kernel();

    codegen::CudaArgsLayout l = codegen::cuda_args_layout(k);
    CHECK(l.sizes == 0);
    CHECK(l.buffers == 16);
    CHECK(l.strides == 40);
    CHECK(l.fparams == 88);
    CHECK(l.iparams == 96);
    CHECK(l.total == 104);   // 100 rounded up to the struct's alignment

    kir::LaunchArgs a;
    a.sizes = {3, 5};
    int x0, x1, x2;
    a.buffers = {&x0, &x1, &x2};
    a.strides = {1, 0, 5, 1, 0, 7};
    a.fparams = {0.5f, -2.0f};
    a.iparams = {-9};
    std::vector<uint8_t> bytes = codegen::pack_cuda_args(k, a);
    REQUIRE(bytes.size() == 104);
    auto at = [&](size_t off, auto v) {
        std::memcpy(&v, bytes.data() + off, sizeof v);
        return v;
    };
    CHECK(at(0, int64_t{}) == 3);
    CHECK(at(8, int64_t{}) == 5);
    CHECK(at(16, (void*)nullptr) == (void*)&x0);
    CHECK(at(32, (void*)nullptr) == (void*)&x2);
    CHECK(at(40 + 8 * 2, int64_t{}) == 5);
    CHECK(at(40 + 8 * 5, int64_t{}) == 7);
    CHECK(at(88, float{}) == 0.5f);
    CHECK(at(92, float{}) == -2.0f);
    CHECK(at(96, int32_t{}) == -9);
    CHECK(at(100, int32_t{}) == 0);   // padding is zero

    // The device struct has exactly this layout: the PTX of a probe kernel shows the parameter's
    // size and the byte offset of each member it reads.
    require_device_layout(k, l);

    kir::LaunchArgs wrong = a;
    wrong.iparams.clear();
    CHECK_THROWS_AS(codegen::pack_cuda_args(k, wrong), InternalError);
}

TEST_CASE("pack_cuda_args pads empty arrays to one slot") {
    kir::Kernel k = test::scalar_kernel();   // rank 0, 2 buffers, no params
    codegen::CudaArgsLayout l = codegen::cuda_args_layout(k);
    CHECK(l.buffers == 8);
    CHECK(l.strides == 24);
    CHECK(l.fparams == 32);
    CHECK(l.iparams == 36);
    CHECK(l.total == 40);
    kir::LaunchArgs a;
    int x = 0, y = 0;
    a.buffers = {&x, &y};
    CHECK(codegen::pack_cuda_args(k, a).size() == 40);

    require_device_layout(k, l);
}

TEST_CASE("plan_cuda_launch follows the documented launch convention") {
    using codegen::kCudaBlockSize;
    kir::LaunchArgs a;

    a.sizes = {1000, 3};
    const codegen::CudaDeviceCaps h100{90, 132}, a100{80, 108};
    codegen::CudaLaunchPlan p = codegen::plan_cuda_launch(test::all_ops_kernel(), a, h100);
    REQUIRE(p.launches.size() == 1);
    CHECK(p.launches[0].entry == "kiln_all_ops");
    CHECK(p.launches[0].grid == (3000 + kCudaBlockSize - 1) / kCudaBlockSize);
    CHECK(p.launches[0].block == (uint32_t)kCudaBlockSize);
    // Elementwise grids stop at a few waves of resident blocks (the backend asks the driver's
    // occupancy); the reductions' plans set no such limit.
    CHECK(p.launches[0].max_waves == codegen::kGridStrideWaves);

    a.sizes = {1LL << 40};
    CHECK(codegen::plan_cuda_launch(test::dtypes_kernel(), a, h100).launches[0].grid == codegen::kCudaMaxGrid);
    a.sizes = {0};
    CHECK(codegen::plan_cuda_launch(test::dtypes_kernel(), a, h100).launches[0].grid == 0);

    // Row reductions with a cached row: 8 groups of the widest loaded element per thread (buf3
    // is float16: 64 elements) while a warp covers the row, else 16 (128 elements); a cluster of
    // 256-thread blocks on sm_90 for long rows; the shared-memory cache of the later passes when
    // it leaves room for a second block, else none.
    const codegen::CudaDeviceCaps h100s{90, 132, 227 * 1024 - 1024};
    kir::Kernel row = test::row_softmax_kernel();   // buf3 is loaded by every pass: one slot
    a.sizes = {65536, 1024};
    p = codegen::plan_cuda_launch(row, a, h100s);
    CHECK(p.threads_per_row == 16);
    CHECK(p.launches[0].block == 256);
    CHECK(p.launches[0].cluster == 1);
    CHECK(p.launches[0].param == 16);
    CHECK(p.launches[0].max_waves == 0);
    CHECK(p.launches[0].grid == 65536 / 16);
    CHECK(p.launches[0].shared_bytes == 256 * 64 * 2);
    // KILN_LOG=debug's line for the plan (the backend prints it when it plans a launch).
    const std::string said = codegen::describe(p);
    CHECK(said.rfind("16 threads a row; " + p.launches[0].entry + ": 4096 blocks of 256, 32768 bytes of shared memory, param 16", 0) == 0);
    a.sizes = {4096, 32768};   // a block of 256 per row, 128 elements each
    p = codegen::plan_cuda_launch(row, a, h100s);
    CHECK(p.threads_per_row == 256);
    CHECK(p.launches[0].block == 256);
    CHECK(p.launches[0].cluster == 1);
    CHECK(p.launches[0].shared_bytes == 256 * 128 * 2);
    a.sizes = {1024, 65536};   // 512 threads would cache 128 KiB a block: a cluster of 4 instead
    p = codegen::plan_cuda_launch(row, a, h100s);
    CHECK(p.threads_per_row == 1024);
    CHECK(p.launches[0].block == 256);
    CHECK(p.launches[0].cluster == 4);
    CHECK(p.launches[0].grid == 1024 * 4);   // (the backend then keeps one wave of clusters resident)
    CHECK(p.launches[0].max_waves == 1);
    CHECK(p.launches[0].shared_bytes == 256 * 64 * 2);
    a.sizes = {512, 262144};   // the largest cluster, 128 elements per thread
    p = codegen::plan_cuda_launch(row, a, h100s);
    CHECK(p.threads_per_row == 2048);
    CHECK(p.launches[0].cluster == 8);
    CHECK(p.launches[0].shared_bytes == 256 * 128 * 2);
    a.sizes = {64, 1 << 19};   // 8 blocks would cache 128 KiB each: sm_90's non-portable 16 cache 64
    p = codegen::plan_cuda_launch(row, a, h100s);
    CHECK(p.threads_per_row == 4096);
    CHECK(p.launches[0].cluster == 16);
    CHECK(p.launches[0].grid == 64 * 16);
    CHECK(p.launches[0].shared_bytes == 256 * 128 * 2);
    {   // a device that takes portable clusters only: then nothing is cached, as in 8 blocks
        codegen::CudaDeviceCaps portable = h100s;
        portable.max_cluster = codegen::kCudaPortableCluster;
        p = codegen::plan_cuda_launch(row, a, portable);
        CHECK(p.threads_per_row == 2048);
        CHECK(p.launches[0].cluster == 8);
        CHECK(p.launches[0].shared_bytes == 0);
    }
    a.sizes = {1024, 65536};
    p = codegen::plan_cuda_launch(row, a, a100);   // no clusters, 48 KiB: the cache does not fit
    CHECK(p.threads_per_row == 512);
    CHECK(p.launches[0].cluster == 1);
    CHECK(p.launches[0].shared_bytes == 0);
    a.sizes = {8, 1 << 22};   // longer than a cluster can cache: a portable cluster reads it again
    p = codegen::plan_cuda_launch(row, a, h100s);
    CHECK(p.threads_per_row == 2048);
    CHECK(p.launches[0].cluster == 8);
    CHECK(p.launches[0].shared_bytes == 0);
    {   // one pass, nothing cached: 64 groups per thread (float32: 256 elements)
        test::KernelBuilder one("kiln_onepass", "PR");
        int out = one.output(DType::Float32, "10"), in = one.input(DType::Float32, "x1");
        one.loop();
        int acc = one.accum(kir::AccKind::Sum, one.load(in));
        one.point();
        one.store(out, one.acc_result(acc));
        a.sizes = {4096, 16384};
        p = codegen::plan_cuda_launch(one.kernel(), a, h100s);
        CHECK(p.threads_per_row == 64);
        CHECK(p.launches[0].block == 256);
        CHECK(p.launches[0].grid == 4096 / 4);
        CHECK(p.launches[0].shared_bytes == 0);
        a.sizes = {200000, 96};   // at least 2 threads a row
        CHECK(codegen::plan_cuda_launch(one.kernel(), a, h100s).threads_per_row == 2);
        a.sizes = {3000, 5000};   // 20 threads' worth at 64 groups: 32 threads of about 39 groups
        CHECK(codegen::plan_cuda_launch(one.kernel(), a, h100s).threads_per_row == 32);
        a.sizes = {500, 5000};   // 32 or 64 threads a row would leave the GPU idle
        CHECK(codegen::plan_cuda_launch(one.kernel(), a, h100s).threads_per_row == 256);
    }
    {   // a norm: its last pass also reads a weight row from memory, so 8 groups a thread past a
        // warp when that row is 32 KiB or more
        using Op = kir::Op;
        using CT = ComputeType;
        test::KernelBuilder norm("kiln_norm", "PR");
        int out = norm.output(DType::Float32, "x1"), in = norm.input(DType::Float32, "x1"),
            w = norm.input(DType::Float32, "01");
        norm.loop();
        int x = norm.load(in);
        int acc = norm.accum(kir::AccKind::Sum, norm.op(Op::Mul, CT::F32, x, x));
        norm.loop();
        int scaled = norm.op(Op::Mul, CT::F32, norm.load(in), norm.acc_result(acc));
        norm.store(out, norm.op(Op::Mul, CT::F32, scaled, norm.load(w)));
        const std::vector<int> slots = codegen::detail::row_cache_slots(norm.kernel());
        CHECK(codegen::detail::row_later_reads_memory(norm.kernel(), slots, 8192));   // 32 KiB of weights
        CHECK_FALSE(codegen::detail::row_later_reads_memory(norm.kernel(), slots, 8191));
        CHECK_FALSE(codegen::detail::row_later_reads_memory(row, codegen::detail::row_cache_slots(row), 1 << 20));
        a.sizes = {4096, 16384};   // 64 KiB of weights a row
        p = codegen::plan_cuda_launch(norm.kernel(), a, h100s);
        CHECK(p.threads_per_row == 512);
        CHECK(p.launches[0].shared_bytes == 512 * 32 * 4);
        a.sizes = {8192, 3000};   // 12 KB, which stays in L1: 16 groups
        CHECK(codegen::plan_cuda_launch(norm.kernel(), a, h100s).threads_per_row == 64);

        // a residual: its last pass reads a row of its own, from memory whatever its length
        test::KernelBuilder res("kiln_residual", "PR");
        int rout = res.output(DType::Float32, "x1"), rin = res.input(DType::Float32, "x1"),
            rr = res.input(DType::Float32, "x1");
        res.loop();
        int rx = res.load(rin);
        int racc = res.accum(kir::AccKind::Sum, rx);
        res.loop();
        int rs = res.op(Op::Mul, CT::F32, res.load(rin), res.acc_result(racc));
        res.store(rout, res.op(Op::Add, CT::F32, rs, res.load(rr)));
        CHECK(codegen::detail::row_later_reads_memory(res.kernel(), codegen::detail::row_cache_slots(res.kernel()), 3000));
        CHECK(codegen::plan_cuda_launch(res.kernel(), a, h100s).threads_per_row == 128);

        // The register entry: aligned rows of whole groups, kRowRegisterGroups (4) a thread, at
        // most a block of threads a row; its own G, grid and block, no shared memory.
        CHECK(codegen::detail::row_register_entry(norm.kernel()));
        CHECK(codegen::detail::row_register_entry(res.kernel()));   // the residual is read once: not held
        {   // rows held: at most 32 bytes a group (two float32 rows), not three
            for (int held : {2, 3}) {
                test::KernelBuilder wide("kiln_wide", "PR");
                int wout = wide.output(DType::Float32, "x1");
                std::vector<int> ins;
                for (int i = 0; i < held; ++i) ins.push_back(wide.input(DType::Float32, "x1"));
                wide.loop();
                int total = wide.load(ins[0]);
                for (int i = 1; i < held; ++i) total = wide.op(Op::Add, CT::F32, total, wide.load(ins[i]));
                int wacc = wide.accum(kir::AccKind::Sum, total);
                wide.loop();
                int again = wide.load(ins[0]);
                for (int i = 1; i < held; ++i) again = wide.op(Op::Add, CT::F32, again, wide.load(ins[i]));
                wide.store(wout, wide.op(Op::Mul, CT::F32, again, wide.acc_result(wacc)));
                CHECK(codegen::detail::row_register_entry(wide.kernel()) == (held == 2));
            }
        }
        // Softmax (its sum of exponentials folds): registers for rows of a warp's threads at most.
        REQUIRE(codegen::detail::row_register_entry(row));
        for (auto [cols, reg] : {std::pair{96, true}, {1024, true}, {3000, false}}) {
            INFO(cols);
            kir::LaunchArgs sa;
            sa.sizes = {8192, cols};
            const codegen::CudaLaunchPlan sp = codegen::plan_cuda_launch(row, sa, h100s);
            CHECK(sp.launches[0].aligned_entry.empty() == !reg);   // float16: 128 groups of 1024 are 32 threads'
            if (reg) CHECK(sp.launches[0].aligned_param <= 32);
        }
        const kir::Kernel rnorm = test::row_norm_kernel();
        REQUIRE(codegen::detail::row_register_entry(rnorm));
        CHECK(codegen::detail::row_folds(rnorm).size() == 1);   // the variance: a second round in NAME_r
        {
            const std::string src = codegen::emit_cuda(rnorm).code;
            const std::string reg = src.substr(src.find("kiln_row_norm_r("));
            CHECK(src.find("kiln_moments_merge(mo") < src.find("kiln_row_norm_r("));
            CHECK(reg.find("kiln_moments_merge(mo") == std::string::npos);
            CHECK(reg.find("kiln_row_cache") == std::string::npos);
            CHECK(reg.find("uint4 rg1_0[4];") != std::string::npos);
        }
        a.sizes = {8192, 3000};
        p = codegen::plan_cuda_launch(norm.kernel(), a, h100s);
        CHECK(p.launches[0].aligned_entry == "kiln_norm_r");
        CHECK(p.launches[0].aligned_width == 4);
        CHECK(p.launches[0].aligned_param == 256);   // 750 groups: 188 threads' worth
        CHECK(p.launches[0].aligned_block == 256);
        CHECK(p.launches[0].aligned_grid == 8192);
        CHECK(codegen::emit_cuda(norm.kernel()).entry_points ==
              std::vector<std::string>{"kiln_norm", "kiln_norm_r", "kiln_norm_s"});
        {
            alignas(64) static float data[64];
            kir::LaunchArgs al = a;
            al.buffers.assign(3, data);
            al.strides = {3000, 1, 3000, 1, 0, 1};
            al.fparams.clear();
            CHECK(codegen::cuda_launch_aligned(norm.kernel(), al, p.launches[0]));
            al.buffers[2] = data + 1;   // the weights off a 16-byte boundary
            CHECK_FALSE(codegen::cuda_launch_aligned(norm.kernel(), al, p.launches[0]));
            al.buffers[2] = data;
            al.strides[2] = 3001;   // the input's rows out of phase
            CHECK_FALSE(codegen::cuda_launch_aligned(norm.kernel(), al, p.launches[0]));
            al.strides[2] = 3000;
            al.sizes = {8192, 3002};   // the row ends inside a group
            CHECK_FALSE(codegen::cuda_launch_aligned(norm.kernel(), al, p.launches[0]));
            al.sizes = {8192, 4100};   // more than 4 groups a thread at the plan's G
            CHECK_FALSE(codegen::cuda_launch_aligned(norm.kernel(), al, p.launches[0]));
        }
        a.sizes = {200000, 96};   // 24 groups: 8 threads a row, 32 rows a block
        p = codegen::plan_cuda_launch(norm.kernel(), a, h100s);
        CHECK(p.launches[0].aligned_param == 8);
        CHECK(p.launches[0].aligned_grid == 200000 / 32);
        a.sizes = {128, 32};   // few rows: a thread a group
        {
            codegen::CudaDeviceCaps general = h100s;
            general.small_rows = false;
            CHECK(codegen::plan_cuda_launch(norm.kernel(), a, general).launches[0].aligned_param == 8);
        }
        // Up to kCudaSmallRowElements elements: the small entry alone, G up to a block (within a
        // warp while a lane walks at most kCudaSmallLaneElements), no cluster, no dynamic shared
        // memory.
        static_assert(codegen::kCudaSmallLaneElements == 4);
        for (auto [rows, cols, g] : {std::tuple{128, 32, 32}, {64, 64, 32}, {32, 128, 32}, {32, 129, 256},
                                     {64, 256, 256}, {1, 65536, 512}, {16, 4096, 512}, {65536, 1, 1},
                                     {256, 256, 256}}) {
            INFO(rows << "x" << cols);
            a.sizes = {rows, cols};
            a.strides = {cols, 1, cols, 1, 0, 1};
            const codegen::CudaLaunchPlan sp = codegen::plan_cuda_launch(norm.kernel(), a, h100s);
            REQUIRE(sp.launches.size() == 1);
            const codegen::CudaLaunch& l = sp.launches[0];
            CHECK(l.entry == "kiln_norm_s");
            CHECK(sp.offsets_32);
            CHECK(l.aligned_entry.empty());
            CHECK(l.param == g);
            CHECK(l.cluster == 1);
            CHECK(l.shared_bytes == 0);
            CHECK(l.block == (uint32_t)std::max(g, codegen::kCudaBlockSize));
            CHECK(l.reach == (g <= 32 ? codegen::CudaReach::Warp : codegen::CudaReach::Block));
            CHECK((int64_t)l.grid * (l.block / g) >= rows);
        }
        a.sizes = {257, 256};   // one row past: the general entries
        CHECK(codegen::plan_cuda_launch(norm.kernel(), a, h100s).launches[0].entry == "kiln_norm");
        // The small entry's offsets are 32-bit: a view whose last element lies 2^31 elements or
        // more past its first takes the general entries, and so does a launch without strides.
        a.sizes = {64, 64};
        a.strides = {(1LL << 31) / 63 + 1, 1, 64, 1, 0, 1};
        CHECK(codegen::plan_cuda_launch(norm.kernel(), a, h100s).launches[0].entry == "kiln_norm");
        a.strides = {(1LL << 31) / 63 - 2, 1, 64, 1, 0, 1};   // (63 x that + 63 < 2^31)
        CHECK(codegen::plan_cuda_launch(norm.kernel(), a, h100s).launches[0].entry == "kiln_norm_s");
        a.strides = {-((1LL << 31) / 63 + 1), 1, 64, 1, 0, 1};   // a reversed view as far
        CHECK(codegen::plan_cuda_launch(norm.kernel(), a, h100s).launches[0].entry == "kiln_norm");
        a.strides = {64, 1, 64, 1, 1LL << 40, 1};   // a broadcast dimension's stride is never used
        CHECK(codegen::plan_cuda_launch(norm.kernel(), a, h100s).launches[0].entry == "kiln_norm_s");
        a.strides.clear();
        CHECK(codegen::plan_cuda_launch(norm.kernel(), a, h100s).launches[0].entry == "kiln_norm");
        CHECK_FALSE(codegen::plan_cuda_launch(norm.kernel(), a, h100s).offsets_32);
        CHECK_FALSE(codegen::cuda_offsets_fit_32(norm.kernel(), a));
        // The backend plans again where a launch of the same sizes reaches further
        // (plan.offsets_32): the bound is the arguments', not the sizes'.
        a.strides = {64, 1, 64, 1, 0, 1};
        CHECK(codegen::cuda_offsets_fit_32(norm.kernel(), a));
        a.strides[0] = int64_t(1) << 30;
        CHECK_FALSE(codegen::cuda_offsets_fit_32(norm.kernel(), a));
        a.sizes = {1, 64};   // a dimension of one reaches nowhere, whatever its stride
        CHECK(codegen::cuda_offsets_fit_32(norm.kernel(), a));
        // Rows of no elements still store a result a row: 100000 of them are no small launch.
        a.sizes = {100000, 0};
        a.strides = {64, 1, 64, 1, 0, 1};
        CHECK(codegen::plan_cuda_launch(norm.kernel(), a, h100s).launches[0].entry == "kiln_norm");
        a.sizes = {1000, 0};
        CHECK(codegen::plan_cuda_launch(norm.kernel(), a, h100s).launches[0].entry == "kiln_norm_s");
        a.sizes = {4096, 16384};   // 1024 threads' worth: the shared-memory entry alone
        CHECK(codegen::plan_cuda_launch(norm.kernel(), a, h100s).launches[0].aligned_entry.empty());

        // One 16-byte group held and one pass streaming one more buffer: 3 blocks a multiprocessor
        // (40 registers) past a warp, so rows of up to 512 threads' groups, a block each.
        CHECK(codegen::detail::row_register_blocks(norm.kernel(), slots) == 3);
        a.sizes = {4096, 8192};   // 2048 groups: 512 threads
        p = codegen::plan_cuda_launch(norm.kernel(), a, h100s);
        CHECK(p.launches[0].aligned_entry == "kiln_norm_r");
        CHECK(p.launches[0].aligned_param == 512);
        CHECK(p.launches[0].aligned_block == 512);
        CHECK(p.launches[0].aligned_grid == 4096);
        CHECK(p.launches[0].aligned_reach == codegen::CudaReach::Block);
        auto bounds = [](const kir::Kernel& k, const std::string& entry, codegen::CudaReach r) {
            const std::string code = codegen::emit_cuda_module(k, {entry, r}).code;
            const size_t at = code.find("__launch_bounds__(");
            return code.substr(at, code.find(')', at) - at + 1);
        };
        CHECK(bounds(norm.kernel(), "kiln_norm_r", codegen::CudaReach::Block) == "__launch_bounds__(512, 3)");
        CHECK(bounds(norm.kernel(), "kiln_norm_r", codegen::CudaReach::Warp) == "__launch_bounds__(512, 2)");
        CHECK(bounds(norm.kernel(), "kiln_norm", codegen::CudaReach::Block) == "__launch_bounds__(512, 2)");
        {   // two weight rows in the last pass (a layer norm's scale and shift): 64 registers, rows
            // of up to 256 threads' groups
            test::KernelBuilder ln("kiln_ln", "PR");
            int lout = ln.output(DType::Float32, "x1"), lin = ln.input(DType::Float32, "x1"),
                lg = ln.input(DType::Float32, "01"), lb = ln.input(DType::Float32, "01");
            ln.loop();
            int lacc = ln.accum(kir::AccKind::Sum, ln.load(lin));
            ln.loop();
            int ls = ln.op(Op::Mul, CT::F32, ln.load(lin), ln.acc_result(lacc));
            ln.store(lout, ln.op(Op::Add, CT::F32, ln.op(Op::Mul, CT::F32, ls, ln.load(lg)), ln.load(lb)));
            CHECK(codegen::detail::row_register_blocks(ln.kernel(), codegen::detail::row_cache_slots(ln.kernel())) == 2);
            CHECK(bounds(ln.kernel(), "kiln_ln_r", codegen::CudaReach::Block) == "__launch_bounds__(512, 2)");
            CHECK(codegen::plan_cuda_launch(ln.kernel(), a, h100s).launches[0].aligned_entry.empty());
            a.sizes = {4096, 4096};   // 1024 groups: 256 threads
            p = codegen::plan_cuda_launch(ln.kernel(), a, h100s);
            CHECK(p.launches[0].aligned_entry == "kiln_ln_r");
            CHECK(p.launches[0].aligned_block == 256);
        }
    }
    a.sizes = {128, 32};   // few short rows: a warp per row rather than one thread
    p = codegen::plan_cuda_launch(row, a, h100);
    CHECK(p.threads_per_row == 32);
    a.sizes = {0, 32};
    CHECK(codegen::plan_cuda_launch(row, a, h100).launches[0].grid == 0);

    // Column: 128 bytes of the narrowest loaded dtype per block row (int8 here: 128 parallel
    // points, 2 slices); the reduced points split into chunks of at least kColumnMinChunk until
    // about kColumnTargetBlocks blocks run, whatever the device.
    kir::Kernel column = test::column_kernel();
    REQUIRE(codegen::detail::column_splittable(column));
    CHECK(codegen::detail::column_width(column) == 128);
    for (auto [dt, width] : {std::pair{DType::Float32, 32}, {DType::BFloat16, 64}}) {
        test::KernelBuilder cb("kiln_colw", "RP");
        int o = cb.output(DType::Float32, "01"), x = cb.input(dt, "x1");
        cb.loop();
        int acc = cb.accum(kir::AccKind::Sum, cb.load(x));
        cb.point();
        cb.store(o, cb.acc_result(acc));
        CHECK(codegen::detail::column_width(cb.kernel()) == width);
        const std::string code = codegen::emit_cuda(cb.kernel()).code;
        CHECK(code.find(fmt::format("const int column = (int)(threadIdx.x & {}), slice = (int)(threadIdx.x / {});", width - 1,
                                    width)) != std::string::npos);
        CHECK(code.find(fmt::format("kiln_column_reduce<kiln_sum_f, {}>", width)) != std::string::npos);
        // The vector entry: V = 16 bytes of x per thread, column_width / V threads across.
        const int v = 16 / (int)dtype_size(dt);
        CHECK(codegen::detail::column_vector_width(cb.kernel()) == v);
        CHECK(code.find(fmt::format("kiln_colw_v(const Args a")) != std::string::npos);
        CHECK(code.find(fmt::format("kiln_column_reduce_v<kiln_sum_f, {}, {}, false>(rv, rp", width / v, v)) !=
              std::string::npos);
    }
    {
        // No vector entry: a buffer strided along the parallel dim, or a coordinate read.
        test::KernelBuilder sb("kiln_cols", "RP");
        int o = sb.output(DType::Float32, "01"), x = sb.input(DType::Float32, "xx"), y = sb.input(DType::Float32, "x1");
        sb.loop();
        int acc = sb.accum(kir::AccKind::Sum, sb.op(kir::Op::Add, ComputeType::F32, sb.load(x), sb.load(y)));
        sb.point();
        sb.store(o, sb.acc_result(acc));
        CHECK(codegen::detail::column_vector_width(sb.kernel()) == 0);
        CHECK(codegen::emit_cuda(sb.kernel()).code.find("kiln_cols_v") == std::string::npos);
        test::KernelBuilder cb("kiln_colc", "RP");
        int o2 = cb.output(DType::Float32, "01"), x2 = cb.input(DType::Float32, "x1");
        cb.loop();
        int acc2 = cb.accum(kir::AccKind::Sum, cb.op(kir::Op::Add, ComputeType::F32, cb.load(x2),
                                                     cb.op(kir::Op::ToF32, ComputeType::F32, cb.coord(1))));
        cb.point();
        cb.store(o2, cb.acc_result(acc2));
        CHECK(codegen::detail::column_vector_width(cb.kernel()) == 0);
    }
    a.sizes = {4096, 100};
    p = codegen::plan_cuda_launch(column, a, h100);
    // The vector entry (V = 4: float32 x), taken when groups of 4 lie whole in the row and
    // every buffer contiguous along it is aligned for them.
    CHECK(p.launches[0].aligned_entry == "kiln_column_v");
    CHECK(p.launches[0].aligned_width == 4);
    {
        alignas(64) static float data[64];
        kir::LaunchArgs al = a;
        al.buffers.assign(column.buffers.size(), data);
        al.strides.assign(column.buffers.size() * 2, 0);
        for (size_t b = 0; b < column.buffers.size(); ++b) {
            al.strides[b * 2 + 1] = column.buffers[b].layout[1] == kir::StrideKind::One ? 1 : 0;
            al.strides[b * 2] = column.buffers[b].layout[0] == kir::StrideKind::Zero ? 0 : 100;
        }
        CHECK(codegen::cuda_launch_aligned(column, al, p.launches[0]));
        al.sizes = {4096, 102};   // the row ends inside a group
        CHECK_FALSE(codegen::cuda_launch_aligned(column, al, p.launches[0]));
        al.sizes = {4096, 100};
        al.strides[2 * 2] = 101;   // x's rows out of phase
        CHECK_FALSE(codegen::cuda_launch_aligned(column, al, p.launches[0]));
        al.strides[2 * 2] = 100;
        al.buffers[2] = data + 1;   // x not on a 16-byte boundary
        CHECK_FALSE(codegen::cuda_launch_aligned(column, al, p.launches[0]));
        al.buffers[2] = data + 4;
        al.buffers[3] = (char*)data + 2;   // int8: a 4-byte group needs 4-byte alignment
        CHECK_FALSE(codegen::cuda_launch_aligned(column, al, p.launches[0]));
        al.buffers[3] = (char*)data + 4;
        CHECK(codegen::cuda_launch_aligned(column, al, p.launches[0]));
        al.sizes = {1, 100};   // a reduced dim of one point: its stride does not matter
        al.strides[2 * 2] = 7;
        CHECK(codegen::cuda_launch_aligned(column, al, p.launches[0]));
    }
    // 16 chunks, more than kColumnCombineChunks: the final entry, a warp per column, combines them.
    REQUIRE(p.launches.size() == 2);
    CHECK(p.launches[0].entry == "kiln_column");
    CHECK(p.launches[0].param == 4096 / codegen::detail::kColumnMinChunk);
    CHECK(p.launches[0].param > codegen::detail::kColumnCombineChunks);
    CHECK(p.launches[0].grid == (100 / 128 + 1) * 16);
    CHECK(p.launches[0].block == 256);
    CHECK(p.launches[1].entry == "kiln_column_final");
    CHECK(p.launches[1].param == 16);
    CHECK(p.launches[1].grid == (100 + 7) / 8);   // a warp per column
    CHECK(p.launches[1].block == 256);
    CHECK(p.scratch_bytes == 100 * 16 * 8 * column.accums.size());
    CHECK(p.counters == 0);
    CHECK(codegen::plan_cuda_launch(column, a, a100).launches[0].param == 16);
    // 4 chunks (128 column blocks): the last block of a column block to finish combines them,
    // counted in a word per column block; one launch.
    a.sizes = {4096, 128 * 128};
    p = codegen::plan_cuda_launch(column, a, h100);
    REQUIRE(p.launches.size() == 1);
    CHECK(p.launches[0].param == 4);
    CHECK(p.launches[0].grid == 128 * 4);
    CHECK(p.scratch_bytes == (size_t)128 * 128 * 4 * 8 * column.accums.size());
    CHECK(p.counters == 128);
    CHECK(codegen::describe(p).find("128 counters") != std::string::npos);
    a.sizes = {1 << 20, 256 * 1024};   // enough column blocks already: not split
    p = codegen::plan_cuda_launch(column, a, h100);
    REQUIRE(p.launches.size() == 1);
    CHECK(p.launches[0].param == 1);
    CHECK(p.launches[0].grid == 2048);
    CHECK(p.scratch_bytes == 0);
    CHECK(p.counters == 0);
    a.sizes = {4096, 512 * 128};   // kColumnTargetBlocks column blocks: not split
    CHECK(codegen::plan_cuda_launch(column, a, h100).launches.size() == 1);
    a.sizes = {4096, 511 * 128};
    CHECK(codegen::plan_cuda_launch(column, a, h100).launches[0].param == (512 + 510) / 511);
    a.sizes = {1 << 20, 128};   // one column block: at most kColumnTargetBlocks chunks
    CHECK(codegen::plan_cuda_launch(column, a, h100).launches[0].param == 512);
    a.sizes = {100, 100};   // too few reduced points to split
    CHECK(codegen::plan_cuda_launch(column, a, h100).launches.size() == 1);

    kir::Kernel full = test::full_reduce_kernel();
    a.sizes = {100, 1000};
    p = codegen::plan_cuda_launch(full, a, h100);
    REQUIRE(p.launches.size() == 1);   // the last block to finish combines the partials
    CHECK(p.launches[0].entry == "kiln_full");
    CHECK(p.num_partials == (100000 + codegen::kCudaPointsPerPartial - 1) / codegen::kCudaPointsPerPartial);
    CHECK(p.launches[0].grid == (uint32_t)p.num_partials);
    CHECK(p.counters == 1);
    CHECK(codegen::describe(p).find("1 counters") != std::string::npos);
    CHECK(p.scratch_bytes == (size_t)p.num_partials * 8 * full.accums.size());
    a.sizes = {0, 5};   // an empty full reduction still runs, to store the identity
    CHECK(codegen::plan_cuda_launch(full, a, h100).num_partials == 1);
    a.sizes = {1LL << 20, 1LL << 20};
    CHECK(codegen::plan_cuda_launch(full, a, h100).num_partials == codegen::kCudaMaxPartials);
}

TEST_CASE("NVRTC reports a broken source with a log") {
    cuda::NvrtcResult r = cuda::nvrtc_compile("extern \"C\" __global__ void k() { undeclared_thing(); }", "broken.cu", 80);
    CHECK_FALSE(r.ok);
    CHECK_FALSE(r.log.empty());
    CHECK(r.binary.empty());
    if (kHaveNvrtc) CHECK(r.log.find("undeclared_thing") != std::string::npos);
}

TEST_CASE("NVRTC version and PTX output") {
    std::string v = cuda::nvrtc_version();
    CHECK_FALSE(v.empty());
    if (!kHaveNvrtc) {
        CHECK(v == "none");
        return;
    }
    CHECK(v != "none");
    CudaSource src = codegen::emit_cuda(test::mean_kernel());
    cuda::NvrtcResult r = cuda::nvrtc_compile(src.code, "mean.cu", 90, /*want_cubin=*/false);
    REQUIRE(r.ok);
    std::string ptx(r.binary.begin(), r.binary.end());
    CHECK(ptx.find(".entry kiln_mean(") != std::string::npos);
    CHECK(r.milliseconds > 0);
    // The disk cache's toolchain names the version and every option but the architecture.
    const std::string tc = cuda::nvrtc_toolchain();
    CHECK(tc.rfind("nvrtc " + v + " ", 0) == 0);
    CHECK(r.options == "--gpu-architecture=compute_90 " + tc.substr(("nvrtc " + v + " ").size()));
    const int major = std::stoi(v.substr(0, v.find('.'))), minor = std::stoi(v.substr(v.find('.') + 1));
    CHECK((tc.find("-minimal") != std::string::npos) == (major > 12 || (major == 12 && minor >= 4)));
    // Compiled for compile time: -Ofc=mid where NVRTC has it, in the options and the toolchain.
    const std::string fast = cuda::nvrtc_toolchain(true);
    const bool has_ofc = major > 12 || (major == 12 && minor >= 8);
    CHECK(fast == tc + (has_ofc ? " -Ofc=mid" : ""));
    cuda::NvrtcResult rf = cuda::nvrtc_compile(src.code, "mean.cu", 90, true, true);
    REQUIRE(rf.ok);
    CHECK(rf.options == "--gpu-architecture=sm_90 " + fast.substr(("nvrtc " + v + " ").size()));
}

TEST_CASE("kernel IR listing names ops, buffers, accumulators and stores") {
    std::string s = kir::to_string(test::row_softmax_kernel());
    CHECK(s.find("kernel kiln_row_softmax: rank 2, dims [PR]") != std::string::npos);
    CHECK(s.find("buf3: in  float16 strides [x1]") != std::string::npos);
    CHECK(s.find("acc1: argmax f32 of %0") != std::string::npos);
    CHECK(s.find("%4 = exp f32 %3") != std::string::npos);
    CHECK(s.find("store buf0 <- %") != std::string::npos);
    CHECK(s.find("block 2 (point)") != std::string::npos);
    for (int op = 0; op <= (int)kir::kLastOp; ++op) CHECK(std::string(kir::op_name((kir::Op)op)) != "?");
}

TEST_CASE("64-bit and 16-bit integer expressions, lowered as the runtime lowers them, compile for sm_80 and "
          "sm_90: elementwise, and reduced along rows, columns and whole, every accumulator kind") {
    using test::host_view;
    const Expr d = leaf(host_view({64, 33}, DType::Float64)), e = leaf(host_view({64, 33}, DType::Float64));
    const Expr l = leaf(host_view({64, 33}, DType::Int64)), u = leaf(host_view({64, 33}, DType::UInt32));
    const Expr s = leaf(host_view({64, 33}, DType::Int16)), h = leaf(host_view({64, 33}, DType::Float16));
    const Expr w = leaf(host_view({64, 33}, DType::UInt64));
    const std::vector<std::pair<Expr, DType>> work = {
        {d * 0.1 + floor_divide(d, e) + remainder(d, e) + power(d, 2.5) + nextafter(d, e), DType::Float64},
        {where(d > e, exp(d), tanh(e)) + cast(l, DType::Float64), DType::Float64},
        {power(l, cast(s, DType::Int64)) + floor_divide(l, cast(u, DType::Int64)) + bitwise_right_shift(l, Expr(3)),
         DType::Int64},
        {u * u + cast(s, DType::UInt32), DType::UInt32},
        {floor_divide(w, cast(u, DType::UInt64)) + remainder(w, w) + bitwise_right_shift(w, Expr(3)) +
             maximum(w, cast(l, DType::UInt64)) + cast(d, DType::UInt64) + cast(w > w * 3, DType::UInt64),
         DType::UInt64},
        {cast(w, DType::Float64) + cast(w, DType::Float32), DType::Float64},
        {s * s - cast(h, DType::Int16), DType::Int16},
        {cast(d, DType::Float16) + h, DType::Float16},   // float64 stored to float16
        {cast(l, DType::Float32) * 0.5, DType::Float32},
        {take(d, leaf(host_view({5}, DType::Int64)), 0), DType::Float64},
    };
    int n = 0;
    for (const auto& [x, dtype] : work) {
        const std::string name = fmt::format("wide_expr_{}", n++);
        INFO(name);
        for (auto& stage : compile_assignment(x.node(), host_view(x.shape(), dtype), "sm_90").stages) {
            CHECK(codegen::cuda_shape(stage.kernel) == codegen::CudaShape::Elementwise);
            CudaSource src = codegen::emit_cuda(stage.kernel);
            CHECK(codegen::detail::elementwise_vector_width(stage.kernel) == 1);   // the scalar path
            require_compiles(name, src);
        }
    }
    // Rows (axis 1), columns (axis 0) and full reductions, every kind, every 64-bit state type and
    // the narrow integers whose loads are wide-path (16-bit, uint32).
    const Expr z = leaf(host_view({64, 33}, DType::UInt16));
    const std::vector<std::pair<std::string, Expr>> reductions = {
        {"sum_f64", sum(d, 1) + sum(d)},
        {"var_f64", var(d, 1)},   // mean and a second pass (no float32 fold)
        {"softmax_f64", exp(d - max(d, 1)) / sum(exp(d - max(d, 1)), 1)},
        {"prod_f64", prod(d, 0)},
        {"minmax_f64", max(d, 0) - min(e)},
        {"arg_f64", cast(argmax(d, 1), DType::Float64) + cast(argmin(e, 0), DType::Float64)},
        {"sum_i64", sum(l, 0) + sum(l)},
        {"prod_i64", prod(l, 1)},
        {"minmax_i64", max(l, 1) - min(l, 1)},
        {"arg_i64", cast(argmax(l), DType::Int64) + cast(argmin(l, 1), DType::Int64)},
        {"uint32", sum(u, 1) + cast(max(u, 1), DType::Int64)},
        {"int16", sum(s, 0) + cast(min(s, 0), DType::Int64) + cast(argmax(s, 0), DType::Int64)},
        {"uint16", sum(z) + cast(max(z), DType::Int64)},
        {"uint64", sum(w, 1) + max(w, 1) + min(w) + cast(argmax(w, 0), DType::UInt64)},
        {"matmul_f64", sum(expand_dims(d, -1) * expand_dims(reshape(e, {33, 64}), 0), 1)},
    };
    for (const auto& [name, r] : reductions) {
        INFO(name);
        for (auto& stage : compile_assignment(r.node(), host_view(r.shape(), r.dtype()), "sm_90").stages) {
            CudaSource src = codegen::emit_cuda(stage.kernel);
            CHECK(codegen::detail::row_vector_width(stage.kernel) == 1);
            CHECK(codegen::detail::column_vector_width(stage.kernel) == 0);
            CHECK(!codegen::detail::row_register_entry(stage.kernel));
            require_compiles("wide_" + name + "_" + stage.kernel.name, src);
        }
    }
}
