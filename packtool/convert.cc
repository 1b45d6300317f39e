#include "packtool/convert.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <filesystem>
#include <optional>
#include <span>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/gguf/gguf_file.h"
#include "engine/model/model_config.h"
#include "engine/pack/pack_format.h"
#include "engine/status_macros.h"
#include "packtool/dense_convert.h"
#include "packtool/hf_checkpoint.h"
#include "packtool/pack_writer.h"
#include "packtool/source_transcode.h"

namespace strata::packtool {
namespace {

// The three expert tensors of one MoE block.
struct MoeBlock {
  uint32_t block = 0;
  const gguf::TensorInfo* role[3] = {nullptr, nullptr, nullptr};  // gate, up, down
};

constexpr const char* kExpertTensorSuffix[3] = {"ffn_gate_exps.weight", "ffn_up_exps.weight",
                                                     "ffn_down_exps.weight"};

// "blk.12.ffn_up_exps.weight" -> (12, 1); other names -> nullopt.
std::optional<std::pair<uint32_t, int>> ParseExpertTensorName(std::string_view name) {
  std::vector<std::string> parts = absl::StrSplit(std::string(name), absl::MaxSplits('.', 2));
  if (parts.size() != 3 || parts[0] != "blk") return std::nullopt;
  uint32_t block = 0;
  if (!absl::SimpleAtoi(parts[1], &block)) return std::nullopt;
  for (int r = 0; r < 3; ++r) {
    if (parts[2] == kExpertTensorSuffix[r]) return std::make_pair(block, r);
  }
  return std::nullopt;
}

bool IsExpertTensor(std::string_view name) { return ParseExpertTensorName(name).has_value(); }

struct SourceModel {
  std::string arch;
  pack::v1::Geometry geometry;
  std::vector<MoeBlock> blocks;  // in block order
  uint64_t expert_bytes = 0;     // bytes of all expert tensors in the source
};

absl::StatusOr<SourceModel> Describe(const gguf::GgufModel& model, const std::string& input) {
  SourceModel src;
  auto arch = model.metadata().GetString("general.architecture");
  if (!arch.ok()) return absl::InvalidArgumentError(absl::StrCat(input, ": ", arch.status().message()));
  src.arch = *arch;
  // Refused before any work: an architecture the engine cannot run would convert for hours for nothing.
  if (auto supported = model::FindArchitecture(src.arch); !supported.ok()) {
    return WithContext(supported.status(), input);
  }
  const std::string a = src.arch;
  auto meta_uint = [&](const std::string& key) -> absl::StatusOr<uint64_t> {
    auto v = model.metadata().GetUint(key);
    if (!v.ok()) return absl::InvalidArgumentError(absl::StrCat(input, ": ", v.status().message()));
    return *v;
  };
  auto blocks = model::ReadBlockCount(model.metadata(), a);
  if (!blocks.ok()) return WithContext(blocks.status(), input);
  const uint64_t n_block = static_cast<uint64_t>(blocks->total), n_layer = static_cast<uint64_t>(blocks->run());

  std::map<uint32_t, MoeBlock> by_block;
  for (const gguf::TensorInfo& t : model.tensors()) {
    if (absl::StrContains(t.name, "ffn_gate_up_exps")) {
      return absl::UnimplementedError(absl::StrCat(input, ": tensor '", t.name,
                                                   "' holds fused gate+up experts, which Strata does not convert"));
    }
    auto parsed = ParseExpertTensorName(t.name);
    if (!parsed) continue;
    if (parsed->first >= n_block) {
      return absl::InvalidArgumentError(absl::StrCat(input, ": tensor '", t.name, "' is in block ", parsed->first,
                                                     " but ", a, ".block_count is ", n_block));
    }
    // A multi-token-prediction block's experts: the pack holds the blocks that run (WriteDenseGguf leaves the
    // rest of the block out too).
    if (parsed->first >= n_layer) continue;
    auto info = gguf::GetTypeInfo(static_cast<uint32_t>(t.type));
    if (!info.ok() || !info->can_dequantize) {
      return absl::UnimplementedError(absl::StrCat(input, ": tensor '", t.name, "' has type ",
                                                   gguf::TypeName(static_cast<uint32_t>(t.type)),
                                                   ", which Strata cannot decode"));
    }
    MoeBlock& b = by_block[parsed->first];
    b.block = parsed->first;
    b.role[parsed->second] = &t;
    src.expert_bytes += t.bytes;
  }
  if (by_block.empty() && blocks->mtp > 0) {
    return absl::InvalidArgumentError(absl::StrCat(input, ": no expert tensors in the ", n_layer, " blocks that run (",
                                                   a, ".nextn_predict_layers is ", blocks->mtp, " of ", a,
                                                   ".block_count ", n_block, "): not a MoE model"));
  }
  if (by_block.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(input, ": no expert tensors (blk.N.ffn_gate_exps.weight ...): not a MoE model"));
  }
  // Read after the tensors, so that a dense model is told it is not a MoE model rather than missing a key.
  ASSIGN_OR_RETURN(const uint64_t n_used, meta_uint(a + ".expert_used_count"));
  ASSIGN_OR_RETURN(const uint64_t n_embd_meta, meta_uint(a + ".embedding_length"));
  int64_t n_embd = -1, ff = -1, n_expert = -1;
  for (auto& [block, b] : by_block) {
    for (int r = 0; r < 3; ++r) {
      if (b.role[r] == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat(input, ": block ", block, " lacks tensor 'blk.", block, ".", kExpertTensorSuffix[r], "'"));
      }
      const gguf::TensorInfo& t = *b.role[r];
      if (t.ne.size() != 3) {
        return absl::InvalidArgumentError(
            absl::StrCat(input, ": tensor '", t.name, "' has ", t.ne.size(), " dimensions, expected 3"));
      }
      // gate/up: [n_embd, ff, n_expert]; down: [ff, n_embd, n_expert].
      const int64_t e = t.ne[0 + (r == 2 ? 1 : 0)], f = t.ne[r == 2 ? 0 : 1];
      if (n_embd < 0) n_embd = e, ff = f, n_expert = t.ne[2];
      if (e != n_embd || f != ff || t.ne[2] != n_expert) {
        return absl::InvalidArgumentError(absl::StrCat(
            input, ": tensor '", t.name, "' has shape [", t.ne[0], ", ", t.ne[1], ", ", t.ne[2], "], expected ",
            r == 2 ? absl::StrCat("[", ff, ", ", n_embd, ", ", n_expert, "]")
                   : absl::StrCat("[", n_embd, ", ", ff, ", ", n_expert, "]")));
      }
    }
    src.blocks.push_back(b);
  }
  if (static_cast<uint64_t>(n_embd) != n_embd_meta) {
    return absl::InvalidArgumentError(absl::StrCat(input, ": expert tensors have n_embd ", n_embd, " but ", a,
                                                   ".embedding_length is ", n_embd_meta));
  }
  ASSIGN_OR_RETURN(const uint64_t n_expert_meta,
                   model.metadata().GetUintOr(a + ".expert_count", static_cast<uint64_t>(n_expert)));
  if (n_expert_meta != static_cast<uint64_t>(n_expert)) {
    return absl::InvalidArgumentError(absl::StrCat(input, ": expert tensors hold ", n_expert, " experts but ", a,
                                                   ".expert_count is ", n_expert_meta));
  }
  if (n_used == 0 || n_used > static_cast<uint64_t>(n_expert)) {
    return absl::InvalidArgumentError(absl::StrCat(input, ": ", a, ".expert_used_count is ", n_used,
                                                   ", expected 1 .. ", n_expert));
  }
  ASSIGN_OR_RETURN(const uint64_t n_shared, model.metadata().GetUintOr(a + ".expert_shared_count", 0));
  pack::v1::Geometry& g = src.geometry;
  g.set_n_layer(static_cast<uint32_t>(n_layer));
  g.set_n_moe_layers(static_cast<uint32_t>(src.blocks.size()));
  for (const MoeBlock& b : src.blocks) g.add_moe_layers(b.block);
  g.set_n_expert(static_cast<uint32_t>(n_expert));
  g.set_n_expert_used(static_cast<uint32_t>(n_used));
  g.set_n_embd(static_cast<uint32_t>(n_embd));
  g.set_expert_ff(static_cast<uint32_t>(ff));
  g.set_n_shared_experts(static_cast<uint32_t>(n_shared));
  return src;
}

