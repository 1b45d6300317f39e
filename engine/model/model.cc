#include "engine/model/model.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"

namespace strata::model {
namespace {

absl::Status Mismatch(const char* what, int64_t pack_value, int64_t model_value) {
  return absl::InvalidArgumentError(absl::StrCat("pack geometry ", what, " is ", pack_value,
                                                 " but dense.gguf says ", model_value));
}

// Whether `cache` is laid out for `config`: its layers and key and value widths, and each ring sized for
// that layer's window (a ring for another window would hold the wrong positions, and the CUDA backend places
// every layer's slots from the model's windows). A cache without rings fits any windows.
absl::Status CheckCacheFits(const KvCache& cache, const ModelConfig& config) {
  const KvLayout layout = CacheLayout(config);
  if (cache.n_layer() != config.n_layer || cache.key_dim() != layout.key_dim ||
      cache.value_dim() != layout.value_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a KV cache of ", cache.n_layer(), " layers of keys ", cache.key_dim(), " and values ", cache.value_dim(),
        " wide reached a model that needs ", config.n_layer, " layers of ", layout.key_dim, " and ",
        layout.value_dim));
  }
  if (!cache.windowed()) return absl::OkStatus();
  for (int64_t l = 0; l < config.n_layer; ++l) {
    if (cache.slots(l) < cache.capacity() && cache.window(l) != AttentionWindow(config, l)) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", l, " of a KV cache keeps a ring for a window of ",
                                                     cache.window(l), " positions; the model's is ",
                                                     AttentionWindow(config, l)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> Model::Create(const pack::Pack& pack) {
  std::unique_ptr<Model> m(new Model());
  ASSIGN_OR_RETURN(m->config_, ReadModelConfig(pack.dense().metadata()));
  RETURN_IF_ERROR(ConfigureFromTensors(pack.dense(), &m->config_));
  const ModelConfig& c = m->config_;
  const pack::v1::Geometry& g = pack.manifest().geometry();
  if (g.n_layer() != c.n_layer) return Mismatch("n_layer", g.n_layer(), c.n_layer);
  if (g.n_embd() != c.n_embd) return Mismatch("n_embd", g.n_embd(), c.n_embd);
  if (g.n_expert() != c.n_expert) return Mismatch("n_expert", g.n_expert(), c.n_expert);
  if (g.n_expert_used() != c.n_expert_used) return Mismatch("n_expert_used", g.n_expert_used(), c.n_expert_used);
  if (g.expert_ff() != c.expert_ff) return Mismatch("expert_ff", g.expert_ff(), c.expert_ff);
  if (g.n_shared_experts() != 0 && c.shared_expert_ff == 0) {
    return absl::UnimplementedError(absl::StrCat("the pack has ", g.n_shared_experts(),
                                                 " shared experts; ", c.arch, " models in Strata have none"));
  }
  // Every block is MoE but the architecture's dense leading blocks.
  bool moe_layers_as_expected = static_cast<int64_t>(g.n_moe_layers()) == c.n_layer - c.n_dense_lead &&
                                static_cast<uint32_t>(g.moe_layers_size()) == g.n_moe_layers();
  for (int i = 0; moe_layers_as_expected && i < g.moe_layers_size(); ++i) {
    moe_layers_as_expected = static_cast<int64_t>(g.moe_layers(i)) == c.n_dense_lead + i;
  }
  if (!moe_layers_as_expected) {
    return absl::UnimplementedError(absl::StrCat("the pack has ", g.n_moe_layers(), " MoE layers of ", c.n_layer,
                                                 "; Strata runs ", c.arch, " models whose blocks from ", c.n_dense_lead,
                                                 " on are all MoE"));
  }
  m->moe_index_.assign(static_cast<size_t>(c.n_layer), kDenseBlock);
  for (int i = 0; i < g.moe_layers_size(); ++i) m->moe_index_[g.moe_layers(i)] = static_cast<uint32_t>(i);
  ASSIGN_OR_RETURN(m->weights_, LoadWeights(pack.dense(), c));
  return m;
}

void Model::Attach(std::unique_ptr<DenseBackend> backend, std::unique_ptr<MoeDispatch> dispatch) {
  backend_ = std::move(backend);
  dispatch_ = std::move(dispatch);
}

absl::Status Model::CheckBatch(std::span<const ForwardToken> tokens) const {
  for (size_t i = 0; i < tokens.size(); ++i) {
    const ForwardToken& t = tokens[i];
    if (t.token < 0 || t.token >= config_.n_vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", t.token, " is not in the vocabulary (", config_.n_vocab, " tokens)"));
    }
    if (t.cache == nullptr || t.pos < 0 || t.pos >= t.cache->capacity()) {
      return absl::OutOfRangeError(absl::StrCat("position ", t.pos, " is outside the sequence's KV cache (",
                                                t.cache == nullptr ? 0 : t.cache->capacity(), " positions)"));
    }
    // A sequence's tokens come together in a step: check each cache once.
    if (i == 0 || tokens[i - 1].cache != t.cache) RETURN_IF_ERROR(CheckCacheFits(*t.cache, config_));
  }
  // A windowed layer's ring holds the window plus step_positions() - 1 positions: a step spanning more
  // positions of one sequence would overwrite keys its own earlier queries attend to.
  absl::flat_hash_map<const KvCache*, std::pair<int64_t, int64_t>> spans;  // first and last position
  for (const ForwardToken& t : tokens) {
    if (!t.cache->windowed()) continue;
    auto& [first, last] = spans.try_emplace(t.cache, t.pos, t.pos).first->second;
    first = std::min(first, t.pos);
    last = std::max(last, t.pos);
    if (last - first + 1 > t.cache->step_positions()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "one step spans positions ", first, "..", last, " of a sequence, ", last - first + 1,
          " positions; its sliding-window KV cache holds at most ", t.cache->step_positions(), " per step"));
    }
  }
  return absl::OkStatus();
}

