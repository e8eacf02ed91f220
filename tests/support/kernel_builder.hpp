// Builds kir::Kernel objects by hand, so that each renderer (CUDA C, LLVM IR) is tested on
// exactly the shapes the kernel IR allows, independently of what the lowering produces today.
// The one kernel builder of the test programs.
#pragma once
#include "compiler/kernel_ir.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kiln::test {

using kir::AccKind;
using kir::Op;
using CT = kir::ComputeType;
using SK = kir::StrideKind;

class KernelBuilder {
public:
    using CT = kir::ComputeType;
    using Op = kir::Op;

    // `dims`: one letter per domain dim, 'P' parallel or 'R' reduced; a kernel with only 'R'
    // dims is a full reduction.
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

    int buffer(DType t, std::vector<SK> layout, bool output = false) {
        k_.buffers.push_back({t, output, std::move(layout)});
        return (int)k_.buffers.size() - 1;
    }
    // `layout`: one letter per dim, '0', '1' or 'x' (any stride).
    int input(DType t, const std::string& layout) { return buffer(t, strides(layout), false); }
    int output(DType t, const std::string& layout) { return buffer(t, strides(layout), true); }

    // A new parameter's index (indexed() also counts the ones it meets).
    int fparam() { return k_.num_fparams++; }
    int iparam() { return k_.num_iparams++; }

    void loop() { open(true); }
    void point() { open(false); }

    int op(Op o, CT t, int a = -1, int b = -1, int c = -1) {
        kir::Instr in{};
        in.op = o;
        in.type = t;
        in.a[0] = a;
        in.a[1] = b;
        in.a[2] = c;
        return add(in);
    }
    int constf(float v) {
        const int id = op(Op::ConstF, CT::F32);
        k_.instrs[id].fimm = v;
        return id;
    }
    int consti(int32_t v) {
        const int id = op(Op::ConstI, CT::I32);
        k_.instrs[id].iimm = v;
        return id;
    }
    int constd(double v) {
        const int id = op(Op::ConstF, CT::F64);
        k_.instrs[id].fimm = v;
        return id;
    }
    int constl(int64_t v) {
        const int id = op(Op::ConstI, CT::I64);
        k_.instrs[id].iimm = v;
        return id;
    }
    int indexed(Op o, CT t, int index, int a = -1, int aux = 0) {
        const int id = op(o, t, a);
        k_.instrs[id].index = index;
        k_.instrs[id].aux = aux;
        const int slots = kiln::is_wide(t) ? 2 : 1;   // a 64-bit parameter takes two
        if (o == Op::ParamF) k_.num_fparams = std::max(k_.num_fparams, index + slots);
        if (o == Op::ParamI) k_.num_iparams = std::max(k_.num_iparams, index + slots);
        if (o == Op::Gather) k_.num_iparams = std::max(k_.num_iparams, aux + 1);
        return id;
    }
    int load(int buf) { return indexed(Op::Load, compute_type(k_.buffers[buf].dtype), buf); }
    // Element `idx` along the buffer's gathered dim, whose stride is int parameter `stride_iparam`.
    int gather(int buf, int idx, int stride_iparam) {
        return indexed(Op::Gather, compute_type(k_.buffers[buf].dtype), buf, idx, stride_iparam);
    }
    int paramf(int i) { return indexed(Op::ParamF, CT::F32, i); }
    int parami(int i) { return indexed(Op::ParamI, CT::I32, i); }
    int paramd(int i) { return indexed(Op::ParamF, CT::F64, i); }   // fparams i and i + 1
    int paraml(int i) { return indexed(Op::ParamI, CT::I64, i); }   // iparams i and i + 1
    int coord(int d) { return indexed(Op::Coord, CT::I32, d); }
    int linear_id() { return op(Op::LinearId, CT::I32); }

    // Accumulates `value` in the current (Loop) block; returns the accumulator's index.
    int accum(AccKind kind, int value) {
        k_.accums.push_back({kind, k_.instrs[value].type, value});
        k_.blocks.back().accums.push_back((int)k_.accums.size() - 1);
        return (int)k_.accums.size() - 1;
    }
    int acc_result(int acc) {
        const kir::Accum& a = k_.accums[acc];
        const bool pos = a.kind == AccKind::ArgMax || a.kind == AccKind::ArgMin;
        return indexed(Op::AccResult, pos ? CT::I32 : a.type, acc);
    }

    void store(int buf, int value) { k_.blocks.back().stores.push_back({buf, value}); }

    CT type(int id) const { return k_.instrs[id].type; }
    const kir::Kernel& kernel() const { return k_; }

private:
    kir::Kernel k_;

    static std::vector<SK> strides(const std::string& layout) {
        std::vector<SK> s;
        for (char c : layout) s.push_back(c == '0' ? SK::Zero : c == '1' ? SK::One : SK::Any);
        return s;
    }
    void open(bool loop) {
        k_.blocks.push_back({});
        k_.blocks.back().loop = loop;
    }
    int add(const kir::Instr& in) {
        k_.instrs.push_back(in);
        const int id = (int)k_.instrs.size() - 1;
        k_.blocks.back().instrs.push_back(id);
        return id;
    }
};

} // namespace kiln::test
