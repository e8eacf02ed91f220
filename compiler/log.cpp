#include "compiler/log.hpp"

#include "compiler/env.hpp"

#include <cstdio>
#include <mutex>

namespace kiln {

LogLevel log_level() {
    // The choices in LogLevel's order.
    static const LogLevel level =
        (LogLevel)env::choice("KILN_LOG", {"error", "warn", "info", "debug"}).value_or((int)LogLevel::Warn);
    return level;
}

void log_write(LogLevel level, const std::string& text) {
    static std::mutex mu;
    static const char* names[] = {"error", "warn", "info", "debug"};
    std::lock_guard<std::mutex> lock(mu);
    std::fprintf(stderr, "kiln[%s] %s%s", names[(int)level], text.c_str(), text.empty() || text.back() != '\n' ? "\n" : "");
}

} // namespace kiln
