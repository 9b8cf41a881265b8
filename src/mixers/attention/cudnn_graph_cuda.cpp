// cuDNN backend API layer (cudnn_graph.h): the run-time loaded library, descriptors, graphs, plans.
#include "mixers/attention/cudnn_graph.h"

#include <dlfcn.h>

#include <cstring>
#include <map>
#include <sstream>

#include "core/error.h"

namespace stateflow {

#ifdef STATEFLOW_HAVE_CUDNN
namespace {

// The entry points used, resolved from libcudnn.so.9 (the dispatcher library that loads the
// graph and engine libraries beside it).
struct CudnnLib {
  size_t (*version)();
  void (*last_error)(char*, size_t);
  cudnnStatus_t (*create)(cudnnHandle_t*);
  cudnnStatus_t (*set_stream)(cudnnHandle_t, cudaStream_t);
  cudnnStatus_t (*create_desc)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t*);
  cudnnStatus_t (*destroy_desc)(cudnnBackendDescriptor_t);
  cudnnStatus_t (*set_attr)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
                            int64_t, const void*);
  cudnnStatus_t (*get_attr)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
                            int64_t, int64_t*, void*);
  cudnnStatus_t (*finalize)(cudnnBackendDescriptor_t);
  cudnnStatus_t (*execute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t);
};

struct Loaded {
  CudnnLib lib{};
  bool ok = false;
  std::string why;
};

const Loaded& loaded() {
  static const Loaded l = [] {
    Loaded r;
    void* h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
      r.why = std::string("libcudnn.so.9 could not be loaded (") + dlerror() +
              "); put cuDNN 9's lib folder (e.g. the nvidia-cudnn wheel's nvidia/cudnn/lib) on LD_LIBRARY_PATH";
      return r;
    }
    auto sym = [&](const char* name) {
      void* p = dlsym(h, name);
      if (!p && r.why.empty()) r.why = std::string("libcudnn.so.9 lacks ") + name;
      return p;
    };
    auto& L = r.lib;
    L.version = reinterpret_cast<decltype(L.version)>(sym("cudnnGetVersion"));
    L.last_error = reinterpret_cast<decltype(L.last_error)>(sym("cudnnGetLastErrorString"));
    L.create = reinterpret_cast<decltype(L.create)>(sym("cudnnCreate"));
    L.set_stream = reinterpret_cast<decltype(L.set_stream)>(sym("cudnnSetStream"));
    L.create_desc = reinterpret_cast<decltype(L.create_desc)>(sym("cudnnBackendCreateDescriptor"));
    L.destroy_desc = reinterpret_cast<decltype(L.destroy_desc)>(sym("cudnnBackendDestroyDescriptor"));
    L.set_attr = reinterpret_cast<decltype(L.set_attr)>(sym("cudnnBackendSetAttribute"));
    L.get_attr = reinterpret_cast<decltype(L.get_attr)>(sym("cudnnBackendGetAttribute"));
    L.finalize = reinterpret_cast<decltype(L.finalize)>(sym("cudnnBackendFinalize"));
    L.execute = reinterpret_cast<decltype(L.execute)>(sym("cudnnBackendExecute"));
    if (!r.why.empty()) return r;
    if (L.version() < 90000) {
      r.why = "cuDNN " + std::to_string(L.version()) + " is older than 9.0, which the attention graphs need";
      return r;
    }
    r.ok = true;
    return r;
  }();
  return l;
}

const CudnnLib& lib() {
  SF_CHECK(loaded().ok, "cuDNN: ", loaded().why);
  return loaded().lib;
}

std::string last_error() {
  char msg[1024] = {0};
  lib().last_error(msg, sizeof msg);
  return msg[0] ? msg : "(cuDNN gave no message)";
}

void check(cudnnStatus_t s, const char* what) {
  SF_CHECK(s == CUDNN_STATUS_SUCCESS, "cuDNN: ", what, " failed (status ", int(s), "): ", last_error());
}

}  // namespace

int64_t cudnn_version() { return loaded().ok ? int64_t(loaded().lib.version()) : 0; }
std::string cudnn_unavailable_reason() { return loaded().ok ? std::string() : loaded().why; }

cudnnHandle_t cudnn_handle_for_thread() {
  thread_local std::map<int, cudnnHandle_t> per_gpu;  // never destroyed: lives as long as the thread's GPU context
  int gpu = 0;
  cudaGetDevice(&gpu);
  cudnnHandle_t& h = per_gpu[gpu];
  if (!h) check(lib().create(&h), "creating a handle");
  return h;
}

