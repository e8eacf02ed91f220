#include "compiler/log.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace kiln {

LogLevel log_level() {
    static const LogLevel level = [] {
        const char* e = std::getenv("KILN_LOG");
        if (!e) return LogLevel::Warn;
        if (!std::strcmp(e, "debug")) return LogLevel::Debug;
        if (!std::strcmp(e, "info")) return LogLevel::Info;
        if (!std::strcmp(e, "error")) return LogLevel::Error;
        return LogLevel::Warn;
    }();
    return level;
}

void log_write(LogLevel level, const std::string& text) {
    static std::mutex mu;
    static const char* names[] = {"error", "warn", "info", "debug"};
    std::lock_guard<std::mutex> lock(mu);
    std::fprintf(stderr, "kiln[%s] %s%s", names[(int)level], text.c_str(), text.empty() || text.back() != '\n' ? "\n" : "");
}

} // namespace kiln
