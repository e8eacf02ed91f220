// GPU test helpers: whether a CUDA device is usable, and the visible skip when it is not.
#pragma once
#include <kiln/kiln.hpp>

#include <cstdio>
#include <string>

namespace kiln::test {

// Empty when a CUDA context can be created; otherwise why not.
inline std::string why_no_gpu() {
    static const std::string why = [] {
        try {
            Context c(ContextOptions{"cuda"});
            return std::string();
        } catch (const Error& e) {
            return std::string(e.what());
        }
    }();
    return why;
}

} // namespace kiln::test

#define REQUIRE_GPU()                                                                                  \
    do {                                                                                               \
        if (!kiln::test::why_no_gpu().empty()) {                                                       \
            std::printf("SKIPPED (no usable CUDA device): %s\n", kiln::test::why_no_gpu().c_str());    \
            return;                                                                                    \
        }                                                                                              \
    } while (0)
