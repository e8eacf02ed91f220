// Hand-built kernels for the CPU backend's tests: a small builder over kir::Kernel, launch
// arguments, a shared JIT and float helpers.
#pragma once
#include "compiler/kernel_ir.hpp"
#include "runtime/cpu/cpu_jit.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace kiln::test {

using kir::AccKind;
using kir::Op;
using CT = kir::ComputeType;
using SK = kir::StrideKind;

class KernelBuilder {
public:
    KernelBuilder(std::string name, std::vector<bool> reduced, bool full_reduce = false) {
        k_.name = std::move(name);
        k_.rank = (int)reduced.size();
        k_.reduced = std::move(reduced);
        k_.full_reduce = full_reduce;
    }

    int buffer(DType t, std::vector<SK> layout, bool output = false) {
        k_.buffers.push_back({t, output, std::move(layout)});
        return (int)k_.buffers.size() - 1;
    }

    void loop_block() { open(true); }
    void point_block() { open(false); }

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
        int id = op(Op::ConstF, CT::F32);
        k_.instrs[id].fimm = v;
        return id;
    }
    int consti(int32_t v) {
        int id = op(Op::ConstI, CT::I32);
        k_.instrs[id].iimm = v;
        return id;
    }
    int indexed(Op o, CT t, int index, int a = -1, int aux = 0) {
        int id = op(o, t, a);
        k_.instrs[id].index = index;
        k_.instrs[id].aux = aux;
        if (o == Op::ParamF) k_.num_fparams = std::max(k_.num_fparams, index + 1);
        if (o == Op::ParamI) k_.num_iparams = std::max(k_.num_iparams, index + 1);
        if (o == Op::Gather) k_.num_iparams = std::max(k_.num_iparams, aux + 1);
        return id;
    }
    int paramf(int i) { return indexed(Op::ParamF, CT::F32, i); }
    int parami(int i) { return indexed(Op::ParamI, CT::I32, i); }
    int load(int buf) { return indexed(Op::Load, compute_type(k_.buffers[buf].dtype), buf); }
    int coord(int d) { return indexed(Op::Coord, CT::I32, d); }
    int acc(AccKind kind, int value) {
        k_.accums.push_back({kind, k_.instrs[value].type, value});
        k_.blocks.back().accums.push_back((int)k_.accums.size() - 1);
        return (int)k_.accums.size() - 1;
    }
    int acc_result(int a) {
        const kir::Accum& ac = k_.accums[a];
        bool pos = ac.kind == AccKind::ArgMax || ac.kind == AccKind::ArgMin;
        return indexed(Op::AccResult, pos ? CT::I32 : ac.type, a);
    }
    void store(int buf, int value) { k_.blocks.back().stores.push_back({buf, value}); }

    const kir::Kernel& kernel() const { return k_; }

private:
    kir::Kernel k_;

    void open(bool loop) {
        k_.blocks.push_back({});
        k_.blocks.back().loop = loop;
    }
    int add(const kir::Instr& in) {
        k_.instrs.push_back(in);
        int id = (int)k_.instrs.size() - 1;
        k_.blocks.back().instrs.push_back(id);
        return id;
    }
};

struct Launch {
    kir::LaunchArgs args;
    explicit Launch(std::vector<int64_t> sizes) { args.sizes = std::move(sizes); }
    Launch& buffer(const void* p, std::vector<int64_t> strides) {
        args.buffers.push_back(const_cast<void*>(p));
        args.strides.insert(args.strides.end(), strides.begin(), strides.end());
        return *this;
    }
    Launch& fparam(float v) {
        args.fparams.push_back(v);
        return *this;
    }
    Launch& iparam(int32_t v) {
        args.iparams.push_back(v);
        return *this;
    }
};

// One JIT for the tests that do not care about threads or counters (LLVM setup is not free).
inline cpu::CpuJit& shared_jit() {
    static cpu::CpuJit jit;
    return jit;
}

inline void run(cpu::CpuJit& jit, const kir::Kernel& k, const Launch& l) { jit.launch(jit.compile(k, k.name), l.args); }
inline void run(const kir::Kernel& k, const Launch& l) { run(shared_jit(), k, l); }

inline uint32_t bits_of(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float float_of(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// Same value, with NaN equal to NaN.
inline bool same(float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

inline bool near_rel(double got, double want, double rel) {
    if (std::isnan(want)) return std::isnan(got);
    if (std::isinf(want)) return got == want;
    return std::fabs(got - want) <= rel * std::max(1.0, std::fabs(want));
}

inline std::vector<float> random_floats(size_t n, float lo, float hi, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng);
    return v;
}

} // namespace kiln::test
