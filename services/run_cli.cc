#include "services/run_cli.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "engine/gguf/gguf_file.h"
#include "engine/status_macros.h"
#include "engine/tokenizer/tokenizer.h"
#include "services/count_progress.h"
#include "services/path_flags.h"

namespace strata::services {
namespace {

void PrintIds(const std::vector<int32_t>& ids, std::ostream& out) {
  for (size_t i = 0; i < ids.size(); ++i) out << (i ? " " : "") << ids[i];
  out << "\n";
}

int Fail(std::ostream& err, const absl::Status& s) {
  err << "strata-run: error: " << s.message() << "\n";
  return 1;
}

int Tokenize(const RunOptions& o, std::ostream& out, std::ostream& err) {
  std::unique_ptr<gguf::GgufFile> file;
  const std::string path = o.gguf_path.empty() ? o.pack_dir + "/dense.gguf" : o.gguf_path;
  auto opened = gguf::GgufFile::Open(path);
  if (!opened.ok()) return Fail(err, opened.status());
  auto tok = tokenizer::Tokenizer::FromMetadata((*opened)->metadata());
  if (!tok.ok()) return Fail(err, tok.status());
  PrintIds((*tok)->Encode(o.prompt, {.add_special = o.add_special, .parse_special = o.parse_special}), out);
  return 0;
}

// Runs `tokens` through a fresh engine on `pack_dir` and returns the logits of every position.
absl::StatusOr<std::vector<float>> PromptLogits(const RunOptions& o, const std::string& pack_dir,
                                                const std::vector<int32_t>& tokens, int64_t* n_vocab) {
  runtime::EngineOptions eo = o.engine;
  eo.pack_dir = pack_dir;
  auto engine = runtime::Engine::Create(eo);
  if (!engine.ok()) return engine.status();
  runtime::GenerateRequest req;
  req.prompt_tokens = tokens;
  req.prompt_logits = true;
  req.sampling.temperature = 0;
  req.sampling.max_tokens = 1;
  auto done = (*engine)->Generate(req);
  if (!done.ok()) return done.status();
  if (!done->result.status.ok()) return done->result.status;
  *n_vocab = (*engine)->info().config.n_vocab;
  return done->result.prompt_logits;
}

}  // namespace

bool ParseTokenList(const std::string& text, std::vector<int32_t>* ids) {
  ids->clear();
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int32_t id;
    if (!absl::SimpleAtoi(part, &id)) return false;
    ids->push_back(id);
  }
  return !ids->empty();
}

double KlDivergence(const float* p_logits, const float* q_logits, int64_t n) {
  auto log_z = [n](const float* l) {
    const float max = *std::max_element(l, l + n);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(l[i]) - max);
    return max + std::log(sum);
  };
  const double zp = log_z(p_logits), zq = log_z(q_logits);
  double kl = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double lp = p_logits[i] - zp, lq = q_logits[i] - zq;
    kl += std::exp(lp) * (lp - lq);
  }
  return std::max(0.0, kl);
}

namespace {

// Every path the options name, checked before anything is loaded or generated.
absl::Status CheckPaths(const RunOptions& o) {
  if (o.tokenize_only) {
    return o.gguf_path.empty() ? CheckPackDirFlag("--pack", o.pack_dir) : CheckInputFileFlag("--gguf", o.gguf_path);
  }
  RETURN_IF_ERROR(CheckPackDirFlag("--pack", o.pack_dir));
  if (!o.dump_logits_path.empty()) RETURN_IF_ERROR(CheckOutputFileFlag("--dump-logits", o.dump_logits_path));
  if (!o.kl_against_dir.empty()) RETURN_IF_ERROR(CheckPackDirFlag("--kl-against", o.kl_against_dir));
  return absl::OkStatus();
}

}  // namespace

