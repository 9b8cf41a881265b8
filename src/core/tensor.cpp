#include "core/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "core/parallel.h"

namespace stateflow {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    SF_CHECK(d >= 0, "negative dimension in shape ", shape_str(s));
    n *= d;
  }
  return n;
}

Storage::Storage(size_t bytes, MemCategory c, MemoryTracker& t, Device d, bool zero_fill)
    : device_(d),
      data_(d == Device::CPU ? allocate_bytes(bytes, c, t) : device_backend(d).allocate(bytes, c, t, zero_fill)),
      bytes_(bytes),
      category_(c),
      tracker_(t) {}

Storage::~Storage() {
  if (device_ == Device::CPU)
    free_bytes(data_, bytes_, category_, tracker_);
  else
    device_backend(device_).free(data_, bytes_, category_, tracker_);
}

Tensor Tensor::allocate(const Shape& shape, DType dtype, MemCategory c, Device d, bool zero_fill) {
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), c,
                                         current_tracker(), d, zero_fill);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, MemCategory c, Device d) {
  return allocate(shape, dtype, c, d, true);
}

Tensor Tensor::uninitialized(const Shape& shape, DType dtype, MemCategory c, Device d) {
  return allocate(shape, dtype, c, d, false);
}

// Byte copy between any two devices.
static void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (!bytes) return;
  if (dst_device == Device::CPU && src_device == Device::CPU)
    std::memmove(dst, src, bytes);
  else
    device_backend(dst_device == Device::CPU ? src_device : dst_device).copy(dst, dst_device, src, src_device, bytes);
}

static void check_on_host(const Tensor& t, const char* what) {
  SF_CHECK(t.on_host(), what, " needs a host tensor, got one on ", device_name(t.device()),
           ": copy it with to(Device::CPU) first");
}

Tensor Tensor::reshape(const Shape& s) const {
  SF_CHECK(shape_numel(s) == numel(), "cannot reshape ", shape_str(shape_), " to ", shape_str(s));
  Tensor t = *this;
  t.shape_ = s;
  return t;
}

Tensor Tensor::clone(MemCategory c) const {
  return to(device(), c);
}

Tensor Tensor::to(Device d, MemCategory c) const {
  Tensor t = zeros(shape_, dtype_, c, d);
  copy_bytes(t.raw(), d, raw(), device(), nbytes());
  return t;
}

Tensor Tensor::cast(DType to_type) const {
  check_on_host(*this, "cast");
  Tensor t = zeros(shape_, to_type, category());
  const int64_t n = numel();
  // Pieces in parallel: a GPU model's bf16 weight copies are ~1.2G elements made on the host.
  constexpr int64_t kPiece = int64_t(1) << 20;
  auto pieces = [&](auto loop) {
    if (n <= kPiece) return loop(0, n);
    parallel_for((n + kPiece - 1) / kPiece, [&](int64_t k) { loop(k * kPiece, std::min(n, (k + 1) * kPiece)); });
  };
  // read(i): source element i as double; one typed loop per (source, target) pair.
  auto convert = [&](auto read) {
    if (to_type == DType::BF16) {
      BF16* dst = t.data<BF16>();
      pieces([&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) dst[i] = bf16_from_float(static_cast<float>(read(i)));
      });
    } else {
      dispatch_float(to_type, [&](auto z) {
        using T = decltype(z);
        T* dst = t.data<T>();
        pieces([&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) dst[i] = static_cast<T>(read(i));
        });
      });
    }
  };
  if (dtype_ == DType::BF16) {
    const BF16* src = data<BF16>();
    convert([&](int64_t i) { return static_cast<double>(float_from_bf16(src[i])); });
  } else {
    dispatch_float(dtype_, [&](auto z) {
      const auto* src = data<decltype(z)>();
      convert([&](int64_t i) { return static_cast<double>(src[i]); });
    });
  }
  return t;
}

void Tensor::zero_() {
  if (!nbytes()) return;
  if (on_host())
    std::memset(raw(), 0, nbytes());
  else
    device_backend(device()).zero(raw(), nbytes());
}

void Tensor::copy_from(const Tensor& src) {
  SF_CHECK(src.numel() == numel() && src.dtype() == dtype_, "copy_from: shape/dtype mismatch ",
           shape_str(src.shape()), " ", dtype_name(src.dtype()), " -> ", shape_str(shape_), " ",
           dtype_name(dtype_));
  copy_bytes(raw(), device(), src.raw(), src.device(), nbytes());
}

void Tensor::add_(const Tensor& other) {
  SF_CHECK(other.numel() == numel() && other.dtype() == dtype_, "add_: shape/dtype mismatch ",
           shape_str(other.shape()), " vs ", shape_str(shape_));
  check_on_host(*this, "add_");
  check_on_host(other, "add_");
  dispatch_float(dtype_, [&](auto z) {
    using T = decltype(z);
    T* a = data<T>();
    const T* b = other.data<T>();
    for (int64_t i = 0; i < numel(); ++i) a[i] += b[i];
  });
}

double Tensor::item() const {
  SF_CHECK(numel() == 1, "item() needs a single element, shape is ", shape_str(shape_));
  if (!on_host()) return to(Device::CPU).item();
  return dispatch_float(dtype_, [&](auto z) {
    using T = decltype(z);
    return static_cast<double>(*data<T>());
  });
}

static double to_double_at(const Tensor& t, int64_t i) {
  return dispatch_float(t.dtype(), [&](auto z) {
    using T = decltype(z);
    return static_cast<double>(t.data<T>()[i]);
  });
}

double max_rel_diff(const Tensor& a, const Tensor& ref) {
  SF_CHECK(a.numel() == ref.numel(), "max_rel_diff: sizes differ ", shape_str(a.shape()), " vs ",
           shape_str(ref.shape()));
  if (!a.on_host() || !ref.on_host()) return max_rel_diff(a.to(Device::CPU), ref.to(Device::CPU));
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double x = to_double_at(a, i), r = to_double_at(ref, i);
    if (std::isnan(x) != std::isnan(r)) return INFINITY;
    num = std::max(num, std::fabs(x - r));
    den = std::max(den, std::fabs(r));
  }
  if (den == 0) return num;  // reference all zero: report the absolute difference
  return num / den;
}

}  // namespace stateflow
