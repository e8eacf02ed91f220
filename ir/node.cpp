#include "ir/node.hpp"

#include "ir/error.hpp"

#include <fmt/format.h>

#include <cstring>
#include <mutex>
#include <new>
#include <unordered_set>

namespace kiln {

namespace {

using O = OpKind;
using C = OpClass;

// Every op once, in the enum's order: the static_asserts below refuse a table that misses an op
// or lists one out of place.
constexpr OpKindInfo kOpKinds[] = {
    // op         name       class        arity, commutative, comparison, dtype rule, hint
    {O::Leaf,     "tensor",  C::Leaf,     0, false, false, DTypeRule::None, ""},
    {O::Scalar,   "scalar",  C::Leaf,     0, false, false, DTypeRule::None, ""},
    {O::Rand,     "rand",    C::Leaf,     0, false, false, DTypeRule::None, ""},
    {O::Iota,     "iota",    C::Leaf,     0, false, false, DTypeRule::None, ""},
#define KILN_UNARY(K, name, rule, fold, hint) {O::K, #name, C::Unary, 1, false, false, DTypeRule::rule, hint},
#define KILN_BINARY(K, name, rule, commutative, fold, hint)
#include <kiln/elementwise.def>
#undef KILN_BINARY
#undef KILN_UNARY
    {O::Cast,     "cast",    C::Unary,    1, false, false, DTypeRule::None, ""},
#define KILN_UNARY(K, name, rule, fold, hint)
#define KILN_BINARY(K, name, rule, commutative, fold, hint) \
    {O::K, #name, C::Binary, 2, commutative, DTypeRule::rule == DTypeRule::Compare, DTypeRule::rule, hint},
#include <kiln/elementwise.def>
#undef KILN_BINARY
#undef KILN_UNARY
    {O::Where,    "where",   C::Ternary,  3, false, false, DTypeRule::None, ""},
    {O::Sum,      "sum",     C::Reduction,1, false, false, DTypeRule::None, ""},
    {O::Max,      "max",     C::Reduction,1, false, false, DTypeRule::None, ""},
    {O::Min,      "min",     C::Reduction,1, false, false, DTypeRule::None, ""},
    {O::ArgMax,   "argmax",  C::Reduction,1, false, false, DTypeRule::None, ""},
    {O::ArgMin,   "argmin",  C::Reduction,1, false, false, DTypeRule::None, ""},
    {O::Prod,     "prod",    C::Reduction,1, false, false, DTypeRule::None, ""},
    {O::Reshape,  "reshape", C::Movement, 1, false, false, DTypeRule::None, ""},
    {O::Take,     "take",    C::Movement, 2, false, false, DTypeRule::None, ""},
#define KILN_MATH(K, name, c_function, host) {O::K, #name, C::Unary, 1, false, false, DTypeRule::Float, ""},
#define KILN_MATH2(K, name, c_function, host) {O::K, #name, C::Binary, 2, false, false, DTypeRule::Float, ""},
#include <kiln/math_functions.def>
#undef KILN_MATH2
#undef KILN_MATH
};

constexpr bool in_enum_order() {
    for (size_t i = 0; i < sizeof(kOpKinds) / sizeof(kOpKinds[0]); ++i)
        if ((size_t)kOpKinds[i].op != i) return false;
    return true;
}
static_assert(sizeof(kOpKinds) / sizeof(kOpKinds[0]) == (size_t)kNumOpKinds, "kOpKinds must list every OpKind");
static_assert(in_enum_order(), "kOpKinds must list the ops in the enum's order");

} // namespace

const OpKindInfo& opkind_info(OpKind k) {
    static constexpr OpKindInfo unknown{OpKind::Leaf, "?", OpClass::Leaf, 0, false, false, DTypeRule::None, ""};
    return (size_t)k < sizeof(kOpKinds) / sizeof(kOpKinds[0]) ? kOpKinds[(size_t)k] : unknown;
}

bool View::is_contiguous() const {
    int64_t expect = 1;
    for (size_t i = shape.size(); i-- > 0;) {
        if (shape[i] != 1 && strides[i] != expect) return false;
        expect *= shape[i];
    }
    return true;
}

namespace {

size_t mix(size_t h, size_t v) { return h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2)); }

size_t structural_hash(const Node& n) {
    size_t h = mix((size_t)n.op, (size_t)n.dtype);
    for (int64_t d : n.shape) h = mix(h, (size_t)d);
    for (auto& in : n.inputs) h = mix(h, std::hash<const void*>()(in.get()));
    h = mix(h, (size_t)n.axis);
    uint64_t bits;
    std::memcpy(&bits, &n.value, sizeof bits);
    h = mix(h, bits);
    h = mix(h, (size_t)n.ivalue);
    h = mix(h, n.weak);
    h = mix(h, n.serial);
    if (n.op == OpKind::Leaf) {
        h = mix(h, std::hash<const void*>()(n.view.storage.get()));
        h = mix(h, (size_t)n.view.offset);
        for (int64_t s : n.view.strides) h = mix(h, (size_t)s);
    }
    return h;
}

bool same_value(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }  // NaN == NaN, -0 != 0

bool structurally_equal(const Node& a, const Node& b) {
    if (a.op != b.op || a.dtype != b.dtype || a.shape != b.shape || a.axis != b.axis || !same_value(a.value, b.value) ||
        a.ivalue != b.ivalue || a.weak != b.weak || a.serial != b.serial || a.inputs.size() != b.inputs.size())
        return false;
    for (size_t i = 0; i < a.inputs.size(); ++i)
        if (a.inputs[i] != b.inputs[i]) return false;
    if (a.op == OpKind::Leaf && !a.view.same_layout(b.view)) return false;
    return true;
}

// An interned node: the Node and its reference count in one allocation (make_shared), linked
// into its bucket of the table through `next`. Building an expression makes and drops a node per
// operation; each costs one allocation here besides its shape and inputs, none in the table.
struct Interned : Node, std::enable_shared_from_this<Interned> {
    explicit Interned(Node&& n) : Node(std::move(n)) {}
    Interned(const Interned&) = delete;
    Interned& operator=(const Interned&) = delete;
    ~Interned();
    Interned* next = nullptr;  // the table's chain; guarded by its mutex
};

// Buckets of intrusive chains, a power of two of them, doubled when the nodes outnumber them.
struct InternTable {
    std::mutex mu;
    std::vector<Interned*> buckets = std::vector<Interned*>(1024, nullptr);
    int shift = 64 - 10;  // bucket of hash h: (h * golden) >> shift, the hash's high bits mixed in
    size_t count = 0;
    uint64_t next_id = 1;

