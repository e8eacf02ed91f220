// The kernel IR: what one kernel stage computes, in a form both backends render directly.
//
// Why it exists: the expression graph says *what* to compute; this says *how one kernel walks
// memory*. The lowering (compiler/lower.cpp) turns a partitioned stage into a Kernel; the LLVM
// renderer (codegen/llvm) and the CUDA C renderer (codegen/cuda) are small printers over it, so
// every semantic decision (promotion, NaN rules, RNG, integer wrap-around) is made once, here
// and in the lowering, never in a backend.
//
// The iteration domain has `rank` dimensions. Their sizes are run-time arguments. Each dim is
// either parallel (P) or reduced (R). A kernel is executed once per point of the P dims; for
// that point it runs its blocks in order:
//   - a Loop block iterates over every point of the R dims (row-major, last dim fastest) and
//     runs its instructions there; in an elementwise kernel (no R dims) it runs exactly once.
//     Accumulators listed in the block are reset before the loop and updated at each point.
//   - a Point block runs once (R coordinates all 0). It may read accumulator results of earlier
//     Loop blocks and store to outputs whose strides over the R dims are 0.
// Values defined in a Loop block are visible only inside it; values of a Point block are
// visible in every later block. Accumulator results are visible in every later block.
//
// Buffers are strided views: element address = base + sum_d coord[d] * stride[buf][d] (in
// elements; the runtime folds the view's offset into base). Strides are run-time arguments;
// `layout[buf][d]` tells the renderer which are known to be 0 or 1 so it can specialise.
#pragma once
#include "ir/dtype.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::kir {

using ComputeType = kiln::ComputeType;  // F32, I32, F64 or I64: the only types values have in a kernel

enum class Op : uint8_t {
    // ---- leaves
    ConstF,      // float immediate `fimm` (f32 or f64)
    ConstI,      // integer immediate `iimm` (i32 or i64)
    ParamF,      // float kernel argument: f32 fparams[index]; f64 the bits of fparams[index] (low
                 // word) and fparams[index + 1] (high word)
    ParamI,      // integer kernel argument: i32 iparams[index]; i64 iparams[index] and [index + 1]
    Load,        // buffer[index] at the current point, converted from its storage dtype to the compute type
    Gather,      // buffer[index] at the current point plus a[0] * iparams[aux] elements along the
                 // gathered axis (a[0] is i32; the lowering already wrapped/clipped it into range)
    Coord,       // i32 coordinate of domain dim `index` at the current point
    LinearId,    // i32: low 32 bits of the row-major linear index of the current point over the whole domain
    AccResult,   // result of accumulator `index` (value for Sum/Prod/Max/Min, i32 position for ArgMax/ArgMin)
    // ---- unary (type of a[0] unless noted)
    Neg, Abs, Sqrt, Exp, Exp2, Log, Log2, Tanh,   // Sqrt..Tanh: floats only (F32 or F64)
    Rint,        // float: round half to even
    Sgn,         // -1, 0, +1 (floats: NaN stays NaN)
    Finite,      // float -> I32 (1 when neither inf nor NaN)
    ToF32,       // I32 -> F32 (value conversion)
    ToI32,       // F32 -> I32: truncation toward zero, saturating at the i32 range, NaN -> 0 (PTX cvt.rzi.sat, llvm.fptosi.sat)
    WrapI8,      // I32 -> I32: sign-extend the low 8 bits (int8 arithmetic wrap-around)
    WrapU8,      // I32 -> I32: zero-extend the low 8 bits
    ToBool,      // any -> I32: 1 when != 0 (NaN is true, as in NumPy)
    // ---- binary (both operands have the same type; comparisons give I32 0/1)
    Add, Sub, Mul, Div,    // Div: floats only (integer true division is lowered through a conversion)
    Pow,                   // floats
    Maximum, Minimum,      // floats: NaN-propagating (NumPy's maximum/minimum)
    Eq, Ne, Lt, Le, Gt, Ge,
    And, Or, Xor,          // integers, bitwise
    Shl, Shr,              // integers; Shr is a logical (unsigned) shift; amount in [0, bits - 1]
    MulHi,                 // I32: high 32 bits of the unsigned 32x32 product (Philox RNG)
    // ---- ternary
    Select,                // a[0] (I32, nonzero = true) ? a[1] : a[2]
    // ---- bit casts (stochastic rounding works on a float's bits)
    AsI32,                 // F32 -> I32: the same 32 bits
    AsF32,                 // I32 -> F32: the same 32 bits
    // ---- division (after the others, so that recorded kernel texts keep their numbers)
    Floor,                 // float: round toward -inf
    Fmod,                  // float: C's fmod, exact: a - trunc(a / b) * b with a's sign; NaN for b == 0 or a = +-inf
    IDiv, IRem,            // integers: C's a / b (truncated toward zero) and a % b (a's sign); defined
                           // only for b != 0 and (a, b) != (MIN, -1), which the lowering guarantees
    // ---- float functions of one and two arguments, printed as C calls (kiln/math_functions.def)
#define KILN_MATH(K, name, c_function, host) K,
#define KILN_MATH2(K, name, c_function, host) K,
#include <kiln/math_functions.def>
#undef KILN_MATH2
#undef KILN_MATH
    // ---- 64-bit values (after the functions, so that recorded kernel texts keep their numbers)
    Convert,               // any -> the instruction's type: integer to float rounds to nearest;
                           // float to integer truncates toward zero, saturating, NaN -> 0; f64 to
                           // f32 rounds to nearest; i64 to i32 keeps the low 32 bits, i32 to i64
                           // sign-extends
    WrapI16,               // I32 -> I32: sign-extend the low 16 bits (int16 wrap-around)
    WrapU16,               // I32 -> I32: zero-extend the low 16 bits
    WrapU32,               // I64 -> I64: zero-extend the low 32 bits (uint32 wrap-around)
    AsI64,                 // F64 -> I64: the same 64 bits
    AsF64,                 // I64 -> F64: the same 64 bits
    NextAfter,             // float: the next value of a's type after a toward b (C's nextafter); b if a == b
};
inline constexpr Op kLastOp = Op::NextAfter;