// The bytes of expert `e` inside an expert tensor: its rows are contiguous.
std::span<const uint8_t> ExpertSlice(const gguf::TensorInfo& t, int64_t expert) {
  const uint64_t per_expert = t.bytes / static_cast<uint64_t>(t.ne[2]);
  return {t.data + per_expert * static_cast<uint64_t>(expert), per_expert};
}

// Hashes every shard of a model on one thread, started at construction, where the model maps them (no copy
// through read(2)). AddSources waits for it; the destructor stops it (when the conversion ended early) and
// waits. Owned and called by ConvertGguf's thread; `model` must outlive it.
class ShardHasher {
 public:
  ShardHasher(const gguf::GgufModel& model, const std::atomic<bool>* cancel) : cancel_(cancel) {
    for (const auto& shard : model.shards()) {
      paths_.push_back(shard->path());
      bytes_.push_back(shard->bytes());
    }
    thread_ = std::thread([this] {
      for (size_t i = 0; i < paths_.size(); ++i) {
        results_.push_back(HashMapped(bytes_[i], paths_[i], &stop_));
        if (!results_.back().ok()) break;
      }
      std::lock_guard<std::mutex> lock(mu_);
      finished_ = true;
      done_cv_.notify_all();
    });
  }
  ~ShardHasher() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

