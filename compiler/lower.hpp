// lower: turns one stage into the kernel IR plus the run-time arguments of this launch. All
// semantic decisions live here, once for both backends: NumPy promotion inside the kernel,
// integer wrap-around of int8/uint8/bool results, NaN rules, the RNG, the reduction passes
// (one Loop block per reduction level: the postfix order of the seeds' rule), and the merging
// of dimensions that are contiguous for every operand, so that the kernel's rank — part of
// its cache key — depends on the layout pattern and not on the sizes. Runs after partition.
#pragma once
#include "compiler/kernel_ir.hpp"
#include "compiler/key.hpp"
#include "compiler/stage.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

// Where a kernel buffer's memory comes from at launch time.
struct BufferSource {
    bool is_temp = false;
    int temp = -1;
    View view;  // !is_temp: the tensor view (its storage and offset give the base pointer)
};

// An RNG draw: two iparam slots the runtime fills with the context's seed and the counter it
// assigns to the Rand node (one counter per rand() node per assignment).
struct RandSlot {
    uint64_t serial;
    int seed_slot;
    int counter_slot;
};

struct LoweredStage {
    kir::Kernel kernel;
    kir::LaunchArgs args;               // buffer pointers are left null: the runtime resolves `sources`
    std::vector<BufferSource> sources;  // per kernel buffer
    std::vector<RandSlot> rands;
    std::string key;                    // full key material (structure, dtypes, layout, target, version)
};

// Random-number serials at and above this one belong to stochastic rounding (one per stage
// output), below it to rand() nodes; each gets its own counter per assignment.
inline constexpr uint64_t kRoundingSerial = uint64_t(1) << 63;

struct LowerOptions {
    // Stores to float16/bfloat16 round stochastically keeping this many mantissa bits (1..10;
    // bfloat16 keeps at most its 7); 0: round to nearest even.
    int stochastic_round_bits = 0;
    // A destination of float dtype (not a temporary) has its stored values counted into this
    // histogram (kir::Hist); bins == 0: none.
    kir::Hist hist;
};

// `target` names what the code is for ("cpu-x86_64-avx2", "sm_90"); it is part of the key.
LoweredStage lower(const Stage& stage, const std::string& target, const LowerOptions& opts = {});

} // namespace kiln
