#ifndef STRATA_TESTS_ENGINE_RUNTIME_ENGINE_TEST_UTIL_H_
#define STRATA_TESTS_ENGINE_RUNTIME_ENGINE_TEST_UTIL_H_

// What the engine tests share: the tiny model's packs, engine options, greedy requests, a bounded wait for a
// generation, and the reference model's greedy continuation.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "engine/gguf/gguf_file.h"
#include "engine/gguf/gguf_writer.h"
#include "engine/runtime/engine.h"
#include "gtest/gtest.h"
#include "packtool/builtin_vocab.h"
#include "packtool/convert.h"
#include "packtool/synth.h"
#include "tests/testing/reference_model.h"
#include "tests/testing/test_util.h"
#include "tests/testing/wait.h"

namespace strata::runtime {

using ::strata::testing::kHangDeadline;
using ::strata::testing::ReferenceModel;
using ::strata::testing::ScratchDir;
using ::strata::testing::WaitUntil;

// A synthesized model of `arch` (the tiny preset unless told), as GGUF and as packs in each scheme, shared
// by a test suite.
struct TinyModel {
  explicit TinyModel(const std::string& arch, gguf::GgmlType dense_type = gguf::GgmlType::kF32,
                     const std::string& preset = "tiny", gguf::GgmlType expert_type = gguf::GgmlType::kF32) {
    packtool::SynthOptions o;
    o.geometry = *packtool::PresetGeometry(arch, preset);
    o.dense_type = dense_type;
    o.expert_type = expert_type;
    o.seed = 11;
    o.output = dir.Join("model.gguf");
    o.threads = 2;
    const absl::Status s = packtool::SynthesizeGguf(o);
    EXPECT_TRUE(s.ok()) << s;
  }
  std::string Pack(kernels::Scheme scheme) {
    const std::string out = dir.Join(std::string(kernels::SchemeName(scheme)));
    if (!std::filesystem::exists(out)) {
      packtool::ConvertOptions c;
      c.input = dir.Join("model.gguf");
      c.output_dir = out;
      c.scheme = scheme;
      c.threads = 2;
      auto m = packtool::ConvertGguf(c, nullptr, nullptr);
      EXPECT_TRUE(m.ok()) << m.status();
    }
    return out;
  }
  ScratchDir dir;
};

inline EngineOptions Options(const std::string& pack, int max_seqs = 4) {
  EngineOptions o;
  o.pack_dir = pack;
  o.threads = 2;
  o.max_seqs = max_seqs;
  o.max_ctx = 256;
  return o;
}

inline GenerateRequest Greedy(std::vector<int32_t> prompt, int max_tokens) {
  GenerateRequest r;
  r.prompt_tokens = std::move(prompt);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

// Engine::Generate with a deadline: DEADLINE_EXCEEDED when the request has not finished by then. The
// callbacks own what they write, so one that comes after a failed wait touches nothing of the test's.
inline absl::StatusOr<std::vector<Engine::Completion>> GenerateAllWithin(Engine& engine,
                                                                         std::vector<GenerateRequest> requests);
inline absl::StatusOr<Engine::Completion> GenerateWithin(Engine& engine, GenerateRequest request) {
  std::vector<GenerateRequest> one;
  one.push_back(std::move(request));
  absl::StatusOr<std::vector<Engine::Completion>> all = GenerateAllWithin(engine, std::move(one));
  if (!all.ok()) return all.status();
  return std::move((*all)[0]);
}

// Engine::Generate of several requests submitted together (so that the scheduler may batch them), each
// waited for with the same deadline; the completions in request order.
inline absl::StatusOr<std::vector<Engine::Completion>> GenerateAllWithin(Engine& engine,
                                                                         std::vector<GenerateRequest> requests) {
  struct State {
    Engine::Completion completion;
    absl::Notification done;
  };
  std::vector<std::shared_ptr<State>> states;
  for (GenerateRequest& request : requests) {
    auto state = std::make_shared<State>();
    GenerateCallbacks cb;
    cb.on_tokens = [state](const TokenEvent& e) { state->completion.text += e.text; };
    cb.on_done = [state](const GenerationResult& r) {
      state->completion.result = r;
      state->done.Notify();
    };
    absl::StatusOr<std::shared_ptr<RequestHandle>> handle = engine.Submit(std::move(request), std::move(cb));
    if (!handle.ok()) return handle.status();
    states.push_back(std::move(state));
  }
  std::vector<Engine::Completion> completions;
  for (const std::shared_ptr<State>& state : states) {
    if (!state->done.WaitForNotificationWithTimeout(kHangDeadline)) {
      return absl::DeadlineExceededError("a request did not finish");
    }
    completions.push_back(state->completion);
  }
  return completions;
}

// Greedy continuation by the reference: recompute the whole sequence each step.
inline std::vector<int32_t> ReferenceGreedy(ReferenceModel& ref, std::vector<int32_t> tokens, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const std::vector<float> logits = ref.Logits(tokens);
    const float* last = logits.data() + (tokens.size() - 1) * ref.n_vocab();
    const int32_t next = static_cast<int32_t>(std::max_element(last, last + ref.n_vocab()) - last);
    out.push_back(next);
    tokens.push_back(next);
  }
  return out;
}

inline double RelativeError(const float* a, const float* b, int64_t n) {
  double d = 0, r = 0;
  for (int64_t i = 0; i < n; ++i) {
    d += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    r += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(d / r);
}

}  // namespace strata::runtime

#endif  // STRATA_TESTS_ENGINE_RUNTIME_ENGINE_TEST_UTIL_H_