    Interned*& bucket(size_t h) { return buckets[(size_t)((uint64_t)h * 0x9e3779b97f4a7c15ull >> shift)]; }
    void push(Interned* n) {   // onto its bucket's chain
        Interned*& b = bucket(n->hash);
        n->next = b;
        b = n;
    }
    void link(Interned* n) {
        push(n);
        if (++count > buckets.size()) grow();
    }
    void unlink(const Interned* n) {
        for (Interned** p = &bucket(n->hash); *p; p = &(*p)->next)
            if (*p == n) {
                *p = n->next;
                --count;
                return;
            }
    }
    void grow() {  // without memory to grow, the chains only get longer
        std::vector<Interned*> old;
        try {
            old.assign(buckets.size() * 2, nullptr);
        } catch (const std::bad_alloc&) {
            return;
        }
        old.swap(buckets);
        --shift;
        for (Interned* n : old)
            while (n) {
                Interned* after = n->next;
                push(n);
                n = after;
            }
    }
};

InternTable& table() {
    static InternTable* t = new InternTable();  // never destroyed: nodes may outlive static teardown
    return *t;
}

// Releases a dying node's inputs without recursion: the inputs it held the last reference to
// would release theirs in turn, as deep as the expression (200000 chained additions overflow the
// stack). The outermost release on a thread drains a list of released inputs; nested ones only
// add to it. A node can die after its thread's list (a thread_local or static holding a Tensor,
// destroyed as the thread or the process ends): releaser_gone, which has no destructor, says so,
// and ~Node then releases its inputs itself.
thread_local bool releaser_gone = false;
struct Releaser {
    std::vector<NodePtr> pending;
    bool draining = false;
    ~Releaser() { releaser_gone = true; }
};

Interned::~Interned() {
    {
        auto& t = table();
        std::lock_guard<std::mutex> l(t.mu);
        t.unlink(this);
    }
    if (releaser_gone) return;
    thread_local Releaser r;
    // A destructor must not throw: where the list cannot grow, push_back leaves the input in
    // place and ~Node releases it, recursively (deeper stack, no std::terminate).
    for (NodePtr& in : inputs) {
        try {
            r.pending.push_back(std::move(in));
        } catch (const std::bad_alloc&) {
        }
    }
    if (r.draining) return;
    r.draining = true;
    while (!r.pending.empty()) {
        NodePtr last = std::move(r.pending.back());
        r.pending.pop_back();
        last.reset();  // may run this destructor again, which appends to `pending`
    }
    r.draining = false;
}

} // namespace

