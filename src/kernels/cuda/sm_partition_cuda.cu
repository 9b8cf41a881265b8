#include "kernels/cuda/sm_partition_cuda.h"

#include <cuda.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_check.h"

namespace stateflow {
namespace {

// Green contexts came with CUDA 12.4; the driver's entry points are looked up at run time, so
// the program needs no libcuda at link time and an older driver gets an error, not a crash.
constexpr unsigned kGreenContextVersion = 12040;

template <class Fn>
Fn* driver_entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, kGreenContextVersion, cudaEnableDefault, &found);
  int driver = 0;
  cudaDriverGetVersion(&driver);
  SF_CHECK(e == cudaSuccess && found == cudaDriverEntryPointSuccess && fn != nullptr, "--sm-split needs CUDA green ",
           "contexts (driver API ", name, ", CUDA 12.4 or newer), which this driver (CUDA ", driver / 1000, ".",
           driver % 1000 / 10, ") lacks: update the NVIDIA driver, or leave out --sm-split (the stages then share ",
           "the whole GPU, one action at a time)");
  return reinterpret_cast<Fn*>(fn);
}

struct Driver {
  decltype(&cuDeviceGet) device_get = driver_entry<decltype(cuDeviceGet)>("cuDeviceGet");
  decltype(&cuDeviceGetDevResource) device_resource =
      driver_entry<decltype(cuDeviceGetDevResource)>("cuDeviceGetDevResource");
  decltype(&cuDevSmResourceSplitByCount) split =
      driver_entry<decltype(cuDevSmResourceSplitByCount)>("cuDevSmResourceSplitByCount");
  decltype(&cuDevResourceGenerateDesc) describe =
      driver_entry<decltype(cuDevResourceGenerateDesc)>("cuDevResourceGenerateDesc");
  decltype(&cuGreenCtxCreate) green_create = driver_entry<decltype(cuGreenCtxCreate)>("cuGreenCtxCreate");
  decltype(&cuCtxFromGreenCtx) from_green = driver_entry<decltype(cuCtxFromGreenCtx)>("cuCtxFromGreenCtx");
  decltype(&cuCtxSetCurrent) set_current = driver_entry<decltype(cuCtxSetCurrent)>("cuCtxSetCurrent");
  decltype(&cuCtxGetCurrent) get_current = driver_entry<decltype(cuCtxGetCurrent)>("cuCtxGetCurrent");
  decltype(&cuCtxGetDevResource) context_resource = driver_entry<decltype(cuCtxGetDevResource)>("cuCtxGetDevResource");
};

const Driver& driver() {
  static const Driver d;  // a failed lookup throws and is tried again next time
  return d;
}

void check(CUresult r, const char* what) { SF_CHECK(r == CUDA_SUCCESS, "CUDA driver: ", what, " failed (error ", int(r), ")"); }

CUdevResource gpu_sms(int gpu) {
  const Driver& d = driver();
  CUdevice dev;
  check(d.device_get(&dev, gpu), "cuDeviceGet");
  CUdevResource all{};
  check(d.device_resource(dev, &all, CU_DEV_RESOURCE_TYPE_SM), "cuDeviceGetDevResource (SMs)");
  return all;
}

// SMs per part: an equal share rounded down to a multiple of the smallest part (8 on Hopper),
// since the driver rounds a part's size up to its granularity, which could leave too few SMs for
// the last part.
unsigned part_size(const CUdevResource& all, int parts) {
  const unsigned align = std::max({1u, all.sm.smCoscheduledAlignment, all.sm.minSmPartitionSize});
  const unsigned size = all.sm.smCount / unsigned(parts) / align * align;
  SF_CHECK(size >= all.sm.minSmPartitionSize, "--sm-split: this GPU's ", all.sm.smCount, " SMs do not split into ",
           parts, " parts of at least ", all.sm.minSmPartitionSize, " SMs each: use at most ",
           all.sm.smCount / all.sm.minSmPartitionSize, " stages, or leave out --sm-split");
  return size;
}

struct Parts {
  std::vector<CUcontext> contexts;  // green contexts converted for cuCtxSetCurrent; never destroyed
  unsigned sms = 0;
};

Parts make_parts(int gpu, int parts) {
  const Driver& d = driver();
  CUdevice dev;
  check(d.device_get(&dev, gpu), "cuDeviceGet");
  CUdevResource all = gpu_sms(gpu);
  const unsigned size = part_size(all, parts);
  std::vector<CUdevResource> groups(static_cast<size_t>(parts));
  unsigned made = unsigned(parts);
  CUdevResource rest{};
  check(d.split(groups.data(), &made, &all, &rest, 0, size), "cuDevSmResourceSplitByCount");
  SF_CHECK(made == unsigned(parts), "--sm-split: the driver made ", made, " SM groups of ", size, " where ", parts,
           " were asked for: use fewer stages, or leave out --sm-split");
  Parts out;
  out.sms = groups[0].sm.smCount;
  for (CUdevResource& g : groups) {
    CUdevResourceDesc desc;
    check(d.describe(&desc, &g, 1), "cuDevResourceGenerateDesc");
    CUgreenCtx green;
    check(d.green_create(&green, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM), "cuGreenCtxCreate");
    CUcontext ctx;
    check(d.from_green(&ctx, green), "cuCtxFromGreenCtx");
    out.contexts.push_back(ctx);
  }
  return out;
}

std::mutex g_mu;
std::map<std::pair<int, int>, Parts> g_parts;  // (GPU, part count)

const Parts& parts_of(int gpu, int parts) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_parts.find({gpu, parts});
  if (it == g_parts.end()) it = g_parts.emplace(std::make_pair(gpu, parts), make_parts(gpu, parts)).first;
  return it->second;
}

int current_gpu_started() {
  int gpu = 0;
  cuda_check(cudaGetDevice(&gpu), "cudaGetDevice");
  cuda_check(cudaFree(nullptr), "cudaFree(0) (starting the primary context)");  // green contexts build on it
  return gpu;
}

}  // namespace

void use_sm_partition(int part, int parts) {
  SF_CHECK(parts >= 1 && part >= 0 && part < parts, "SM partition ", part, " of ", parts, " does not exist");
  const Parts& p = parts_of(current_gpu_started(), parts);
  check(driver().set_current(p.contexts[size_t(part)]), "cuCtxSetCurrent (green context)");
}

int sm_count_of_thread() {
  current_gpu_started();
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  check(d.get_current(&ctx), "cuCtxGetCurrent");
  CUdevResource r{};
  check(d.context_resource(ctx, &r, CU_DEV_RESOURCE_TYPE_SM), "cuCtxGetDevResource (SMs)");
  return int(r.sm.smCount);
}

std::string sm_partition_description(int parts) {
  const int gpu = current_gpu_started();
  const CUdevResource all = gpu_sms(gpu);
  return std::to_string(part_size(all, parts)) + " of " + std::to_string(all.sm.smCount) + " SMs";
}

void synchronize_thread_stream() { cuda_check(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize"); }

}  // namespace stateflow
