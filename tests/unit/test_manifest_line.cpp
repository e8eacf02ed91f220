// Manifest lines as JSON (runtime/manifest_line.hpp): any valid JSON spelling of a line reads
// the same (as another tool may re-serialise it), what kiln writes reads back whatever its
// fields hold, and each kind of bad line is a kiln::Error naming the file, the line and what is
// valid.
#include "tests/support/catch.hpp"
#include "tests/support/sample_kernels.hpp"

#include "compiler/kernel_text.hpp"
#include "ir/error.hpp"
#include "runtime/manifest_line.hpp"

#include <string>

using namespace kiln;

namespace {

// The message of the kiln::Error that reading `line` as line 7 of m.jsonl throws ("" when none).
std::string line_error(const std::string& line) {
    try {
        parse_manifest_line(line, "m.jsonl", 7);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

} // namespace

TEST_CASE("manifest line: what kiln writes reads back, fields escaped as JSON needs") {
    const std::string kernel = kernel_text(test::sample_kernels()[0]);
    const ManifestLine l{kManifestFormat, "0.1.0", "cuda", "sm_90", "kiln_0123456789abcdef", kernel};
    const std::string json = manifest_line_json(l);
    CHECK(json == R"({"format":1,"kiln":"0.1.0","backend":"cuda","target":"sm_90","name":"kiln_0123456789abcdef","kernel":")" +
                      kernel + "\"}");
    const ManifestLine back = parse_manifest_line(json, "m.jsonl", 1);
    CHECK(back.kernel == kernel);
    CHECK(back.backend == "cuda");
    CHECK(back.target == "sm_90");
    CHECK(back.kiln == "0.1.0");
    // Quotes, backslashes, control characters and non-ASCII text in a field survive the trip.
    const ManifestLine odd{kManifestFormat, "dev \"q\" \\ \t\n", "cpu", "cpu-\"x\"\\é", "n\x01", "k"};
    const ManifestLine odd_back = parse_manifest_line(manifest_line_json(odd), "m.jsonl", 1);
    CHECK(odd_back.kiln == odd.kiln);
    CHECK(odd_back.target == odd.target);
    CHECK(odd_back.name == odd.name);
}

TEST_CASE("manifest line: other valid JSON spellings of a line read the same") {
    const std::string kernel = kernel_text(test::sample_kernels()[0]);
    // Python's json.dumps: spaces after ':' and ','.
    const std::string python = R"({"format": 1, "kiln": "0.1.0", "backend": "cuda", "target": "sm_90", "name": "x", "kernel": ")" +
                               kernel + "\"}";
    CHECK(parse_manifest_line(python, "m.jsonl", 1).kernel == kernel);
    // Other key order, whitespace around everything, \u escapes, extra fields, a trailing CR.
    const std::string other = " {\"kernel\" : \"" + kernel + "\",\t\"backend\":\"\\u0063uda\", \"target\":\"sm\\u005f80\","
                              " \"extra\": {\"nested\": [1, 2]}, \"format\": 1.0 } \r";
    const ManifestLine l = parse_manifest_line(other, "m.jsonl", 1);
    CHECK(l.backend == "cuda");
    CHECK(l.target == "sm_80");
    CHECK(l.kernel == kernel);
    CHECK(l.kiln.empty());
    CHECK(l.name.empty());
}

TEST_CASE("manifest line: each bad line is an error naming the file, the line and what is valid") {
    const std::string ok_fields = R"("backend":"cuda","target":"sm_90","kernel":"rank 0")";
    // Malformed JSON: the column and the parser's reason.
    std::string m = line_error(R"({"format":1,"backend":"cuda")");
    CHECK(m == "m.jsonl:7: bad JSON at line 7, column 29: syntax error while parsing object - unexpected end of input; "
               "expected '}'; each line of a manifest is one JSON object, such as KILN_RECORD writes");
    m = line_error(R"({"format":1,})");
    CHECK(m.rfind("m.jsonl:7: bad JSON at line 7, column 13: ", 0) == 0);
    CHECK(line_error("{\"format\":1,\"kernel\":\"a\xff\"}").rfind("m.jsonl:7: bad JSON at line 7", 0) == 0);
    CHECK(line_error(std::string(100, '[')).find("nested more than 16 levels deep") != std::string::npos);
    CHECK(line_error(R"({"format":1E1986})") ==
          "m.jsonl:7: bad JSON at line 7: number overflow parsing '1E1986'; each line of a manifest is one JSON object, "
          "such as KILN_RECORD writes");
    // Not an object; missing fields; wrong types.
    CHECK(line_error("[1,2]") == "m.jsonl:7: the line is [1,2] (array), not a JSON object with the fields \"format\", "
                                 "\"kiln\", \"backend\", \"target\", \"name\" and \"kernel\"");
    CHECK(line_error(R"({"backend":"cuda"})").rfind("m.jsonl:7: missing field \"format\" (the manifest format version, 1)", 0) == 0);
    CHECK(line_error(R"({"format":1,"backend":"cuda","target":"sm_90"})")
              .rfind("m.jsonl:7: missing field \"kernel\" (the kernel text)", 0) == 0);
    CHECK(line_error(R"({"format":"1",)" + ok_fields + "}") ==
          "m.jsonl:7: field \"format\" is \"1\" (string), not an integer (the manifest format version, 1)");
    CHECK(line_error(R"({"format":1,"backend":"cuda","target":90,"kernel":"rank 0"})") ==
          "m.jsonl:7: field \"target\" is 90 (number), not a string (the architecture it ran on: sm_XX, or the CPU's label)");
    // A format version this kiln does not read; an unknown backend; a target that is not one.
    CHECK(line_error(R"({"format":2,"kiln":"9.0",)" + ok_fields + "}") ==
          "m.jsonl:7: manifest format 2 is not one this kiln reads (it reads format 1); the line was recorded by kiln 9.0");
    // A version that is not short printable ASCII is shown as JSON, escaped and cut: no control
    // character reaches the terminal, and a megabyte of it is not printed.
    const std::string esc = line_error(R"({"format":2,"kiln":"\u001b]0;x\u0007\u001b[2J)" + std::string(1000000, 'A') +
                                       "\"," + ok_fields + "}");
    CHECK(esc.rfind("m.jsonl:7: manifest format 2 is not one this kiln reads (it reads format 1); the line was recorded by "
                    "kiln \"\\u001b]0;x\\u0007\\u001b[2JAAA",
                    0) == 0);
    CHECK(esc.size() < 300);
    CHECK(esc.find('\x1b') == std::string::npos);
    CHECK(line_error(R"({"format":1,"backend":"gpu","target":"sm_90","kernel":"rank 0"})") ==
          "m.jsonl:7: unknown backend \"gpu\"; valid: cuda, cpu");
    CHECK(line_error(R"({"format":1,"backend":"cuda","target":"sm90","kernel":"rank 0"})") ==
          "m.jsonl:7: target \"sm90\" is not a CUDA architecture (sm_ and a number, like sm_80 or sm_90) for backend cuda");
    CHECK(line_error(R"({"format":1,"backend":"cuda","target":"sm_90","kernel":""})").find("field \"kernel\" is empty") !=
          std::string::npos);
    // A line longer than any kiln writes is refused unread.
    CHECK(line_error(std::string(kMaxManifestLineLength + 1, ' ')).find("a manifest line has at most") != std::string::npos);
}
