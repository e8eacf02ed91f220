// The message of the kiln::Error a call throws, or "(no error)": for tests that assert what a
// misuse says.
#pragma once
#include <kiln/error.hpp>

#include <string>

namespace kiln::test {

template <class F>
std::string error_message(F&& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

} // namespace kiln::test
