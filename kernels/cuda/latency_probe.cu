// MeasureDependentKernelMicros (device_info.h).

#include <algorithm>
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

}  // namespace

absl::StatusOr<double> MeasureDependentKernelMicros(int kernels, int blocks, int repeats) {
  if (kernels < 1 || blocks < 1 || repeats < 1) {
    return absl::InvalidArgumentError(absl::StrCat("MeasureDependentKernelMicros: kernels ", kernels, ", blocks ",
                                                   blocks, " and repeats ", repeats, " must be at least 1"));
  }
  absl::StatusOr<DeviceBuffer> values = DeviceBuffer::Allocate(2 * static_cast<size_t>(blocks) * sizeof(unsigned));
  if (!values.ok()) return values.status();
  CUDA_RETURN_IF_ERROR(cudaMemset(values->data(), 0, values->bytes()), "chain probe");
  unsigned* a = values->as<unsigned>();
  unsigned* b = a + blocks;
  cudaStream_t stream = nullptr;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "chain probe");
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  absl::Status status = CudaStatus(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "chain probe");
  for (int i = 0; status.ok() && i < kernels; ++i) {
    status = LaunchKernel("chain probe", ChainLinkKernel, dim3(blocks), dim3(kLinkThreads), 0, stream,
                          i % 2 == 0 ? a : b, i % 2 == 0 ? b : a);
  }
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (status.ok()) status = CudaStatus(ended, "chain probe");
  if (status.ok()) status = CudaStatus(cudaGraphInstantiate(&exec, graph, 0), "chain probe");
  if (status.ok()) status = CudaStatus(cudaEventCreate(&start), "chain probe");
  if (status.ok()) status = CudaStatus(cudaEventCreate(&stop), "chain probe");
  if (status.ok()) status = CudaStatus(cudaGraphLaunch(exec, stream), "chain probe warm-up");
  std::vector<double> micros;
  for (int r = 0; status.ok() && r < repeats; ++r) {
    cudaEventRecord(start, stream);
    cudaGraphLaunch(exec, stream);
    cudaEventRecord(stop, stream);
    status = CudaStatus(cudaEventSynchronize(stop), "chain probe");
    float ms = 0;
    if (status.ok()) status = CudaStatus(cudaEventElapsedTime(&ms, start, stop), "chain probe");
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

}  // namespace strata::kernels::cuda
