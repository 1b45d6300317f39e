#ifndef STRATA_PACKTOOL_PACK_WRITER_H_
#define STRATA_PACKTOOL_PACK_WRITER_H_

// Writes a pack from any source of f32 expert weights, or of finished blobs: the shared back end of convert
// and synth.
//
// The pack is built in `<output>.partial/` and renamed to `<output>` only once complete and synced; on any
// error or cancellation the partial directory is removed, so a directory named `<output>` is always whole.
// Experts are quantized (or their blobs filled) by `threads` workers, each holding one blob (and, when
// quantizing, one expert's f32 roles), so memory stays bounded by the thread count, not the model size.

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/pack/pack_format.h"
#include "engine/exec/thread_pool.h"
#include "kernels/cpu/quantize.h"
#include "packtool/convert.h"
#include "strata/pack/v1/manifest.pb.h"

namespace strata::packtool {

// Fills the f32 roles of one expert: gate and up are expert_ff x n_embd, down is n_embd x expert_ff, all
// row-major. Called concurrently from several threads with different (moe_layer, expert).
using ExpertFiller =
    std::function<absl::Status(int64_t moe_layer, int64_t expert, float* gate, float* up, float* down)>;

// Writes the finished blob of one expert in the job's layout: `blob` is blob_bytes long and zeroed, and the
// filler writes the three roles at their offsets (the padding stays zero). Called concurrently from several
// threads with different (moe_layer, expert).
using BlobFiller = std::function<absl::Status(int64_t moe_layer, int64_t expert, std::span<uint8_t> blob)>;

// Writes dense.gguf at the given path. When it changed the dense weights' type it appends the error it added
// (role "dense") to `errors`, which the manifest's quant_error then lists after the expert roles.
using DenseWriter = std::function<absl::Status(const std::string& path, std::vector<pack::v1::RoleError>* errors)>;

struct PackWriteJob {
  std::string output_dir;
  pack::v1::Manifest manifest;  // architecture, geometry, sources, created_by; the rest is filled in
  pack::BlobLayout layout;
  int threads = 0;
  uint64_t source_expert_bytes = 0;  // for the read rate in progress reports
  DenseWriter write_dense;
  // Exactly one of these is set. fill_expert: f32 weights, quantized here, with the quantization error
  // measured per role. fill_blob: finished blobs (no f32 buffers); the error is then not measured: the
  // manifest's quant_error stays empty and progress reports rel_rms_error as NaN.
  ExpertFiller fill_expert;
  BlobFiller fill_blob;
  // Optional, with fill_expert: writes role `role` (0 gate, 1 up, 2 down) of an expert straight from its
  // source into `dst` (the role's bytes in the blob), adding its error against `values` (the role's f32
  // weights, already filled) to *error, and returns true; or returns false, having written nothing, to
  // have the role quantized from `values`. Called concurrently like fill_expert.
  std::function<absl::StatusOr<bool>(int64_t moe_layer, int64_t expert, int role, const float* values, uint8_t* dst,
                                     kernels::QuantizeError* error)>
      transcode_role;
  // Optional, with transcode_role: true when transcode_role writes all three roles of this expert without their
  // values; fill_expert is then not called and transcode_role gets null values.
  std::function<bool(int64_t moe_layer, int64_t expert)> transcodes_without_values;
  // Called after each expert is done with its source bytes (e.g. to drop mapped pages). May be null.
  std::function<void(int64_t moe_layer, int64_t expert)> release_expert;
  // Called by a worker, before it fills an expert, for an expert one round ahead (e.g. to have the disk
  // read its source pages while this one is quantized). May be null.
  std::function<void(int64_t moe_layer, int64_t expert)> prefetch_expert;
  // Called once every expert is written and before the manifest is: completes the manifest with what was
  // computed beside the conversion (convert: the source shards' checksums). May be null.
  std::function<absl::Status(pack::v1::Manifest* manifest)> complete_manifest;
};

absl::StatusOr<pack::v1::Manifest> WritePack(const PackWriteJob& job, const ConvertProgressFn& progress,
                                             const std::atomic<bool>* cancel);

// Fails with ALREADY_EXISTS when `output` (a pack directory or a file) exists and FAILED_PRECONDITION when
// `<output>.partial` does (another job is writing it, or one was killed: remove it by hand).
absl::Status CheckOutputFree(const std::string& output);

// Most threads a conversion or validation may ask for; each holds a blob's worth of buffers.
inline constexpr int kMaxThreads = exec::ThreadPool::kMaxThreads;

using exec::ResolveThreads;

// INVALID_ARGUMENT naming `field` unless 0 <= threads <= kMaxThreads.
absl::Status CheckThreads(int64_t threads, std::string_view field);

// Size and xxh3-64 of a whole file, read with read(2) so that hashing does not grow the process's RSS.
// CANCELLED, between 1 MiB reads, once `cancel` (may be null) is set.
absl::StatusOr<std::pair<uint64_t, uint64_t>> HashFile(const std::string& path,
                                                       const std::atomic<bool>* cancel = nullptr);

// Size and xxh3-64 of the bytes of a read-only file mapping (HashFile's result for the whole file mapped),
// hashed where they are mapped, without read(2)'s copy; each MiB's pages are dropped from the resident set
// once hashed (ReleaseMappedRange). CANCELLED, between MiBs, once `cancel` (may be null) is set.
absl::StatusOr<std::pair<uint64_t, uint64_t>> HashMapped(std::span<const uint8_t> bytes, const std::string& name,
                                                         const std::atomic<bool>* cancel = nullptr);

// Drops the pages of [data, data + size) of a read-only file mapping from this process's resident set
// (only whole pages inside the range). Used to keep streaming conversions at bounded memory.
void ReleaseMappedRange(const uint8_t* data, uint64_t size);

// Asks the kernel to start reading the pages of [data, data + size) of a file mapping (MADV_WILLNEED).
void PrefetchMappedRange(const uint8_t* data, uint64_t size);

}  // namespace strata::packtool

#endif  // STRATA_PACKTOOL_PACK_WRITER_H_
