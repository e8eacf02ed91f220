// Where a tensor's elements are: a device, a block of memory (an opaque Storage the backend
// owns), and the dtype, shape, strides (in elements) and offset that place the elements in it;
// and the index expressions that slice a view.
#pragma once
#include <kiln/dtype.hpp>
#include <kiln/export.hpp>
#include <kiln/shape.hpp>

#include <cstdint>
#include <memory>

namespace kiln {

enum class DeviceKind : uint8_t { CPU, CUDA };

struct Device {
    DeviceKind kind = DeviceKind::CPU;
    int index = 0;
    bool operator==(const Device&) const = default;
};

struct Storage;   // the runtime's: an application holds it, never looks inside

struct View {
    std::shared_ptr<Storage> storage;
    DType dtype = DType::Float32;
    Shape shape;
    Strides strides;
    int64_t offset = 0;  // in elements

    KILN_API bool is_contiguous() const;
    bool same_layout(const View& o) const {
        return storage == o.storage && dtype == o.dtype && shape == o.shape && strides == o.strides && offset == o.offset;
    }
};

// One index expression per dimension, Python-style. `index` selects a single position and
// drops the dimension; otherwise [start:stop:step] with negative values counting from the end.
struct Slice {
    static constexpr int64_t kNone = INT64_MIN;
    int64_t start = kNone, stop = kNone, step = 1;
    bool is_index = false;

    static Slice all() { return {}; }
    static Slice at(int64_t i) { Slice s; s.start = i; s.is_index = true; return s; }
    static Slice range(int64_t start, int64_t stop, int64_t step = 1) { return {start, stop, step, false}; }
};

} // namespace kiln
