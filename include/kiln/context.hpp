// Context: the factory of tensors and the place expressions run (the seeds' NervanaGPU).
// It owns the backend (CUDA through the Driver API when a device is present, else the CPU
// through LLVM ORC JIT), the plan and kernel caches, the RNG state and the counters.
// KILN_BACKEND=cpu|cuda forces the backend; KILN_VALIDATE=cpu checks every CUDA kernel
// against the CPU backend.
#pragma once
#include <kiln/export.hpp>
#include <kiln/tensor.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kiln {

enum class Backend { CPU, CUDA };

struct ContextOptions {
    std::string device;                 // "cpu", "cuda", "cuda:N"; empty: KILN_BACKEND, else the best available
    uint64_t seed = 0;                  // RNG seed
    DType default_dtype = DType::Float32;
    // Stores to float16/bfloat16 round stochastically, keeping this many mantissa bits (1..10;
    // bfloat16 keeps at most 7), with random bits from the context's RNG (reproducible for a
    // seed); 0: round to nearest even. See Context::set_stochastic_round.
    int stochastic_round = 0;
    // float32 GEMMs may use tf32 tensor cores (10-bit mantissa products, float32 accumulation):
    // several times faster, less exact. Off by default: float32 means float32 arithmetic.
    bool allow_tf32 = false;
    // The most kernels the in-memory kernel cache keeps (least recently used evicted, with the
    // cached plans that use them); 0: KILN_KERNEL_CACHE, else 1024 (about 55 KB each on the CPU).
    size_t kernel_cache_capacity = 0;
    // neon's bench mode (Context::set_bench): every call that runs kernels (an assignment, a
    // GEMM, a convolution, a layer operation) is timed on the context's stream (CUDA events;
    // the host clock on the CPU), waited for, printed as one line on stderr with its rate, and
    // kept in bench_log(). Off: no cost beyond a flag test per call.
    bool bench = false;
};

// One timed call of bench mode: what ran (op: "assign", "compound_dot", "fprop_conv", ...;
// detail: dtypes and shapes), its time, and the bytes it moved and the flops it computed as
// counted from its operands (0 where not counted).
struct BenchRecord {
    std::string op;
    std::string detail;
    double ms = 0;
    double bytes = 0;
    double flops = 0;
    int depth = 0;   // 1 for a call made inside another timed call (a GEMM inside a convolution), ...
};

// The random stream's state: the seed its draws are keyed on and how many draws (random
// tensors, stochastically rounded stores) it has made.
struct RngState {
    uint32_t seed = 0;
    uint32_t counter = 0;
    bool operator==(const RngState&) const = default;
};

// A timing mark (neon's init_mark): a point in the order of a context's work, placed by
// Context::record_mark. Copies share the mark.
class KILN_API Mark {
public:
    Mark() = default;
    bool recorded() const { return recorded_; }
    bool made_by(const Context& ctx) const { return handle_ && owner_ == &ctx; }

private:
    friend class Context;
    std::shared_ptr<void> handle_;   // the backend's: a CUDA event, or a host time
    const void* owner_ = nullptr;    // the context that made it
    bool recorded_ = false;
};

struct Counters {
    uint64_t compiles = 0;          // kernels compiled (JIT)
    uint64_t memory_hits = 0;       // kernels found in the in-memory cache
    uint64_t disk_hits = 0;         // kernels loaded from the disk cache (CUDA cubins, CPU objects)
    uint64_t plan_hits = 0;         // assignments that reused a cached plan (no pass ran)
    uint64_t plan_resizes = 0;      // assignments whose plan is another shape's resized (no pass ran)
    double compile_ms = 0;          // time spent compiling
    uint64_t launches = 0;          // kernels run
    uint64_t assignments = 0;       // expressions evaluated
    uint64_t cached_kernels = 0;    // kernels in the in-memory cache now (at most its capacity)
};

class KILN_API Context {
public:
    explicit Context(ContextOptions opts = {});
    ~Context();
    Context(const Context&) = delete;
    Context& operator=(const Context&) = delete;

    // The process-wide context used where none is given (created on first use).
    static Context& default_context();

    Backend backend() const;
    std::string device_name() const;          // "cpu", "cuda:0"
    std::string device_description() const;   // with the device's name, arch and memory
    DType default_dtype() const;
    Device device() const;                    // where this context's tensors live
    // The CUstream every kernel and copy of this context is ordered on (CUDA); 0 on the CPU.
    // Work from another stream that this context must see has to be ordered before it.
    uintptr_t stream_handle() const;
    // Whether this context may read and write `t` (one rule for every operation): host memory
    // is any CPU context's; device memory only the context's that made or wrapped it, since
    // that context's stream orders the work on it.
    bool can_use(const Tensor& t) const;

