// The CUDA C renderer's emitter: one Kernel to one source, kernel shape by kernel shape. Shared
// pieces (scopes, offsets, expressions, accumulators) are in cuda_codegen.cpp; each kernel shape
// has its file: cuda_elementwise.cpp, cuda_row.cpp, cuda_column.cpp, cuda_full.cpp.
#pragma once
#include "codegen/cuda/cuda_codegen.hpp"
#include "codegen/cuda/cuda_internal.hpp"
#include "ir/error.hpp"

#include <fmt/format.h>

#include <string>
#include <vector>

namespace kiln::codegen::detail {

using kir::AccKind;
using kir::Op;
using kir::StrideKind;
using CT = ComputeType;

// Helpers the emitter's files share (defined in cuda_codegen.cpp).
const char* ctype(CT t);
bool is_arg(AccKind k);
// Kinds whose float states take a row's grouped step at once: arg kinds, max and min.
bool stepped(AccKind k);
std::string acc_struct(const kir::Accum& a);   // the prelude's accumulator kind, e.g. kiln_sum_f
const char* acc_suffix(CT t);                   // f, i, d, l: of acc_struct and the scratch names
std::string float_literal(float f);         // reads back to exactly f
std::string int_literal(int32_t i);
const char* storage_type(DType t);
std::string load_expr(DType t, const std::string& elem);   // storage element -> compute value
std::string store_value(DType t, const std::string& v);    // compute value -> storage element
void validate(const kir::Kernel& k);                       // InternalError for a malformed Kernel

// What a group of instructions and stores touches: buffers, coordinates, the linear index.
struct Uses {
    std::vector<bool> buffers;
    std::vector<bool> coords;   // by Coord
    bool linear_id = false;
};

class Emitter {
public:
    explicit Emitter(const kir::Kernel& k, CudaModuleId module = {}) : k_(k), module_(std::move(module)) {
        for (int d = 0; d < k.rank; ++d) (k.reduced[d] ? rdims_ : pdims_).push_back(d);
        for (size_t bi = 0; bi < k.blocks.size(); ++bi) block_uses_.push_back(uses_of(k.blocks[bi]));
        all_uses_ = Uses{std::vector<bool>(k.buffers.size()), std::vector<bool>(k.rank), false};
        for (auto& u : block_uses_) merge(all_uses_, u);
        load_override_.assign(k.buffers.size(), "");
        for (const kir::Block& b : k.blocks)
            for (const kir::Store& st : b.stores) {
                const DType t = k.buffers[st.buffer].dtype;
                stores_16_ = stores_16_ && (t == DType::Float16 || t == DType::BFloat16);
            }
        find_payload_uses();
    }

    CudaSource run();

private:
    // Where the code being emitted runs: which coordinates are variables and how offsets read.
    enum class Scope {
        Elementwise,   // one thread per domain point, all coordinates from `i`
        PPoint,        // per P point of a reduction: R coordinates are 0
        RLoop,         // inside a loop over R points: every coordinate is a variable
    };

