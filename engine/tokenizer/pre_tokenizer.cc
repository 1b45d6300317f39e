#include "engine/tokenizer/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/tokenizer/token_index.h"
#include "engine/tokenizer/utf8.h"

namespace strata::tokenizer {
namespace {

// Unicode White_Space, as a character-class body.
constexpr char kWhiteSpaceClass[] =
    R"(\t-\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// The regexes, transcribed from the Hugging Face tokenizer.json files (as llama.cpp carries them; the
// case-insensitive contraction groups spelled out with explicit [sS] classes as llama.cpp does, so that
// Unicode case folding cannot make 'ſ' match 's').
constexpr char kContractionsCased[] = R"('s|'t|'re|'ve|'m|'ll|'d)";
constexpr char kContractions[] = R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]))";

std::string Gpt2Pattern() {
  return absl::StrCat(kContractionsCased,
                      R"(| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)");
}

// Llama 3 and Qwen2 differ only in how many digits a number piece may hold.
std::string Llama3StylePattern(const char* digits) {
  return absl::StrCat(kContractions, R"(|[^\r\n\p{L}\p{N}]?\p{L}+|)", digits,
                      R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)");
}

std::string Gpt4oPattern() {
  constexpr char kUpper[] = R"([\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])";
  constexpr char kLower[] = R"([\p{Ll}\p{Lm}\p{Lo}\p{M}])";
  return absl::StrCat(R"([^\r\n\p{L}\p{N}]?)", kUpper, "*", kLower, "+", kContractions, "?",  //
                      R"(|[^\r\n\p{L}\p{N}]?)", kUpper, "+", kLower, "*", kContractions, "?",
                      R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)");
}

struct Family {
  const char* name;
  std::vector<const char*> aliases;  // tokenizer.ggml.pre values
};

absl::StatusOr<PreTokenizerSpec> SpecFor(std::string_view family) {
  PreTokenizerSpec spec;
  spec.name = std::string(family);
  if (family == "default") {
    spec.patterns = {R"([\p{P}\$\+<=>\^~\|]+)", Gpt2Pattern(), R"(\p{N}+)", "[0-9][0-9][0-9]"};
  } else if (family == "gpt-2") {
    spec.patterns = {Gpt2Pattern()};
  } else if (family == "llama3") {
    spec.patterns = {Llama3StylePattern(R"(\p{N}{1,3})")};
    spec.ignore_merges = true;
    spec.add_bos = true;
  } else if (family == "dbrx" || family == "chatglm4") {  // llama3's regex without its flags
    spec.patterns = {Llama3StylePattern(R"(\p{N}{1,3})")};
  } else if (family == "qwen2") {
    spec.patterns = {Llama3StylePattern(R"(\p{N})")};
  } else if (family == "starcoder") {
    spec.patterns = {R"(\p{N})", Gpt2Pattern()};
  } else if (family == "deepseek-v3") {
    spec.patterns = {
        R"(\p{N}{1,3})",
        R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)",
        R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|)"
        R"( ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
    };
  } else if (family == "deepseek-llm") {
    // `$` of llama.cpp's ECMAScript regex is the end of the piece: `\z` here (PCRE2's `$` also matches
    // before a final newline).
    spec.patterns = {
        R"([\r\n])",
        // Cased letters, as code points (a normalising editor would change some of them).
        "\\s?["
        "A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}"
        "\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-"
        "\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-"
        "\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-"
        "\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-"
        "\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}"
        "\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-"
        "\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-"
        "\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}"
        "\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}"
        "\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}"
        "\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-"
        "\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-"
        "\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}"
        "\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}"
        "]+",
        "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
        R"(\s+\z)",
        "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+",
        R"(\p{N}+)",
    };
  } else if (family == "deepseek-coder") {
    spec.patterns = {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+", R"(\p{N})"};
  } else if (family == "gpt-4o") {
    spec.patterns = {Gpt4oPattern()};
  } else {
    return absl::InternalError(absl::StrCat("no pre-tokenizer family '", AsAbsl(family), "'"));
  }
  return spec;
}

