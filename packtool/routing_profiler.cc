#include "packtool/routing_profiler.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "engine/chat/chat_template.h"
#include "engine/exec/thread_pool.h"
#include "engine/model/kv_cache.h"
#include "engine/model/model.h"
#include "engine/pack/pack.h"
#include "engine/runtime/model_factory.h"
#include "engine/status_macros.h"
#include "engine/tokenizer/tokenizer.h"
#include "packtool/pack_writer.h"

namespace strata::packtool {
namespace {

using Clock = std::chrono::steady_clock;

// Prompt tokens run through the model in one step (the engine's default prefill chunk).
constexpr size_t kPrefillChunk = 256;

double Since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

bool Cancelled(const std::atomic<bool>* cancel) { return cancel != nullptr && cancel->load(std::memory_order_relaxed); }

bool Blank(const std::string& line) {
  return std::all_of(line.begin(), line.end(), [](unsigned char c) { return std::isspace(c) != 0; });
}

int32_t Argmax(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// Adds the router's picks of the model's last step (`n_tokens` tokens) to `profile`.
void CountRouting(const model::Model& model, const pack::v1::Geometry& g, int n_tokens,
                  pack::RoutingProfile* profile) {
  const int picks = n_tokens * static_cast<int>(g.n_expert_used());
  for (int layer = 0; layer < g.moe_layers_size(); ++layer) {
    // routing() is indexed by transformer block; the profile by MoE layer, as the blobs.
    const int32_t* ids = model.backend().routing(g.moe_layers(layer));
    uint64_t* counts = profile->counts.data() + static_cast<size_t>(layer) * g.n_expert();
    for (int i = 0; i < picks; ++i) {
      // An id outside the layer is not counted; the sums check of WriteRoutingProfile then refuses the profile.
      if (ids[i] >= 0 && static_cast<uint32_t>(ids[i]) < g.n_expert()) ++counts[ids[i]];
    }
  }
  profile->tokens += static_cast<uint64_t>(n_tokens);
}

}  // namespace

absl::Status CheckProfileOptions(const ProfileOptions& options) {
  if (options.pack_dir.empty()) return absl::InvalidArgumentError("pack_dir: empty; expected the pack directory");
  if (options.prompts_path.empty() && options.prompt_tokens.empty()) {
    return absl::InvalidArgumentError(
        "prompts_path: empty; expected a text file of prompts, one a line (or prompts as prompt_tokens)");
  }
  if (!options.prompts_path.empty() && !options.prompt_tokens.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("prompt_tokens: ", options.prompt_tokens.size(),
                                                   " prompts given with prompts_path ", options.prompts_path,
                                                   "; expected one of them"));
  }
  if (options.chat && !options.prompt_tokens.empty()) {
    return absl::InvalidArgumentError("chat: needs prompts_path (prompt_tokens are run as they are)");
  }
  if (options.decode_tokens < 0 || options.decode_tokens > kMaxDecodeTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode_tokens: ", options.decode_tokens, " is not in 0 .. ", kMaxDecodeTokens));
  }
  return CheckThreads(options.threads, "threads");
}

absl::StatusOr<std::vector<Prompt>> ReadPrompts(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory; expected a text file of prompts"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the prompts file: ", std::strerror(errno)));
  std::vector<Prompt> prompts;
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!Blank(line)) prompts.push_back({number, line});
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  if (prompts.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no prompts (", number == 0 ? "the file is empty" : "only blank lines",
                                                   "); expected one prompt a line"));
  }
  return prompts;
}