    const kir::Kernel& k_;
    CudaModuleId module_;   // what run() emits: every entry (entry empty), or one row entry for a reach
    std::vector<int> pdims_, rdims_;
    std::vector<Uses> block_uses_;
    Uses all_uses_;
    std::string out_;
    int indent_ = 0;
    Scope scope_ = Scope::Elementwise;
    // Index arithmetic in 32 bits (the small row entry: its launches' every offset fits, which
    // the plan checks): ptxas then spends less on the coordinates and offsets than in 64 bits.
    bool narrow_ = false;
    const char* index_type() const { return narrow_ ? "int" : "long long"; }
    // Every value the kernel stores is a 16-bit float: exp may take the hardware's
    // approximation, whose error lies far below the stored value's rounding step
    // (kiln_exp_fast in the prelude).
    bool stores_16_ = true;
    // The template argument of the prelude's exp helpers: the same exp as Op::Exp.
    const char* fast_exp() const { return stores_16_ ? "true" : "false"; }
    // Row kernels, per instruction: an exp whose only use is a sum of exponentials about the
    // row's max (a softmax fold's, taken as a round of its own from registers), which may
    // flush terms below float's normal range (kiln_exp_sum_fast).
    std::vector<bool> sum_exp_;
    // 16-bit NaNs. The exact conversions keep a NaN's payload; the hardware's give the canonical
    // NaN, and so does the GPU's float arithmetic (canonicalising: add, sub, mul, div, sqrt,
    // exp). Where a loaded value only feeds such arithmetic or ops blind to payloads
    // (comparisons, conversion to integer, finiteness, a select's condition, a float sum, an arg
    // reduction), both
    // conversions give the same results, and the loads skip the NaN test; where a stored value
    // comes from such arithmetic it is the canonical NaN, which both conversions to 16 bits
    // turn into the same bits, and the stores skip theirs. payload_seen_: per instruction, some
    // use can carry its NaN's payload on.
    std::vector<bool> payload_seen_;
    void find_payload_uses();
    static bool canonicalising(const kir::Instr& in);
    // Whether some Load of `buf` in block `bi` (any block when bi < 0) needs the exact conversion.
    bool needs_exact_load(size_t buf, int bi) const;
    // Whether a store of `buf` in block `bi` (any block when bi < 0) needs the exact conversion.
    bool needs_exact_store(size_t buf, int bi) const;
    // Per buffer: when set, what a Load of it reads (a register holding the converted value).
    std::vector<std::string> load_override_;
    // Row kernels, per buffer: when set, the element already loaded (by a 16-byte load).
    std::vector<std::string> preloaded_;
    // Row kernels, per buffer: when set, where a store of it puts the (compute-type) value, to
    // be packed into a 16-byte store afterwards.
    std::vector<std::string> store_to_;
    // Row kernels, per instruction: computed once per row before the loop (row_invariant).
    std::vector<bool> hoisted_;
    // Row kernels: the folds (detail::row_folds) the pass being emitted also
    // computes, and how each element enters them: into the step's array mv<acc>[u] (grouped
    // path) or one by one.
    std::vector<detail::RowFold> folds_now_;
    bool folds_grouped_ = false;
    // Row kernels' grouped steps: sums of the values a moments fold also takes, which gain the
    // step's sum (the fold computes it for the step's mean) instead of each element.
    std::vector<bool> step_summed_;
    // Row kernels' grouped steps: float arg, max and min kinds, whose step's values gather in
    // av<acc>[u] and enter the state at once (kiln_arg_step, kiln_ext_step) instead of element by
    // element.
    std::vector<bool> step_arg_;
    // Of those, per accumulator, the step's 16-bit words holding its values, where the value is
    // such a load (kiln_*_step16 take the extreme from the words; an arg kind then needs no
    // floats, av<acc> left out).
    std::vector<std::string> step_words_;
    // Whether a grouped step gathers accumulator ai's values as floats (av<ai>).
    bool step_floats(int ai) const {
        return step_arg_[ai] && (!is_arg(k_.accums[ai].kind) || step_words_.empty() || step_words_[ai].empty());
    }
    // Row kernels: accumulators whose state a fold gives (the max a sum of exponentials keeps
    // anyway), not accumulated element by element.
    std::vector<bool> from_fold_;
    // Accumulating a thread's elements in position order (a row's grouped steps): add_next.
    bool in_order_ = false;

    template <typename... T>
    void line(fmt::format_string<T...> f, T&&... args) {
        out_.append(4 * indent_, ' ');
        out_ += fmt::format(f, std::forward<T>(args)...);
        out_ += '\n';
    }
    void open(const std::string& head) {
        if (head.empty()) line("{{");
        else line("{} {{", head);
        ++indent_;
    }
    void close() { --indent_; line("}}"); }

    static void merge(Uses& into, const Uses& u);

    Uses uses_of(const kir::Block& b) const;

    // Coordinates among `dims` that code with uses `u` reads, in the current scope.
    std::vector<bool> needed_coords(const Uses& u, const std::vector<int>& dims, bool linear_from_coords) const;

    std::string size(int d) const { return fmt::format("{}a.sizes[{}]", narrow_ ? "(int)" : "", d); }

    std::string product(const std::vector<int>& dims) const;

