// MeasureDependentKernelMicros and MeasureCodeFetchMicros (device_info.h).

#include <algorithm>
#include <array>
#include <functional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/device_info.h"

namespace strata::kernels::cuda {
namespace {

constexpr int kLinkThreads = 128;

// One link of the chain: block b reads in[b] (written by the kernel before, so from L2) and writes it, plus one,
// to out[b] for the next.
__global__ void __launch_bounds__(kLinkThreads) ChainLinkKernel(const unsigned* in, unsigned* out) {
  WaitForPriorKernels();
  if (threadIdx.x == 0) out[blockIdx.x] = __ldcg(in + blockIdx.x) + 1u;
}

// A link with a body of kBodyInstructions multiply-adds after its wait, in four independent chains by a
// multiplier read at run time (so that none folds), so that its time is mostly fetching its code. kVariant
// makes each instantiation another function at another address.
constexpr int kBodyInstructions = 1024;
constexpr int kCodeVariants = 16;

template <int kVariant>
__global__ void __launch_bounds__(kLinkThreads) CodeBodyKernel(const unsigned* in, unsigned* out) {
  WaitForPriorKernels();
  unsigned v[4];
  const unsigned x = __ldcg(in + blockIdx.x);
  const unsigned m = x | 1u;  // not known when compiled: no chain folds into fewer instructions
#pragma unroll
  for (int c = 0; c < 4; ++c) v[c] = x + c;
#pragma unroll
  for (int i = 0; i < kBodyInstructions / 4; ++i) {
    asm volatile("mad.lo.u32 %0, %0, %1, %2;" : "+r"(v[0]) : "r"(m), "n"(kVariant + 1));
    asm volatile("mad.lo.u32 %0, %0, %1, %2;" : "+r"(v[1]) : "r"(m), "n"(kVariant + 2));
    asm volatile("mad.lo.u32 %0, %0, %1, %2;" : "+r"(v[2]) : "r"(m), "n"(kVariant + 3));
    asm volatile("mad.lo.u32 %0, %0, %1, %2;" : "+r"(v[3]) : "r"(m), "n"(kVariant + 4));
  }
  if (threadIdx.x == 0) out[blockIdx.x] = v[0] ^ v[1] ^ v[2] ^ v[3];
}

using LinkKernel = void (*)(const unsigned*, unsigned*);

template <int... kVariants>
constexpr std::array<LinkKernel, sizeof...(kVariants)> CodeBodies(std::integer_sequence<int, kVariants...>) {
  return {&CodeBodyKernel<kVariants>...};
}

// Microseconds a launch of a graph of `kernels` launches of `blocks` blocks, link(i) the kernel of launch i,
// each reading what the one before wrote: the median of `repeats` replays after a warm-up.
absl::StatusOr<double> TimeChain(const char* what, int kernels, int blocks, int repeats,
                                 const std::function<LinkKernel(int)>& link) {
  absl::StatusOr<DeviceBuffer> values = DeviceBuffer::Allocate(2 * static_cast<size_t>(blocks) * sizeof(unsigned));
  if (!values.ok()) return values.status();
  CUDA_RETURN_IF_ERROR(cudaMemset(values->data(), 0, values->bytes()), what);
  unsigned* a = values->as<unsigned>();
  unsigned* b = a + blocks;
  cudaStream_t stream = nullptr;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), what);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  absl::Status status = CudaStatus(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), what);
  for (int i = 0; status.ok() && i < kernels; ++i) {
    status = LaunchKernel(what, link(i), dim3(blocks), dim3(kLinkThreads), 0, stream, i % 2 == 0 ? a : b,
                          i % 2 == 0 ? b : a);
  }
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (status.ok()) status = CudaStatus(ended, what);
  if (status.ok()) status = CudaStatus(cudaGraphInstantiate(&exec, graph, 0), what);
  if (status.ok()) status = CudaStatus(cudaEventCreate(&start), what);
  if (status.ok()) status = CudaStatus(cudaEventCreate(&stop), what);
  if (status.ok()) status = CudaStatus(cudaGraphLaunch(exec, stream), absl::StrCat(what, " warm-up"));
  std::vector<double> micros;
  for (int r = 0; status.ok() && r < repeats; ++r) {
    cudaEventRecord(start, stream);
    cudaGraphLaunch(exec, stream);
    cudaEventRecord(stop, stream);
    status = CudaStatus(cudaEventSynchronize(stop), what);
    float ms = 0;
    if (status.ok()) status = CudaStatus(cudaEventElapsedTime(&ms, start, stop), what);
    if (status.ok()) micros.push_back(1e3 * ms / kernels);
  }
  if (start != nullptr) cudaEventDestroy(start);
  if (stop != nullptr) cudaEventDestroy(stop);
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  if (!status.ok()) return status;
  std::sort(micros.begin(), micros.end());
  return micros[micros.size() / 2];
}

}  // namespace

absl::StatusOr<double> MeasureDependentKernelMicros(int kernels, int blocks, int repeats) {
  if (kernels < 1 || blocks < 1 || repeats < 1) {
    return absl::InvalidArgumentError(absl::StrCat("MeasureDependentKernelMicros: kernels ", kernels, ", blocks ",
                                                   blocks, " and repeats ", repeats, " must be at least 1"));
  }
  return TimeChain("chain probe", kernels, blocks, repeats, [](int) { return &ChainLinkKernel; });
}

absl::StatusOr<double> MeasureCodeFetchMicros(int kernels_in_turn, int kernels, int blocks, int repeats) {
  if (kernels_in_turn < 1 || kernels_in_turn > kCodeVariants || kernels < 1 || blocks < 1 || repeats < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MeasureCodeFetchMicros: kernels_in_turn ", kernels_in_turn, " must be in [1, ", kCodeVariants,
        "], kernels ", kernels, ", blocks ", blocks, " and repeats ", repeats, " at least 1"));
  }
  static constexpr auto kBodies = CodeBodies(std::make_integer_sequence<int, kCodeVariants>());
  return TimeChain("code fetch probe", kernels, blocks, repeats,
                   [kernels_in_turn](int i) { return kBodies[i % kernels_in_turn]; });
}

}  // namespace strata::kernels::cuda
