// Column reductions (cuda_codegen.hpp): 32 parallel points x 8 slices of the reduced points per block.
#include "codegen/cuda/cuda_emitter.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace kiln::codegen::detail {

void Emitter::emit_column_kernel() {
    const int width = detail::kColumnWidth, slices = detail::kColumnSlices;
    line("");
    open_kernel(k_.name, width * slices);
    emit_buffer_pointers(all_uses_);
    emit_reduce_scratch(false);
    line("(void)scratch; (void)param;");
    line("const long long np = {};", product(pdims_));
    line("const long long nr = {};", product(rdims_));
    line("const int column = (int)(threadIdx.x & {}), slice = (int)(threadIdx.x / {});", width - 1, width);
    open(fmt::format("for (long long p0 = (long long)blockIdx.x * {0}; p0 < np; p0 += (long long)gridDim.x * {0})",
                     width));
    line("const bool live = p0 + column < np;");
    line("const long long pi = live ? p0 + column : p0;");
    emit_ppoint_setup();
    for (size_t bi = 0; bi < k_.blocks.size(); ++bi) {
        const kir::Block& b = k_.blocks[bi];
        if (!b.loop) {
            emit_point_block(b, "live && slice == 0");
            continue;
        }
        declare_acc_results(b);
        open("");
        init_acc_states(b);
        open(fmt::format("for (long long ri = live ? slice : nr; ri < nr; ri += {})", slices));
        emit_rloop_body(bi);
        close();
        for (int ai : b.accums) {
            const kir::Accum& ac = k_.accums[ai];
            line("kiln_column_reduce<{0}>(acc{1}_v, acc{1}_p, kiln_sv{2}, kiln_sp);", acc_struct(ac), ai,
                 ac.type == CT::F32 ? "f" : "i");
        }
        set_acc_results(b);
        close();
    }
    close();
    close();
}

} // namespace kiln::codegen::detail
