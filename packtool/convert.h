#ifndef STRATA_PACKTOOL_CONVERT_H_
#define STRATA_PACKTOOL_CONVERT_H_

// Converts a GGUF model (one file or split shards) into a pack; or a Hugging Face checkpoint (a directory
// with config.json and *.safetensors, packtool/hf_checkpoint.h), first written as a GGUF next to the output.
//
// Streams expert by expert on `threads` workers, each reading (through the mapping, with the next round's
// expert prefetched), quantizing (vectorized fits that report the error in the same pass) and writing
// (pwrite) on its own, so reading, quantizing and writing overlap across workers; the source shards are
// hashed on one more thread beside them. Memory is bounded whatever the model size:
//   threads x (3 x n_embd x expert_ff x 4 bytes of f32 roles + one blob + two experts' source pages)
//   + the largest dense tensor (dense.gguf is written one tensor at a time) + 1 MiB for hashing;
// mapped source pages are dropped once used. Writes `<out>.partial/` and renames it to `<out>` only when
// everything is written and synced; on failure or cancellation the partial directory is removed.

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/format/scheme.h"
#include "packtool/dense_convert.h"
#include "strata/pack/v1/manifest.pb.h"

namespace strata::packtool {

struct ConvertOptions {
  std::string input;       // .gguf, any shard of a split model, or a Hugging Face checkpoint's directory
  std::string tokenizer_gguf;  // Hugging Face input only: the tokenizer from this GGUF, not tokenizer.json
  std::string output_dir;  // must not exist; neither may output_dir + ".partial"
  kernels::Scheme scheme = kernels::Scheme::kS4;
  int threads = 0;         // 0 = one per core this process may use
  DenseTarget dense_type = DenseTarget::kKeep;  // the dense weight matrices' type in dense.gguf
  // Roles whose source codes the scheme holds (source_transcode.h: q4_0, q4_1, q4_K into s4, mxfp4 into s8 or
  // mxfp4) are carried over code for code; false sends every role through the generic fit (for measuring what
  // that adds).
  bool transcode = true;
};

struct ConvertProgress {
  std::string phase;       // "hf-to-gguf" (Hugging Face input), "dense", "experts", "finish", "done"
  uint64_t bytes_done = 0;   // pack expert bytes written
  uint64_t bytes_total = 0;
  uint64_t experts_done = 0;
  uint64_t experts_total = 0;
  double bytes_per_second = 0;  // source expert bytes read per second
  double rel_rms_error = 0;     // over all roles so far
};

// Called from the converting thread, at most every ~100 ms and once per phase change.
using ConvertProgressFn = std::function<void(const ConvertProgress&)>;

// Converts; returns the manifest written. Fails with CANCELLED (and leaves nothing behind) when `cancel`
// becomes true; checks it at least once per expert. `cancel` and `progress` may be null.
absl::StatusOr<pack::v1::Manifest> ConvertGguf(const ConvertOptions& options, const ConvertProgressFn& progress,
                                               const std::atomic<bool>* cancel);

}  // namespace strata::packtool

#endif  // STRATA_PACKTOOL_CONVERT_H_