NodePtr intern(Node proto) {
    check_shape(proto.shape, opkind_name(proto.op));
    KILN_CHECK_INTERNAL(proto.inputs.size() == (size_t)opkind_info(proto.op).arity, "intern: {} with {} inputs",
                        opkind_name(proto.op), proto.inputs.size());
    proto.hash = structural_hash(proto);
    auto& t = table();
    std::lock_guard<std::mutex> lock(t.mu);
    // A node in the table is alive or waiting in its destructor for this mutex, fields intact;
    // only a live one is shared (lock() fails on a dying one, which is then left to unlink itself).
    for (Interned* c = t.bucket(proto.hash); c; c = c->next)
        if (c->hash == proto.hash && structurally_equal(*c, proto))
            if (std::shared_ptr<Interned> existing = c->weak_from_this().lock()) return existing;
    proto.id = t.next_id++;
    auto made = std::make_shared<Interned>(std::move(proto));
    t.link(made.get());
    return made;
}

size_t live_node_count() {
    auto& t = table();
    std::lock_guard<std::mutex> lock(t.mu);
    return t.count;
}

namespace {

template <class Stop>
std::vector<const Node*> postorder_until(const NodePtr& root, const Stop& stop) {
    // Runs several times on every new plan, and once on every assignment (the plan cache's
    // signature): expressions are small, so "seen" is a scan of the nodes met so far, kept on
    // the stack, until there are many of them, then a hash set.
    constexpr size_t kScan = 64;
    const Node* met[kScan] = {root.get()};
    size_t n_met = 1;
    std::unordered_set<const Node*> seen;
    auto first_visit = [&](const Node* c) {
        if (n_met < kScan) {
            for (size_t i = 0; i < n_met; ++i)
                if (met[i] == c) return false;
            met[n_met++] = c;
            if (n_met == kScan) seen.insert(met, met + kScan);
            return true;
        }
        return seen.insert(c).second;
    };
    std::vector<const Node*> out;
    out.reserve(16);
    std::vector<std::pair<const Node*, size_t>> stack;
    stack.reserve(16);
    stack.push_back({root.get(), 0});
    while (!stack.empty()) {
        auto& [n, i] = stack.back();
        if (i < n->inputs.size() && !stop(n)) {
            const Node* c = n->inputs[i++].get();
            if (first_visit(c)) stack.push_back({c, 0});
        } else {
            out.push_back(n);
            stack.pop_back();
        }
    }
    return out;
}

} // namespace

std::vector<const Node*> postorder(const NodePtr& root) {
    return postorder_until(root, [](const Node*) { return false; });
}

std::vector<const Node*> postorder(const NodePtr& root, const std::function<bool(const Node*)>& stop) {
    return postorder_until(root, stop);
}

std::string node_str(const Node& n) {
    std::string args;
    for (auto& in : n.inputs) args += fmt::format("{}%{}", args.empty() ? "" : ", ", in->id);
    std::string attr;
    switch (n.op) {
    case OpKind::Leaf:
        attr = fmt::format("@{} offset={} strides={}", fmt::ptr(n.view.storage.get()), n.view.offset,
                           shape_str(n.view.strides));
        break;
    case OpKind::Scalar:
        attr = is_float(n.dtype) ? fmt::format("{}{}", n.value, n.weak ? " (weak)" : "")
                                 : fmt::format("{}{}", n.ivalue, n.weak ? " (weak)" : "");
        break;
    case OpKind::Rand: attr = fmt::format("#{}", n.serial); break;
    case OpKind::Iota: case OpKind::Take: attr = fmt::format("axis={}", n.axis); break;
    default:
        if (is_reduction(n.op)) attr = n.axis == kAllAxes ? "axis=all" : fmt::format("axis={}", n.axis);
    }
    std::string inner = args;
    if (!attr.empty()) inner += (inner.empty() ? "" : ", ") + attr;
    return fmt::format("%{} = {}({}) {} {}", n.id, opkind_name(n.op), inner, dtype_name(n.dtype), shape_str(n.shape));
}

std::string graph_str(const NodePtr& root) {
    std::string s;
    for (const Node* n : postorder(root)) s += "  " + node_str(*n) + "\n";
    return s;
}

} // namespace kiln
