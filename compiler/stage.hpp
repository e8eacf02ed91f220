// A kernel stage: one kernel's worth of the graph, as chosen by the legality and partition
// passes, before lowering to the kernel IR.
#pragma once
#include "ir/node.hpp"

#include <string>
#include <unordered_map>
#include <vector>

namespace kiln {

enum class StageKind : uint8_t { Elementwise, RowReduction, ColumnReduction, FullReduction };
const char* stage_kind_name(StageKind k);

// Where a stage writes: the destination view of the assignment, or a temporary buffer the
// runtime allocates (contiguous, `shape`, `dtype`), identified by index.
struct StageOutput {
    bool is_temp = false;
    int temp = -1;
    View view;    // destination (when !is_temp)
    Shape shape;  // the domain-aligned shape being written
    DType dtype = DType::Float32;
};

struct Stage {
    StageKind kind = StageKind::Elementwise;
    NodePtr root;               // value stored
    Shape domain;               // iteration space
    std::vector<bool> reduced;  // per domain dim
    StageOutput out;
    // Further values the same kernel stores (compile_together): reductions over the same
    // domain, each to its own destination, so that the operands they share are read once.
    struct Sibling {
        NodePtr root;
        StageOutput out;
    };
    std::vector<Sibling> siblings;
    // Nodes computed by earlier stages, read here as buffers: node -> temp index.
    std::unordered_map<const Node*, int> inputs_from_temps;
    std::string why;            // one line for the debug log: why this stage exists
};

struct TempBuffer {
    Shape shape;
    DType dtype;
};

struct Plan {
    std::vector<TempBuffer> temps;
    std::vector<Stage> stages;  // in execution order
    std::string str() const;
};

} // namespace kiln
