// Tensor: a view of memory owned by a Context's backend. Converts implicitly to an Expr leaf,
// so tensors take part in expressions; `t.assign(expr)` (or `t[all] = expr`, the spelling of
// nervanagpu's `t[:] = expr`) evaluates the expression into the tensor's memory.
#pragma once
#include <kiln/expr.hpp>
#include <kiln/export.hpp>
#include <kiln/view.hpp>

#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

namespace kiln {

class Context;
class Tensor;

// `t[all] = expr` writes into t: a proxy, because `Tensor = Tensor` rebinds the handle.
struct AllTag {};
inline constexpr AllTag all{};

class KILN_API Assignable {
public:
    explicit Assignable(Tensor& t) : t_(t) {}
    Assignable& operator=(const Expr& e);
private:
    Tensor& t_;
};

class KILN_API Tensor {
public:
    Tensor() = default;
    Tensor(Context* ctx, View v);

    // ---- properties
    const Shape& shape() const { return view_.shape; }
    const Strides& strides() const { return view_.strides; }
    int64_t offset() const { return view_.offset; }
    DType dtype() const { return view_.dtype; }
    int rank() const { return (int)view_.shape.size(); }
    int64_t size() const { return numel(view_.shape); }
    bool is_contiguous() const { return view_.is_contiguous(); }
    bool defined() const { return view_.storage != nullptr; }
    const View& view() const { return view_; }
    // The address of element (0, ..., 0): host memory on a CPU context, a device address
    // (CUdeviceptr) on a CUDA one. For handing the memory to other libraries (DLPack, BLAS).
    void* data() const;
    Context& context() const;

    // ---- views (no copy)
    Tensor slice(const std::vector<Slice>& s) const;
    Tensor operator[](int64_t i) const { return slice({Slice::at(i)}); }
    Tensor transpose(const std::vector<int>& perm = {}) const;
    Tensor T() const { return transpose(); }
    // A view when the memory allows it, otherwise a contiguous copy (as NumPy's reshape).
    Tensor reshape(const Shape& s) const;
    // The view with shape `s` (one dim may be -1) over the same memory, or nullopt when the
    // layout needs a copy; throws kiln::Error when the element counts differ.
    std::optional<Tensor> reshape_view(const Shape& s) const;

    // ---- evaluation
    operator Expr() const { return expr(); }
    Expr expr() const { return leaf_ ? Expr(leaf_) : leaf(view_); }
    Tensor& assign(const Expr& e);
    Assignable operator[](AllTag) { return Assignable(*this); }
    Tensor& operator=(const Expr& e) { return assign(e); }
    Tensor& operator=(double v) { return assign(Expr(v)); }
    Tensor(const Tensor&) = default;
    Tensor(Tensor&&) = default;
    Tensor& operator=(const Tensor&) = default;  // rebinds the handle; use assign() to copy data
    Tensor& operator=(Tensor&&) = default;

    // ---- host data
    void copy_to_host(void* dst, DType as) const;         // row-major, converted to `as`
    template <typename T> std::vector<T> to_vector() const;
    void copy_from_host(const void* src, DType as);        // row-major `as` values into this view

private:
    Context* ctx_ = nullptr;
    View view_;
    // The view's leaf node, made once: a tensor in an expression built again and again (a loop
    // body) is not hashed and looked up again each time.
    NodePtr leaf_;
};

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::Float32; }
template <> constexpr DType dtype_of<int32_t>() { return DType::Int32; }
template <> constexpr DType dtype_of<int8_t>() { return DType::Int8; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::UInt8; }
template <> constexpr DType dtype_of<bool>() { return DType::Bool; }
template <> constexpr DType dtype_of<double>() { return DType::Float64; }
template <> constexpr DType dtype_of<int64_t>() { return DType::Int64; }
template <> constexpr DType dtype_of<int16_t>() { return DType::Int16; }
template <> constexpr DType dtype_of<uint16_t>() { return DType::UInt16; }
template <> constexpr DType dtype_of<uint32_t>() { return DType::UInt32; }

template <typename T>
std::vector<T> Tensor::to_vector() const {
    std::vector<T> out((size_t)size());
    if constexpr (std::is_same_v<T, bool>) {
        std::vector<uint8_t> tmp((size_t)size());
        copy_to_host(tmp.data(), DType::Bool);
        for (size_t i = 0; i < tmp.size(); ++i) out[i] = tmp[i] != 0;
    } else {
        copy_to_host(out.data(), dtype_of<T>());
    }
    return out;
}

} // namespace kiln