    // Declares `c<d>` for the needed dims of `dims` from their row-major flattened index `lin`.
    void emit_coords(const std::vector<int>& dims, const std::string& lin, const std::vector<bool>& need,
                     const std::string& tmp);

    // sum over `dims` of c<d> * stride, constants folded from the layout; "" when empty.
    std::string offset_terms(int b, const std::vector<int>& dims) const;

    // Offset expression of buffer b in the current scope (variables declared by the scope).
    std::string offset(int b) const;

    std::string coord(int d) const;

    std::string linear_id() const;

    // Per-column names of the column kernels' vector entry (several parallel points per
    // thread): appended to every value, accumulator and offset name; empty elsewhere.
    std::string col_;
    std::string v(int id) const { return fmt::format("v{}{}", id, col_); }
    std::string acc(int ai) const { return fmt::format("acc{}{}", ai, col_); }

    std::string expr(const kir::Instr& in) const;
    std::string wide_expr(const kir::Instr& in, const std::string& x, const std::string& y) const;
    std::string width_free_expr(const kir::Instr& in, const std::string& x, const std::string& y) const;
    static std::string double_function(const char* c_function);

    void emit_instrs(const kir::Block& b);

    void emit_stores(const kir::Block& b);

    // ---- numerics histogram (kir::Hist): each entry point zeroes a block histogram in shared
    // memory at its start, every store to a counted buffer adds its value there, and the block
    // adds its counts to LaunchArgs::hist at the end (close_kernel).
    void emit_hist_count(int buffer, const std::string& value);
    void close_kernel();

    // ---- pieces shared by the kernels

    void emit_args_struct();

    void emit_buffer_pointers(const Uses& u);

    void emit_scratch();
    void declare_acc_scratch(int n);

    void declare_acc_results(const kir::Block& b);
    void init_acc_states(const kir::Block& b);
    void add_to_acc_states(const kir::Block& b, const std::string& pos);
    void block_reduce_acc_states(const kir::Block& b);
    // A partial-reduction record at `rec` (cuda_codegen.hpp: accumulator i's value at byte
    // S * i, its position at S * i + S / 2, S = acc_record_slot): written from the block's
    // states, or folded into them (read past L1, which may hold an older copy of another
    // block's record: the combining block reads what other multiprocessors wrote).
    void store_acc_record(const kir::Block& b);
    void fold_acc_record(const kir::Block& b);
    // After the block's records: thread 0 counts the block's arrival at `counter` (a word of the
    // zeroed counters) after a barrier; the block that brings it to `arrivals` sets the shared
    // kiln_last and the word back to zero for the next launch; a barrier, then every thread
    // reads kiln_last.
    void emit_last_arrival(const std::string& counter, const std::string& arrivals);
    // An Arg accumulator that saw no point (an empty R domain) yields position 0.
    void set_acc_results(const kir::Block& b);

    // Declares o<b> for the buffers the block uses, inside an R loop: P part plus R part.
    void emit_rloop_offsets(const Uses& u);

    // The body of a Loop block for one R point at flattened R index `ri`.
    // walked: the coordinates are kept in k<d> (a full reduction's walk), not divided out of ri.
    void emit_rloop_body(size_t bi, bool walked = false);

    // ---- the kernels

    // counters: the entry takes a fourth parameter, the launch's words of zeroed counters
    // (CudaLaunchPlan::counters).
    std::string signature(const std::string& entry, int max_threads, int min_blocks, bool counters) const;
    // Opens a kernel's body: its signature, then the wait for the grids before it in the stream
    // (the runtime may launch it before they end; kiln_after_prior_grids in the prelude).
    void open_kernel(const std::string& entry, int max_threads, int min_blocks = 1, bool counters = false);

    void emit_elementwise_kernel();

    void emit_pbase_offsets();

    // ---- row reductions (see cuda_codegen.hpp): G threads per row, the row in shared memory

    // Column kernels: per_thread parallel points per thread (the vector entry's V).
    // folds: the row folds' scratch too (not in the register entry, which has none).
    void emit_reduce_scratch(bool row, int per_thread = 1, bool folds = true, bool cluster = false);

