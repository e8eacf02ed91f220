// The kernel-text reader (compiler/kernel_text.hpp) on text from outside: real kernels come back
// whole; counts beyond the reader's limits, indices that name nothing and kernels that break a
// rule of the kernel IR are kiln::Errors naming what is wrong, found before anything is
// allocated for them.
#include "tests/support/catch.hpp"
#include "tests/support/kernel_builder.hpp"
#include "tests/support/sample_kernels.hpp"

#include "compiler/kernel_check.hpp"
#include "compiler/kernel_text.hpp"
#include "compiler/key.hpp"
#include "ir/error.hpp"

#include <chrono>
#include <string>

using namespace kiln;

namespace {

// The message of the kiln::Error that parsing `text` throws ("" when it parses).
std::string parse_error(const std::string& text) {
    try {
        parse_kernel_text(text);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

// The variance kernel's text with `from` replaced by `to` (once).
std::string variance_with(const std::string& from, const std::string& to) {
    std::string t = kernel_text(test::sample_kernels()[0]);
    const size_t at = t.find(from);
    REQUIRE(at != std::string::npos);
    return t.replace(at, from.size(), to);
}

// Checks that `message` contains `part`, showing both when it does not.
#define CHECK_CONTAINS(message, part)                                                                                  \
    do {                                                                                                               \
        const std::string m_ = (message);                                                                              \
        INFO("message: " << m_);                                                                                       \
        CHECK(m_.find(part) != std::string::npos);                                                                     \
    } while (0)

} // namespace

TEST_CASE("kernel text: every sample kernel comes back whole, keeping every rule") {
    const std::vector<kir::Kernel> kernels = test::sample_kernels();
    REQUIRE(kernels.size() >= 12);
    for (const kir::Kernel& k : kernels) {
        INFO(kir::to_string(k));
        CHECK(kir::kernel_problem(k).empty());
        const std::string text = kernel_text(k);
        const kir::Kernel back = parse_kernel_text(text);
        CHECK(kernel_text(back) == text);
        CHECK(key_material(back, "sm_90") == key_material(k, "sm_90"));
    }
}

TEST_CASE("kernel text: counts beyond the reader's limits are refused at once, naming the count and the limit") {
    const auto t0 = std::chrono::steady_clock::now();
    std::string m = parse_error(variance_with("|fp 1|", "|fp 2147483647|"));
    CHECK_CONTAINS(m, "kernel text: 2147483647 float parameters at offset");
    CHECK_CONTAINS(m, fmt::format("a kernel has 0 to {}", kMaxKernelParams));
    m = parse_error(variance_with("|ip ", "|ip 99999999999"));
    CHECK_CONTAINS(m, "integer parameters");
    m = parse_error(variance_with("rank 2|red01", "rank 65|red01"));
    CHECK_CONTAINS(m, "kernel text: 65 dimensions at offset 5 (\"65|red01|part|buf 0o:10|\"); a kernel has 0 to 64");
    m = parse_error("rank 1|red0|part" + std::string("|buf 0o:1") + "|fp -1|ip 0");
    CHECK_CONTAINS(m, "-1 float parameters");
    // The reader stops counting at the limit: no more buffers, instructions, blocks than that.
    std::string many = "rank 0|red|part";
    for (int i = 0; i <= kMaxKernelBuffers; ++i) many += "|buf 0o:";
    CHECK_CONTAINS(parse_error(many), fmt::format("more than {} buffers", kMaxKernelBuffers));
    many = "rank 0|red|part|buf 0o:|fp 0|ip 0";
    for (int i = 0; i <= kMaxKernelInstrs; ++i) many += "|0,0,-1,-1,-1,0,0,0,0";
    CHECK_CONTAINS(parse_error(many), fmt::format("more than {} instructions", kMaxKernelInstrs));
    CHECK_CONTAINS(parse_error(std::string(kMaxKernelTextLength + 1, 'x')), "a kernel's text has at most");
    // None of it took long (the fp count above once meant minutes and gigabytes downstream).
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));
}

