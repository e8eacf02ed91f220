// Zero-copy exchange with other array libraries: the DLPack protocol (__dlpack__,
// __dlpack_device__, from_dlpack; versioned 1.x capsules and the legacy ones) and CUDA's
// __cuda_array_interface__ (v3). Streams follow the DLPack rule: the producer makes its data
// ready on the consumer's stream. Exporting, kiln orders the consumer's stream after its own
// work (an event, no host wait); importing, kiln passes its own stream to the producer.
#include "binding.hpp"

#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include <cstring>

namespace kiln::py {

namespace {

using namespace nb::literals;

// The DLPack ABI (v1.0), declared here from the specification.
enum : int32_t { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13 };
enum : uint8_t { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLComplex = 5, kDLBool = 6 };
struct DLDevice { int32_t device_type; int32_t device_id; };
struct DLDataType { uint8_t code; uint8_t bits; uint16_t lanes; };
struct DLTensor {
    void* data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t* shape;
    int64_t* strides;
    uint64_t byte_offset;
};
struct DLManagedTensor {
    DLTensor dl_tensor;
    void* manager_ctx;
    void (*deleter)(DLManagedTensor*);
};
struct DLPackVersion { uint32_t major; uint32_t minor; };
struct DLManagedTensorVersioned {
    DLPackVersion version;
    void* manager_ctx;
    void (*deleter)(DLManagedTensorVersioned*);
    uint64_t flags;
    DLTensor dl_tensor;
};
constexpr uint64_t kFlagReadOnly = 1;
constexpr uint64_t kFlagIsCopied = 2;

DLDataType dl_dtype(DType t) {
    switch (t) {
    case DType::Float32: return {kDLFloat, 32, 1};
    case DType::Float16: return {kDLFloat, 16, 1};
    case DType::BFloat16: return {kDLBfloat, 16, 1};
    case DType::Int32: return {kDLInt, 32, 1};
    case DType::Int8: return {kDLInt, 8, 1};
    case DType::UInt8: return {kDLUInt, 8, 1};
    case DType::Bool: return {kDLBool, 8, 1};
    case DType::Float64: return {kDLFloat, 64, 1};
    case DType::Int64: return {kDLInt, 64, 1};
    case DType::Int16: return {kDLInt, 16, 1};
    case DType::UInt16: return {kDLUInt, 16, 1};
    case DType::UInt32: return {kDLUInt, 32, 1};
    case DType::UInt64: return {kDLUInt, 64, 1};
    }
    return {};
}

bool kiln_dtype(DLDataType d, DType& out) {
    if (d.lanes != 1) return false;
    if (d.code == kDLFloat && d.bits == 32) out = DType::Float32;
    else if (d.code == kDLFloat && d.bits == 16) out = DType::Float16;
    else if (d.code == kDLBfloat && d.bits == 16) out = DType::BFloat16;
    else if (d.code == kDLInt && d.bits == 32) out = DType::Int32;
    else if (d.code == kDLInt && d.bits == 8) out = DType::Int8;
    else if (d.code == kDLUInt && d.bits == 8) out = DType::UInt8;
    else if (d.code == kDLBool && d.bits == 8) out = DType::Bool;
    else if (d.code == kDLFloat && d.bits == 64) out = DType::Float64;
    else if (d.code == kDLInt && d.bits == 64) out = DType::Int64;
    else if (d.code == kDLInt && d.bits == 16) out = DType::Int16;
    else if (d.code == kDLUInt && d.bits == 16) out = DType::UInt16;
    else if (d.code == kDLUInt && d.bits == 32) out = DType::UInt32;
    else if (d.code == kDLUInt && d.bits == 64) out = DType::UInt64;
    else return false;
    return true;
}

std::string dl_dtype_str(DLDataType d) {
    const char* kind = d.code == kDLInt ? "int" : d.code == kDLUInt ? "uint" : d.code == kDLFloat ? "float"
                     : d.code == kDLBfloat ? "bfloat" : d.code == kDLComplex ? "complex" : d.code == kDLBool ? "bool" : "code";
    return fmt::format("{}{}{}", kind, (int)d.bits, d.lanes != 1 ? fmt::format("x{}", d.lanes) : "");
}

[[noreturn]] void buffer_error(const std::string& msg) {
    PyErr_SetString(PyExc_BufferError, msg.c_str());
    throw nb::python_error();
}

// What an exported capsule owns: a view of the tensor (keeping its memory) and a reference
// to its Python Context (keeping the device state), plus the shape and stride arrays.
struct Export {
    Tensor t;
    PyObject* ctx;
    std::vector<int64_t> shape, strides;
};

void drop_export(Export* e) {
    // The consumer may call the deleter from any thread, with or without the GIL.
    if (!Py_IsInitialized()) return;  // interpreter gone: leak rather than crash
    PyGILState_STATE g = PyGILState_Ensure();
    Py_XDECREF(e->ctx);
    delete e;
    PyGILState_Release(g);
}

template <class Managed>
void fill(Managed* m, Export* e, const PyTensor& s) {
    const Tensor& t = s.t;
    DLTensor& d = m->dl_tensor;
    e->shape = t.shape();
    e->strides = t.strides();
    d.data = t.data();
    Device dev = t.context().device();
    d.device = {dev.kind == DeviceKind::CUDA ? kDLCUDA : kDLCPU, dev.index};
    d.ndim = t.rank();
    d.dtype = dl_dtype(t.dtype());
    d.shape = e->shape.data();
    d.strides = e->strides.data();
    d.byte_offset = 0;
    m->manager_ctx = e;
}

// The capsule names of each managed-tensor flavour (DLPack 1.x and the legacy one).
template <class Managed> struct CapsuleName;
template <> struct CapsuleName<DLManagedTensorVersioned> { static constexpr const char* value = "dltensor_versioned"; };
template <> struct CapsuleName<DLManagedTensor> { static constexpr const char* value = "dltensor"; };

template <class Managed>
nb::object make_capsule(Managed* m, Export* e, const PyTensor& s) {
    fill(m, e, s);
    m->deleter = [](Managed* self) {
        drop_export(static_cast<Export*>(self->manager_ctx));
        delete self;
    };
    PyObject* cap = PyCapsule_New(m, CapsuleName<Managed>::value, [](PyObject* c) {
        if (PyCapsule_IsValid(c, CapsuleName<Managed>::value)) {  // never consumed: ours to free
            auto* mt = static_cast<Managed*>(PyCapsule_GetPointer(c, CapsuleName<Managed>::value));
            if (mt && mt->deleter) mt->deleter(mt);
        } else {
            PyErr_Clear();
        }
    });
    if (!cap) {
        m->deleter(m);
        throw nb::python_error();
    }
    return nb::steal(cap);
}

nb::object export_capsule(const PyTensor& s, bool versioned, bool copied) {
    auto* e = new Export{s.t, s.ctx.ptr(), {}, {}};
    Py_INCREF(e->ctx);
    if (versioned) {
        auto* m = new DLManagedTensorVersioned{};
        m->version = {1, 0};
        m->flags = copied ? kFlagIsCopied : 0;
        return make_capsule(m, e, s);
    }
    return make_capsule(new DLManagedTensor{}, e, s);
}

// PyTorch's from_dlpack aborts the process on a negative stride (its storage-size check throws
// where nothing catches it; NumPy's arrays trigger it too). Its caller is Python code of the
// torch package, the frame this method is called from.
bool called_from_torch() {
    nb::object frame = nb::module_::import_("sys").attr("_getframe")(0);
    nb::object name = nb::borrow<nb::dict>(frame.attr("f_globals")).get("__name__", nb::none());
    if (!nb::isinstance<nb::str>(name)) return false;
    std::string n = nb::cast<std::string>(name);
    return n == "torch" || n.rfind("torch.", 0) == 0;
}

bool has_negative_stride(const Tensor& t) {
    for (size_t d = 0; d < t.strides().size(); ++d)
        if (t.strides()[d] < 0 && t.shape()[d] > 1) return true;
    return false;
}

// A keyword argument of __dlpack__ as T, or a TypeError naming it (std::bad_cast before).
template <class T>
T dlpack_arg(nb::handle h, const char* name, const char* what) {
    T v{};
    if (!nb::try_cast(h, v))
        throw Error(fmt::format("__dlpack__: {}= is of type {}; it is {}", name, nb::type_name(h.type()).c_str(), what),
                    Error::Kind::Type);
    return v;
}

nb::object dlpack(nb::handle self, nb::handle stream, nb::handle max_version, nb::handle dl_device, nb::handle copy) {
    if (!nb::isinstance<PyTensor>(self))
        throw Error(fmt::format("__dlpack__: self is of type {}; it must be a kiln tensor", nb::type_name(self.type()).c_str()),
                    Error::Kind::Type);
    PyTensor s = *nb::inst_ptr<PyTensor>(self);
    Device dev = s.t.context().device();
    if (!dl_device.is_none()) {
        auto want = dlpack_arg<std::pair<int, int>>(dl_device, "dl_device", "a (device type, index) pair of ints");
        int have_type = dev.kind == DeviceKind::CUDA ? kDLCUDA : kDLCPU;
        if (want.first != have_type || want.second != dev.index)
            buffer_error(fmt::format("__dlpack__: the tensor is on {}; exporting to device ({}, {}) is not supported: copy "
                                     "it through the host (np.asarray(t)) first",
                                     s.t.context().device_name(), want.first, want.second));
    }
    bool copied = false;
    if (!copy.is_none() && dlpack_arg<bool>(copy, "copy", "a bool or None")) {
        s = evaluate(s.t.expr(), s.ctx);
        copied = true;
    } else if (has_negative_stride(s.t) && called_from_torch()) {
        if (!copy.is_none())
            buffer_error("__dlpack__: PyTorch cannot take a view with negative strides (a reversed slice) and copy=False "
                         "forbids the copy it needs");
        s = evaluate(s.t.expr(), s.ctx);   // a compact copy, as copy=None allows
        copied = true;
    }
    if (dev.kind == DeviceKind::CUDA) {
        // None: the consumer's legacy default stream (1); -1: the consumer asks for no ordering.
        int64_t st = stream.is_none() ? 1 : dlpack_arg<int64_t>(stream, "stream", "an int or None");
        if (st == 0) buffer_error("__dlpack__: stream=0 is ambiguous for CUDA; use 1 (legacy default) or 2 (per-thread default)");
        if (st != -1) s.t.context().order_before((uintptr_t)st);
    } else if (!stream.is_none()) {
        buffer_error("__dlpack__: stream must be None for a CPU tensor");
    }
    bool versioned = false;
    if (!max_version.is_none()) {
        auto v = dlpack_arg<std::pair<int, int>>(max_version, "max_version", "a (major, minor) pair of ints");
        versioned = v.first >= 1;
    }
    return export_capsule(s, versioned, copied);
}

nb::tuple dlpack_device(const PyTensor& s) {
    Device dev = s.t.context().device();
    return nb::make_tuple(dev.kind == DeviceKind::CUDA ? (int)kDLCUDA : (int)kDLCPU, dev.index);
}

// Whether the interpreter has begun its shutdown (its modules may be half torn down).
bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing() != 0;
#else
    return _Py_IsFinalizing() != 0;
#endif
}

// Takes over a producer's managed tensor: the capsule is marked used (so the producer's capsule
// destructor leaves it alone) and the returned function calls its deleter, with the GIL, when
// kiln's last view of the memory dies.
template <class Managed>
std::function<void()> take_over(nb::handle capsule, Managed* m, const char* used_name) {
    PyCapsule_SetName(capsule.ptr(), used_name);
    return [m] {
        // A producer's deleter may be Python code (a ctypes callback) that the interpreter's
        // shutdown has already torn down: once it is finalizing, the memory is left to the
        // process's end instead.
        if (!m->deleter || !Py_IsInitialized() || interpreter_finalizing()) return;
        PyGILState_STATE g = PyGILState_Ensure();
        m->deleter(m);
        PyGILState_Release(g);
    };
}

// Imports a capsule as a tensor of `ctx` sharing its memory. `readonly` reports the
// producer's read-only flag (the caller copies in that case).
nb::object import_capsule(nb::handle capsule, nb::handle pyctx, bool* readonly) {
    PyContext& pc = context_of(pyctx, "from_dlpack");
    DLTensor* d = nullptr;
    std::function<void()> release;
    *readonly = false;
    if (PyCapsule_IsValid(capsule.ptr(), "dltensor_versioned")) {
        auto* m = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor_versioned"));
        if (m->version.major > 1)
            buffer_error(fmt::format("from_dlpack: the producer sent a DLPack {}.{} tensor; kiln reads version 1",
                                     m->version.major, m->version.minor));
        d = &m->dl_tensor;
        *readonly = (m->flags & kFlagReadOnly) != 0;
        release = take_over(capsule, m, "used_dltensor_versioned");
    } else if (PyCapsule_IsValid(capsule.ptr(), "dltensor")) {
        auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
        d = &m->dl_tensor;
        release = take_over(capsule, m, "used_dltensor");
    } else {
        throw Error("from_dlpack: __dlpack__() did not return a DLPack capsule (or it was already consumed)",
                    Error::Kind::Type);
    }
    DType dt;
    if (!kiln_dtype(d->dtype, dt)) {
        std::string name = dl_dtype_str(d->dtype);
        release();
        throw Error(fmt::format("from_dlpack: {} data cannot be shared; kiln's dtypes are float64, float32, float16, bfloat16, "
                                "int64, int32, int16, int8, uint64, uint32, uint16, uint8 and bool: convert it first (e.g. x.astype('float32'))",
                                name),
                    Error::Kind::Type);
    }
    Device dev;
    if (d->device.device_type == kDLCPU || d->device.device_type == kDLCUDAHost) dev = {DeviceKind::CPU, 0};
    else if (d->device.device_type == kDLCUDA || d->device.device_type == kDLCUDAManaged) dev = {DeviceKind::CUDA, d->device.device_id};
    else {
        release();
        buffer_error(fmt::format("from_dlpack: DLPack device type {} is not one kiln can use (CPU or CUDA)", d->device.device_type));
    }
    Shape shape(d->shape, d->shape + d->ndim);
    Strides strides;
    if (d->strides) strides.assign(d->strides, d->strides + d->ndim);
    void* data = static_cast<char*>(d->data) + d->byte_offset;
    Tensor t = pc.c().wrap(data, dt, shape, strides, dev, std::move(release));
    return nb::cast(PyTensor{t, context_object(pyctx, "from_dlpack")});
}

} // namespace

