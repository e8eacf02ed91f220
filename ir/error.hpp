// Two kinds of failure: kiln::Error is something the caller did (bad shapes, dtypes, axes...),
// and its message names the operation, the operands and what would be valid. InternalError is
// a bug in kiln: it should never reach a user, and its message says so.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace kiln {

class Error : public std::runtime_error {
public:
    // Which standard Python exception a binding should derive the error from.
    enum class Kind { Value, Type, Index, Memory, Runtime };
    explicit Error(const std::string& msg, Kind kind = Kind::Value) : std::runtime_error(msg), kind_(kind) {}
    Kind kind() const { return kind_; }

private:
    Kind kind_;
};

class InternalError : public std::logic_error {
public:
    explicit InternalError(const std::string& msg) : std::logic_error("kiln internal error (a bug, please report): " + msg) {}
};

template <typename... Args>
[[noreturn]] void fail(Error::Kind kind, fmt::format_string<Args...> f, Args&&... args) {
    throw Error(fmt::format(f, std::forward<Args>(args)...), kind);
}

#define KILN_CHECK_INTERNAL(cond, ...)                                                             \
    do {                                                                                           \
        if (!(cond)) throw ::kiln::InternalError(fmt::format(__VA_ARGS__));                        \
    } while (0)

} // namespace kiln