absl::StatusOr<ProfileResult> ProfilePack(const ProfileOptions& options,
                                          const std::function<void(const ProfileProgress&)>& progress) {
  RETURN_IF_ERROR(CheckProfileOptions(options));
  std::vector<Prompt> prompts;
  if (options.prompt_tokens.empty()) {
    ASSIGN_OR_RETURN(prompts, ReadPrompts(options.prompts_path));
  } else {
    prompts.resize(options.prompt_tokens.size());
    // line: the index into prompt_tokens, for messages.
    for (size_t p = 0; p < prompts.size(); ++p) prompts[p].line = static_cast<int64_t>(p);
  }
  // Where each prompt came from, for messages.
  auto where = [&](const Prompt& prompt) {
    return options.prompt_tokens.empty() ? absl::StrCat(options.prompts_path, " line ", prompt.line, ": ")
                                         : absl::StrCat("prompt_tokens[", prompt.line, "]: ");
  };
  const Clock::time_point load_start = Clock::now();
  // The profile being replaced is not read: a malformed one must not stop its replacement.
  ASSIGN_OR_RETURN(std::unique_ptr<pack::Pack> pack,
                   pack::Pack::Open(options.pack_dir, {.ignore_routing_profile = true}));
  ASSIGN_OR_RETURN(std::unique_ptr<exec::ThreadPool> pool,
                   exec::ThreadPool::Create(exec::ResolveThreads(options.threads)));
  runtime::DeviceOptions device;
  device.device = "cpu";
  pack::ExpertSourceOptions experts;
  experts.threads = options.threads;
  ASSIGN_OR_RETURN(runtime::LoadedModel loaded, runtime::LoadModel(*pack, device, experts, {}, pool.get(), nullptr));
  model::Model& model = *loaded.model;
  const model::ModelConfig& c = model.config();
  ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tokenizer,
                   tokenizer::Tokenizer::FromMetadata(pack->dense().metadata()));
  if (tokenizer->n_vocab() != c.n_vocab) {
    return absl::InvalidArgumentError(absl::StrCat(options.pack_dir, ": the tokenizer has ", tokenizer->n_vocab(),
                                                   " tokens but the model's vocabulary is ", c.n_vocab));
  }

  std::unique_ptr<chat::ChatTemplate> chat_template;
  if (options.chat) {
    ASSIGN_OR_RETURN(chat_template, chat::LoadChatTemplate(pack->dense().metadata(), *tokenizer, ""));
    if (chat_template == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(options.pack_dir, ": the model has no chat template (",
                                                        chat::kChatTemplateKey,
                                                        " is absent from dense.gguf); profile the prompts as "
                                                        "they are, without chat"));
    }
  }

  // Every prompt is tokenized and checked before any is run.
  const int64_t n_ctx = std::max<int64_t>(1, c.n_ctx_train);
  std::vector<std::vector<int32_t>> tokens(prompts.size());
  for (size_t p = 0; p < prompts.size(); ++p) {
    const std::string where_p = where(prompts[p]);
    if (!options.prompt_tokens.empty()) {
      tokens[p] = options.prompt_tokens[p];
      for (const int32_t id : tokens[p]) {
        if (id < 0 || id >= c.n_vocab) {
          return absl::InvalidArgumentError(
              absl::StrCat(where_p, "token ", id, " is not in the model's vocabulary (0 .. ", c.n_vocab - 1, ")"));
        }
      }
    } else if (chat_template != nullptr) {
      // As a server sends a one-message conversation (Engine::PrepareChat).
      const chat::ChatMessage message{"user", prompts[p].text};
      absl::StatusOr<std::string> rendered = chat_template->Render({&message, 1}, chat::ChatOptions());
      if (!rendered.ok()) return absl::InvalidArgumentError(absl::StrCat(where_p, rendered.status().message()));
      tokens[p] = tokenizer->Encode(
          *rendered, {.add_special = chat::AddSpecialToRendered(*rendered, *tokenizer), .parse_special = true});
    } else {
      tokens[p] = tokenizer->Encode(prompts[p].text, {.add_special = true, .parse_special = false});
    }
    if (tokens[p].empty()) return absl::InvalidArgumentError(absl::StrCat(where_p, "the prompt makes no token"));
    if (static_cast<int64_t>(tokens[p].size()) > n_ctx) {
      return absl::InvalidArgumentError(absl::StrCat(where_p, "the prompt is ", tokens[p].size(),
                                                     " tokens, more than the model's context of ", n_ctx));
    }
  }
  const model::KvShape kv_shape = model::CacheShape(c, static_cast<int64_t>(kPrefillChunk));
  model::KvCachePool kv_pool(kv_shape, model::KvCachePool::BytesFor(kv_shape, n_ctx), model.backend().kv_memory());

  ProfileResult result;
  result.load_seconds = Since(load_start);
  const Clock::time_point start = Clock::now();
  const pack::v1::Geometry& g = pack->manifest().geometry();
  pack::RoutingProfile& profile = result.profile;
  profile = pack::EmptyRoutingProfile(pack->manifest());
  ProfileProgress report;
  report.prompts = prompts.size();
  std::vector<float> logits(static_cast<size_t>(c.n_vocab));
  std::vector<model::ForwardToken> batch;
  // One step of the model over `batch`, counted and reported.
  auto step = [&](const Prompt& prompt) -> absl::Status {
    if (Cancelled(options.cancel)) {
      return absl::CancelledError(absl::StrCat("profiling of ", options.pack_dir, " cancelled after ",
                                               report.prompts_done, " of ", report.prompts,
                                               " prompts; the pack is unchanged"));
    }
    if (absl::Status s = model.Forward(batch, logits.data(), nullptr); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(where(prompt), s.message()));
    }
    CountRouting(model, g, static_cast<int>(batch.size()), &profile);
    report.tokens = profile.tokens;
    report.seconds = Since(start);
    if (progress) progress(report);
    return absl::OkStatus();
  };
  for (size_t p = 0; p < prompts.size(); ++p) {
    const std::vector<int32_t>& ids = tokens[p];
    const int64_t positions = std::min<int64_t>(n_ctx, static_cast<int64_t>(ids.size()) + options.decode_tokens);
    ASSIGN_OR_RETURN(std::unique_ptr<model::KvCache> cache, kv_pool.Allocate(positions));
    int64_t pos = 0;
    for (size_t begin = 0; begin < ids.size(); begin += kPrefillChunk) {
      const size_t end = std::min(ids.size(), begin + kPrefillChunk);
      batch.clear();
      for (size_t i = begin; i < end; ++i) batch.push_back({ids[i], pos++, cache.get(), i + 1 == ids.size()});
      RETURN_IF_ERROR(step(prompts[p]));
    }
    for (int64_t generated = 0; generated < options.decode_tokens && pos < positions; ++generated) {
      const int32_t next = Argmax(logits);
      if (tokenizer->IsEog(next)) break;
      batch.assign(1, {next, pos++, cache.get(), true});
      RETURN_IF_ERROR(step(prompts[p]));
    }
    ++report.prompts_done;
  }
  profile.prompts = prompts.size();
  result.seconds = Since(start);
  if (Cancelled(options.cancel)) {
    return absl::CancelledError(absl::StrCat("profiling of ", options.pack_dir, " cancelled; the pack is unchanged"));
  }
  RETURN_IF_ERROR(pack::WriteRoutingProfile(profile, pack->manifest(), options.pack_dir));
  return result;
}

ProfileSkew MeasureSkew(const pack::RoutingProfile& profile) {
  ProfileSkew skew;
  if (profile.n_expert == 0 || profile.counts.size() != uint64_t{profile.n_moe_layers} * profile.n_expert) return skew;
  for (uint32_t layer = 0; layer < profile.n_moe_layers; ++layer) {
    const uint64_t* counts = profile.counts.data() + static_cast<size_t>(layer) * profile.n_expert;
    double sum = 0;
    for (uint32_t e = 0; e < profile.n_expert; ++e) sum += static_cast<double>(counts[e]);
    const double mean = sum / profile.n_expert;
    for (uint32_t e = 0; e < profile.n_expert; ++e) {
      if (counts[e] == 0) ++skew.never_picked;
      const double ratio = mean > 0 ? static_cast<double>(counts[e]) / mean : 0;
      if (ratio > skew.hottest_over_mean) {
        skew.hottest_over_mean = ratio;
        skew.hottest_layer = layer;
        skew.hottest_expert = e;
      }
    }
  }
  return skew;
}

}  // namespace strata::packtool
