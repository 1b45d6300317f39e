#ifndef STRATA_PACKTOOL_PACK_WRITER_H_
#define STRATA_PACKTOOL_PACK_WRITER_H_

// Writes a pack from any source of f32 expert weights: the shared back end of convert and synth.
//
// The pack is built in `<output>.partial/` and renamed to `<output>` only once complete and synced; on any
// error or cancellation the partial directory is removed, so a directory named `<output>` is always whole.
// Experts are quantized by `threads` workers, each holding one expert's f32 roles and one blob, so memory
// stays bounded by the thread count, not the model size.

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/pack/pack_format.h"
#include "kernels/cpu/thread_pool.h"
#include "packtool/convert.h"
#include "strata/pack/v1/manifest.pb.h"

namespace strata::packtool {

// Fills the f32 roles of one expert: gate and up are expert_ff x n_embd, down is n_embd x expert_ff, all
// row-major. Called concurrently from several threads with different (moe_layer, expert).
using ExpertFiller =
    std::function<absl::Status(int64_t moe_layer, int64_t expert, float* gate, float* up, float* down)>;

// Writes dense.gguf at the given path.
using DenseWriter = std::function<absl::Status(const std::string& path)>;

struct PackWriteJob {
  std::string output_dir;
  pack::v1::Manifest manifest;  // architecture, geometry, sources, created_by; the rest is filled in
  pack::BlobLayout layout;
  int threads = 0;
  uint64_t source_expert_bytes = 0;  // for the read rate in progress reports
  DenseWriter write_dense;
  ExpertFiller fill_expert;
  // Called after each expert is done with its source bytes (e.g. to drop mapped pages). May be null.
  std::function<void(int64_t moe_layer, int64_t expert)> release_expert;
};

absl::StatusOr<pack::v1::Manifest> WritePack(const PackWriteJob& job, const ConvertProgressFn& progress,
                                             const std::atomic<bool>* cancel);

// Fails with ALREADY_EXISTS when `output` (a pack directory or a file) exists and FAILED_PRECONDITION when
// `<output>.partial` does (another job is writing it, or one was killed: remove it by hand).
absl::Status CheckOutputFree(const std::string& output);

// Most threads a conversion or validation may ask for; each holds a blob's worth of buffers.
inline constexpr int kMaxThreads = kernels::ThreadPool::kMaxThreads;

using kernels::ResolveThreads;

// INVALID_ARGUMENT naming `field` unless 0 <= threads <= kMaxThreads.
absl::Status CheckThreads(int64_t threads, std::string_view field);

// Size and xxh3-64 of a whole file, read with read(2) so that hashing does not grow the process's RSS.
// CANCELLED, between 1 MiB reads, once `cancel` (may be null) is set.
absl::StatusOr<std::pair<uint64_t, uint64_t>> HashFile(const std::string& path,
                                                       const std::atomic<bool>* cancel = nullptr);

// Drops the pages of [data, data + size) of a read-only file mapping from this process's resident set
// (only whole pages inside the range). Used to keep streaming conversions at bounded memory.
void ReleaseMappedRange(const uint8_t* data, uint64_t size);

}  // namespace strata::packtool

#endif  // STRATA_PACKTOOL_PACK_WRITER_H_
