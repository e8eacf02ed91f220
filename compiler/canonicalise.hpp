// canonicalise: the first pass. Folds operations whose operands are all scalars, strips identities
// (x*1, x+0, x-0, x/1, x**1, --x) where they change neither dtype nor shape, turns a float's x**2
// into x*x (the same condition), and orders the operands of commutative operations (scalars last,
// then by creation) so that a*b and b*a become one node. Runs on the graph as built by the
// operator API; nothing before it.
#pragma once
#include "ir/node.hpp"

namespace kiln {

struct CanonicaliseStats {
    int folded = 0, identities = 0, squares = 0, reordered = 0;
    bool changed() const { return folded || identities || squares || reordered; }
};

NodePtr canonicalise(const NodePtr& root, CanonicaliseStats* stats = nullptr);

} // namespace kiln
