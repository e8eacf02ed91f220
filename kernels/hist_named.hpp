// Named-tensor counting (include/kiln/hist.hpp, set_hist_named) for the library's own calls:
// each call that writes a tensor passes it here after its work.
#pragma once
#include <kiln/tensor.hpp>

#include <exception>

namespace kiln {

// hist(written, its memory's tag) when the context counts named tensors and the memory has a
// tag and a float dtype; otherwise nothing (one flag test).
void count_named(Context& ctx, const Tensor& written);

// Counts `out` when it goes out of scope, if the call holding it is not inside another (declare
// it before the call's BenchTimer, so that it runs after the timer has closed) and did not fail.
class NamedCount {
public:
    NamedCount(Context& ctx, const Tensor& out) : ctx_(ctx), out_(out), unwinding_(std::uncaught_exceptions()) {}
    ~NamedCount();
    NamedCount(const NamedCount&) = delete;
    NamedCount& operator=(const NamedCount&) = delete;

private:
    Context& ctx_;
    const Tensor& out_;
    int unwinding_;
};

} // namespace kiln
