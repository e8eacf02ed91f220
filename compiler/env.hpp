// Reading kiln's environment variables (KILN_LOG, KILN_PDL, KILN_NUM_THREADS, ...).
//
// Why it exists: a variable is outside input like any other. Each has a set of valid values,
// and a value outside it must neither crash nor be ignored silently: it gets one warning on
// stderr, naming the variable, the value and the valid values, and then counts as unset. The
// parsers are pure functions of the text (tested directly, and by the fuzz suite); the readers
// add getenv and the warning. A variable set to the empty string counts as unset.
#pragma once
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

namespace kiln::env {

// A value's meaning, or (value empty) `problem`: why the text is not valid, naming the
// variable, the text and the valid values.
template <class T>
struct Parsed {
    std::optional<T> value;
    std::string problem;
};

// One of `choices`, exactly; the result is its position in the list.
Parsed<int> parse_choice(std::string_view var, std::string_view text, std::initializer_list<std::string_view> choices);
// A decimal integer in [lo, hi] and nothing else (no sign for lo >= 0, no spaces, no units).
Parsed<long long> parse_integer(std::string_view var, std::string_view text, long long lo, long long hi);
// 1, true, yes, on / 0, false, no, off.
Parsed<bool> parse_flag(std::string_view var, std::string_view text);

// The variable's text; nullopt when unset or empty.
std::optional<std::string> text(const char* var);

// The readers: nullopt when unset or empty, and when not valid (after the warning).
std::optional<int> choice(const char* var, std::initializer_list<std::string_view> choices);
std::optional<long long> integer(const char* var, long long lo, long long hi);
std::optional<bool> flag(const char* var);

// Prints "kiln[warn] <problem>; it is ignored" to stderr, the first time for each variable.
// Whatever KILN_LOG says: a configuration that is not understood is always worth saying.
void warn_once(std::string_view var, const std::string& problem);

} // namespace kiln::env
