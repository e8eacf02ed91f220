// Builds kir::Kernel objects by hand, so that the CUDA renderer is tested on exactly the shapes
// the IR allows, independently of what the lowering happens to produce today.
#pragma once
#include "compiler/kernel_ir.hpp"

#include <string>
#include <utility>
#include <vector>

namespace kiln::test {

class KernelBuilder {
public:
    using CT = ComputeType;
    using Op = kir::Op;

    // `dims`: one letter per domain dim, 'P' parallel or 'R' reduced.
    KernelBuilder(std::string name, const std::string& dims) {
        k_.name = std::move(name);
        k_.rank = (int)dims.size();
        bool any_p = false;
        for (char c : dims) {
            k_.reduced.push_back(c == 'R');
            any_p = any_p || c == 'P';
        }
        k_.full_reduce = k_.has_reduction() && !any_p;
    }

    // `layout`: one letter per dim, '0', '1' or 'x' (any stride).
    int buffer(DType t, bool output, const std::string& layout) {
        kir::Buffer b{t, output, {}};
        for (char c : layout)
            b.layout.push_back(c == '0' ? kir::StrideKind::Zero : c == '1' ? kir::StrideKind::One : kir::StrideKind::Any);
        k_.buffers.push_back(b);
        return (int)k_.buffers.size() - 1;
    }
    int input(DType t, const std::string& layout) { return buffer(t, false, layout); }
    int output(DType t, const std::string& layout) { return buffer(t, true, layout); }

    int fparam() { return k_.num_fparams++; }
    int iparam() { return k_.num_iparams++; }

    void loop() { block(true); }
    void point() { block(false); }

    int op(Op o, CT t, int a = -1, int b = -1, int c = -1) {
        kir::Instr in{o, t};
        in.a[0] = a;
        in.a[1] = b;
        in.a[2] = c;
        return push(in);
    }
    int cf(float v) { kir::Instr in{Op::ConstF, CT::F32}; in.fimm = v; return push(in); }
    int ci(int32_t v) { kir::Instr in{Op::ConstI, CT::I32}; in.iimm = v; return push(in); }
    int indexed(Op o, CT t, int index, int a0 = -1, int aux = 0) {
        kir::Instr in{o, t};
        in.index = index;
        in.a[0] = a0;
        in.aux = aux;
        return push(in);
    }
    int load(int buf) { return indexed(Op::Load, compute_type(k_.buffers[buf].dtype), buf); }
    int gather(int buf, int idx, int stride_iparam) {
        return indexed(Op::Gather, compute_type(k_.buffers[buf].dtype), buf, idx, stride_iparam);
    }
    int paramf(int i) { return indexed(Op::ParamF, CT::F32, i); }
    int parami(int i) { return indexed(Op::ParamI, CT::I32, i); }
    int coord(int d) { return indexed(Op::Coord, CT::I32, d); }
    int linear_id() { return op(Op::LinearId, CT::I32); }

    // Accumulates `value` in the current (Loop) block; returns the accumulator index.
    int accum(kir::AccKind kind, int value) {
        k_.accums.push_back({kind, k_.instrs[value].type, value});
        int a = (int)k_.accums.size() - 1;
        k_.blocks.back().accums.push_back(a);
        return a;
    }
    int acc_result(int acc) {
        bool arg = k_.accums[acc].kind == kir::AccKind::ArgMax || k_.accums[acc].kind == kir::AccKind::ArgMin;
        return indexed(Op::AccResult, arg ? CT::I32 : k_.accums[acc].type, acc);
    }

    void store(int buf, int value) { k_.blocks.back().stores.push_back({buf, value}); }

    CT type(int id) const { return k_.instrs[id].type; }
    const kir::Kernel& kernel() const { return k_; }

private:
    kir::Kernel k_;

    void block(bool loop) {
        k_.blocks.push_back({});
        k_.blocks.back().loop = loop;
    }
    int push(const kir::Instr& in) {
        k_.instrs.push_back(in);
        int id = (int)k_.instrs.size() - 1;
        k_.blocks.back().instrs.push_back(id);
        return id;
    }
};

} // namespace kiln::test
