// kiln.Context: the seeds' NervanaGPU factory. Its operation methods follow neon's backend:
// reductions keep their dimensions (keepdims=True), argmax/argmin default to axis=1, and each
// returns a lazy expression unless out= receives the value. The Python package subclasses it
// for the constructor's keyword spellings and the host-data factories (array, zeros, ...).
#include "ops.hpp"

#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

namespace kiln::py {

namespace {

using namespace nb::literals;

// The Context's own handle when an expression has no tensor operand (ng.rand(), ng.add(1, 2)).
nb::handle ctx_or(nb::handle found, nb::handle self) { return found.is_valid() && !found.is_none() ? found : self; }

} // namespace

void bind_context(nb::module_& m) {
    nb::enum_<DType>(m, "DType", "kiln's storage dtypes.")
        .value("float32", DType::Float32)
        .value("float16", DType::Float16)
        .value("bfloat16", DType::BFloat16)
        .value("int32", DType::Int32)
        .value("int8", DType::Int8)
        .value("uint8", DType::UInt8)
        .value("bool", DType::Bool)
        .value("float64", DType::Float64)
        .value("int64", DType::Int64)
        .value("int16", DType::Int16)
        .value("uint16", DType::UInt16)
        .value("uint32", DType::UInt32)
        .value("uint64", DType::UInt64);
    m.def("_dtype_from_name", [](const std::string& name) -> nb::object {
        DType d;
        if (!parse_dtype(name, d)) return nb::none();
        return nb::cast(d);
    });
    m.def("_promote", &promote, "The dtype two operands of these dtypes promote to (NumPy's rules).");
    m.def("assign_together", [](nb::handle pairs) {
        const char* op = "assign_together";
        if (!nb::isinstance<nb::sequence>(pairs) || nb::isinstance<nb::str>(pairs))
            throw Error(fmt::format("{}: takes a list of (tensor, value) pairs, not {}", op,
                                    nb::str(nb::type_name(pairs.type())).c_str()), Error::Kind::Type);
        std::vector<PyTensor> dsts;
        std::vector<Expr> values;
        for (nb::handle item : nb::borrow<nb::sequence>(pairs)) {
            if (!nb::isinstance<nb::tuple>(item) || nb::len(item) != 2 || !nb::isinstance<PyTensor>(item[0]))
                throw Error(fmt::format("{}: each item must be a (tensor, value) pair; got {}", op,
                                        nb::str(nb::repr(item)).c_str()), Error::Kind::Type);
            dsts.push_back(*nb::inst_ptr<PyTensor>(item[0]));
            nb::handle ctx = dsts.back().ctx;
            values.push_back(operand(item[1], ctx, op));
            if (!dsts.front().ctx.is(dsts.back().ctx))
                throw Error(fmt::format("{}: every destination must belong to one context", op), Error::Kind::Value);
        }
        if (dsts.empty()) return;
        std::vector<std::pair<Tensor*, Expr>> list;
        for (size_t i = 0; i < dsts.size(); ++i) list.emplace_back(&dsts[i].t, values[i]);
        PyContext& pc = owner(dsts.front());
        run_unlocked(pc, [&] { pc.c().assign_together(list); });
        pc.last = values.back();
    }, "pairs"_a, nb::sig("def assign_together(pairs: list[tuple[Tensor, Tensor | Expr | float | int | bool]]) -> None"),
       "dst[...] = value for each (dst, value) pair, in order. Where the values are reductions over the same axes "
       "of the same shape, into destinations that no value reads (a sum beside a sum of squares), one kernel "
       "computes them all, reading their shared operands once.");

    nb::class_<Mark>(m, "Mark", "A timing mark (init_mark): a point in a context's work that record_mark places.")
        .def_prop_ro("recorded", &Mark::recorded);

    auto cls = nb::class_<PyContext>(m, "_Context");
    cls.def("__init__", [](PyContext* self, const std::string& device, uint64_t seed, DType default_dtype, int stochastic_round,
                           bool bench, size_t kernel_cache_capacity) {
            ContextOptions o;
            o.device = device;
            o.seed = seed;
            o.default_dtype = default_dtype;
            o.stochastic_round = stochastic_round;
            o.kernel_cache_capacity = kernel_cache_capacity;
            o.bench = bench;
            std::unique_ptr<Context> c;
            {
                nb::gil_scoped_release unlocked;
                c = std::make_unique<Context>(o);
            }
            new (self) PyContext{std::move(c)};
        }, "device"_a, "seed"_a, "default_dtype"_a, "stochastic_round"_a, "bench"_a, "kernel_cache_capacity"_a = 0)
        .def_prop_ro("device", [](const PyContext& c) { return c.c().device_name(); }, "'cpu' or 'cuda:N'.")
        .def_prop_ro("backend", [](const PyContext& c) { return c.c().backend() == Backend::CUDA ? "cuda" : "cpu"; })
        .def_prop_ro("description", [](const PyContext& c) { return c.c().device_description(); })
        .def_prop_ro("default_dtype", [](const PyContext& c) { return dtype_object(c.c().default_dtype()); })
        .def_prop_ro("_default_dtype", [](const PyContext& c) { return c.c().default_dtype(); })
        .def_prop_rw("bench", [](const PyContext& c) { return c.c().bench(); }, [](PyContext& c, bool b) { c.c().set_bench(b); },
                     "The seeds' bench mode: every call that runs kernels (assignments, GEMMs, convolutions, layers) is timed "
                     "on the device (CUDA events; the host clock on the CPU), waited for, and printed as one line on stderr "
                     "with its rate; bench_log() keeps them.")
        .def("bench_log", [](const PyContext& c) {
                nb::list out;
                for (const BenchRecord& r : c.c().bench_log()) {
                    nb::dict d;
                    d["op"] = r.op;
                    d["detail"] = r.detail;
                    d["ms"] = r.ms;
                    d["bytes"] = r.bytes;
                    d["flops"] = r.flops;
                    d["depth"] = r.depth;
                    out.append(d);
                }
                return out;
            }, "The calls bench mode timed, oldest first (the last 4096): dicts of op, detail, ms, bytes, flops and "
               "depth (1 for a call inside another timed call).")
        .def("clear_bench_log", [](PyContext& c) { c.c().clear_bench_log(); })
        .def("set_hist_buffers", [](PyContext& c, nb::handle bins, nb::handle offset) {
                 set_hist_buffers(c.c(), int_value(bins, "hist_bins", "set_hist_buffers"),
                                  int_value(offset, "hist_offset", "set_hist_buffers"));
             }, nb::sig("def set_hist_buffers(self, hist_bins: int = 64, hist_offset: int = -48) -> None"),
             "hist_bins"_a.none() = 64, "hist_offset"_a.none() = -48,
             "The bins and offset of the numerics histograms (kiln.hist) from now on; discards the slots taken so far.")
        .def_prop_rw("hist_named", [](PyContext& c) { return hist_named(c.c()); },
                     [](PyContext& c, bool on) { set_hist_named(c.c(), on); },
                     "Count every tensor with a histogram tag (set_hist_tag, name=) as each call writes it (on CUDA, an assignment's kernels count in their store path).")
        .def_prop_ro("hist_bins", [](PyContext& c) { return hist_bins(c.c()); })
        .def_prop_ro("hist_offset", [](PyContext& c) { return hist_offset(c.c()); })
        .def("_dump_hist_data", [](nb::handle self) {
            PyContext& c = context_of(self, "dump_hist_data");
            HistData d;
            run_unlocked(c, [&] { d = dump_hist_data(c.c()); });
            nb::list tags;
            for (const std::string& t : d.tags) tags.append(t);
            return nb::make_tuple(wrap(std::move(d.counts), self), tags);
        })
        .def_prop_rw("stochastic_round", [](const PyContext& c) { return c.c().stochastic_round(); },
                     [](PyContext& c, nb::handle v) {
                         if (PyBool_Check(v.ptr())) return c.c().set_stochastic_round(v.ptr() == Py_True);
                         const int64_t bits = int_value(v, "stochastic_round", "Context");
                         if (bits < 0 || bits > 10)   // (the core's message, for a value past int's range too)
                             throw Error(fmt::format("Context: stochastic_round = {} is not a number of mantissa bits to "
                                                     "keep; valid: 1 to 10 (true = 10, float16's whole mantissa; bfloat16 "
                                                     "keeps at most 7), or 0 / false for round to nearest",
                                                     bits),
                                         Error::Kind::Value);
                         c.c().set_stochastic_round(int(bits));
                     },
                     "Mantissa bits kept by stochastic rounding of 16-bit float stores (0: round to nearest; True: 10).")
        .def_prop_rw("allow_tf32", [](const PyContext& c) { return c.c().allow_tf32(); },
                     [](PyContext& c, bool on) { c.c().set_allow_tf32(on); },
                     "float32 GEMMs may use tf32 tensor cores (faster, 10-bit mantissa products).")
        .def_prop_ro("stream_handle", [](const PyContext& c) { return c.c().stream_handle(); },
                     "The CUstream this context's work is ordered on (0 on the CPU).")
        .def("order_before", [](PyContext& c, uintptr_t stream) { c.c().order_before(stream); }, "stream"_a,
             "Makes work later submitted to a CUDA stream wait for this context's work so far.")
        .def("wait_for", [](PyContext& c, uintptr_t stream) { c.c().wait_for(stream); }, "stream"_a,
             "Makes this context's later work wait for what a CUDA stream has been given so far.")
        .def("init_mark", [](PyContext& c) { return c.c().init_mark(); }, "A new timing mark (neon's init_mark).")
        .def("record_mark", [](PyContext& c, Mark& mark) { run_unlocked(c, [&] { c.c().record_mark(mark); }); },
             "mark"_a, "Places the mark after everything given so far (no host wait).")
        .def("synchronize_mark", [](PyContext& c, const Mark& mark) { run_unlocked(c, [&] { c.c().synchronize_mark(mark); }); },
             "mark"_a, "Returns once the work before the mark has finished.")
        .def("get_time", [](PyContext& c, const Mark& start, const Mark& end) {
            double ms = 0;
            run_unlocked(c, [&] { ms = c.c().elapsed_ms(start, end); });
            return ms;
        }, "start"_a, "end"_a, "Milliseconds of the context's work between two recorded marks (CUDA events on a GPU).")
        .def("synchronize", [](PyContext& c) {
            nb::gil_scoped_release unlocked;
            std::lock_guard<std::mutex> one_at_a_time(c.busy);
            c.c().synchronize();
        }, "Waits until every kernel and copy this context submitted has finished.")
        .def("seed", [](PyContext& c, uint64_t s) { c.c().seed(s); }, "seed"_a, "Restarts the random stream from seed.")
        .def("_rng_state", [](const PyContext& c) {
            const RngState s = c.c().rng_state();
            return std::make_tuple(s.seed, s.counter);
        })
        .def("_set_rng_state", [](PyContext& c, uint32_t seed, uint32_t counter) { c.c().set_rng_state({seed, counter}); },
             "seed"_a, "counter"_a)
        .def("_rng_reset", [](PyContext& c) { c.c().rng_reset(); })
        .def("counters", [](const PyContext& c) {
            Counters k = c.c().counters();
            nb::dict d;
            d["compiles"] = k.compiles;
            d["memory_hits"] = k.memory_hits;
            d["disk_hits"] = k.disk_hits;
            d["plan_hits"] = k.plan_hits;
            d["plan_resizes"] = k.plan_resizes;
            d["compile_ms"] = k.compile_ms;
            d["launches"] = k.launches;
            d["assignments"] = k.assignments;
            d["cached_kernels"] = k.cached_kernels;
            return d;
        }, "Kernel cache and launch counters since creation (or reset_counters()).")
        .def("reset_counters", [](PyContext& c) { c.c().reset_counters(); })
        .def("record_to", [](PyContext& c, const std::string& path) { c.c().record_to(path); }, "path"_a,
             "Appends every kernel this context compiles or loads to a manifest (JSON lines); '' stops.")
        .def("_empty", [](nb::handle self, nb::handle shape, DType dtype) {
            auto& c = context_of(self, "empty");
            return PyTensor{c.c().empty(shape_arg(shape, "empty"), dtype), nb::borrow(self)};
        })
        .def("_full", [](nb::handle self, nb::handle shape, double value, DType dtype) {
            auto& c = context_of(self, "full");
            PyTensor t{c.c().empty(shape_arg(shape, "full"), dtype), nb::borrow(self)};
            assign(t, scalar(value, dtype));
            return t;
        })
        .def("rand", [](nb::handle self, nb::handle out) {
            // A rank-0 rand() draws a value per element of whatever it is assigned to.
            return finish(rand({}), self, out, "rand");
        }, "out"_a.none() = nb::none(), "Uniform random numbers in [0, 1), one per element of the assignment.")
        .def("dropout", [](nb::handle self, double keep, nb::handle out) {
            if (!(keep > 0 && keep <= 1)) throw Error(fmt::format("dropout: keep={} is not a probability in (0, 1]", keep));
            return finish(less(rand({}), Expr(keep)), self, out, "dropout");
        }, "keep"_a = 0.5, "out"_a.none() = nb::none(), "A keep mask: 1 with probability keep, else 0.");
    for (const UnaryOp& u : unary_ops()) {
        UnaryFn fn = u.fn;
        const char* name = u.name;
        cls.def(name, [fn, name](nb::handle self, nb::handle a, nb::handle out) {
            nb::handle ctx;
            Expr e = fn(operand(a, ctx, name));
            return finish(e, ctx_or(ctx, self), out, name);
        }, nb::sig(signature(fmt::format("def {}(self, a: {}, out: Tensor | None = None) -> Expr | Tensor", name, kOperand))),
           "a"_a.none(), "out"_a.none() = nb::none());
    }
    for (const BinaryOp& b : binary_ops()) {
        BinaryFn fn = b.fn;
        const char* name = b.name;
        cls.def(name, [fn, name](nb::handle self, nb::handle a, nb::handle x, nb::handle out) {
            nb::handle ctx;
            Expr ea = operand(a, ctx, name);
            Expr eb = operand(x, ctx, name);
            return finish(fn(ea, eb), ctx_or(ctx, self), out, name);
        }, nb::sig(signature(fmt::format("def {}(self, a: {}, b: {}, out: Tensor | None = None) -> Expr | Tensor", name,
                                         kOperand, kOperand))),
           "a"_a.none(), "b"_a.none(), "out"_a.none() = nb::none());
    }
    for (const ReductionOp& r : reduction_ops()) {
        Reduction kind = r.r;
        const char* name = r.name;
        nb::object default_axis = (kind == Reduction::ArgMax || kind == Reduction::ArgMin) ? nb::object(nb::int_(1)) : nb::object(nb::none());
        cls.def(name, [kind, name](nb::handle self, nb::handle a, nb::handle axis, nb::handle out, nb::handle keepdims_arg) {
            nb::handle ctx;
            Expr e = reduce(kind, operand(a, ctx, name), axis, keepdims_arg, 0, nb::handle(), name);
            return finish(e, ctx_or(ctx, self), out, name);
        }, nb::sig(signature(fmt::format("def {}(self, a: {}, axis: int | tuple[int, ...] | None = {}, out: Tensor | None = None, "
                                         "keepdims: bool = True) -> Expr | Tensor",
                                         name, kOperand, default_axis.is_none() ? "None" : "1"))),
           "a"_a.none(), "axis"_a.none() = default_axis, "out"_a.none() = nb::none(), "keepdims"_a.none() = true);
    }
    cls.def("clip", [](nb::handle self, nb::handle a, nb::handle lo, nb::handle hi, nb::handle out) {
        nb::handle ctx;
        Expr e = clip(operand(a, ctx, "clip"), operand(lo, ctx, "clip"), operand(hi, ctx, "clip"));
        return finish(e, ctx_or(ctx, self), out, "clip");
    }, "a"_a.none(), "a_min"_a.none(), "a_max"_a.none(), "out"_a.none() = nb::none());
    cls.def("where", [](nb::handle self, nb::handle c, nb::handle a, nb::handle b, nb::handle out) {
        nb::handle ctx;
        Expr e = where(operand(c, ctx, "where"), operand(a, ctx, "where"), operand(b, ctx, "where"));
        return finish(e, ctx_or(ctx, self), out, "where");
    }, "condition"_a.none(), "x"_a.none(), "y"_a.none(), "out"_a.none() = nb::none());
    cls.def("take", [](nb::handle self, nb::handle a, nb::handle indices, nb::handle axis, nb::handle out) {
        return nb::module_::import_("kiln._kiln").attr("take")(a, self.attr("asarray")(indices), axis, "out"_a = out);
    }, "a"_a.none(), "indices"_a.none(), "axis"_a.none() = nb::none(), "out"_a.none() = nb::none());
    cls.def("onehot", [](nb::handle self, nb::handle indices, int axis, nb::handle out, nb::handle num_classes) {
        nb::handle ctx;
        Expr ei = operand(indices, ctx, "onehot");
        int64_t n;
        DType dt = DType::Float32;
        // neon's labels are (1, N) for an (C, N) output: the size-1 axis becomes the class axis.
        const bool out_given = !out.is_none() && nb::isinstance<PyTensor>(out);
        const int r = ei.rank();
        if (r >= 1 && axis >= -r && axis < r && (out_given ? nb::inst_ptr<PyTensor>(out)->t.rank() == r : r >= 2)) {
            int ax = axis < 0 ? axis + r : axis;
            if (ei.shape()[ax] == 1) {
                Shape sq = ei.shape();
                sq.erase(sq.begin() + ax);
                ei = reshape(ei, sq);
            }
        }
        if (!num_classes.is_none()) {
            n = int_value(num_classes, "num_classes", "onehot");
        } else if (!out.is_none() && nb::isinstance<PyTensor>(out)) {
            const Tensor& o = nb::inst_ptr<PyTensor>(out)->t;
            n = o.shape()[normalize_axis(axis, o.rank(), "onehot")];
            dt = o.dtype();
        } else {
            throw Error("onehot: the number of classes comes from out= (its size along axis) or num_classes=; neither was given");
        }
        return finish(onehot(ei, n, axis, dt), ctx_or(ctx, self), out, "onehot");
    }, "indices"_a.none(), "axis"_a, "out"_a.none() = nb::none(), "num_classes"_a.none() = nb::none(),
       "One-hot rows (or columns) of the indices; the class count is out's size along axis.");
}

} // namespace kiln::py