void bind_dlpack_methods(nb::class_<PyTensor>& tc) {
    tc.def("__dlpack__", &dlpack, "stream"_a.none() = nb::none(), "max_version"_a.none() = nb::none(), "dl_device"_a.none() = nb::none(),
           "copy"_a.none() = nb::none(), "Exports the tensor as a DLPack capsule (zero copy).");
    tc.def("__dlpack_device__", &dlpack_device);
    tc.def_prop_ro("__cuda_array_interface__", [](const PyTensor& s) -> nb::dict {
        Device dev = s.t.context().device();
        if (dev.kind != DeviceKind::CUDA) {
            PyErr_SetString(PyExc_AttributeError, "__cuda_array_interface__: this tensor is in host memory (a CPU context)");
            throw nb::python_error();
        }
        // In DType's order.
        static const char* typestr[] = {"<f4", "<f2", "<V2", "<i4", "|i1", "|u1", "|b1", "<f8", "<i8", "<i2", "<u2", "<u4", "<u8"};
        static_assert(sizeof(typestr) / sizeof(typestr[0]) == kNumDTypes);
        nb::dict d;
        nb::list shape, strides;
        for (int64_t x : s.t.shape()) shape.append(x);
        for (int64_t x : s.t.strides()) strides.append(x * (int64_t)dtype_size(s.t.dtype()));
        d["shape"] = nb::tuple(shape);
        d["typestr"] = typestr[(int)s.t.dtype()];
        if (s.t.dtype() == DType::BFloat16) {
            nb::list descr;
            descr.append(nb::make_tuple("bfloat16", "<V2"));
            d["descr"] = descr;
        }
        uintptr_t ptr = (uintptr_t)s.t.data();
        d["data"] = nb::make_tuple(s.t.size() == 0 ? 0 : ptr, false);
        d["strides"] = s.t.is_contiguous() ? nb::object(nb::none()) : nb::object(nb::tuple(strides));
        d["version"] = 3;
        d["stream"] = s.t.context().stream_handle();  // consumers order their work after this stream
        return d;
    });
}

