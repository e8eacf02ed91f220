// KILN_LOG=error|warn|info|debug (default warn) controls what kiln prints to stderr; another
// value is warned about once (compiler/env.hpp) and leaves the default.
#pragma once
#include <fmt/format.h>

#include <string>

namespace kiln {

enum class LogLevel { Error = 0, Warn = 1, Info = 2, Debug = 3 };

LogLevel log_level();  // read once from KILN_LOG
void log_write(LogLevel level, const std::string& text);

template <typename... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... args) {
    if (log_level() >= LogLevel::Debug) log_write(LogLevel::Debug, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
    if (log_level() >= LogLevel::Info) log_write(LogLevel::Info, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
    if (log_level() >= LogLevel::Warn) log_write(LogLevel::Warn, fmt::format(f, std::forward<Args>(args)...));
}

} // namespace kiln
