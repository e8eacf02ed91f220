#include "runtime/warmup/manifests.hpp"

#include "compiler/kernel_text.hpp"
#include "runtime/warmup/options.hpp"
#include "ir/error.hpp"
#include "runtime/manifest_line.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

namespace kiln::warmup {

namespace {

constexpr size_t kMaxReported = 20;

enum class LineRead { Line, End, TooLong };

// The next line of `in` without its '\n'; a line longer than `max` is skipped to its end.
LineRead next_line(std::FILE* in, std::string& line, size_t max) {
    line.clear();
    bool any = false, too_long = false;
    for (int c; (c = getc_unlocked(in)) != EOF;) {
        any = true;
        if (c == '\n') break;
        if (line.size() == max) too_long = true;
        else line.push_back((char)c);
    }
    if (too_long) return LineRead::TooLong;
    return any ? LineRead::Line : LineRead::End;
}

bool blank(const std::string& line) { return line.find_first_not_of(" \t\r") == std::string::npos; }

} // namespace

std::map<std::string, Entry> read_manifests(const std::vector<std::string>& paths) {
    std::map<std::string, Entry> entries;
    // The first kMaxReported bad lines' messages, and how many there were in all (a file of
    // random bytes has millions).
    std::vector<std::string> problems;
    size_t bad_lines = 0;
    auto problem = [&](std::string message) {
        if (bad_lines++ < kMaxReported) problems.push_back(std::move(message));
    };
    for (const std::string& path : paths) {
        std::unique_ptr<std::FILE, int (*)(std::FILE*)> in(std::fopen(path.c_str(), "rb"), &std::fclose);
        if (!in) bad_input(fmt::format("cannot read manifest {}: {}", path, std::strerror(errno)));
        size_t lineno = 0;
        std::string line;
        for (LineRead r; (r = next_line(in.get(), line, kMaxManifestLineLength)) != LineRead::End;) {
            ++lineno;
            if (r == LineRead::TooLong) {
                problem(fmt::format("{}:{}: the line is longer than {} bytes; a manifest line holds one kernel", path, lineno,
                                    kMaxManifestLineLength));
                continue;
            }
            if (blank(line)) continue;
            try {
                const ManifestLine ml = parse_manifest_line(line, path, lineno);
                Entry& e = entries[ml.kernel];
                if (e.recorded_archs.empty()) {
                    try {
                        e.kernel = parse_kernel_text(ml.kernel);
                    } catch (const Error& err) {
                        entries.erase(ml.kernel);
                        throw Error(fmt::format("{}:{}: {}", path, lineno, err.what()));
                    }
                }
                // A CPU line's target names the recording host's CPU; it is warmed for this one.
                e.recorded_archs.insert(ml.backend == "cpu" ? std::string(kCpu) : ml.target);
            } catch (const Error& err) {
                problem(err.what());
            }
        }
        if (std::ferror(in.get())) bad_input(fmt::format("cannot read manifest {} after line {}: {}", path, lineno, std::strerror(errno)));
    }
    if (bad_lines > 0) {
        for (const std::string& p : problems) std::fprintf(stderr, "kiln-warmup: %s\n", p.c_str());
        if (bad_lines > kMaxReported)
            std::fprintf(stderr, "kiln-warmup: ... and %zu more bad lines\n", bad_lines - kMaxReported);
        std::fprintf(stderr, "kiln-warmup: %zu bad manifest line%s: nothing was compiled\n", bad_lines,
                     bad_lines == 1 ? "" : "s");
        std::exit(2);
    }
    return entries;
}

} // namespace kiln::warmup
