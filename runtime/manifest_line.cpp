#include "runtime/manifest_line.hpp"

#include "ir/error.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

namespace kiln {

namespace {

using json = nlohmann::json;

struct Where {
    std::string_view path;
    size_t line;
};

template <typename... Args>
[[noreturn]] void bad(const Where& w, fmt::format_string<Args...> f, Args&&... args) {
    fail(Error::Kind::Value, "{}:{}: {}", w.path, w.line, fmt::format(f, std::forward<Args>(args)...));
}

// A value as the message shows it: JSON, cut after 64 characters.
std::string shown(const json& v) {
    std::string s = v.dump(-1, ' ', true, json::error_handler_t::replace);
    return s.size() > 64 ? s.substr(0, 64) + "..." : s;
}

// A string from the line as a message shows it: as it is when short and printable ASCII, else
// as JSON (control characters escaped, so none reaches the terminal), cut as shown() cuts.
std::string shown(const std::string& s) {
    const bool plain = s.size() <= 64 && std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
    return plain ? s : shown(json(s));
}

// nlohmann's message without its "[json.exception.parse_error.101] parse error at line 1,
// column 5: " or "[json.exception.out_of_range.406] " prefix (the position is the manifest's).
std::string parse_reason(const json::exception& e) {
    std::string m = e.what();
    const size_t column = m.find("column ");
    if (column != std::string::npos) {
        const size_t colon = m.find(": ", column);
        return colon == std::string::npos ? m : m.substr(colon + 2);
    }
    const size_t tag = m.find("] ");   // "[json.exception.out_of_range.406] number overflow ..."
    return tag == std::string::npos ? m : m.substr(tag + 2);
}

constexpr const char* kFields = "\"format\", \"kiln\", \"backend\", \"target\", \"name\" and \"kernel\"";

// The string field `key` ("" when it is missing and not `required`); `what` says what it holds.
std::string string_field(const json& obj, const char* key, bool required, const char* what, const Where& w) {
    const auto it = obj.find(key);
    if (it == obj.end()) {
        if (required) bad(w, "missing field \"{}\" ({}); a manifest line has {}", key, what, kFields);
        return {};
    }
    if (!it->is_string()) bad(w, "field \"{}\" is {} ({}), not a string ({})", key, shown(*it), it->type_name(), what);
    return it->get<std::string>();
}

bool is_cuda_arch(const std::string& t) {
    if (t.size() < 5 || t.size() > 7 || t.rfind("sm_", 0) != 0) return false;
    return t.find_first_not_of("0123456789", 3) == std::string::npos;
}

} // namespace

std::string manifest_line_json(const ManifestLine& l) {
    nlohmann::ordered_json j;
    j["format"] = l.format;
    j["kiln"] = l.kiln;
    j["backend"] = l.backend;
    j["target"] = l.target;
    j["name"] = l.name;
    j["kernel"] = l.kernel;
    return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

ManifestLine parse_manifest_line(std::string_view text, std::string_view path, size_t line_number) {
    const Where w{path, line_number};
    if (text.size() > kMaxManifestLineLength)
        bad(w, "the line has {} bytes; a manifest line has at most {} (kiln writes one kernel's text per line)", text.size(),
            kMaxManifestLineLength);
    json j;
    try {
        const json::parser_callback_t depth_limit = [&](int depth, json::parse_event_t event, json&) {
            if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
                depth >= kMaxManifestJsonDepth)
                bad(w, "JSON nested more than {} levels deep; a manifest line is one flat JSON object", kMaxManifestJsonDepth);
            return true;
        };
        j = json::parse(text.begin(), text.end(), depth_limit);
    } catch (const json::parse_error& e) {
        bad(w, "bad JSON at line {}, column {}: {}; each line of a manifest is one JSON object, such as KILN_RECORD writes",
            line_number, e.byte, parse_reason(e));
    } catch (const json::exception& e) {   // valid syntax the library cannot hold (a number beyond a double)
        bad(w, "bad JSON at line {}: {}; each line of a manifest is one JSON object, such as KILN_RECORD writes", line_number,
            parse_reason(e));
    }
    if (!j.is_object())
        bad(w, "the line is {} ({}), not a JSON object with the fields {}", shown(j), j.type_name(), kFields);

    ManifestLine l;
    l.kiln = string_field(j, "kiln", false, "the kiln version that recorded the line", w);
    const auto f = j.find("format");
    if (f == j.end())
        bad(w, "missing field \"format\" (the manifest format version, {}); a manifest line has {}", kManifestFormat, kFields);
    const bool integral = f->is_number_integer() || f->is_number_unsigned() ||
                          (f->is_number_float() && std::isfinite(f->get<double>()) && std::floor(f->get<double>()) == f->get<double>());
    if (!integral)
        bad(w, "field \"format\" is {} ({}), not an integer (the manifest format version, {})", shown(*f), f->type_name(),
            kManifestFormat);
    if (!(f->is_number_float() ? f->get<double>() == kManifestFormat : *f == kManifestFormat))
        bad(w, "manifest format {} is not one this kiln reads (it reads format {}){}", shown(*f), kManifestFormat,
            l.kiln.empty() ? std::string() : fmt::format("; the line was recorded by kiln {}", shown(l.kiln)));
    l.backend = string_field(j, "backend", true, "where the kernel ran: cuda or cpu", w);
    if (l.backend != "cuda" && l.backend != "cpu") bad(w, "unknown backend {}; valid: cuda, cpu", shown(j.at("backend")));
    l.target = string_field(j, "target", true, "the architecture it ran on: sm_XX, or the CPU's label", w);
    if (l.backend == "cuda" && !is_cuda_arch(l.target))
        bad(w, "target {} is not a CUDA architecture (sm_ and a number, like sm_80 or sm_90) for backend cuda",
            shown(j.at("target")));
    if (l.target.empty()) bad(w, "the target is empty (for backend cpu, the label of the recording CPU, like cpu-x86_64-avx2)");
    l.name = string_field(j, "name", false, "the kernel's name", w);
    l.kernel = string_field(j, "kernel", true, "the kernel text", w);
    if (l.kernel.empty()) bad(w, "field \"kernel\" is empty; it holds the kernel text (\"rank 2|red01|part|...\")");
    return l;
}

} // namespace kiln
