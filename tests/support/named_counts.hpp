// A named output's counts (include/kiln/hist.hpp) checked against a pass over it, for the GPU
// tests of the kernels that count in their store path.
#pragma once
#include "tests/support/catch.hpp"

#include <kiln/kiln.hpp>

#include <functional>
#include <string>
#include <vector>

namespace kiln::test {

// Tags `out`, runs `call` with hist_named on, then `after` (say, a check of how the call
// counted) before turning it off; the slot the call left must equal hist() of `out` (the
// context's `bins`) and hold every value of it.
inline void check_named_counts(Context& ctx, Tensor& out, int bins, const std::function<void()>& call,
                               const std::function<void()>& after = {}) {
    set_hist_tag(out, "out");
    dump_hist_data(ctx);
    set_hist_named(ctx, true);
    call();
    if (after) after();
    set_hist_named(ctx, false);
    hist(out, "check");
    HistData d = dump_hist_data(ctx);
    REQUIRE(d.tags == std::vector<std::string>{"out", "check"});
    const std::vector<int32_t> counts = d.counts.to_vector<int32_t>();
    CHECK(std::vector<int32_t>(counts.begin(), counts.begin() + bins) == std::vector<int32_t>(counts.begin() + bins, counts.end()));
    int64_t total = 0;
    for (int i = 0; i < bins; ++i) total += counts[i];
    CHECK(total == out.size());
}

} // namespace kiln::test
