#include "engine/tokenizer/utf8.h"

#include <array>

namespace strata::tokenizer {
namespace {

// Byte -> code point of the GPT-2 byte-level alphabet, and the reverse for code points below 512.
struct ByteLevelTables {
  std::array<uint16_t, 256> byte_to_cp{};
  std::array<int16_t, 512> cp_to_byte{};
  std::array<std::string, 256> byte_to_utf8;

  ByteLevelTables() {
    cp_to_byte.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      byte_to_cp[b] = static_cast<uint16_t>(printable ? b : next++);
      cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
      AppendUtf8(byte_to_cp[b], &byte_to_utf8[b]);
    }
  }
};

const ByteLevelTables& Tables() {
  static const ByteLevelTables* const tables = new ByteLevelTables();
  return *tables;
}

bool IsContinuation(uint8_t c) { return (c & 0xC0) == 0x80; }

}  // namespace

Utf8Scan ScanUtf8(std::string_view s, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t lead = byte(pos);
  if (lead < 0x80) return {Utf8Scan::kValid, 1, lead};

  size_t need;
  uint32_t cp;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the first continuation byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    need = 1;
    cp = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    need = 2;
    cp = lead & 0x0F;
    if (lead == 0xE0) lo = 0xA0;  // no overlongs
    if (lead == 0xED) hi = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    need = 3;
    cp = lead & 0x07;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return {Utf8Scan::kInvalid, 1, 0};
  }

  for (size_t i = 1; i <= need; ++i) {
    if (pos + i >= s.size()) return {Utf8Scan::kIncomplete, i, 0};
    const uint8_t c = byte(pos + i);
    const bool ok = i == 1 ? (c >= lo && c <= hi) : IsContinuation(c);
    if (!ok) return {Utf8Scan::kInvalid, i, 0};
    cp = (cp << 6) | (c & 0x3F);
  }
  return {Utf8Scan::kValid, need + 1, cp};
}

size_t Utf8SequenceLength(uint8_t lead) {
  static constexpr size_t kLengths[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLengths[lead >> 4];
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string RepairUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    const Utf8Scan scan = ScanUtf8(s, pos);
    if (scan.kind == Utf8Scan::kValid) {
      out.append(s.substr(pos, scan.length));
    } else {
      out.append(kReplacementChar);
    }
    pos += scan.length;
  }
  return out;
}

bool IsValidUtf8(std::string_view s) {
  for (size_t pos = 0; pos < s.size();) {
    const Utf8Scan scan = ScanUtf8(s, pos);
    if (scan.kind != Utf8Scan::kValid) return false;
    pos += scan.length;
  }
  return true;
}

void ByteLevelEncode(std::string_view bytes, std::string* out) {
  const ByteLevelTables& t = Tables();
  for (char c : bytes) out->append(t.byte_to_utf8[static_cast<uint8_t>(c)]);
}

bool ByteLevelDecode(std::string_view s, std::string* out) {
  const ByteLevelTables& t = Tables();
  for (size_t pos = 0; pos < s.size();) {
    const Utf8Scan scan = ScanUtf8(s, pos);
    if (scan.kind != Utf8Scan::kValid || scan.code_point >= t.cp_to_byte.size() ||
        t.cp_to_byte[scan.code_point] < 0) {
      return false;
    }
    out->push_back(static_cast<char>(t.cp_to_byte[scan.code_point]));
    pos += scan.length;
  }
  return true;
}

}  // namespace strata::tokenizer
