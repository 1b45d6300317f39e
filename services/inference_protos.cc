#include "services/inference_protos.h"

#include <string>

namespace strata::services {
namespace {

runtime::FinishReason FinishReasonFromProto(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP:
      return runtime::FinishReason::kStop;
    case v1::FINISH_REASON_LENGTH:
      return runtime::FinishReason::kLength;
    case v1::FINISH_REASON_EOS:
      return runtime::FinishReason::kEos;
    case v1::FINISH_REASON_CANCELLED:
      return runtime::FinishReason::kCancelled;
    case v1::FINISH_REASON_ERROR:
      return runtime::FinishReason::kError;
    default:
      return runtime::FinishReason::kNone;
  }
}

}  // namespace

runtime::SamplingParams SamplingParamsFromProto(const v1::SamplingParams& proto) {
  runtime::SamplingParams p;
  if (proto.has_temperature()) p.temperature = proto.temperature();
  p.top_k = proto.top_k();
  if (proto.has_top_p()) p.top_p = proto.top_p();
  p.min_p = proto.min_p();
  if (proto.has_repetition_penalty()) p.repetition_penalty = proto.repetition_penalty();
  p.presence_penalty = proto.presence_penalty();
  p.frequency_penalty = proto.frequency_penalty();
  if (proto.has_penalty_last_n()) p.penalty_last_n = proto.penalty_last_n();
  if (proto.has_seed()) p.seed = proto.seed();
  if (proto.has_max_tokens()) p.max_tokens = proto.max_tokens();
  p.stop.assign(proto.stop().begin(), proto.stop().end());
  p.stop_token_ids.assign(proto.stop_token_ids().begin(), proto.stop_token_ids().end());
  p.ignore_eos = proto.ignore_eos();
  p.logprobs = proto.logprobs();
  p.top_logprobs = proto.top_logprobs();
  return p;
}

v1::SamplingParams SamplingParamsToProto(const runtime::SamplingParams& p) {
  const runtime::SamplingParams defaults;
  v1::SamplingParams proto;
  if (p.temperature != defaults.temperature) proto.set_temperature(p.temperature);
  proto.set_top_k(p.top_k);
  if (p.top_p != defaults.top_p) proto.set_top_p(p.top_p);
  proto.set_min_p(p.min_p);
  if (p.repetition_penalty != defaults.repetition_penalty) proto.set_repetition_penalty(p.repetition_penalty);
  proto.set_presence_penalty(p.presence_penalty);
  proto.set_frequency_penalty(p.frequency_penalty);
  if (p.penalty_last_n != defaults.penalty_last_n) proto.set_penalty_last_n(p.penalty_last_n);
  if (p.seed.has_value()) proto.set_seed(*p.seed);
  if (p.max_tokens != defaults.max_tokens) proto.set_max_tokens(p.max_tokens);
  for (const std::string& s : p.stop) proto.add_stop(s);
  for (int32_t id : p.stop_token_ids) proto.add_stop_token_ids(id);
  proto.set_ignore_eos(p.ignore_eos);
  proto.set_logprobs(p.logprobs);
  proto.set_top_logprobs(p.top_logprobs);
  return proto;
}

runtime::GenerateRequest GenerateRequestFromProto(const v1::GenerateRequest& proto) {
  runtime::GenerateRequest r;
  if (proto.has_tokens()) {
    r.prompt_tokens.assign(proto.tokens().ids().begin(), proto.tokens().ids().end());
  } else {
    r.prompt = proto.text();
  }
  r.add_special = proto.has_add_special() ? proto.add_special() : true;
  r.parse_special = proto.parse_special();
  r.sampling = SamplingParamsFromProto(proto.sampling());
  return r;
}

runtime::ChatRequest ChatRequestFromProto(const v1::ChatRequest& proto) {
  runtime::ChatRequest r;
  for (const v1::ChatMessage& m : proto.messages()) r.messages.push_back({m.role(), m.content()});
  r.system_prompt = proto.system_prompt();
  r.options.add_generation_prompt = true;
  if (proto.has_enable_thinking()) r.options.enable_thinking = proto.enable_thinking();
  r.sampling = SamplingParamsFromProto(proto.sampling());
  return r;
}

void AppendTokenEvent(const runtime::TokenEvent& event, const tokenizer::Tokenizer& tokenizer,
                      v1::GenerateResponse* response) {
  for (int32_t token : event.tokens) response->add_tokens(token);
  response->mutable_text()->append(event.text);
  for (const runtime::SampleResult& sampled : event.logprobs) {
    v1::TokenLogprob* lp = response->add_logprobs();
    lp->set_token(sampled.token);
    lp->set_logprob(sampled.logprob);
    for (const runtime::TokenLogprob& alt : sampled.top) {
      v1::TopLogprob* top = lp->add_top();
      top->set_token(alt.token);
      top->set_logprob(alt.logprob);
      top->set_piece(std::string(tokenizer.TokenPiece(alt.token)));
    }
  }
}

