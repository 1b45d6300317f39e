#ifndef STRATA_ENGINE_TOKENIZER_UTF8_H_
#define STRATA_ENGINE_TOKENIZER_UTF8_H_

// UTF-8 helpers for the tokenizer: strict validation (no overlongs, surrogates or code points above
// U+10FFFF), repair with U+FFFD, and the GPT-2 byte-level alphabet that byte-level BPE vocabularies use.
// Free functions and immutable tables; safe from any thread.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata::tokenizer {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// What starts at s[pos] (pos < s.size()).
struct Utf8Scan {
  enum Kind {
    kValid,       // a whole code point of `length` bytes
    kIncomplete,  // a valid prefix of `length` bytes that runs to the end of s
    kInvalid,     // `length` bytes (the maximal invalid subpart, at least 1) that no code point starts with
  };
  Kind kind;
  size_t length;
  uint32_t code_point;  // set for kValid only
};
Utf8Scan ScanUtf8(std::string_view s, size_t pos);

// Length of the sequence a lead byte announces (1 for ASCII and for bytes that cannot lead), used where
// the caller splits text into characters without validating (as SentencePiece does).
size_t Utf8SequenceLength(uint8_t lead);

// Appends the UTF-8 encoding of `cp` (which must be at most U+10FFFF).
void AppendUtf8(uint32_t cp, std::string* out);

// `s` with every invalid subpart (and a truncated tail) replaced by U+FFFD.
std::string RepairUtf8(std::string_view s);
bool IsValidUtf8(std::string_view s);

// The GPT-2 byte-to-unicode map: every byte has a printable code point (U+0021..U+0143), so any byte
// string becomes a UTF-8 string without spaces or controls. ByteLevelEncode maps bytes to that alphabet;
// ByteLevelDecode maps it back and returns false (leaving `out` with what decoded) when `s` holds a
// character outside the alphabet.
void ByteLevelEncode(std::string_view bytes, std::string* out);
bool ByteLevelDecode(std::string_view s, std::string* out);

}  // namespace strata::tokenizer

#endif  // STRATA_ENGINE_TOKENIZER_UTF8_H_
