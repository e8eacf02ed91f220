// Raising kiln's errors (kiln/error.hpp) with a formatted message: fail() for the caller's
// mistakes, KILN_CHECK_INTERNAL for kiln's own invariants.
#pragma once
#include <kiln/error.hpp>

#include <fmt/format.h>

namespace kiln {

template <typename... Args>
[[noreturn]] void fail(Error::Kind kind, fmt::format_string<Args...> f, Args&&... args) {
    throw Error(fmt::format(f, std::forward<Args>(args)...), kind);
}

#define KILN_CHECK_INTERNAL(cond, ...)                                                             \
    do {                                                                                           \
        if (!(cond)) throw ::kiln::InternalError(fmt::format(__VA_ARGS__));                        \
    } while (0)

} // namespace kiln
