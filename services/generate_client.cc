#include "services/generate_client.h"

#include <chrono>
#include <cstdio>
#include <functional>
#include <istream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "grpcpp/client_context.h"
#include "services/cancel_watcher.h"
#include "services/cli_flags.h"
#include "services/grpc_status.h"
#include "services/inference_protos.h"
#include "services/pack_cli.h"
#include "services/progress_printer.h"
#include "services/run_cli.h"
#include "services/sampling_flags.h"
#include "strata/v1/inference.grpc.pb.h"

namespace strata::services {
namespace {

constexpr double kDefaultUnaryTimeoutSeconds = 60;

int UsageError(const ClientIo& io, const std::string& message) {
  *io.err << "strata: error: " << message << " (see strata --help)\n";
  return kExitUsage;
}

// A server of another kind (a strata-packd) is named, not left as a bare UNIMPLEMENTED.
int CallFailed(const ClientIo& io, const ClientOptions& options, const std::shared_ptr<grpc::Channel>& channel,
               const grpc::Status& status) {
  *io.err << "strata: error: "
          << FromGrpcStatusAt(status, channel, options.server, v1::Inference::service_full_name()).ToString();
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) *io.err << " (server " << options.server << ")";
  *io.err << "\n";
  return kExitFailure;
}

// The call's deadline and bearer token.
void PrepareCall(const ClientOptions& options, bool streaming, grpc::ClientContext* context) {
  if (!options.auth_token.empty()) context->AddMetadata("authorization", "Bearer " + options.auth_token);
  double seconds = options.timeout_seconds;
  if (seconds <= 0 && !streaming) seconds = kDefaultUnaryTimeoutSeconds;
  if (seconds <= 0) return;
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6)));
}