    // Loop block `bi` at R point `ri`, element `j` of this thread: loads of cached buffers go
    // through the row cache (stored by their first pass, read by the later ones).
    void emit_row_element(size_t bi, const std::vector<int>& slot, const std::vector<int>& first_use,
                          const std::string& j);

    int row_vector_width() const { return detail::row_vector_width(k_); }
    // log2 of row_vector_width (a power of two).
    int row_vector_shift() const {
        int s = 0;
        while ((1 << s) < row_vector_width()) ++s;
        return s;
    }

    // The R index of this thread's element `j` (see row_vector_width).
    std::string row_index(const std::string& j) const;
    // Its index in the thread's part of a row cache region.
    std::string cache_index(const std::string& j) const;

    // Per P point `pi`: the coordinates and the buffers' P offsets.
    void emit_ppoint_setup();

    // A Point block: every thread computes it (later blocks may read its values); the threads
    // for which `who` holds store.
    void emit_point_block(const kir::Block& b, const std::string& who);
    void emit_fold_values();
    // A column kernel's folded Loop block (detail::column_folds): its accumulators from the
    // column's moments, M2 + n (mean - k)^2.
    void emit_column_folded_block(size_t bi, const std::vector<detail::RowFold>& folds, const std::string& guard);
    void emit_moments_step(const detail::RowFold& f, int n);

    int first_loop_block() const;

    std::vector<int> row_invariant(const kir::Block& b) const;

    // Shared: the entry NAME (the row cache in shared memory, every case); Registers: NAME_r
    // (detail::row_register_entry), the row's cached groups in registers, aligned rows only;
    // Small: NAME_s, for launches of few elements (kCudaSmallRowElements), element by element.
    enum class RowEntry { Shared, Registers, Small };
    void emit_row_kernel(RowEntry entry);

    // ---- column reductions: column_width parallel points x slices of the reduced points per block

    void emit_column_kernel();
    void emit_column_entry(int vec);
    std::vector<size_t> column_step_loads(const kir::Block& b) const;
    void fold_column_record(const std::string& column, const std::vector<detail::RowFold>& folds);
    void emit_column_combine(int width);
    void emit_column_final_kernel();

    // ---- the vector path of contiguous rank-1 elementwise kernels

    // Rank 1, every buffer contiguous or a broadcast scalar, no gathers or coordinates.
    bool vectorisable() const;

    // Elements per thread on the vector path: 16 bytes of the widest contiguous buffer.
    int vector_width() const;
    // A word holding `n` elements of `t` (4, 8 or 16 bytes), the expression of element `lane` of
    // word w, and the statement replacing it with storage value v.
    static const char* word_type(DType t, int n);
    static std::string word_part(DType t, int n, const std::string& w, int lane, int* shift);
    static std::string word_element(DType t, int n, const std::string& w, int lane);
    static std::string word_store(DType t, int n, const std::string& w, int lane, const std::string& v);
    // Lines setting dst[base + l] (compute type) from the n elements of word w, and word w from
    // src[base + l]; 16-bit floats convert two elements at a time.
    // How a float16 word becomes floats (emit_unpack): the paired hardware conversions and a test
    // of the word for a NaN that redoes it exactly; the hardware's alone (the caller has tested
    // for NaNs); or the exact conversions alone. bfloat16 widens exactly in every mode.
    enum class Unpack { Tested, Hardware, Exact };
    void emit_unpack(DType t, int n, const std::string& w, const std::string& dst, int base,
                     Unpack mode = Unpack::Tested);
    // exact = false: the values are canonical where NaN (needs_exact_store), no test.
    void emit_pack(DType t, int n, const std::string& w, const std::string& src, int base, bool exact = true);

    // n elements per thread with one load and one store of up to 16 bytes per contiguous
    // buffer, when every contiguous buffer is aligned for it; the scalar loop does the rest.
    void emit_vector_path();
    size_t record_bytes() const { return (size_t)detail::acc_record_slot(k_) * k_.accums.size(); }

    int full_vector_width() const;
    void emit_full_kernel();
    void emit_full_combine();
};

} // namespace kiln::codegen::detail
