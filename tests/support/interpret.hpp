// dst = e through every pass and the kernel IR interpreter instead of a backend: the reference
// the CPU JIT is held to, bit for bit or within a bound, by the unit tests.
#pragma once
#include "tests/support/catch.hpp"

#include <kiln/kiln.hpp>

#include "compiler/pipeline.hpp"
#include "runtime/kir_interpreter.hpp"

namespace kiln::test {

inline void interpret_assignment(const Expr& e, const Tensor& dst) {
    CompiledAssignment ca = compile_assignment(e.node(), dst.view(), "interpreter");
    REQUIRE(ca.plan.temps.empty());
    for (LoweredStage& st : ca.stages) {
        kir::LaunchArgs args = st.args;
        for (size_t b = 0; b < st.sources.size(); ++b) {
            const View& v = st.sources[b].view;
            args.buffers[b] = static_cast<char*>(v.storage->data) + v.offset * (int64_t)dtype_size(v.dtype);
        }
        interpret(st.kernel, args);
    }
}

} // namespace kiln::test