  // Waits for the hashes (stopping them once `cancel` is set) and adds one source entry per shard.
  absl::Status AddSources(pack::v1::Manifest* manifest) {
    for (;;) {
      if (cancel_ != nullptr && cancel_->load(std::memory_order_relaxed)) stop_ = true;
      std::unique_lock<std::mutex> lock(mu_);
      if (done_cv_.wait_for(lock, std::chrono::milliseconds(50), [this] { return finished_; })) break;
    }
    thread_.join();
    for (size_t i = 0; i < paths_.size(); ++i) {
      if (i >= results_.size()) return absl::CancelledError("conversion cancelled while hashing the source");
      RETURN_IF_ERROR(results_[i].status());
      pack::v1::SourceShard* s = manifest->add_sources();
      s->set_name(std::filesystem::path(paths_[i]).filename().string());
      s->set_size(results_[i]->first);
      s->set_xxh3(pack::HashHex(results_[i]->second));
    }
    return absl::OkStatus();
  }

 private:
  const std::atomic<bool>* cancel_;
  std::vector<std::string> paths_;
  std::vector<std::span<const uint8_t>> bytes_;  // each shard's mapping, as paths_
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable done_cv_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<absl::StatusOr<std::pair<uint64_t, uint64_t>>> results_;  // written by thread_ only until joined
  std::thread thread_;
};

}  // namespace

namespace {

// A Hugging Face checkpoint is written as a GGUF next to the output (as much disk as the checkpoint, for
// the time of the conversion), converted like any GGUF, and removed, whatever the outcome.
absl::StatusOr<pack::v1::Manifest> ConvertHfCheckpoint(const ConvertOptions& options, const ConvertProgressFn& progress,
                                                       const std::atomic<bool>* cancel) {
  const std::string temp = options.output_dir + ".hf.gguf";
  std::error_code ec;
  if (std::filesystem::exists(temp, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat(temp, " exists (left by an interrupted convert?); remove it or choose another output"));
  }
  struct RemoveOnExit {
    const std::string& path;
    ~RemoveOnExit() {
      std::error_code ignored;
      std::filesystem::remove(path, ignored);
    }
  } remove_temp{temp};
  if (progress) {
    ConvertProgress p;
    p.phase = "hf-to-gguf";
    progress(p);
  }
  RETURN_IF_ERROR(HfCheckpointToGguf({options.input, temp, options.tokenizer_gguf, cancel}));
  ConvertOptions inner = options;
  inner.input = temp;
  inner.tokenizer_gguf.clear();
  return ConvertGguf(inner, progress, cancel);
}

}  // namespace

