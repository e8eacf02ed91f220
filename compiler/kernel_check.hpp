// The rules every kernel IR keeps (compiler/kernel_ir.hpp), checked in one place.
//
// Why it exists: kernels reach the backends from two sources — the lowering, which must never
// break a rule (a broken one is a bug: the backends throw InternalError), and kernel text read
// from outside (manifests, through parse_kernel_text), where a broken rule is the input's fault
// and must become a kiln::Error before any backend sees it. Both ask this one checker, so a
// kernel text that parses is one every backend can render: no operand out of range, no value
// used where it is not defined, no type a backend's instruction cannot take.
#pragma once
#include "compiler/kernel_ir.hpp"

#include <string>

namespace kiln::kir {

// How many operands (a[0], a[1], a[2]) `op` reads; the others are -1.
int arity(Op op);

// The type an AccResult of `a` has: the i32 position for ArgMax/ArgMin, else the reduced value's.
ComputeType acc_result_type(const Accum& a);

// "" when `k` keeps every rule; otherwise the first rule it breaks, naming the instruction,
// accumulator, block or buffer and what would be valid. The name is not checked (the key
// gives it). The rules:
//   - reduced and every buffer's layout have `rank` entries; there is at least one buffer;
//     op, type, dtype, accumulator and stride kinds are in their enums' ranges;
//   - an instruction's operands are earlier instructions (as many as its op reads, the rest
//     -1), of the types its op takes; its index names an existing param, input buffer
//     (Load, Gather), dim or accumulator;
//   - every instruction is in at most one block, after its operands in that block's order or
//     in an earlier Point block; an AccResult reads an accumulator of an earlier block;
//   - an accumulator is listed by exactly one Loop block, which computes its value, of its type;
//   - a store writes an output buffer a value of the buffer's compute type visible there;
//   - there is at least one block; a full reduction has only R dims (at least one) and two
//     blocks, Loop then Point.
std::string kernel_problem(const Kernel& k);

} // namespace kiln::kir
