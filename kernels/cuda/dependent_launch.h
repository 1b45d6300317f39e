#ifndef STRATA_KERNELS_CUDA_DEPENDENT_LAUNCH_H_
#define STRATA_KERNELS_CUDA_DEPENDENT_LAUNCH_H_

// Programmatic dependent launch (Hopper and later): whether the kernels of kernels/cuda let the next kernel
// on their stream start before they finish.
//
// With it on, every launcher here enqueues its kernels with cudaLaunchAttributeProgrammaticStreamSerialization:
// a kernel's blocks may become resident while the kernel before it on the stream still runs, do the work
// that does not depend on it (loading their weights), then wait (griddepcontrol.wait) until that kernel has
// finished and its writes are visible. Results are bit for bit those of plain launches: only the overlap of
// one kernel's start with the previous one's end changes. Kernels launched by anyone else (cuBLAS, copies)
// keep the plain ordering on both sides.
//
// The setting is process-wide (benches compare both in one run); changing it affects launches made after
// the call, so a CUDA graph keeps the setting it was captured with. Any thread may call these.

namespace strata::kernels::cuda {

// On by default where the device supports it (compute capability 9.0 or later, and the kernels built for
// sm_90 or later: STRATA_CUDA_ARCHITECTURES); off otherwise whatever the argument.
void SetDependentLaunch(bool on);
bool DependentLaunchEnabled();

}  // namespace strata::kernels::cuda

#endif  // STRATA_KERNELS_CUDA_DEPENDENT_LAUNCH_H_
