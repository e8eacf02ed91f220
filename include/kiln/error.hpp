// Two kinds of failure: kiln::Error is something the caller did (bad shapes, dtypes, axes...),
// and its message names the operation, the operands and what would be valid. InternalError is
// a bug in kiln: it should never reach a user, and its message says so.
#pragma once
#include <kiln/export.hpp>

#include <cstddef>
#include <stdexcept>
#include <string>

namespace kiln {

class KILN_API Error : public std::runtime_error {
public:
    // Which standard Python exception a binding should derive the error from.
    enum class Kind { Value, Type, Index, Memory, Runtime };
    explicit Error(const std::string& msg, Kind kind = Kind::Value) : std::runtime_error(msg), kind_(kind) {}
    Kind kind() const { return kind_; }

private:
    Kind kind_;
};

// A kernel kiln generated failed to compile. Carries everything needed to reproduce it.
class KILN_API CompileError : public Error {
public:
    CompileError(const std::string& msg, std::string log, std::string options, std::string numbered_source)
        : Error(msg, Kind::Runtime), log_(std::move(log)), options_(std::move(options)), source_(std::move(numbered_source)) {}
    const std::string& log() const { return log_; }                  // the compiler's log
    const std::string& options() const { return options_; }          // the options it was given, one string
    const std::string& numbered_source() const { return source_; }   // the source, lines numbered

private:
    std::string log_, options_, source_;
};

// A device allocation failed even after the allocator released its cache. The context stays usable.
class KILN_API OutOfMemory : public Error {
public:
    OutOfMemory(const std::string& msg, size_t requested, size_t free_bytes, size_t cached_bytes)
        : Error(msg, Kind::Memory), requested_(requested), free_(free_bytes), cached_(cached_bytes) {}
    size_t requested() const { return requested_; }
    size_t free_bytes() const { return free_; }      // free device memory when it failed
    size_t cached_bytes() const { return cached_; }  // bytes the allocator held in its cache before releasing it

private:
    size_t requested_, free_, cached_;
};

class KILN_API InternalError : public std::logic_error {
public:
    explicit InternalError(const std::string& msg) : std::logic_error("kiln internal error (a bug, please report): " + msg) {}
};

} // namespace kiln
