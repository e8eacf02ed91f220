// Collectives for Python (kiln/collectives.hpp): the extension's _Communicator, _Pending and
// _CollectiveGroup, which the package's kiln.distributed wraps with keyword arguments, the
// launcher's environment and context managers.
#include "binding.hpp"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

namespace kiln::py {

namespace {

using namespace nb::literals;

struct PyCommunicator {
    nb::object ctx;   // the Python Context: declared first, so it outlives the communicator
    std::unique_ptr<Communicator> comm;
    PyContext& pc() const { return *nb::inst_ptr<PyContext>(ctx); }
    Communicator& live() const {
        if (!comm) throw Error("Communicator: it was closed; make a new one", Error::Kind::Runtime);
        return *comm;
    }
};

struct PyPending {
    nb::object ctx;   // outlives p (members are destroyed last to first)
    Pending p;
};

ReduceOp reduce_op(const std::string& name, const char* op) {
    for (ReduceOp r : {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg})
        if (reduce_op_name(r) == name) return r;
    throw Error(fmt::format("{}: op '{}' is not a reduction; valid: 'sum', 'prod', 'max', 'min', 'avg'", op, name),
                Error::Kind::Value);
}

Tensor& tensor_arg(nb::handle h, const char* what, const char* op) { return out_tensor(h, what, op).t; }

std::vector<Tensor> tensor_list(nb::handle seq, const char* op) {
    if (nb::isinstance<PyTensor>(seq)) return {nb::inst_ptr<PyTensor>(seq)->t};
    std::vector<Tensor> out;
    if (!nb::isinstance<nb::list>(seq) && !nb::isinstance<nb::tuple>(seq))
        throw Error(fmt::format("{}: tensors must be a kiln tensor or a list or tuple of them", op), Error::Kind::Type);
    size_t i = 0;
    for (nb::handle h : seq) {
        if (!nb::isinstance<PyTensor>(h))
            throw Error(fmt::format("{}: item {} is a {}, not a kiln tensor", op, i, nb::type_name(h.type()).c_str()),
                        Error::Kind::Type);
        out.push_back(nb::inst_ptr<PyTensor>(h)->t);
        ++i;
    }
    return out;
}

PyCommunicator make(std::unique_ptr<Communicator> c, nb::handle ctx) { return PyCommunicator{nb::borrow(ctx), std::move(c)}; }

} // namespace

void bind_distributed(nb::module_& m) {
    m.def("_nccl_info", [] {
        NcclInfo i = nccl_info();
        nb::dict d;
        d["available"] = i.available;
        d["version"] = i.version;
        d["library"] = i.library;
        d["why_not"] = i.why_not;
        return d;
    }, "The NCCL this process would use: available, version, library, why_not.");
    m.def("_nccl_new_id", [] { return Communicator::new_id().hex(); },
          "A new NCCL id in hex; the calling process hosts the rendezvous until every rank has joined.");
    m.def("_nccl_check_id", [](const std::string& hex) { return NcclId::from_hex(hex).hex(); });

    nb::class_<PyCommunicator>(m, "_Communicator")
        .def_static("join", [](nb::handle ctx, int world, int rank, const std::string& id_hex, double timeout) {
            PyContext& pc = context_of(ctx, "Communicator");
            NcclId id = NcclId::from_hex(id_hex);
            std::unique_ptr<Communicator> c;
            run_unlocked(pc, [&] { c = std::make_unique<Communicator>(pc.c(), world, rank, id, CommOptions{timeout}); });
            return make(std::move(c), ctx);
        }, "ctx"_a, "world_size"_a, "rank"_a, "id"_a, "timeout"_a)
        .def_static("through_file", [](nb::handle ctx, int world, int rank, const std::string& path, double timeout) {
            PyContext& pc = context_of(ctx, "Communicator.through_file");
            std::unique_ptr<Communicator> c;
            run_unlocked(pc, [&] { c = Communicator::through_file(pc.c(), world, rank, path, CommOptions{timeout}); });
            return make(std::move(c), ctx);
        }, "ctx"_a, "world_size"_a, "rank"_a, "path"_a, "timeout"_a)
        .def_static("from_env", [](nb::handle ctx, double timeout) {
            PyContext& pc = context_of(ctx, "Communicator.from_env");
            std::unique_ptr<Communicator> c;
            run_unlocked(pc, [&] { c = Communicator::from_env(pc.c(), CommOptions{timeout}); });
            return make(std::move(c), ctx);
        }, "ctx"_a, "timeout"_a)
        .def_static("for_contexts", [](nb::list ctxs, double timeout) {
            std::vector<Context*> cs;
            for (nb::handle h : ctxs) cs.push_back(&context_of(h, "Communicator.for_contexts").c());
            std::vector<std::unique_ptr<Communicator>> comms;
            {
                nb::gil_scoped_release unlocked;
                comms = Communicator::for_contexts(cs, CommOptions{timeout});
            }
            nb::list out;
            for (size_t i = 0; i < comms.size(); ++i) out.append(nb::cast(make(std::move(comms[i]), ctxs[i])));
            return out;
        }, "contexts"_a, "timeout"_a)
        .def_prop_ro("rank", [](const PyCommunicator& c) { return c.live().rank(); })
        .def_prop_ro("size", [](const PyCommunicator& c) { return c.live().size(); })
        .def_prop_ro("context", [](const PyCommunicator& c) { return c.ctx; })
        .def_prop_ro("timeout", [](const PyCommunicator& c) { return c.live().timeout_s(); })
        .def_prop_ro("error", [](const PyCommunicator& c) { return c.live().error(); })
        .def("all_reduce", [](PyCommunicator& c, nb::handle src, nb::handle dst, const std::string& op) {
            const Tensor& s = tensor_arg(src, "src", "all_reduce");
            Tensor& d = tensor_arg(dst, "out", "all_reduce");
            ReduceOp r = reduce_op(op, "all_reduce");
            run_unlocked(c.pc(), [&] { c.live().all_reduce(s, d, r); });
        }, "src"_a, "out"_a, "op"_a)
        .def("all_reduce_many", [](PyCommunicator& c, nb::handle tensors, const std::string& op) {
            std::vector<Tensor> ts = tensor_list(tensors, "all_reduce");
            ReduceOp r = reduce_op(op, "all_reduce");
            run_unlocked(c.pc(), [&] { c.live().all_reduce(ts, r); });
        }, "tensors"_a, "op"_a)
        .def("all_reduce_async", [](PyCommunicator& c, nb::handle tensors, const std::string& op) {
            std::vector<Tensor> ts = tensor_list(tensors, "all_reduce_async");
            ReduceOp r = reduce_op(op, "all_reduce_async");
            Pending p;
            run_unlocked(c.pc(), [&] { p = c.live().all_reduce_async(ts, r); });
            return PyPending{c.ctx, std::move(p)};
        }, "tensors"_a, "op"_a)
        .def("all_gather", [](PyCommunicator& c, nb::handle src, nb::handle dst) {
            const Tensor& s = tensor_arg(src, "src", "all_gather");
            Tensor& d = tensor_arg(dst, "out", "all_gather");
            run_unlocked(c.pc(), [&] { c.live().all_gather(s, d); });
        }, "src"_a, "out"_a)
        .def("reduce_scatter", [](PyCommunicator& c, nb::handle src, nb::handle dst, const std::string& op) {
            const Tensor& s = tensor_arg(src, "src", "reduce_scatter");
            Tensor& d = tensor_arg(dst, "out", "reduce_scatter");
            ReduceOp r = reduce_op(op, "reduce_scatter");
            run_unlocked(c.pc(), [&] { c.live().reduce_scatter(s, d, r); });
        }, "src"_a, "out"_a, "op"_a)
        .def("broadcast", [](PyCommunicator& c, nb::handle src, nb::handle dst, int root) {
            const Tensor& s = tensor_arg(src, "src", "broadcast");
            Tensor& d = tensor_arg(dst, "out", "broadcast");
            run_unlocked(c.pc(), [&] { c.live().broadcast(s, d, root); });
        }, "src"_a, "out"_a, "root"_a)
        .def("synchronize", [](PyCommunicator& c) { run_unlocked(c.pc(), [&] { c.live().synchronize(); }); })
        .def("abort", [](PyCommunicator& c) {
            nb::gil_scoped_release unlocked;
            c.live().abort();
        })
        .def("close", [](PyCommunicator& c) { run_unlocked(c.pc(), [&] { c.comm.reset(); }); });

    nb::class_<PyPending>(m, "_Pending")
        .def("wait", [](PyPending& p) {
            PyContext& pc = *nb::inst_ptr<PyContext>(p.ctx);
            run_unlocked(pc, [&] { p.p.wait(); });
        })
        .def_prop_ro("done", [](const PyPending& p) { return p.p.done(); });

    nb::class_<CollectiveGroup>(m, "_CollectiveGroup")
        .def(nb::init<>())
        .def("end", [](CollectiveGroup& g) {
            nb::gil_scoped_release unlocked;
            g.end();
        });
}

} // namespace kiln::py