TEST_CASE("kernel text: indices that name nothing are refused, naming the instruction and what exists") {
    // The variance kernel: buf0 output, buf1 input, one float parameter; %0 loads buf1.
    const kir::Kernel v = test::sample_kernels()[0];
    REQUIRE(v.buffers.size() == 2);
    REQUIRE(v.instrs[0].op == kir::Op::Load);
    const std::string text = kernel_text(v);
    auto with_instr0 = [&](const std::string& fields) {
        std::string t = text;
        const size_t at = t.find("|", t.find("|ip ") + 1);
        const size_t end = t.find("|", at + 1);
        return t.replace(at + 1, end - at - 1, fields);
    };
    std::string m = parse_error(with_instr0("4,0,-1,-1,-1,7,0,0,0"));   // load buf7
    CHECK_CONTAINS(m, "kernel text: instruction %0 (load) reads buf7; the kernel has 2 buffers");
    m = parse_error(with_instr0("4,0,-1,-1,-1,0,0,0,0"));   // load the output
    CHECK_CONTAINS(m, "reads buf0, an output");
    m = parse_error(with_instr0("2,0,-1,-1,-1,3,0,0,0"));   // paramf fp[3]
    CHECK_CONTAINS(m, "instruction %0 (paramf) reads fp[3]; the kernel has 1 float parameters");
    m = parse_error(with_instr0("6,1,-1,-1,-1,9,0,0,0"));   // coord dim 9
    CHECK_CONTAINS(m, "(coord) reads dim 9; the kernel has rank 2");
    m = parse_error(with_instr0("8,0,-1,-1,-1,5,0,0,0"));   // acc_result acc5
    CHECK_CONTAINS(m, "(acc_result) reads acc5");
    m = parse_error(with_instr0("9,0,3,-1,-1,0,0,0,0"));    // neg of a later instruction
    CHECK_CONTAINS(m, "instruction %0 (neg): operand 0 is %3, not an earlier instruction (there is none)");
    const int last = (int)kir::kLastOp;
    m = parse_error(with_instr0(fmt::format("{},0,-1,-1,-1,0,0,0,0", last + 1)));  // an op past the last
    CHECK_CONTAINS(m, fmt::format("expected an instruction op (0..{})", last));
    m = parse_error(with_instr0("4,1,-1,-1,-1,1,0,0,0"));   // float32 loaded as i32
    CHECK_CONTAINS(m, "has type i32, but buf1 (float32) loads as f32");
    // Blocks, accumulators, stores.
    m = parse_error(variance_with("|blk L:0,", "|blk L:999,"));
    CHECK_CONTAINS(m, "block 0 lists %999");
    m = parse_error(text + "|blk P:;;1=0,");
    CHECK_CONTAINS(m, "stores to buf1, an input");
    m = parse_error(text + "|blk P:;;0=999,");
    CHECK_CONTAINS(m, "stores %999");
    m = parse_error(text + "|blk P:;;7=0,");
    CHECK_CONTAINS(m, "stores to buf7; the kernel has 2 buffers");
    m = parse_error(text + "|blk P:;5,;");
    CHECK_CONTAINS(m, "lists acc5");
}

TEST_CASE("kernel text: kernels that break a rule of the IR are refused, naming the rule") {
    const kir::Kernel v = test::sample_kernels()[0];
    const std::string text = kernel_text(v);
    // An instruction in two blocks.
    std::string m = parse_error(text + "|blk L:0,;;");
    CHECK_CONTAINS(m, "%0 is listed by block 0 and block");
    // A block that stores a Loop value of an earlier block.
    const int loop_value = v.blocks[0].instrs.back();
    m = parse_error(text + fmt::format("|blk P:;;0={},", loop_value));
    CHECK_CONTAINS(m, "which is not visible there");
    // sqrt of an integer: the backends have no such instruction.
    kir::Kernel k = v;
    k.instrs[1] = kir::Instr{kir::Op::ConstI, ComputeType::I32};
    kir::Instr sq{kir::Op::Sqrt, ComputeType::F32};
    sq.a[0] = 1;
    k.instrs[2] = sq;
    m = parse_error(kernel_text(k));
    CHECK_CONTAINS(m, "(sqrt f32): operand 0 (%1) is i32, which sqrt does not take there");
    // No blocks; a full reduction with a parallel dim.
    CHECK_CONTAINS(parse_error("rank 1|red0|part|buf 0o:1|fp 0|ip 0"), "expected at least one block");
    k = v;
    k.full_reduce = true;
    CHECK_CONTAINS(parse_error(kernel_text(k)), "a full reduction with parallel dim 0");
    // Garbage is named with its offset, control bytes escaped.
    m = parse_error("rank 2|red0\x01");
    CHECK_CONTAINS(m, "expected 2 reduced flags (0 or 1), one per dimension at offset 11 (\"\\x01\")");
}

TEST_CASE("kernel text: float immediates keep their bits, signalling NaNs and f64 constants included") {
    test::KernelBuilder b("kiln_bits", "P");
    const int out = b.output(DType::Float32, "1");
    const int out64 = b.output(DType::Float64, "1");
    b.loop();
    const int snan = b.constf(0.0f);
    const int c64 = b.constd(0.1);
    kir::Kernel k = b.kernel();
    k.instrs[snan].fimm = kir::from_f32_bits(0x7f800001u);   // a signalling NaN with payload 1
    k.blocks[0].stores = {{out, snan}, {out64, c64}};
    const std::string text = kernel_text(k);
    const kir::Kernel back = parse_kernel_text(text);
    CHECK(kir::f32_bits(back.instrs[snan].fimm) == 0x7f800001u);
    CHECK(back.instrs[c64].fimm == 0.1);
    CHECK(kernel_text(back) == text);
    CHECK(kir::f32_bits(kir::from_f32_bits(0xffc12345u)) == 0xffc12345u);   // quiet, negative, with payload
    CHECK(kir::f32_bits(1.5) == 0x3fc00000u);
}