CudnnDesc::CudnnDesc(cudnnBackendDescriptorType_t type) { check(lib().create_desc(type, &d_), "creating a descriptor"); }
CudnnDesc::~CudnnDesc() {
  if (d_) lib().destroy_desc(d_);
}
void CudnnDesc::set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
                    const void* values) {
  const cudnnStatus_t s = lib().set_attr(d_, name, type, count, values);
  SF_CHECK(s == CUDNN_STATUS_SUCCESS, "cuDNN: setting attribute ", int(name), " failed (status ", int(s),
           "): ", last_error());
}
void CudnnDesc::finalize(const char* what) { check(lib().finalize(d_), what); }

namespace {

using DescPtr = std::shared_ptr<CudnnDesc>;
DescPtr make(cudnnBackendDescriptorType_t t) { return std::make_shared<CudnnDesc>(t); }
void set_desc(CudnnDesc& d, cudnnBackendAttributeName_t name, const DescPtr& v) {
  cudnnBackendDescriptor_t raw = v->get();
  d.set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw);
}

}  // namespace

CudnnGraph::CudnnGraph() : scalar_storage_(std::make_shared<std::deque<double>>()) {}

namespace {
// A tensor descriptor; a by-value one is a scalar whose host value goes in the variant pack.
DescPtr tensor_desc(cudnnDataType_t type, const std::vector<int64_t>& dims, const std::vector<int64_t>& strides,
                    int64_t id, int64_t align, bool is_virtual, bool by_value) {
  auto t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  t->set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
  t->set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, int64_t(dims.size()), dims.data());
  t->set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, int64_t(strides.size()), strides.data());
  t->set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id);
  t->set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
  t->set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
  if (by_value) t->set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
  t->finalize("finalizing a tensor");
  return t;
}
}  // namespace

int64_t CudnnGraph::tensor(cudnnDataType_t type, std::vector<int64_t> dims, std::vector<int64_t> strides,
                           bool is_virtual) {
  const int64_t id = next_id_++;
  tensors_.emplace_back(id, tensor_desc(type, dims, strides, id, 16, is_virtual, false));
  return id;
}

template <class T>
int64_t CudnnGraph::scalar(cudnnDataType_t type, T v) {
  static_assert(sizeof(T) <= sizeof(double), "a scalar lives in one double's storage");
  const int64_t id = next_id_++;
  tensors_.emplace_back(id, tensor_desc(type, {1, 1, 1, 1}, {1, 1, 1, 1}, id, int64_t(sizeof(T)), false, true));
  scalar_storage_->push_back(0.0);
  std::memcpy(&scalar_storage_->back(), &v, sizeof v);
  scalars_.emplace_back(id, &scalar_storage_->back());
  return id;
}

int64_t CudnnGraph::scalar_f32(float v) { return scalar(CUDNN_DATA_FLOAT, v); }
int64_t CudnnGraph::scalar_i32(int32_t v) { return scalar(CUDNN_DATA_INT32, v); }

std::shared_ptr<CudnnDesc> CudnnGraph::desc(int64_t id) const {
  for (const auto& [i, d] : tensors_)
    if (i == id) return d;
  throw Error("cuDNN graph: no tensor with id " + std::to_string(id));
}

void CudnnGraph::matmul(int64_t a, int64_t b, int64_t c) {
  auto m = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  m->set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
  m->finalize("finalizing a matmul");
  auto op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
  set_desc(*op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, desc(a));
  set_desc(*op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, desc(b));
  set_desc(*op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, desc(c));
  set_desc(*op, CUDNN_ATTR_OPERATION_MATMUL_DESC, m);
  op->finalize("finalizing a matmul node");
  keep_.push_back(m);
  add_op(op);
}

void CudnnGraph::pointwise(cudnnPointwiseMode_t mode, int64_t x, int64_t y, int64_t b, int64_t t,
                           cudnnDataType_t math, int64_t axis) {
  auto p = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  p->set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
  p->set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math);
  if (axis >= 0) p->set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
  p->finalize("finalizing a pointwise");
  auto op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  set_desc(*op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, p);
  set_desc(*op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, desc(x));
  if (b >= 0) set_desc(*op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, desc(b));
  if (t >= 0) set_desc(*op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, desc(t));
  set_desc(*op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, desc(y));
  op->finalize("finalizing a pointwise node");
  keep_.push_back(p);
  add_op(op);
}