int RunCommand(const RunOptions& o, std::ostream& out, std::ostream& err) {
  if (o.tokenize_only) {
    if (o.pack_dir.empty() && o.gguf_path.empty()) {
      err << "strata-run: --tokenize needs --pack DIR or --gguf FILE\n";
      return 2;
    }
    if (absl::Status s = CheckPaths(o); !s.ok()) return Fail(err, s);
    return Tokenize(o, out, err);
  }
  if (o.pack_dir.empty()) {
    err << "strata-run: --pack DIR is required\n";
    return 2;
  }
  if (o.prompt.empty() && o.tokens.empty()) {
    err << "strata-run: give a prompt (text) or --tokens 1,2,3\n";
    return 2;
  }
  if (absl::Status s = CheckPaths(o); !s.ok()) return Fail(err, s);
  runtime::EngineOptions eo = o.engine;
  eo.pack_dir = o.pack_dir;
  // A large pack's load and a long prompt's prefill show progress (nothing for those done within a second).
  auto err_line = [&err](const std::string& line) { err << line << "\n" << std::flush; };
  auto loading = std::make_shared<CountProgress>("loading experts", CountProgress::Unit::kBytes, err_line);
  eo.experts.on_load_progress = [loading](uint64_t done, uint64_t total) { loading->Update(done, total); };
  auto engine = runtime::Engine::Create(eo);
  if (!engine.ok()) return Fail(err, engine.status());
  const runtime::EngineInfo& info = (*engine)->info();
  err << "loaded " << o.pack_dir << ": " << info.config.arch << ", " << info.config.n_layer << " layers, "
      << info.config.n_expert << " experts (top-" << info.config.n_expert_used << "), scheme " << info.scheme
      << ", " << std::fixed << std::setprecision(2) << info.experts_bytes / 1e9 << " GB of experts ("
      << info.source_kind << (info.source.pinned ? ", pinned" : "") << "), " << info.threads << " threads, load "
      << info.load_seconds << " s";
  if (info.source.gb_per_second > 0) err << " (" << info.source.gb_per_second << " GB/s)";
  // Page-locking matters only where the GPU reads the arena.
  if (info.backend.device == "cuda" && info.source_kind == "arena" && !info.source.pinned) {
    err << "; arena not page-locked: " << info.source.pin_note;
  }
  err << "; device " << info.backend.device << " (" << info.backend.name << ", " << info.backend.isa << ")";
  err << "\n";

  runtime::GenerateRequest req;
  req.prompt = o.prompt;
  req.prompt_tokens = o.tokens;
  req.add_special = o.add_special;
  req.parse_special = o.parse_special;
  req.sampling = o.sampling;
  req.prompt_logits = !o.dump_logits_path.empty() || !o.kl_against_dir.empty();
  auto result = std::make_shared<runtime::GenerationResult>();
  auto done = std::make_shared<absl::Notification>();
  runtime::GenerateCallbacks cb;
  const bool quiet = o.quiet;
  cb.on_tokens = [&out, quiet](const runtime::TokenEvent& e) {
    if (!quiet && !e.text.empty()) out << e.text << std::flush;
  };
  auto prefill = std::make_shared<CountProgress>("prefill", CountProgress::Unit::kTokens, err_line);
  cb.on_prompt_progress = [prefill](int64_t done, int64_t total) {
    prefill->Update(static_cast<uint64_t>(done), static_cast<uint64_t>(total));
  };
  cb.on_done = [result, done](const runtime::GenerationResult& r) {
    *result = r;
    done->Notify();
  };
  auto handle = (*engine)->Submit(req, cb);
  if (!handle.ok()) return Fail(err, handle.status());
  done->WaitForNotification();
  if (!quiet) out << "\n";
  if (!result->status.ok()) return Fail(err, result->status);
  const runtime::Usage& u = result->usage;
  const double per_token = u.completion_tokens > 0 ? static_cast<double>(u.expert_bytes) / (u.prompt_tokens + u.completion_tokens) : 0;
  err << "finish: " << runtime::FinishReasonName(result->reason) << ", seed " << u.seed << "\n"
      << "prompt: " << u.prompt_tokens << " tokens, " << std::setprecision(1) << u.prefill_tokens_per_second
      << " tokens/s\n"
      << "decode: " << u.completion_tokens << " tokens, " << u.decode_tokens_per_second << " tokens/s\n"
      << "experts read: " << std::setprecision(2) << per_token / 1e6 << " MB per token (batch of one decodes "
      << info.expert_bytes_per_token / 1e6 << " MB of experts and " << info.dense_bytes_per_token / 1e6
      << " MB of dense weights)\n"
      << "time to first token: " << std::setprecision(3) << u.time_to_first_token << " s, load time "
      << info.load_seconds << " s\n";

  const int64_t n_vocab = info.config.n_vocab;
  const std::vector<float>& logits = result->prompt_logits;
  if (!o.dump_logits_path.empty()) {
    const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(logits.data()), logits.size() * sizeof(float));
    if (absl::Status s = WriteResultFile(o.dump_logits_path, bytes); !s.ok()) return Fail(err, s);
    err << "wrote " << logits.size() / n_vocab << " x " << n_vocab << " float32 logits to " << o.dump_logits_path << "\n";
  }
  if (!o.kl_against_dir.empty()) {
    const std::vector<int32_t> tokens =
        o.tokens.empty() ? (*engine)->Tokenize(o.prompt, o.add_special, o.parse_special) : o.tokens;
    engine->reset();  // one engine (and arena) at a time
    int64_t other_vocab = 0;
    auto other = PromptLogits(o, o.kl_against_dir, tokens, &other_vocab);
    if (!other.ok()) return Fail(err, other.status());
    if (other_vocab != n_vocab || other->size() != logits.size()) {
      return Fail(err, absl::InvalidArgumentError("--kl-against: the packs have different vocabularies"));
    }
    const int64_t n = static_cast<int64_t>(logits.size()) / n_vocab;
    double sum = 0, max = 0;
    int64_t agree = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float* a = logits.data() + i * n_vocab;
      const float* b = other->data() + i * n_vocab;
      const double kl = KlDivergence(a, b, n_vocab);
      sum += kl;
      max = std::max(max, kl);
      agree += (std::max_element(a, a + n_vocab) - a) == (std::max_element(b, b + n_vocab) - b);
    }
    out << std::fixed << std::setprecision(6) << "KL(" << o.pack_dir << " || " << o.kl_against_dir << ") over " << n
        << " positions: mean " << sum / n << ", max " << max << "; top-1 agreement " << std::setprecision(2)
        << 100.0 * agree / n << "%\n";
  }
  return 0;
}

}  // namespace strata::services
