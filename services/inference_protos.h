#ifndef STRATA_SERVICES_INFERENCE_PROTOS_H_
#define STRATA_SERVICES_INFERENCE_PROTOS_H_

// Conversions between the strata.v1 inference messages and the engine's types. The engine validates what
// it is given (and names the field); these functions only map fields, applying the engine's defaults for
// unset optional fields. Pure functions, callable from any thread.

#include <string_view>

#include "engine/runtime/engine.h"
#include "engine/runtime/request.h"
#include "engine/runtime/sampling_params.h"
#include "engine/tokenizer/tokenizer.h"
#include "strata/v1/inference.pb.h"

namespace strata::services {

runtime::SamplingParams SamplingParamsFromProto(const v1::SamplingParams& proto);
// Only the fields that differ from the engine's defaults are set, so the result converts back equal.
v1::SamplingParams SamplingParamsToProto(const runtime::SamplingParams& params);

// A request with neither text nor tokens becomes one with an empty text prompt, which the engine refuses
// naming "prompt".
runtime::GenerateRequest GenerateRequestFromProto(const v1::GenerateRequest& proto);

// The engine's chat request; Engine::PrepareChat checks it.
runtime::ChatRequest ChatRequestFromProto(const v1::ChatRequest& proto);

// Appends the event's tokens, text and log-probabilities to `response` (which may already hold earlier
// events not yet sent). `tokenizer` gives the pieces of the alternative tokens.
void AppendTokenEvent(const runtime::TokenEvent& event, const tokenizer::Tokenizer& tokenizer,
                      v1::GenerateResponse* response);

v1::FinishReason FinishReasonToProto(runtime::FinishReason reason);
// "stop", "length", "eos", "cancelled", "error" or "none" (unspecified), as the engine names them.
std::string_view FinishReasonProtoName(v1::FinishReason reason);

v1::Usage UsageToProto(const runtime::Usage& usage);

v1::ModelInfo ModelInfoToProto(const runtime::EngineInfo& info, const tokenizer::Tokenizer& tokenizer);

v1::EngineStats EngineStatsToProto(const runtime::EngineStats& stats);

}  // namespace strata::services

#endif  // STRATA_SERVICES_INFERENCE_PROTOS_H_