void CudnnGraph::reduction(cudnnReduceTensorOp_t reduce, int64_t x, int64_t y) {
  auto r = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  r->set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce);
  r->set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
  r->finalize("finalizing a reduction");
  auto op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
  set_desc(*op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, desc(x));
  set_desc(*op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, desc(y));
  set_desc(*op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, r);
  op->finalize("finalizing a reduction node");
  keep_.push_back(r);
  add_op(op);
}

void CudnnGraph::reshape(int64_t x, int64_t y) {
  auto op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
  set_desc(*op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, desc(x));
  set_desc(*op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, desc(y));
  op->finalize("finalizing a reshape node");
  add_op(op);
}

CudnnPlan CudnnGraph::build(const char* what) {
  cudnnHandle_t handle = cudnn_handle_for_thread();
  auto graph = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  std::vector<cudnnBackendDescriptor_t> raw;
  for (const auto& op : ops_) raw.push_back(op->get());
  graph->set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  graph->set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(raw.size()), raw.data());
  graph->finalize((std::string("finalizing the operation graph of ") + what).c_str());

  std::ostringstream refusals;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    auto heur = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    set_desc(*heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    heur->set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    if (lib().finalize(heur->get()) != CUDNN_STATUS_SUCCESS) {
      refusals << " heuristics mode " << int(mode) << ": " << last_error() << ";";
      continue;
    }
    int64_t count = 0;
    check(lib().get_attr(heur->get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                         nullptr),
          "counting the engine configurations");
    std::vector<DescPtr> cfgs;
    std::vector<cudnnBackendDescriptor_t> cfg_raw;
    for (int64_t i = 0; i < count; ++i) cfgs.push_back(make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    for (auto& c : cfgs) cfg_raw.push_back(c->get());
    check(lib().get_attr(heur->get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &count,
                         cfg_raw.data()),
          "reading the engine configurations");
    for (int64_t i = 0; i < count; ++i) {
      auto engine = make(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
      cudnnBackendDescriptor_t engine_raw = engine->get();
      int64_t n = 0, index = -1;
      if (lib().get_attr(cfg_raw[i], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                         &engine_raw) == CUDNN_STATUS_SUCCESS)
        lib().get_attr(engine_raw, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &index);
      auto plan = make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
      plan->set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg_raw[i]);
      if (lib().finalize(plan->get()) != CUDNN_STATUS_SUCCESS) {
        refusals << " engine " << index << ": " << last_error() << ";";
        continue;
      }
      CudnnPlan p;
      p.plan = plan;
      int64_t got = 0;
      check(lib().get_attr(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got,
                           &p.workspace_bytes),
            "reading the plan's workspace size");
      p.keep = keep_;
      p.keep.insert(p.keep.end(), ops_.begin(), ops_.end());
      for (const auto& t : tensors_) p.keep.push_back(t.second);
      p.keep.push_back(graph);
      p.keep.push_back(cfgs[i]);
      p.keep.push_back(engine);
      p.scalars = scalars_;
      p.scalar_storage = scalar_storage_;
      p.engine = "engine " + std::to_string(index);
      return p;
    }
    if (count == 0) refusals << " heuristics mode " << int(mode) << ": no engine;";
  }
  throw Error(std::string("cuDNN: no engine runs ") + what + ":" + refusals.str());
}

void CudnnPlan::run(cudaStream_t stream, const std::vector<std::pair<int64_t, void*>>& tensors,
                    void* workspace) const {
  cudnnHandle_t handle = cudnn_handle_for_thread();
  check(lib().set_stream(handle, stream), "setting the stream");
  std::vector<int64_t> ids;
  std::vector<void*> ptrs;
  for (const auto& [id, p] : tensors) ids.push_back(id), ptrs.push_back(p);
  for (const auto& [id, p] : scalars) ids.push_back(id), ptrs.push_back(const_cast<void*>(p));
  CudnnDesc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(ids.size()), ids.data());
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(ptrs.size()), ptrs.data());
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack.finalize("finalizing a variant pack");
  check(lib().execute(handle, plan->get(), pack.get()), ("running " + engine).c_str());
}

#else  // built without cuDNN's headers

int64_t cudnn_version() { return 0; }
std::string cudnn_unavailable_reason() {
  return "this build found no cuDNN headers (cudnn_graph.h); configure with -DCUDNN_ROOT=DIR to use cuDNN";
}

#endif

}  // namespace stateflow