absl::Status Model::Blocks() {
  DenseBackend& b = *backend_;
  RETURN_IF_ERROR(b.Embed());
  for (int64_t l = 0; l < config_.n_layer; ++l) {
    RETURN_IF_ERROR(b.Attention(l));
    if (moe_index_[l] == kDenseBlock) {
      RETURN_IF_ERROR(b.DenseFfn(l));
      continue;
    }
    MoeBatch moe;
    moe.moe_layer = moe_index_[l];
    RETURN_IF_ERROR(b.Router(l, &moe));
    // moe.n_tokens: the tokens the step computes, which a CUDA graph may pad beyond those given.
    if (l + 1 < config_.n_layer && moe_index_[l + 1] != kDenseBlock && dispatch_->WantsRoutingGuess(moe.n_tokens)) {
      RoutingGuess guess;
      RETURN_IF_ERROR(b.GuessRouting(l + 1, &guess));
      guess.moe_layer = moe_index_[l + 1];
      RETURN_IF_ERROR(dispatch_->Prefetch(guess));
    }
    RETURN_IF_ERROR(dispatch_->Run(moe));
    RETURN_IF_ERROR(b.Combine(l, moe));
  }
  return b.Head();
}

absl::Status Model::Forward(std::span<const ForwardToken> tokens, float* logits, ForwardStats* stats) {
  if (backend_ == nullptr || dispatch_ == nullptr) {
    return absl::FailedPreconditionError("the model has no backend attached");
  }
  RETURN_IF_ERROR(CheckBatch(tokens));
  const int n = static_cast<int>(tokens.size());
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(dispatch_->BeforeStep());
  RETURN_IF_ERROR(backend_->BeginBatch(tokens));
  RETURN_IF_ERROR(backend_->Run([this] { return Blocks(); }));
  RETURN_IF_ERROR(backend_->EndBatch(logits));
  const int k = static_cast<int>(config_.n_expert_used);
  if (stats != nullptr) {
    for (int64_t l = config_.n_dense_lead; l < config_.n_layer; ++l) {
      dispatch_->Account(moe_index_[l], backend_->routing(l), n, k, &stats->dispatch);
    }
    bool any_logits = false;
    for (const ForwardToken& t : tokens) any_logits |= t.want_logits;
    stats->dense_bytes += weights_->dense_bytes_per_token - (any_logits ? 0 : weights_->output.bytes());
  }
  const int64_t n_moe = config_.n_layer - config_.n_dense_lead;
  routing_.resize(static_cast<size_t>(n_moe));
  for (int64_t l = config_.n_dense_lead; l < config_.n_layer; ++l) routing_[moe_index_[l]] = backend_->routing(l);
  RETURN_IF_ERROR(dispatch_->AfterStep(n_moe, routing_.data(), n, k));
  return absl::OkStatus();
}

}  // namespace strata::model