std::string PrintablePiece(const std::string& piece) {
  std::string out;
  for (unsigned char c : piece) {
    if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7f) {
      out += absl::StrFormat("\\x%02x", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

// The sampling of a generate or chat request: the flags' parameters plus --stop-token-ids. False (after
// reporting the usage error) when a value is bad: found before the call, naming the flag.
bool BuildSampling(const ClientOptions& options, const ClientIo& io, v1::SamplingParams* sampling) {
  *sampling = options.sampling;
  if (absl::Status s = CheckSamplingFlags(SamplingParamsFromProto(options.sampling)); !s.ok()) {
    UsageError(io, std::string(s.message()));
    return false;
  }
  if (options.stop_token_ids.empty()) return true;
  std::vector<int32_t> ids;
  if (!ParseTokenList(options.stop_token_ids, &ids)) {
    UsageError(io, absl::StrCat("--stop-token-ids: expected comma-separated integers, got '", options.stop_token_ids,
                                "'"));
    return false;
  }
  sampling->mutable_stop_token_ids()->Add(ids.begin(), ids.end());
  return true;
}

using StartStream =
    std::function<std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>>(grpc::ClientContext* context)>;

// Runs one streaming call (Generate or Chat): the text to `out` as it arrives, then the log-probabilities
// and the summary to `err`. `reply` (may be null) receives the whole text.
int StreamReply(const ClientOptions& options, const std::shared_ptr<grpc::Channel>& channel, const ClientIo& io,
                const StartStream& start, std::string* reply) {
  grpc::ClientContext context;
  PrepareCall(options, /*streaming=*/true, &context);
  std::vector<v1::TokenLogprob> logprobs;
  v1::GenerateResponse last;
  bool ends_with_newline = true;
  grpc::Status status;
  {
    CancelWatcher watcher(io.cancel, &context);
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader = start(&context);
    v1::GenerateResponse message;
    while (reader->Read(&message)) {
      if (!options.quiet && !message.text().empty()) {
        *io.out << message.text() << std::flush;
        ends_with_newline = message.text().back() == '\n';
      }
      if (reply != nullptr) *reply += message.text();
      logprobs.insert(logprobs.end(), message.logprobs().begin(), message.logprobs().end());
      if (message.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) last = message;
    }
    status = reader->Finish();
  }
  if (!ends_with_newline) *io.out << "\n" << std::flush;
  if (!status.ok()) {
    if (io.cancel != nullptr && io.cancel->load() && status.error_code() == grpc::StatusCode::CANCELLED) {
      *io.err << "strata: cancelled\n";
      return kExitFailure;
    }
    return CallFailed(io, options, channel, status);
  }
  for (const v1::TokenLogprob& lp : logprobs) {
    *io.err << absl::StrFormat("token %d  logprob %.4f", lp.token(), lp.logprob());
    for (const v1::TopLogprob& top : lp.top()) {
      *io.err << absl::StrFormat("  | %d '%s' %.4f", top.token(), PrintablePiece(top.piece()), top.logprob());
    }
    *io.err << "\n";
  }
  const v1::Usage& u = last.usage();
  *io.err << absl::StrFormat(
      "-- %d tokens (%s) | prompt %d tokens | first token %.1f ms | decode %.1f tokens/s | expert hit rate "
      "%.1f%% | expert bytes read %s | seed %d\n",
      u.completion_tokens(), std::string(FinishReasonProtoName(last.finish_reason())), u.prompt_tokens(),
      u.time_to_first_token() * 1e3, u.decode_tokens_per_second(), u.expert_hit_rate() * 100,
      FormatBytes(u.expert_bytes()), u.seed());
  return kExitOk;
}

int Generate(const std::vector<std::string>& args, const ClientOptions& options, v1::Inference::Stub& stub,
             const std::shared_ptr<grpc::Channel>& channel, const ClientIo& io) {
  v1::GenerateRequest request;
  if (!options.tokens.empty()) {
    if (args.size() > 1) return UsageError(io, "give either a text prompt or --tokens, not both");
    std::vector<int32_t> ids;
    if (!ParseTokenList(options.tokens, &ids)) {
      return UsageError(io, absl::StrCat("--tokens: expected comma-separated integers, got '", options.tokens, "'"));
    }
    request.mutable_tokens()->mutable_ids()->Add(ids.begin(), ids.end());
  } else {
    if (args.size() != 2) {
      return UsageError(io, absl::StrCat("generate takes one prompt (quote it), got ", args.size() - 1));
    }
    request.set_text(args[1]);
  }
  request.set_add_special(options.add_special);
  request.set_parse_special(options.parse_special);
  if (!BuildSampling(options, io, request.mutable_sampling())) return kExitUsage;
  return StreamReply(options, channel, io,
                     [&](grpc::ClientContext* context) { return stub.Generate(context, request); }, nullptr);
}

void AddMessage(const std::string& role, const std::string& content, v1::ChatRequest* request) {
  v1::ChatMessage* m = request->add_messages();
  m->set_role(role);
  m->set_content(content);
}

// strata chat "user" ["assistant" "user" ...]: one reply to the conversation the arguments spell, turns
// alternating from the user's. Without arguments: a conversation read from `in`, one user message per
// line, each answered in turn with the whole history sent; it ends at end of input.
int Chat(const std::vector<std::string>& args, const ClientOptions& options, v1::Inference::Stub& stub,
         const std::shared_ptr<grpc::Channel>& channel, const ClientIo& io) {
  v1::ChatRequest request;
  request.set_system_prompt(options.system_prompt);
  if (options.enable_thinking.has_value()) request.set_enable_thinking(*options.enable_thinking);
  if (!BuildSampling(options, io, request.mutable_sampling())) return kExitUsage;
  const auto start = [&](grpc::ClientContext* context) { return stub.Chat(context, request); };
  if (args.size() > 1) {
    if (args.size() % 2 != 0) {
      return UsageError(io, absl::StrCat("chat takes messages alternating user, assistant, user, ... and ending "
                                         "with the user's (an odd number), got ",
                                         args.size() - 1));
    }
    for (size_t i = 1; i < args.size(); ++i) AddMessage(i % 2 == 1 ? "user" : "assistant", args[i], &request);
    return StreamReply(options, channel, io, start, nullptr);
  }
  if (io.in == nullptr) return UsageError(io, "chat without messages reads them from standard input");
  std::string line;
  while (true) {
    *io.err << "> " << std::flush;
    if (!std::getline(*io.in, line)) break;
    if (line.empty()) continue;
    AddMessage("user", line, &request);
    std::string reply;
    if (const int rc = StreamReply(options, channel, io, start, &reply); rc != kExitOk) return rc;
    AddMessage("assistant", reply, &request);
  }
  *io.err << "\n";
  return kExitOk;
}

int Tokenize(const std::vector<std::string>& args, const ClientOptions& options, v1::Inference::Stub& stub,
             const std::shared_ptr<grpc::Channel>& channel, const ClientIo& io) {
  if (args.size() != 2) return UsageError(io, absl::StrCat("tokenize takes one text (quote it), got ", args.size() - 1));
  v1::TokenizeRequest request;
  request.set_text(args[1]);
  request.set_add_special(options.add_special);
  request.set_parse_special(options.parse_special);
  v1::TokenizeResponse response;
  grpc::ClientContext context;
  PrepareCall(options, false, &context);
  const grpc::Status status = stub.Tokenize(&context, request, &response);
  if (!status.ok()) return CallFailed(io, options, channel, status);
  *io.out << absl::StrJoin(response.tokens(), ",") << "\n";
  return kExitOk;
}

int Detokenize(const std::vector<std::string>& args, const ClientOptions& options, v1::Inference::Stub& stub,
               const std::shared_ptr<grpc::Channel>& channel, const ClientIo& io) {
  std::vector<int32_t> ids;
  if (args.size() != 2 || !ParseTokenList(args[1], &ids)) {
    return UsageError(io, "detokenize takes one list of comma-separated token ids");
  }
  v1::DetokenizeRequest request;
  request.mutable_tokens()->Add(ids.begin(), ids.end());
  request.set_render_special(options.render_special);
  v1::DetokenizeResponse response;
  grpc::ClientContext context;
  PrepareCall(options, false, &context);
  const grpc::Status status = stub.Detokenize(&context, request, &response);
  if (!status.ok()) return CallFailed(io, options, channel, status);
  *io.out << response.text() << "\n";
  return kExitOk;
}

int Info(const ClientOptions& options, v1::Inference::Stub& stub, const std::shared_ptr<grpc::Channel>& channel,
         const ClientIo& io) {
  v1::ModelInfo m;
  grpc::ClientContext context;
  PrepareCall(options, false, &context);
  const grpc::Status status = stub.GetModelInfo(&context, v1::GetModelInfoRequest(), &m);
  if (!status.ok()) return CallFailed(io, options, channel, status);
  std::ostream& out = *io.out;
  out << "architecture  " << m.architecture() << "\n";
  out << absl::StrFormat("geometry      %d layers, %d experts (top-%d), n_embd %d, expert ff %d\n", m.n_layer(),
                         m.n_expert(), m.n_expert_used(), m.n_embd(), m.expert_ff());
  out << absl::StrFormat("attention     %d heads, %d kv heads, head dim %d\n", m.n_head(), m.n_head_kv(),
                         m.head_dim());
  out << absl::StrFormat("vocabulary    %d tokens (%s), bos %d, eos %d\n", m.vocab_size(), m.tokenizer(), m.bos(),
                         m.eos());
  out << absl::StrFormat("context       %d positions (trained for %d)\n", m.context(), m.train_context());
  out << absl::StrFormat("kv cache      %s per sequence of %d positions\n", FormatBytes(m.kv_bytes_per_sequence()),
                         m.context());
  out << "chat          "
      << (m.has_chat_template() ? "the model's chat template (strata chat)" : "no chat template (generate only)")
      << "\n";
  out << absl::StrFormat("experts       %s, scheme %s, source %s%s\n", FormatBytes(m.experts_bytes()), m.scheme(),
                         m.expert_source(), m.arena_huge_pages() ? " (huge pages)" : "");
  out << absl::StrFormat("per token     %s of experts, %s dense (batch of one)\n",
                         FormatBytes(m.expert_bytes_per_token()), FormatBytes(m.dense_bytes_per_token()));
  out << absl::StrFormat("loaded in     %.2f s (arena %.2f GB/s), %d threads\n", m.load_seconds(),
                         m.arena_load_gb_per_second(), m.threads());
  out << absl::StrFormat("device        %s (%s), kernels %s", m.device(), m.device_name(), m.kernel_isa());
  if (m.device_memory_total() > 0) {
    out << absl::StrFormat(", %s of %s device memory in use", FormatBytes(m.device_memory_used()),
                           FormatBytes(m.device_memory_total()));
  }
  out << "\n";
  return kExitOk;
}

int Stats(const ClientOptions& options, v1::Inference::Stub& stub, const std::shared_ptr<grpc::Channel>& channel,
          const ClientIo& io) {
  v1::EngineStats s;
  grpc::ClientContext context;
  PrepareCall(options, false, &context);
  const grpc::Status status = stub.GetStats(&context, v1::GetStatsRequest(), &s);
  if (!status.ok()) return CallFailed(io, options, channel, status);
  std::ostream& out = *io.out;
  out << "active             " << s.active() << "\n";
  out << "queued             " << s.queued() << "\n";
  out << "requests finished  " << s.requests_finished() << "\n";
  out << "steps              " << s.steps() << "\n";
  out << "tokens generated   " << s.tokens_generated() << "\n";
  out << "prompt tokens      " << s.prompt_tokens() << "\n";
  out << "expert bytes read  " << FormatBytes(s.expert_bytes()) << "\n";
  out << "kv cache in use    " << FormatBytes(s.kv_bytes_in_use()) << " of " << FormatBytes(s.kv_bytes_budget())
      << "\n";
  const uint64_t routed = s.expert_hits() + s.expert_misses();
  out << "device             " << s.device() << "\n";
  out << absl::StrFormat("expert hit rate    %.1f%% (%d of %d routed experts from VRAM)\n",
                         routed > 0 ? 100.0 * s.expert_hits() / routed : 0.0, s.expert_hits(), routed);
  if (s.vram_expert_slots() > 0) {
    out << absl::StrFormat("vram cache         %d slots (%s), %d admissions, %d evictions, %s over PCIe\n",
                           s.vram_expert_slots(), s.cache_policy(), s.cache_admissions(), s.cache_evictions(),
                           FormatBytes(s.pcie_bytes()));
    out << absl::StrFormat("host misses        %.0f%% of a decode step's misses now, %d expert computations so far\n",
                           100.0 * s.host_share(), s.host_experts());
    if (s.guessed_experts() > 0) {
      out << absl::StrFormat("guessed misses     %d, %.1f%% routed; %d copied ahead, %d used\n", s.guessed_experts(),
                             100.0 * s.guessed_right() / s.guessed_experts(), s.prefetched_experts(),
                             s.prefetch_used());
    }
  }
  return kExitOk;
}

}  // namespace

int RunClient(const std::vector<std::string>& args, const ClientOptions& options,
              const std::shared_ptr<grpc::Channel>& channel, const ClientIo& io) {
  if (args.empty()) return UsageError(io, "no command given (generate, chat, tokenize, detokenize, info or stats)");
  const std::string& command = args[0];
  auto no_arguments = [&]() { return args.size() == 1; };
  std::unique_ptr<v1::Inference::Stub> stub = v1::Inference::NewStub(channel);
  if (command == "generate") return Generate(args, options, *stub, channel, io);
  if (command == "chat") return Chat(args, options, *stub, channel, io);
  if (command == "tokenize") return Tokenize(args, options, *stub, channel, io);
  if (command == "detokenize") return Detokenize(args, options, *stub, channel, io);
  if (command == "info" || command == "stats") {
    if (!no_arguments()) return UsageError(io, absl::StrCat(command, " takes no arguments"));
    return command == "info" ? Info(options, *stub, channel, io) : Stats(options, *stub, channel, io);
  }
  return UsageError(io, absl::StrCat("unknown command '", command,
                                     "' (expected generate, chat, tokenize, detokenize, info or stats)"));
}

std::string ClientUsage() {
  return HelpText(R"(usage: strata <command> [arguments] [flags]
a client of strata-server (strata.v1.Inference)

  strata generate [flags] "prompt"   stream the generated text, then speed and expert hit rate
  strata generate --tokens 1,2,3     a prompt of token ids
  strata chat [flags] "message"      the model's reply, through its chat template; more arguments
                                     alternate assistant and user turns ("hi" "hello!" "how are you?")
  strata chat [flags]                a conversation: one user message per line of standard input
  strata tokenize "text"             the prompt's token ids
  strata detokenize 1,2,3            the text of token ids
  strata info                        the loaded model: geometry, scheme, arena, threads
  strata stats                       the engine's counters
)",
                  {kClientFlagFile});
}

}  // namespace strata::services