// What the kernel IR knows of each op, in one table (kernel_ir.cpp): its listing name, how many
// operands it reads, and the types it gives and takes (compiler/kernel_check.hpp checks them).
// Same: the instruction's own type; Any: any compute type; Float: F32 or F64; Int: I32 or I64;
// None: no operand there.
enum class OpType : uint8_t { F32, I32, Same, Any, None, Float, Int, F64, I64 };
struct OpInfo {
    Op op;
    const char* name;
    int arity;            // operands a[0..arity-1]; the others are -1
    OpType result;        // F32, I32, Float, Int or Any (the instruction's type within it; Same operands follow it)
    OpType operand[3];
};
const OpInfo& op_info(Op op);   // an op past kLastOp gets name "?"
const char* op_name(Op op);

struct Instr {
    Op op;
    ComputeType type;      // type of the result
    int a[3] = {-1, -1, -1};  // operand instruction ids
    int index = 0;         // buffer / param / dim / accumulator index
    int aux = 0;           // Gather: iparams index of the gathered axis stride
    double fimm = 0;       // ConstF (an f32 constant holds a float's value)
    int64_t iimm = 0;      // ConstI (an i32 constant holds an int32's value)
};

enum class AccKind : uint8_t { Sum, Max, Min, ArgMax, ArgMin, Prod };
inline constexpr AccKind kLastAccKind = AccKind::Prod;

// A reduction over all R dims. Sum starts at 0, Prod at 1, Max at -inf / the integer type's
// minimum, Min at +inf / its maximum. Max/Min propagate NaN. ArgMax/ArgMin keep the first position of the extreme value, a
// NaN counting as the extreme (first NaN wins), and yield that position as the i32 row-major
// index over the R dims. Float Sum and Prod may be reassociated (vectorised / tree order); i32
// Sum and Prod wrap.
struct Accum {
    AccKind kind;
    ComputeType type;   // type of the reduced value
    int value;          // instruction id (in the Loop block) whose value is reduced
};

enum class StrideKind : uint8_t { Zero, One, Any };

struct Buffer {
    DType dtype;                       // storage dtype
    bool output = false;               // written by this kernel (never also read by it)
    std::vector<StrideKind> layout;    // per domain dim
    bool hist = false;                 // float output whose stored values the kernel counts (Hist)
};

// Numerics histogram of the stored values (include/kiln/hist.hpp): every value stored to a
// buffer marked `hist`, as rounded to its dtype, is counted by round(log2|x|) into `bins` i32
// counters from 2^offset (0 and NaN in the first, beyond either end in the end bins), added to
// the launch's LaunchArgs::hist. bins == 0: no histogram. The CUDA renderer counts in the store
// path; the CPU runtime counts the written tensor after the kernel instead.
struct Hist {
    int bins = 0;
    int offset = 0;
};
inline constexpr int kMaxHistBins = 4096;
inline constexpr int kMaxHistOffset = 1000;

struct Store {
    int buffer;
    int value;    // instruction id; its type equals compute_type(buffer dtype); Bool stores 0/1
};

struct Block {
    bool loop = true;                 // Loop block (iterates R dims) or Point block
    std::vector<int> instrs;          // instruction ids, in a valid evaluation order
    std::vector<int> accums;          // Loop blocks only
    std::vector<Store> stores;
};

struct Kernel {
    std::string name;                 // a C identifier, unique per key ("kiln_<hash>")
    int rank = 0;
    std::vector<bool> reduced;        // per domain dim
    // Full reduction: no P dims, exactly two blocks (Loop, then Point). Backends split the
    // Loop block's work (over R dim 0) into chunks that produce partial accumulator states,
    // combine the partials in chunk order (deterministic), then run the Point block.
    bool full_reduce = false;
    std::vector<Buffer> buffers;
    int num_fparams = 0;
    int num_iparams = 0;
    std::vector<Instr> instrs;
    std::vector<Accum> accums;
    std::vector<Block> blocks;
    Hist hist;

    bool has_reduction() const {
        for (bool r : reduced) if (r) return true;
        return false;
    }
};

// Run-time arguments of one launch, in the Kernel's numbering.
struct LaunchArgs {
    std::vector<int64_t> sizes;        // [rank]
    std::vector<void*> buffers;        // base pointers with the view offset applied
    std::vector<int64_t> strides;      // [buffer * rank + dim], in elements
    std::vector<float> fparams;        // an f64 parameter takes two: its low and its high word
    std::vector<int32_t> iparams;      // an i64 parameter takes two: its low and its high word
    void* hist = nullptr;              // Kernel::hist.bins int32 counters, added to (null without Hist)
};

// An f32 immediate's float bits from the double it is held in, and back: exact for every
// pattern, NaN payloads (signalling ones too) included, which a float/double cast would quiet.
uint32_t f32_bits(double held);
double from_f32_bits(uint32_t bits);

// Human-readable listing, used by KILN_LOG=debug and in test failure messages.
std::string to_string(const Kernel& k);

} // namespace kiln::kir
