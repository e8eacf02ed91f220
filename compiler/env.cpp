#include "compiler/env.hpp"

#include "compiler/log.hpp"

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <mutex>
#include <set>

namespace kiln::env {

namespace {

// The text as the message shows it: quoted, control and non-ASCII bytes escaped, long ones cut.
std::string shown(std::string_view text) {
    std::string out = "'";
    for (char c : text.substr(0, 64)) {
        if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') out += c;
        else out += fmt::format("\\x{:02x}", (unsigned char)c);
    }
    if (text.size() > 64) out += "...";
    return out + "'";
}

std::string listed(std::initializer_list<std::string_view> choices) {
    std::string out;
    for (std::string_view c : choices) out += fmt::format("{}{}", out.empty() ? "" : ", ", c);
    return out;
}

} // namespace

Parsed<int> parse_choice(std::string_view var, std::string_view text, std::initializer_list<std::string_view> choices) {
    int i = 0;
    for (std::string_view c : choices) {
        if (text == c) return {i, {}};
        ++i;
    }
    return {std::nullopt, fmt::format("{}={} is not understood; valid: {}", var, shown(text), listed(choices))};
}

Parsed<long long> parse_integer(std::string_view var, std::string_view text, long long lo, long long hi) {
    long long v = 0;
    const char* end = text.data() + text.size();
    auto [p, ec] = std::from_chars(text.data(), end, v);
    if (text.empty() || ec != std::errc() || p != end || v < lo || v > hi)
        return {std::nullopt, fmt::format("{}={} is not understood; valid: an integer from {} to {}", var, shown(text), lo, hi)};
    return {v, {}};
}

Parsed<bool> parse_flag(std::string_view var, std::string_view text) {
    Parsed<int> c = parse_choice(var, text, {"0", "1", "false", "true", "no", "yes", "off", "on"});
    if (!c.value) return {std::nullopt, c.problem};
    return {*c.value % 2 == 1, {}};
}

std::optional<std::string> text(const char* var) {
    const char* v = std::getenv(var);
    if (!v || !*v) return std::nullopt;
    return std::string(v);
}

void warn_once(std::string_view var, const std::string& problem) {
    static std::mutex mu;
    static std::set<std::string, std::less<>> warned;
    {
        std::lock_guard<std::mutex> lock(mu);
        if (!warned.emplace(var).second) return;
    }
    log_write(LogLevel::Warn, problem + "; it is ignored");
}

namespace {

template <class T>
std::optional<T> report(const char* var, Parsed<T> p) {
    if (!p.value) warn_once(var, p.problem);
    return p.value;
}

} // namespace

std::optional<int> choice(const char* var, std::initializer_list<std::string_view> choices) {
    const std::optional<std::string> t = text(var);
    return t ? report(var, parse_choice(var, *t, choices)) : std::nullopt;
}

std::optional<long long> integer(const char* var, long long lo, long long hi) {
    const std::optional<std::string> t = text(var);
    return t ? report(var, parse_integer(var, *t, lo, hi)) : std::nullopt;
}

std::optional<bool> flag(const char* var) {
    const std::optional<std::string> t = text(var);
    return t ? report(var, parse_flag(var, *t)) : std::nullopt;
}

} // namespace kiln::env