    // ---- tensors
    Tensor empty(const Shape& shape);
    Tensor empty(const Shape& shape, DType dtype);
    Tensor zeros(const Shape& shape, DType dtype);
    Tensor zeros(const Shape& shape) { return zeros(shape, default_dtype()); }
    Tensor ones(const Shape& shape, DType dtype);
    Tensor ones(const Shape& shape) { return ones(shape, default_dtype()); }
    Tensor full(const Shape& shape, double value, DType dtype);
    Tensor arange(int64_t n, DType dtype);
    // Host data (row-major, `src_dtype` values) copied into a new tensor of `dtype`.
    Tensor array(const void* data, size_t count, DType src_dtype, const Shape& shape, DType dtype);
    template <typename T>
    Tensor array(const std::vector<T>& data, const Shape& shape) { return array(data, shape, dtype_of<T>()); }
    template <typename T>
    Tensor array(const std::vector<T>& data, const Shape& shape, DType dtype);
    Tensor array(const std::vector<double>& data, const Shape& shape, DType dtype);
    // A tensor over memory kiln does not own (a host application's buffer, a DLPack or
    // __cuda_array_interface__ producer): `data` is the element at index (0, ..., 0), `strides`
    // are in elements (empty: row-major; negative and zero allowed), and `device` must be this
    // context's device. Nothing is copied; `release` runs once the last view of it is gone.
    // The memory counts as written: kiln reads whatever it holds.
    Tensor wrap(void* data, DType dtype, const Shape& shape, const Strides& strides, Device device,
                std::function<void()> release = {});

    // ---- evaluation
    void assign(Tensor& dst, const Expr& e);
    // Several assignments in one call, with the effect of assign() on each in order (an error
    // in one leaves those before it done). Where every expression is a reduction over the same
    // axes of the same shape, into destinations that no expression reads (a tensor's sum beside
    // its sum of squares) and none draws random numbers, one kernel stores them all and reads
    // the operands they share once.
    void assign_together(const std::vector<std::pair<Tensor*, Expr>>& list);
    Tensor eval(const Expr& e);
    Expr rand(const Shape& shape) { return kiln::rand(shape); }

    // ---- state
    void seed(uint64_t s);
    // The random stream's position: the draws (rand, stochastic rounding) from a state are the
    // same on every backend. set_rng_state returns to a state rng_state gave; rng_reset to the
    // state right after the last seeding (the constructor's seed, or seed()).
    RngState rng_state() const;
    void set_rng_state(const RngState& s);
    void rng_reset();
    // Stochastic rounding of 16-bit float stores, as in the seeds: `bits` mantissa bits kept
    // (1..10), 0 = off; true = 10 (float16's whole mantissa), false = off.
    void set_stochastic_round(int bits);
    void set_stochastic_round(bool on) { set_stochastic_round(on ? 10 : 0); }
    int stochastic_round() const;
    // See ContextOptions::allow_tf32.
    void set_allow_tf32(bool on);
    bool allow_tf32() const;
    Counters counters() const;
    void reset_counters();
    // Appends every kernel this context compiles or loads from now on to the manifest at
    // `path` (JSON lines; docs/warmup.md), for kiln-warmup; "" stops. KILN_RECORD=path does
    // this for every context.
    void record_to(const std::string& path);
    void synchronize();
    // Work submitted to the CUDA stream `stream` (a CUstream; 1 and 2 are the legacy and
    // per-thread default streams) from now on waits for everything this context has submitted
    // so far, without blocking the host. Nothing to do on the CPU.
    void order_before(uintptr_t stream);
    // The reverse: this context's later work waits for what `stream` has been given so far.
    void wait_for(uintptr_t stream);
    // ---- timing marks (neon's init_mark, record_mark, synchronize_mark, get_time)
    Mark init_mark();
    // Places `m` after everything this context has been given so far (no host wait).
    void record_mark(Mark& m);
    // Returns once the work before `m` has finished.
    void synchronize_mark(const Mark& m);
    // Milliseconds of the context's work between two recorded marks (CUDA events on a GPU).
    double elapsed_ms(const Mark& start, const Mark& end);
    // ---- bench mode (ContextOptions::bench)
    void set_bench(bool on);
    bool bench() const;
    // The timed calls so far, oldest first (the last 4096).
    std::vector<BenchRecord> bench_log() const;
    void clear_bench_log();

    struct Impl;

private:
    // The library's own code reaches the state through context_impl (runtime/context_impl.hpp).
    friend Impl& context_impl(Context& c);
    std::unique_ptr<Impl> impl_;
};

template <typename T>
Tensor Context::array(const std::vector<T>& data, const Shape& shape, DType dtype) {
    if constexpr (std::is_same_v<T, bool>) {
        std::vector<uint8_t> tmp(data.begin(), data.end());
        return array(tmp.data(), tmp.size(), DType::Bool, shape, dtype);
    } else {
        return array(data.data(), data.size(), dtype_of<T>(), shape, dtype);
    }
}

// Evaluates `e` on the context of its first tensor operand (else the default context).
KILN_API Tensor eval(const Expr& e);

} // namespace kiln