absl::StatusOr<pack::v1::Manifest> ConvertGguf(const ConvertOptions& options, const ConvertProgressFn& progress,
                                               const std::atomic<bool>* cancel) {
  if (options.input.empty()) return absl::InvalidArgumentError("input: no GGUF file given");
  if (options.output_dir.empty()) return absl::InvalidArgumentError("output: no pack directory given");
  RETURN_IF_ERROR(CheckOutputFree(options.output_dir));
  if (IsHfCheckpointDir(options.input)) return ConvertHfCheckpoint(options, progress, cancel);
  if (!options.tokenizer_gguf.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer_gguf: only for a Hugging Face checkpoint directory ",
                                                   "input; ", options.input, " is a GGUF, whose own tokenizer is used"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<gguf::GgufModel> model, gguf::GgufModel::Open(options.input));
  ASSIGN_OR_RETURN(SourceModel src, Describe(*model, options.input));
  // Everything else the engine would refuse at load time (RoPE scaling, head sizes, the tokenizer's list).
  if (auto config = model::ReadModelConfig(model->metadata()); !config.ok()) {
    return WithContext(config.status(), options.input);
  }
  ASSIGN_OR_RETURN(pack::BlobLayout layout,
                   pack::ComputeBlobLayout(options.scheme, src.geometry.n_embd(), src.geometry.expert_ff()));

  PackWriteJob job;
  job.output_dir = options.output_dir;
  job.layout = layout;
  job.threads = options.threads;
  job.source_expert_bytes = src.expert_bytes;
  job.manifest.set_architecture(src.arch);
  job.manifest.set_created_by("convert");
  *job.manifest.mutable_geometry() = src.geometry;
  // The shards are hashed on a thread of their own while the experts convert (it reads ahead of the
  // workers, whose reads then mostly hit the page cache), not in a pass of their own before.
  ShardHasher hasher(*model, cancel);
  job.complete_manifest = [&hasher](pack::v1::Manifest* manifest) { return hasher.AddSources(manifest); };
  const gguf::GgufModel* m = model.get();
  const DenseTarget dense_target = options.dense_type;
  job.write_dense = [m, dense_target](const std::string& path, std::vector<pack::v1::RoleError>* errors) {
    return WriteDenseGguf(*m, IsExpertTensor, dense_target, path, errors);
  };
  const std::vector<MoeBlock>& blocks = src.blocks;
  const int64_t n_embd = src.geometry.n_embd(), ff = src.geometry.expert_ff();
  job.fill_expert = [&blocks, n_embd, ff](int64_t moe_layer, int64_t expert, float* gate, float* up,
                                          float* down) -> absl::Status {
    float* out[3] = {gate, up, down};
    for (int r = 0; r < 3; ++r) {
      const gguf::TensorInfo& t = *blocks[moe_layer].role[r];
      const std::span<const uint8_t> slice = ExpertSlice(t, expert);
      absl::Status s = gguf::Dequantize(t.type, slice.data(), out[r], n_embd * ff);
      if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' expert ", expert, ": ", s.message()));
    }
    return absl::OkStatus();
  };
  // Roles whose source codes the scheme holds as they are are carried over code for code.
  bool any_transcoded = false;
  for (const MoeBlock& b : blocks) {
    for (int r = 0; r < 3; ++r) any_transcoded |= options.transcode && CanTranscode(b.role[r]->type, options.scheme);
  }
  if (any_transcoded) {
    const kernels::Scheme scheme = options.scheme;
    job.transcode_role = [&blocks, n_embd, ff, scheme](int64_t moe_layer, int64_t expert, int role, const float* values,
                                                       uint8_t* dst, kernels::QuantizeError* error) -> absl::StatusOr<bool> {
      const gguf::TensorInfo& t = *blocks[moe_layer].role[role];
      if (!CanTranscode(t.type, scheme)) return false;
      const int64_t rows = role == 2 ? n_embd : ff, cols = role == 2 ? ff : n_embd;
      absl::Status s = TranscodeRole(t.type, ExpertSlice(t, expert).data(), values, rows, cols, scheme, dst, error);
      if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' expert ", expert, ": ", s.message()));
      return true;
    };
  }
  if (any_transcoded) {
    const kernels::Scheme scheme = options.scheme;
    job.transcodes_without_values = [&blocks, scheme](int64_t moe_layer, int64_t) {
      for (int r = 0; r < 3; ++r) {
        if (!TranscodesWithoutValues(blocks[moe_layer].role[r]->type, scheme)) return false;
      }
      return true;
    };
  }
  job.prefetch_expert = [&blocks](int64_t moe_layer, int64_t expert) {
    for (int r = 0; r < 3; ++r) {
      const std::span<const uint8_t> slice = ExpertSlice(*blocks[moe_layer].role[r], expert);
      PrefetchMappedRange(slice.data(), slice.size());
    }
  };
  job.release_expert = [&blocks](int64_t moe_layer, int64_t expert) {
    for (int r = 0; r < 3; ++r) {
      const std::span<const uint8_t> slice = ExpertSlice(*blocks[moe_layer].role[r], expert);
      ReleaseMappedRange(slice.data(), slice.size());
    }
  };
  return WritePack(job, progress, cancel);
}

}  // namespace strata::packtool
