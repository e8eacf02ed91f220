// Full reductions (cuda_codegen.hpp): partial records per chunk, then one block combines them in order.
#include "codegen/cuda/cuda_emitter.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace kiln::codegen::detail {

void Emitter::emit_partial_kernel() {
    const kir::Block& b = k_.blocks[0];
    line("");
    open_kernel(k_.name + "_partial", kCudaBlockSize);
    line("unsigned char* const partials = scratch;");
    line("const int num_partials = param;");
    emit_buffer_pointers(block_uses_[0]);
    emit_scratch();
    line("const long long nr = {};", product(rdims_));
    line("const long long chunk = (nr + num_partials - 1) / num_partials;");
    open("for (int part = blockIdx.x; part < num_partials; part += gridDim.x)");
    scope_ = Scope::PPoint;
    line("const long long rbegin = (long long)part * chunk;");
    line("const long long rend = rbegin + chunk < nr ? rbegin + chunk : nr;");
    init_acc_states(b);
    open("for (long long ri = rbegin + threadIdx.x; ri < rend; ri += blockDim.x)");
    emit_rloop_body(0);
    close();
    block_reduce_acc_states(b);
    open("if (threadIdx.x == 0)");
    line("unsigned char* const rec = partials + (long long)part * {};", record_bytes());
    for (int ai : b.accums) {
        line("*({}*)(rec + {}) = acc{}_v;", ctype(k_.accums[ai].type), 8 * ai, ai);
        line("*(int*)(rec + {}) = acc{}_p;", 8 * ai + 4, ai);
    }
    close();
    close();
    close();
}

void Emitter::emit_final_kernel() {
    const kir::Block& loop = k_.blocks[0];
    const kir::Block& point = k_.blocks[1];
    line("");
    open_kernel(k_.name + "_final", kCudaBlockSize);
    line("const unsigned char* const partials = scratch;");
    line("const int num_partials = param;");
    emit_buffer_pointers(block_uses_[1]);
    emit_scratch();
    scope_ = Scope::PPoint;
    declare_acc_results(loop);
    init_acc_states(loop);
    // Thread t folds records t, t + blockDim.x, ... in order, then the block combines the
    // threads in a fixed tree: the same partials always give the same result.
    open("for (int j = threadIdx.x; j < num_partials; j += blockDim.x)");
    line("const unsigned char* const rec = partials + (long long)j * {};", record_bytes());
    for (int ai : loop.accums) {
        const kir::Accum& ac = k_.accums[ai];
        line("{}::add(acc{}_v, acc{}_p, *(const {}*)(rec + {}), *(const int*)(rec + {}));", acc_struct(ac), ai, ai,
             ctype(ac.type), 8 * ai, 8 * ai + 4);
    }
    close();
    block_reduce_acc_states(loop);
    set_acc_results(loop);
    emit_instrs(point);
    if (!point.stores.empty()) {
        open("if (threadIdx.x == 0)");
        emit_stores(point);
        close();
    }
    close();
}

} // namespace kiln::codegen::detail
