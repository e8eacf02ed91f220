// Hand-built kernels covering every Op, every AccKind, every storage dtype and every kernel
// shape the CUDA renderer knows (elementwise, reduction with P dims, full reduction).
#pragma once
#include "tests/support/kernel_builder.hpp"

#include <utility>
#include <vector>

namespace kiln::test {

using kir::AccKind;
using Op = kir::Op;
using CT = ComputeType;

// Sums values of one compute type into a single value, so that every result reaches a store.
inline int sum_all(KernelBuilder& b, const std::vector<int>& vals) {
    int s = vals.at(0);
    for (size_t i = 1; i < vals.size(); ++i) s = b.op(Op::Add, b.type(s), s, vals[i]);
    return s;
}

// Elementwise rank 2: every Op, float and int flavours where both exist, plus accumulators over
// an empty set of reduced dims (one point) and a Point block.
inline kir::Kernel all_ops_kernel() {
    KernelBuilder b("kiln_all_ops", "PP");
    int outf = b.output(DType::Float32, "x1");
    int outi = b.output(DType::Int32, "x1");
    int inx = b.input(DType::Float32, "x1");
    int inn = b.input(DType::Int32, "01");
    int table = b.input(DType::Float32, "0x");
    int fp0 = b.fparam();
    int ip_stride = b.iparam(), ip1 = b.iparam();

    b.loop();
    int x = b.load(inx), y = b.paramf(fp0);
    int n = b.load(inn), m = b.parami(ip1);
    int ax = b.op(Op::Abs, CT::F32, x);
    std::vector<int> f = {
        b.op(Op::Neg, CT::F32, x), ax, b.op(Op::Sqrt, CT::F32, ax), b.op(Op::Exp, CT::F32, x),
        b.op(Op::Exp2, CT::F32, x), b.op(Op::Log, CT::F32, ax), b.op(Op::Log2, CT::F32, ax),
        b.op(Op::Tanh, CT::F32, x), b.op(Op::Rint, CT::F32, x), b.op(Op::Sgn, CT::F32, x),
        b.op(Op::ToF32, CT::F32, n), b.op(Op::Add, CT::F32, x, y), b.op(Op::Sub, CT::F32, x, y),
        b.op(Op::Mul, CT::F32, x, y), b.op(Op::Div, CT::F32, x, y), b.op(Op::Pow, CT::F32, ax, y),
        b.op(Op::Maximum, CT::F32, x, y), b.op(Op::Minimum, CT::F32, x, y), b.constf(1.5f), b.constf(-0.1f), b.constf(0.25f),
        b.constf(1e-45f), b.constf(2.0f), b.op(Op::Floor, CT::F32, x), b.op(Op::Fmod, CT::F32, x, y),
        b.op(Op::NextAfter, CT::F32, x, y),
    };
#define KILN_MATH(K, name, c_function, host) f.push_back(b.op(Op::K, CT::F32, ax));
#define KILN_MATH2(K, name, c_function, host) f.push_back(b.op(Op::K, CT::F32, x, y));
#include <kiln/math_functions.def>
#undef KILN_MATH2
#undef KILN_MATH
    int lt = b.op(Op::Lt, CT::I32, x, y);
    f.push_back(b.op(Op::Select, CT::F32, lt, x, y));
    f.push_back(b.op(Op::AsF32, CT::F32, b.op(Op::And, CT::I32, n, b.consti(0x3fffffff))));
    int idx = b.op(Op::And, CT::I32, n, b.consti(3));
    f.push_back(b.gather(table, idx, ip_stride));
    int fsum = sum_all(b, f);

    std::vector<int> i = {
        b.op(Op::Neg, CT::I32, n), b.op(Op::Abs, CT::I32, n), b.op(Op::Sgn, CT::I32, n),
        b.op(Op::Finite, CT::I32, x), b.op(Op::ToI32, CT::I32, x), b.op(Op::WrapI8, CT::I32, n),
        b.op(Op::WrapU8, CT::I32, n), b.op(Op::ToBool, CT::I32, x), b.op(Op::ToBool, CT::I32, n),
        b.op(Op::Add, CT::I32, n, m), b.op(Op::Sub, CT::I32, n, m), b.op(Op::Mul, CT::I32, n, m),
        b.op(Op::Maximum, CT::I32, n, m), b.op(Op::Minimum, CT::I32, n, m), lt,
        b.op(Op::Eq, CT::I32, x, y), b.op(Op::Ne, CT::I32, x, y), b.op(Op::Le, CT::I32, x, y),
        b.op(Op::Gt, CT::I32, x, y), b.op(Op::Ge, CT::I32, x, y), b.op(Op::Eq, CT::I32, n, m),
        b.op(Op::Ne, CT::I32, n, m), b.op(Op::Lt, CT::I32, n, m), b.op(Op::Le, CT::I32, n, m),
        b.op(Op::Gt, CT::I32, n, m), b.op(Op::Ge, CT::I32, n, m), b.op(Op::And, CT::I32, n, m),
        b.op(Op::Or, CT::I32, n, m), b.op(Op::Xor, CT::I32, n, m), b.op(Op::Shl, CT::I32, n, idx),
        b.op(Op::Shr, CT::I32, n, idx), b.op(Op::MulHi, CT::I32, n, m), b.op(Op::Select, CT::I32, lt, n, m),
        b.op(Op::AsI32, CT::I32, x),
        b.coord(0), b.coord(1), b.linear_id(), b.consti(INT32_MIN), b.consti(-7),
    };
    // IDiv/IRem are defined for divisors other than 0 and -1 only: the lowering's guard.
    int safe = b.op(Op::Select, CT::I32, b.op(Op::Lt, CT::I32, m, b.consti(1)), b.consti(3), m);
    i.push_back(b.op(Op::IDiv, CT::I32, n, safe));
    i.push_back(b.op(Op::IRem, CT::I32, n, safe));
    int isum = sum_all(b, i);
    int a_sum = b.accum(AccKind::Sum, fsum);
    int a_max = b.accum(AccKind::Max, isum);
    int a_min = b.accum(AccKind::Min, x);
    int a_argmax = b.accum(AccKind::ArgMax, x);
    int a_argmin = b.accum(AccKind::ArgMin, n);
    int a_prod = b.accum(AccKind::Prod, x);
    int a_iprod = b.accum(AccKind::Prod, n);
    b.store(outf, fsum);

    b.point();
    int r = sum_all(b, {b.acc_result(a_sum), b.acc_result(a_min), b.acc_result(a_prod)});
    int ri = sum_all(b, {b.acc_result(a_max), b.acc_result(a_argmax), b.acc_result(a_argmin), b.acc_result(a_iprod),
                         b.op(Op::ToI32, CT::I32, r)});
    b.store(outi, ri);
    return b.kernel();
}

// Elementwise rank 1: a load and a store of every storage dtype, plus conversions between them.
inline kir::Kernel dtypes_kernel() {
    KernelBuilder b("kiln_dtypes", "P");
    const DType all[] = {DType::Float32, DType::Float16, DType::BFloat16, DType::Int32,
                         DType::Int8,    DType::UInt8,   DType::Bool};
    std::vector<int> outs, ins;
    for (DType t : all) outs.push_back(b.output(t, "1"));
    for (DType t : all) ins.push_back(b.input(t, "x"));
    b.loop();
    std::vector<int> vals;
    for (int in : ins) vals.push_back(b.load(in));
    int fsum = sum_all(b, {vals[0], vals[1], vals[2]});
    int isum = sum_all(b, {vals[3], vals[4], vals[5], vals[6]});
    b.store(outs[0], b.op(Op::Add, CT::F32, fsum, b.op(Op::ToF32, CT::F32, isum)));
    b.store(outs[1], vals[2]);   // bfloat16 -> float16
    b.store(outs[2], vals[1]);   // float16 -> bfloat16
    b.store(outs[3], b.op(Op::Add, CT::I32, isum, b.op(Op::ToI32, CT::I32, fsum)));
    b.store(outs[4], b.op(Op::WrapI8, CT::I32, isum));
    b.store(outs[5], b.op(Op::WrapU8, CT::I32, isum));
    b.store(outs[6], b.op(Op::ToBool, CT::I32, fsum));
    return b.kernel();
}

// Elementwise: the dtypes with 64-bit values (float64, int64, uint32, uint64) and the 16-bit integers,
// every op in its 64-bit form, the 64-bit parameters and constants, and the conversions between
// 32-bit and 64-bit values.
inline kir::Kernel wide_kernel() {
    KernelBuilder b("kiln_wide", "P");
    const DType all[] = {DType::Float64, DType::Int64, DType::Int16, DType::UInt16, DType::UInt32, DType::UInt64};
    std::vector<int> outs, ins;
    for (DType t : all) outs.push_back(b.output(t, "1"));
    for (DType t : all) ins.push_back(b.input(t, "x"));
    int table = b.input(DType::Float64, "0");
    const int ip_stride = b.iparam();
    b.loop();
    const int x = b.load(ins[0]), n = b.load(ins[1]), s16 = b.load(ins[2]), u16 = b.load(ins[3]), u32 = b.load(ins[4]);
    const int u64 = b.load(ins[5]);
    const int y = b.paramd(0), m = b.paraml(1);
    const int ax = b.op(Op::Abs, CT::F64, x);
    std::vector<int> f = {
        b.op(Op::Neg, CT::F64, x), ax, b.op(Op::Sqrt, CT::F64, ax), b.op(Op::Exp, CT::F64, x),
        b.op(Op::Exp2, CT::F64, x), b.op(Op::Log, CT::F64, ax), b.op(Op::Log2, CT::F64, ax),
        b.op(Op::Tanh, CT::F64, x), b.op(Op::Rint, CT::F64, x), b.op(Op::Sgn, CT::F64, x),
        b.op(Op::Add, CT::F64, x, y), b.op(Op::Sub, CT::F64, x, y), b.op(Op::Mul, CT::F64, x, y),
        b.op(Op::Div, CT::F64, x, y), b.op(Op::Pow, CT::F64, ax, y), b.op(Op::Maximum, CT::F64, x, y),
        b.op(Op::Minimum, CT::F64, x, y), b.op(Op::Floor, CT::F64, x), b.op(Op::Fmod, CT::F64, x, y),
        b.op(Op::NextAfter, CT::F64, x, y),
        b.constd(0.1), b.constd(-1e300), b.constd(5e-324), b.op(Op::Convert, CT::F64, n),
        b.op(Op::Convert, CT::F64, b.op(Op::Convert, CT::F32, x)), b.op(Op::AsF64, CT::F64, b.op(Op::And, CT::I64, n, b.constl(0x3fffffffffffffffLL))),
        b.op(Op::Select, CT::F64, b.op(Op::Lt, CT::I32, x, y), x, y),
        b.gather(table, b.op(Op::Convert, CT::I32, b.op(Op::And, CT::I64, n, b.constl(3))), ip_stride),
    };
#define KILN_MATH(K, name, c_function, host) f.push_back(b.op(Op::K, CT::F64, ax));
#define KILN_MATH2(K, name, c_function, host) f.push_back(b.op(Op::K, CT::F64, x, y));
#include <kiln/math_functions.def>
#undef KILN_MATH2
#undef KILN_MATH
    const int fsum = sum_all(b, f);
    const int safe = b.op(Op::Select, CT::I64, b.op(Op::Lt, CT::I32, m, b.constl(1)), b.constl(3), m);
    const int sh = b.op(Op::And, CT::I64, n, b.constl(63));
    std::vector<int> i = {
        b.op(Op::Neg, CT::I64, n), b.op(Op::Abs, CT::I64, n), b.op(Op::Sgn, CT::I64, n),
        b.op(Op::Add, CT::I64, n, m), b.op(Op::Sub, CT::I64, n, m), b.op(Op::Mul, CT::I64, n, m),
        b.op(Op::Maximum, CT::I64, n, m), b.op(Op::Minimum, CT::I64, n, m), b.op(Op::And, CT::I64, n, m),
        b.op(Op::Or, CT::I64, n, m), b.op(Op::Xor, CT::I64, n, m), b.op(Op::Shl, CT::I64, n, sh),
        b.op(Op::Shr, CT::I64, n, sh), b.op(Op::IDiv, CT::I64, n, safe), b.op(Op::IRem, CT::I64, n, safe),
        b.op(Op::Convert, CT::I64, x), b.op(Op::Convert, CT::I64, s16), b.op(Op::Convert, CT::I64, b.op(Op::Convert, CT::F32, x)),
        b.op(Op::WrapU32, CT::I64, n), b.op(Op::AsI64, CT::I64, x), u32, u64,
        b.op(Op::Convert, CT::I64, b.op(Op::Eq, CT::I32, n, m)), b.op(Op::Convert, CT::I64, b.op(Op::Ge, CT::I32, x, y)),
        b.op(Op::Convert, CT::I64, b.op(Op::Finite, CT::I32, x)), b.op(Op::Convert, CT::I64, b.op(Op::ToBool, CT::I32, x)),
        b.op(Op::Convert, CT::I64, b.op(Op::ToBool, CT::I32, n)), b.constl(INT64_MIN), b.constl(-7),
    };
    const int isum = sum_all(b, i);
    b.store(outs[0], fsum);
    b.store(outs[1], isum);
    const int narrow = b.op(Op::Convert, CT::I32, isum);
    b.store(outs[2], b.op(Op::WrapI16, CT::I32, b.op(Op::Add, CT::I32, narrow, s16)));
    b.store(outs[3], b.op(Op::WrapU16, CT::I32, b.op(Op::Add, CT::I32, narrow, u16)));
    b.store(outs[4], b.op(Op::WrapU32, CT::I64, b.op(Op::Add, CT::I64, isum, u32)));
    b.store(outs[5], b.op(Op::Xor, CT::I64, isum, u64));
    return b.kernel();
}

// A 16-bit norm: the row read by three passes (the variance's folded into the first, but not in
// the entry that holds the row in registers), scaled by a bfloat16 weight row in the last.
inline kir::Kernel row_norm_kernel() {
    KernelBuilder b("kiln_row_norm", "PR");
    int out = b.output(DType::Float16, "x1");
    int in = b.input(DType::Float16, "x1");
    int w = b.input(DType::BFloat16, "01");

    b.loop();
    int s = b.accum(AccKind::Sum, b.load(in));

    b.loop();
    int d = b.op(Op::Sub, CT::F32, b.load(in), b.acc_result(s));
    int q = b.accum(AccKind::Sum, b.op(Op::Mul, CT::F32, d, d));

    b.loop();
    int y = b.op(Op::Mul, CT::F32, b.op(Op::Sub, CT::F32, b.load(in), b.acc_result(s)), b.acc_result(q));
    b.store(out, b.op(Op::Mul, CT::F32, y, b.load(w)));
    return b.kernel();
}

// Row reduction (softmax over the last dim): two Loop blocks of accumulators, a Point block that
// stores per-row results and computes a value for the last Loop block, which stores back at
// every point (the broadcast-back store).
inline kir::Kernel row_softmax_kernel() {
    KernelBuilder b("kiln_row_softmax", "PR");
    int out = b.output(DType::Float32, "x1");
    int out_arg = b.output(DType::Int32, "x0");
    int out_max = b.output(DType::Float16, "x0");
    int in = b.input(DType::Float16, "x1");
    int scale = b.input(DType::BFloat16, "x0");

    b.loop();
    int x = b.load(in);
    int a_max = b.accum(AccKind::Max, x);
    int a_arg = b.accum(AccKind::ArgMax, x);

    b.loop();
    int e = b.op(Op::Exp, CT::F32, b.op(Op::Sub, CT::F32, b.load(in), b.acc_result(a_max)));
    int a_sum = b.accum(AccKind::Sum, e);

    b.point();
    int rcp = b.op(Op::Div, CT::F32, b.load(scale), b.acc_result(a_sum));
    b.store(out_max, b.acc_result(a_max));
    b.store(out_arg, b.acc_result(a_arg));

    b.loop();
    int e2 = b.op(Op::Exp, CT::F32, b.op(Op::Sub, CT::F32, b.load(in), b.acc_result(a_max)));
    b.store(out, b.op(Op::Mul, CT::F32, e2, rcp));
    return b.kernel();
}

// Column reduction: reduce the outer dim, keep the inner one; every AccKind on f32 and i32.
inline kir::Kernel column_kernel() {
    KernelBuilder b("kiln_column", "RP");
    int outf = b.output(DType::Float32, "01");
    int outi = b.output(DType::Int32, "01");
    int inx = b.input(DType::Float32, "x1");
    int inn = b.input(DType::Int8, "x1");
    b.loop();
    int x = b.load(inx), n = b.load(inn);
    int fa[] = {b.accum(AccKind::Sum, x), b.accum(AccKind::Max, x), b.accum(AccKind::Min, x),
                b.accum(AccKind::ArgMax, x), b.accum(AccKind::ArgMin, x), b.accum(AccKind::Prod, x)};
    int ia[] = {b.accum(AccKind::Sum, n), b.accum(AccKind::Max, n), b.accum(AccKind::Min, n),
                b.accum(AccKind::ArgMax, n), b.accum(AccKind::ArgMin, n), b.accum(AccKind::Prod, n)};
    b.point();
    std::vector<int> f, i;
    for (int a : fa) f.push_back(b.acc_result(a));
    for (int a : ia) i.push_back(b.acc_result(a));
    // positions (i32) fold into the int output, values into the float output
    b.store(outf, sum_all(b, {f[0], f[1], f[2], f[5], b.op(Op::ToF32, CT::F32, sum_all(b, i))}));
    b.store(outi, sum_all(b, {f[3], f[4]}));
    return b.kernel();
}

// Rank 3 with the reduced dim in the middle: coordinates, the linear id and a gather inside the
// R loop and in the Point block, bool/uint8 outputs, a broadcast-back store.
inline kir::Kernel middle_reduction_kernel() {
    KernelBuilder b("kiln_middle", "PRP");
    int outf = b.output(DType::Float32, "x0x");
    int outb = b.output(DType::Bool, "x0x");
    int outu = b.output(DType::UInt8, "xxx");
    int in = b.input(DType::Float32, "xxx");
    int table = b.input(DType::Float32, "000");
    int ip_stride = b.iparam();

    b.loop();
    int x = b.load(in);
    int lid = b.linear_id();
    int g = b.gather(table, b.op(Op::And, CT::I32, lid, b.consti(7)), ip_stride);
    int v = sum_all(b, {x, b.op(Op::ToF32, CT::F32, b.coord(1)), g});
    int a_sum = b.accum(AccKind::Sum, v);
    int a_arg = b.accum(AccKind::ArgMin, v);

    b.point();
    int s = b.acc_result(a_sum);
    int c = sum_all(b, {b.coord(0), b.coord(1), b.coord(2), b.linear_id()});
    b.store(outf, b.op(Op::Add, CT::F32, s, b.op(Op::ToF32, CT::F32, c)));
    b.store(outb, b.op(Op::ToBool, CT::I32, b.acc_result(a_arg)));

    b.loop();
    b.store(outu, b.op(Op::WrapU8, CT::I32, b.op(Op::ToI32, CT::I32, b.op(Op::Mul, CT::F32, b.load(in), s))));
    return b.kernel();
}

// Full reduction over two dims: every AccKind on f32 and i32 in one pass.
inline kir::Kernel full_reduce_kernel() {
    KernelBuilder b("kiln_full", "RR");
    int outf = b.output(DType::Float32, "00");
    int outi = b.output(DType::Int32, "00");
    int inx = b.input(DType::Float32, "x1");
    int inn = b.input(DType::Int32, "x1");
    b.loop();
    int x = b.load(inx), n = b.load(inn);
    std::vector<int> acc;
    for (AccKind kind : {AccKind::Sum, AccKind::Max, AccKind::Min, AccKind::ArgMax, AccKind::ArgMin, AccKind::Prod}) {
        acc.push_back(b.accum(kind, x));
        acc.push_back(b.accum(kind, n));
    }
    b.point();
    std::vector<int> f, i;
    for (int a : acc) {
        int r = b.acc_result(a);
        (b.type(r) == CT::F32 ? f : i).push_back(r);
    }
    b.store(outf, sum_all(b, f));
    b.store(outi, sum_all(b, i));
    return b.kernel();
}

// Full reduction of rank 1 from float16 (a mean): the smallest two-kernel case.
inline kir::Kernel mean_kernel() {
    KernelBuilder b("kiln_mean", "R");
    int out = b.output(DType::BFloat16, "0");
    int in = b.input(DType::Float16, "1");
    int inv_n = b.fparam();
    b.loop();
    int a = b.accum(AccKind::Sum, b.load(in));
    b.point();
    b.store(out, b.op(Op::Mul, CT::F32, b.acc_result(a), b.paramf(inv_n)));
    return b.kernel();
}

// Rank 0: one point, no coordinates.
inline kir::Kernel scalar_kernel() {
    KernelBuilder b("kiln_scalar", "");
    int out = b.output(DType::Float32, "");
    int in = b.input(DType::Float32, "");
    b.loop();
    int x = b.op(Op::Mul, CT::F32, b.load(in), b.constf(2.0f));
    b.store(out, b.op(Op::Add, CT::F32, x, b.op(Op::ToF32, CT::F32, b.linear_id())));
    return b.kernel();
}

inline std::vector<std::pair<const char*, kir::Kernel>> sample_kernels() {
    return {{"all_ops", all_ops_kernel()},       {"dtypes", dtypes_kernel()},
            {"row_softmax", row_softmax_kernel()}, {"row_norm", row_norm_kernel()}, {"column", column_kernel()},
            {"middle", middle_reduction_kernel()}, {"full", full_reduce_kernel()},
            {"mean", mean_kernel()},               {"scalar", scalar_kernel()},
            {"wide", wide_kernel()}};
}

} // namespace kiln::test
