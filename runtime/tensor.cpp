// Tensor: views, assignment, and host data in and out (through the owning context's backend).
#include "runtime/context_impl.hpp"
#include "ir/view_ops.hpp"

#include "ir/error.hpp"
#include "runtime/host_convert.hpp"

#include <cstring>

namespace kiln {

Context& Tensor::context() const {
    if (!ctx_) throw Error("tensor: an empty kiln::Tensor has no context");
    return *ctx_;
}

Tensor Tensor::slice(const std::vector<Slice>& s) const { return Tensor(ctx_, slice_view(view_, s)); }
Tensor Tensor::transpose(const std::vector<int>& perm) const { return Tensor(ctx_, transpose_view(view_, perm)); }

Tensor Tensor::reshape(const Shape& s) const {
    Shape to = resolve_reshape(view_.shape, s, "reshape");
    if (auto v = kiln::reshape_view(view_, to)) return Tensor(ctx_, *v);
    Tensor out = context().empty(to, view_.dtype);
    out.assign(kiln::reshape(expr(), to));
    return out;
}

std::optional<Tensor> Tensor::reshape_view(const Shape& s) const {
    if (auto v = kiln::reshape_view(view_, resolve_reshape(view_.shape, s, "reshape"))) return Tensor(ctx_, *v);
    return std::nullopt;
}

Tensor::Tensor(Context* ctx, View v) : ctx_(ctx), view_(std::move(v)) {
    if (view_.storage) leaf_ = leaf(view_).node();
}

Tensor& Tensor::assign(const Expr& e) {
    if (!defined()) throw Error("assign: the destination is an empty kiln::Tensor (default-constructed)");
    context().assign(*this, e);
    return *this;
}

Assignable& Assignable::operator=(const Expr& e) {
    t_.assign(e);
    return *this;
}

namespace {

// Calls f(element offset, row-major index) for every element of the view.
template <typename F>
void for_each_element(const View& v, F f) {
    int64_t n = numel(v.shape);
    if (n == 0) return;
    int r = (int)v.shape.size();
    std::vector<int64_t> idx(r, 0);
    int64_t off = v.offset;
    for (int64_t i = 0; i < n; ++i) {
        f(off, i);
        for (int d = r - 1; d >= 0; --d) {
            if (++idx[d] < v.shape[d]) { off += v.strides[d]; break; }
            off -= v.strides[d] * (v.shape[d] - 1);
            idx[d] = 0;
        }
    }
}

// Converts n contiguous values between dtypes on the host.
void convert(DType to, void* dst, DType from, const void* src, int64_t n) {
    size_t ts = dtype_size(to), fs = dtype_size(from);
    for (int64_t i = 0; i < n; ++i)
        store_element(to, static_cast<char*>(dst) + i * ts, load_element(from, static_cast<const char*>(src) + i * fs));
}

} // namespace

void* Tensor::data() const {
    if (!defined()) throw Error("data: the tensor is empty (default-constructed)");
    return static_cast<char*>(view_.storage->data) + view_.offset * (int64_t)dtype_size(view_.dtype);
}

void Tensor::copy_to_host(void* dst, DType as) const {
    if (!defined()) throw Error("copy_to_host: the tensor is empty (default-constructed)");
    if (!view_.storage->written)
        fail(Error::Kind::Value,
             "copy_to_host: the {} tensor of shape {} was never written (created by empty() and not assigned)",
             dtype_name(view_.dtype), shape_str(view_.shape));
    if (size() == 0) return;
    const size_t is = dtype_size(view_.dtype), os = dtype_size(as);
    auto& impl = context_impl(context());
    if (view_.is_contiguous() && as == view_.dtype) {
        impl.backend->read(*view_.storage, view_.offset * is, dst, (size_t)size() * is);
        return;
    }
    if (view_.is_contiguous() && view_.storage->device.kind != DeviceKind::CPU) {
        std::vector<char> tmp((size_t)size() * is);
        impl.backend->read(*view_.storage, view_.offset * is, tmp.data(), tmp.size());
        return convert(as, dst, view_.dtype, tmp.data(), size());
    }
    if (view_.storage->device.kind != DeviceKind::CPU) {
        // Strided device data: gather it into a contiguous device tensor first (one kernel), so
        // the transfer is one block of bytes (converted on the host by the contiguous path).
        Tensor packed = context().empty(shape(), dtype());
        packed.assign(expr());
        return packed.copy_to_host(dst, as);
    }
    auto* base = static_cast<const char*>(view_.storage->data);
    auto* out = static_cast<char*>(dst);
    for_each_element(view_, [&](int64_t off, int64_t i) {
        const void* p = base + off * (int64_t)is;
        if (as == view_.dtype) std::memcpy(out + i * os, p, is);
        else store_element(as, out + i * os, load_element(view_.dtype, p));
    });
}

void Tensor::copy_from_host(const void* src, DType as) {
    if (!defined()) throw Error("copy_from_host: the tensor is empty (default-constructed)");
    const size_t is = dtype_size(view_.dtype), ss = dtype_size(as);
    auto& impl = context_impl(context());
    if (size() == 0) {
        view_.storage->written = true;
        return;
    }
    if (view_.is_contiguous() && as == view_.dtype) {
        impl.backend->write(*view_.storage, view_.offset * is, src, (size_t)size() * is);
    } else if (view_.is_contiguous() && view_.storage->device.kind != DeviceKind::CPU) {
        std::vector<char> tmp((size_t)size() * is);
        convert(view_.dtype, tmp.data(), as, src, size());
        impl.backend->write(*view_.storage, view_.offset * is, tmp.data(), tmp.size());
    } else if (view_.storage->device.kind != DeviceKind::CPU) {
        // Upload into a contiguous device tensor (converted on the host by the contiguous path),
        // then scatter it into the view with one kernel.
        Tensor packed = context().empty(shape(), dtype());
        packed.copy_from_host(src, as);
        assign(packed.expr());
    } else {
        auto* base = static_cast<char*>(view_.storage->data);
        auto* in = static_cast<const char*>(src);
        for_each_element(view_, [&](int64_t off, int64_t i) {
            void* p = base + off * (int64_t)is;
            if (as == view_.dtype) std::memcpy(p, in + i * ss, is);
            else store_element(view_.dtype, p, load_element(as, in + i * ss));
        });
    }
    view_.storage->written = true;
}

} // namespace kiln
