// libFuzzer target for the GGUF reader: parses arbitrary bytes; when they parse, reads every tensor's
// bytes and decodes the first block of each decodable tensor, so that any region the parser vouched for
// but lies outside the input shows up under ASan. Seeds: tests/fuzz/corpus/gguf.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/gguf/gguf_file.h"

namespace {

void TouchValue(const strata::gguf::Value& v, size_t* sink) {
  if (const auto* array = std::get_if<strata::gguf::Array>(&v.data)) {
    for (const strata::gguf::Value& e : array->elements) TouchValue(e, sink);
  } else if (const auto* s = std::get_if<std::string>(&v.data)) {
    for (char c : *s) *sink += static_cast<unsigned char>(c);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata::gguf;
  // Copy so that the input is an exactly-sized heap block regardless of how libFuzzer holds it.
  std::vector<uint8_t> bytes(data, data + size);
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Parse("fuzz.gguf", bytes);
  if (!file.ok()) return 0;
  size_t sink = 0;
  for (const auto& [key, value] : (*file)->metadata().entries()) TouchValue(value, &sink);
  for (const TensorInfo& t : (*file)->tensors()) {
    for (uint64_t i = 0; i < t.bytes; ++i) sink += t.data[i];
    absl::StatusOr<GgmlTypeInfo> info = GetTypeInfo(static_cast<uint32_t>(t.type));
    if (!info.ok()) continue;
    std::vector<float> block(static_cast<size_t>(info->block_size));
    if (!Dequantize(t.type, t.data, block.data(), info->block_size).ok()) __builtin_trap();
  }
  volatile size_t keep = sink;
  (void)keep;
  return 0;
}
