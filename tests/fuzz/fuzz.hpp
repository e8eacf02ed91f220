// The fuzz suite's harness: seeded inputs made by mutating valid ones (and plain random bytes),
// each run through one parser of outside input, which must accept it or refuse it with a
// kiln::Error whose message starts as the parser's messages do. Anything else fails the test,
// printing the input and how to replay it: another exception (InternalError, std::bad_alloc,
// ...), more memory than the parser's bound (global operator new is counted, alloc_meter.cpp;
// RLIMIT_AS caps the process), a crash or an input that runs for more than a few seconds (a
// signal handler prints the input's number and the seed before the process ends).
//
// Environment (tests/differential uses the same seed variable):
//   KILN_FUZZ_SEED=<s>      base seed (default fixed, so CI runs are reproducible)
//   KILN_FUZZ_INPUTS=<n>    inputs per parser (default: kDefaultInputs, a few seconds each)
//   KILN_FUZZ_VERBOSE=1     print every input before it runs (with the seed and input count a
//                           failure prints, the last one printed is the culprit)
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::fuzz {

// splitmix64: small, fast and the same everywhere.
struct Rng {
    uint64_t state;
    uint64_t next() {
        uint64_t z = (state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    uint64_t below(uint64_t n) { return n ? next() % n : 0; }
    bool chance(unsigned percent) { return below(100) < percent; }
};

struct Target {
    const char* name;                     // "kernel text"
    std::vector<std::string> seeds;       // valid inputs to mutate
    std::string alphabet;                 // characters the format is made of (inserted by mutations)
    std::string error_prefix;             // how every kiln::Error message of the parser starts
    size_t max_alloc_bytes;               // the most one input may allocate at once
    int64_t default_inputs;
    // Runs the parser (and whatever consumes what it accepts); true when it accepted the input.
    // A kiln::Error is a refusal; anything else escaping is a failure.
    std::function<bool(const std::string& input)> run;
};

// Runs the target over its inputs, FAILing (with the input and how to replay it) on anything
// but acceptance or a clear refusal; prints a "fuzz: ..." summary line.
void run_target(const Target& t);

// The input as a C string literal would show it (printable ASCII kept, the rest escaped).
std::string shown(std::string_view input);

// Bytes counted by alloc_meter.cpp.
size_t live_bytes();
size_t peak_bytes_since_reset();
void reset_peak_bytes();

} // namespace kiln::fuzz