v1::FinishReason FinishReasonToProto(runtime::FinishReason reason) {
  switch (reason) {
    case runtime::FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case runtime::FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case runtime::FinishReason::kEos:
      return v1::FINISH_REASON_EOS;
    case runtime::FinishReason::kCancelled:
      return v1::FINISH_REASON_CANCELLED;
    case runtime::FinishReason::kError:
      return v1::FINISH_REASON_ERROR;
    case runtime::FinishReason::kNone:
      break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

std::string_view FinishReasonProtoName(v1::FinishReason reason) {
  return runtime::FinishReasonName(FinishReasonFromProto(reason));
}

v1::Usage UsageToProto(const runtime::Usage& usage) {
  v1::Usage proto;
  proto.set_prompt_tokens(usage.prompt_tokens);
  proto.set_completion_tokens(usage.completion_tokens);
  proto.set_queue_seconds(usage.queue_seconds);
  proto.set_time_to_first_token(usage.time_to_first_token);
  proto.set_prefill_tokens_per_second(usage.prefill_tokens_per_second);
  proto.set_decode_tokens_per_second(usage.decode_tokens_per_second);
  proto.set_expert_hit_rate(usage.expert_hit_rate);
  proto.set_expert_bytes(usage.expert_bytes);
  proto.set_dense_bytes(usage.dense_bytes);
  proto.set_seed(usage.seed);
  return proto;
}

v1::ModelInfo ModelInfoToProto(const runtime::EngineInfo& info, const tokenizer::Tokenizer& tokenizer) {
  v1::ModelInfo proto;
  const model::ModelConfig& c = info.config;
  proto.set_architecture(c.arch);
  proto.set_n_layer(c.n_layer);
  proto.set_n_embd(c.n_embd);
  proto.set_n_head(c.n_head);
  proto.set_n_head_kv(c.n_head_kv);
  proto.set_head_dim(c.head_dim);
  proto.set_n_expert(c.n_expert);
  proto.set_n_expert_used(c.n_expert_used);
  proto.set_expert_ff(c.expert_ff);
  proto.set_vocab_size(c.n_vocab);
  proto.set_context(info.max_ctx);
  proto.set_train_context(c.n_ctx_train);
  proto.set_scheme(info.scheme);
  proto.set_expert_source(info.source_kind);
  proto.set_experts_bytes(info.experts_bytes);
  proto.set_load_seconds(info.load_seconds);
  proto.set_arena_load_gb_per_second(info.source.gb_per_second);
  proto.set_arena_huge_pages(info.source.huge_pages);
  proto.set_threads(info.threads);
  proto.set_expert_bytes_per_token(info.expert_bytes_per_token);
  proto.set_dense_bytes_per_token(info.dense_bytes_per_token);
  proto.set_kv_bytes_per_sequence(info.kv_bytes_per_sequence);
  proto.set_bos(tokenizer.bos());
  proto.set_eos(tokenizer.eos());
  proto.set_tokenizer(tokenizer.model() == tokenizer::Tokenizer::Model::kSpm ? "spm" : "bpe");
  proto.set_device(info.backend.device);
  proto.set_device_name(info.backend.name);
  proto.set_kernel_isa(info.backend.isa);
  proto.set_device_memory_used(info.backend.memory_used);
  proto.set_device_memory_total(info.backend.memory_total);
  proto.set_has_chat_template(info.has_chat_template);
  return proto;
}

v1::EngineStats EngineStatsToProto(const runtime::EngineStats& stats) {
  v1::EngineStats proto;
  proto.set_active(stats.active);
  proto.set_queued(stats.queued);
  proto.set_steps(stats.steps);
  proto.set_tokens_generated(stats.tokens_generated);
  proto.set_prompt_tokens(stats.prompt_tokens);
  proto.set_expert_bytes(stats.expert_bytes);
  proto.set_kv_bytes_in_use(stats.kv_bytes_in_use);
  proto.set_requests_finished(stats.requests_finished);
  proto.set_expert_hits(stats.expert_hits);
  proto.set_expert_misses(stats.expert_misses);
  proto.set_kv_bytes_budget(stats.kv_bytes_budget);
  proto.set_device(stats.device);
  proto.set_vram_expert_slots(stats.cache.slots);
  proto.set_cache_policy(stats.cache.policy);
  proto.set_cache_admissions(stats.cache.admissions);
  proto.set_cache_evictions(stats.cache.evictions);
  proto.set_pcie_bytes(stats.cache.pcie_bytes);
  proto.set_host_share(stats.cache.host_share);
  proto.set_host_experts(stats.cache.host_experts);
  proto.set_guessed_experts(stats.cache.guessed);
  proto.set_guessed_right(stats.cache.guessed_right);
  proto.set_prefetched_experts(stats.cache.prefetched);
  proto.set_prefetch_used(stats.cache.prefetch_used);
  return proto;
}

}  // namespace strata::services
