#include "tests/testing/safetensors_writer.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace strata::testing {

std::string SafetensorsHeaderJson(const std::vector<SafetensorsEntry>& entries) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const SafetensorsEntry& e : entries) {
    header[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {offset, offset + e.bytes.size()}}};
    offset += e.bytes.size();
  }
  return header.dump();
}

absl::Status WriteSafetensorsRaw(const std::string& path, const std::string& header_json,
                                 const std::vector<uint8_t>& data) {
  std::string header = header_json;
  while (header.size() % 8 != 0) header.push_back(' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InternalError(absl::StrCat("cannot create ", path));
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries) {
  std::vector<uint8_t> data;
  for (const SafetensorsEntry& e : entries) data.insert(data.end(), e.bytes.begin(), e.bytes.end());
  return WriteSafetensorsRaw(path, SafetensorsHeaderJson(entries), data);
}

}  // namespace strata::testing