const std::vector<Family>& Families() {
  static const auto* const families = new std::vector<Family>{
      {"default", {"default"}},
      {"gpt-2",
       {"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
        "modern-bert", "mpt", "olmo", "jais", "trillion", "exaone4", "granite-docling"}},
      {"llama3",
       {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"}},
      {"dbrx", {"dbrx", "smaug-bpe"}},
      {"chatglm4", {"glm4", "chatglm-bpe"}},
      {"qwen2", {"qwen2", "deepseek-r1-qwen", "stablelm2", "hunyuan", "megrez", "grok-2"}},
      {"starcoder", {"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"}},
      {"deepseek-v3", {"deepseek-v3"}},
      {"deepseek-llm", {"deepseek-llm"}},
      {"deepseek-coder", {"deepseek-coder"}},
      {"gpt-4o", {"gpt-4o", "llama4"}},
  };
  return *families;
}

// Rewrites \s and \S (outside and inside classes) to explicit White_Space classes.
absl::StatusOr<std::string> ExpandWhiteSpace(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      ++i;
      if (e == 's') {
        absl::StrAppend(&out, in_class ? "" : "[", kWhiteSpaceClass, in_class ? "" : "]");
      } else if (e == 'S') {
        if (in_class) return absl::InvalidArgumentError(absl::StrCat("\\S inside a class in ", AsAbsl(pattern)));
        absl::StrAppend(&out, "[^", kWhiteSpaceClass, "]");
      } else {
        out.push_back(c);
        out.push_back(e);
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out.push_back(c);
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out.push_back(pattern[++i]);
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out.push_back(pattern[++i]);  // literal ]
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out.push_back(c);
  }
  return out;
}

}  // namespace

absl::StatusOr<PreTokenizerSpec> LookupPreTokenizer(std::string_view pre) {
  if (pre.empty()) return SpecFor("default");
  std::vector<std::string> known;
  for (const Family& family : Families()) {
    for (const char* alias : family.aliases) {
      if (pre == alias) return SpecFor(family.name);
      known.push_back(alias);
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("tokenizer.ggml.pre: unsupported pre-tokenizer '", AsAbsl(pre),
                   "' (supported: ", absl::StrJoin(known, ", "), ")"));
}

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::Create(const std::vector<std::string>& patterns) {
  std::unique_ptr<PreTokenizer> result(new PreTokenizer());
  for (const std::string& pattern : patterns) {
    absl::StatusOr<std::string> expanded = ExpandWhiteSpace(pattern);
    if (!expanded.ok()) return expanded.status();
    int error = 0;
    PCRE2_SIZE error_offset = 0;
    auto regex = std::make_unique<Regex>();
    regex->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(expanded->data()), expanded->size(),
                                PCRE2_UTF | PCRE2_UCP, &error, &error_offset, nullptr);
    if (regex->code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      return absl::InternalError(absl::StrCat("pre-tokenizer regex /", pattern, "/ does not compile at offset ",
                                              error_offset, ": ", reinterpret_cast<const char*>(message)));
    }
    // JIT is an optimisation only; the interpreter gives the same matches when it is unavailable.
    pcre2_jit_compile(regex->code, PCRE2_JIT_COMPLETE);
    result->regexes_.push_back(std::move(regex));
  }
  return result;
}

PreTokenizer::~PreTokenizer() = default;

void PreTokenizer::SplitOne(const Regex& regex, std::string_view piece, void* match_data_ptr,
                            std::vector<std::string_view>* out) const {
  auto* match_data = static_cast<pcre2_match_data*>(match_data_ptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
  size_t emitted = 0;  // end of what has been appended to `out`
  size_t search = 0;
  while (search < piece.size()) {
    const int rc = pcre2_match(regex.code, subject, piece.size(), search, PCRE2_NO_UTF_CHECK, match_data,
                               nullptr);
    if (rc < 0) break;  // no match (or a resource limit): the rest is one gap
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data);
    const size_t begin = ovector[0];
    const size_t end = ovector[1];
    if (end <= begin) {  // empty match: look again one character further on
      search = begin + ScanUtf8(piece, begin).length;
      continue;
    }
    if (begin > emitted) out->push_back(piece.substr(emitted, begin - emitted));
    out->push_back(piece.substr(begin, end - begin));
    emitted = search = end;
  }
  if (emitted < piece.size()) out->push_back(piece.substr(emitted));
}

void PreTokenizer::Split(std::string_view text, std::vector<std::string_view>* words) const {
  if (text.empty()) return;
  pcre2_match_data* match_data = pcre2_match_data_create(8, nullptr);
  std::vector<std::string_view> current = {text};
  std::vector<std::string_view> next;
  for (const auto& regex : regexes_) {
    next.clear();
    for (std::string_view piece : current) SplitOne(*regex, piece, match_data, &next);
    std::swap(current, next);
  }
  pcre2_match_data_free(match_data);
  words->insert(words->end(), current.begin(), current.end());
}

}  // namespace strata::tokenizer
