// Tensor: a contiguous, row-major block of one dtype with a shape, on one device. Storage is
// shared by copies (copying a Tensor is cheap; clone() copies the data) and is released, and
// un-charged from its tracker, when the last copy goes away. A device tensor's data<T>() is a
// device pointer for the kernels; add_ and cast need host tensors (to(Device::CPU) first),
// item and max_rel_diff copy device tensors to the host themselves.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"

namespace stateflow {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

class Storage {
 public:
  Storage(size_t bytes, MemCategory c, MemoryTracker& t, Device d = Device::CPU, bool zero_fill = true);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  MemCategory category() const { return category_; }
  Device device() const { return device_; }

 private:
  Device device_;
  void* data_;
  size_t bytes_;
  MemCategory category_;
  MemoryTracker& tracker_;
};

class Tensor {
 public:
  Tensor() = default;
  // Zero-filled tensor charged to `c` (default: the thread's current category).
  static Tensor zeros(const Shape& shape, DType dtype, MemCategory c, Device d = Device::CPU);
  static Tensor zeros(const Shape& shape, DType dtype) { return zeros(shape, dtype, current_category()); }
  // A device tensor whose contents are undefined (a host tensor is still zero-filled): for
  // outputs a kernel overwrites entirely, so that no zero-fill is issued per chunk.
  static Tensor uninitialized(const Shape& shape, DType dtype, MemCategory c, Device d);
  static Tensor zeros_like(const Tensor& t) {
    return zeros(t.shape(), t.dtype(), current_category(), t.device());
  }

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  MemCategory category() const { return storage_->category(); }
  Device device() const { return storage_ ? storage_->device() : Device::CPU; }
  bool on_host() const { return device() == Device::CPU; }

  template <class T> T* data() {
    SF_CHECK(dtype_of<T>() == dtype_, "tensor holds ", dtype_name(dtype_), ", accessed as ",
             dtype_name(dtype_of<T>()));
    return reinterpret_cast<T*>(raw());
  }
  template <class T> const T* data() const { return const_cast<Tensor*>(this)->data<T>(); }
  void* raw() const { return storage_ ? storage_->data() : nullptr; }

  // Same storage, new shape (same element count).
  Tensor reshape(const Shape& s) const;
  // A new tensor with a copy of the data, on the same device, charged to `c`.
  Tensor clone(MemCategory c) const;
  Tensor clone() const { return clone(current_category()); }
  // A copy on device d (the same data if already there is *not* reused: always a new tensor).
  Tensor to(Device d, MemCategory c) const;
  Tensor to(Device d) const { return to(d, current_category()); }
  // Host only: a copy converted between float types (to BF16: via f32, nearest even).
  Tensor cast(DType t) const;
  void zero_();
  void copy_from(const Tensor& src);  // same numel and dtype; any devices
  void add_(const Tensor& other);     // this += other (float dtypes)
  double item() const;                // the single element as double (any device)

 private:
  static Tensor allocate(const Shape& shape, DType dtype, MemCategory c, Device d, bool zero_fill);
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  DType dtype_ = DType::F32;
};

// max |a-b| / max |b| over all elements: the normwise relative error of MATH.md section 8.
double max_rel_diff(const Tensor& a, const Tensor& ref);

}  // namespace stateflow