void bind_dlpack(nb::module_& m) {
    m.def("_import_capsule", [](nb::handle capsule, nb::handle ctx) {
        bool ro = false;
        nb::object t = import_capsule(capsule, ctx, &ro);
        return nb::make_tuple(t, ro);
    });
    m.def("_wrap", [](nb::handle ctx, uintptr_t ptr, DType dtype, nb::handle shape, nb::handle strides, nb::object owner,
                      bool cuda, int device_index) {
        // Memory described by __cuda_array_interface__ (or any pointer): `owner` is kept alive
        // until the tensor dies. Strides in elements; None for row-major.
        PyContext& pc = context_of(ctx, "wrap");
        Shape sh = shape_arg(shape, "wrap");
        Strides st;
        if (!strides.is_none()) st = shape_arg(strides, "wrap");
        PyObject* keep = owner.release().ptr();
        std::function<void()> release = [keep] {
            if (!Py_IsInitialized()) return;
            PyGILState_STATE g = PyGILState_Ensure();
            Py_DECREF(keep);
            PyGILState_Release(g);
        };
        Device dev{cuda ? DeviceKind::CUDA : DeviceKind::CPU, cuda ? device_index : 0};
        Tensor t = pc.c().wrap((void*)ptr, dtype, sh, st, dev, std::move(release));
        return PyTensor{t, context_object(ctx, "wrap")};
    }, "ctx"_a, "ptr"_a, "dtype"_a, "shape"_a, "strides"_a.none(), "owner"_a, "cuda"_a, "device_index"_a);
}

} // namespace kiln::py
