#include "engine/gguf/ggml_types.h"

#include <cmath>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/gguf/ggml_quants.h"

namespace strata::gguf {
namespace {

static_assert(std::endian::native == std::endian::little, "GGUF is read in place: little-endian hosts only");

struct TypeRow {
  uint32_t id;
  std::string_view name;
  int64_t block_size;
  int64_t type_size;
  bool can_dequantize;
};

// The ids ggml has assigned (through mxfp4, nvfp4 and q1_0), with ggml's names and block geometry. Ids 31-33 and 36-38 are repacked
// layouts ggml no longer writes to GGUF, kept so that older files holding them still parse.
constexpr TypeRow kTypes[] = {
    {0, "f32", 1, 4, true},         {1, "f16", 1, 2, true},         {2, "q4_0", 32, 18, true},
    {3, "q4_1", 32, 20, true},      {6, "q5_0", 32, 22, true},      {7, "q5_1", 32, 24, true},
    {8, "q8_0", 32, 34, true},      {9, "q8_1", 32, 36, false},     {10, "q2_K", 256, 84, true},
    {11, "q3_K", 256, 110, true},   {12, "q4_K", 256, 144, true},   {13, "q5_K", 256, 176, true},
    {14, "q6_K", 256, 210, true},   {15, "q8_K", 256, 292, false},  {16, "iq2_xxs", 256, 66, false},
    {17, "iq2_xs", 256, 74, false}, {18, "iq3_xxs", 256, 98, false}, {19, "iq1_s", 256, 50, false},
    {20, "iq4_nl", 32, 18, false},  {21, "iq3_s", 256, 110, false}, {22, "iq2_s", 256, 82, false},
    {23, "iq4_xs", 256, 136, false}, {24, "i8", 1, 1, false},       {25, "i16", 1, 2, false},
    {26, "i32", 1, 4, false},       {27, "i64", 1, 8, false},       {28, "f64", 1, 8, false},
    {29, "iq1_m", 256, 56, false},  {30, "bf16", 1, 2, true},       {31, "q4_0_4x4", 32, 18, false},
    {32, "q4_0_4x8", 32, 18, false}, {33, "q4_0_8x8", 32, 18, false}, {34, "tq1_0", 256, 54, false},
    {35, "tq2_0", 256, 66, false},  {36, "iq4_nl_4x4", 32, 18, false}, {37, "iq4_nl_4x8", 32, 18, false},
    {38, "iq4_nl_8x8", 32, 18, false}, {39, "mxfp4", 32, 17, true}, {40, "nvfp4", 64, 36, false},
    {41, "q1_0", 128, 18, false},
};

const TypeRow* FindRow(uint32_t id) {
  for (const TypeRow& row : kTypes) {
    if (row.id == id) return &row;
  }
  return nullptr;
}

GgmlTypeInfo ToInfo(const TypeRow& row) {
  return GgmlTypeInfo{row.name, row.block_size, row.type_size, row.can_dequantize};
}

// a * b for non-negative values, or nullopt when it does not fit in int64_t.
std::optional<int64_t> CheckedMul(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

}  // namespace

absl::StatusOr<GgmlTypeInfo> LookupType(uint32_t type_id) {
  const TypeRow* row = FindRow(type_id);
  if (row == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("unknown ggml type id ", type_id));
  }
  return ToInfo(*row);
}

absl::StatusOr<GgmlTypeInfo> GetTypeInfo(uint32_t type_id) {
  const TypeRow* row = FindRow(type_id);
  if (row == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("unknown ggml type id ", type_id));
  }
  if (!row->can_dequantize) {
    return absl::UnimplementedError(
        absl::StrCat("ggml type ", std::string(row->name), " (id ", type_id, ") cannot be decoded by Strata"));
  }
  return ToInfo(*row);
}

std::string TypeName(uint32_t type_id) {
  const TypeRow* row = FindRow(type_id);
  if (row == nullptr) return absl::StrCat("type", type_id);
  return std::string(row->name);
}

absl::StatusOr<uint64_t> RowBytes(GgmlType type, int64_t n) {
  const uint32_t id = static_cast<uint32_t>(type);
  const TypeRow* row = FindRow(id);
  if (row == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown ggml type id ", id));
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("negative element count ", n));
  if (n % row->block_size != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d elements is not a whole number of %s blocks (%d elements each)", n, row->name, row->block_size));
  }
  std::optional<int64_t> bytes = CheckedMul(n / row->block_size, row->type_size);
  if (!bytes) {
    return absl::InvalidArgumentError(absl::StrFormat("%d elements of %s overflow 64 bits", n, row->name));
  }
  return static_cast<uint64_t>(*bytes);
}

absl::StatusOr<uint64_t> TensorBytes(GgmlType type, std::span<const int64_t> ne) {
  int64_t n_rows = 1;
  int64_t n_elements = 1;
  for (size_t i = 0; i < ne.size(); ++i) {
    if (ne[i] < 0) {
      return absl::InvalidArgumentError(absl::StrFormat("dimension %d is negative (%d)", i, ne[i]));
    }
    std::optional<int64_t> elements = CheckedMul(n_elements, ne[i]);
    if (!elements) {
      return absl::InvalidArgumentError(
          absl::StrFormat("the element count overflows 64 bits at dimension %d (%d)", i, ne[i]));
    }
    n_elements = *elements;
    if (i > 0) {
      std::optional<int64_t> rows = CheckedMul(n_rows, ne[i]);  // a zero ne[0] leaves this unbounded
      if (!rows) return absl::InvalidArgumentError(absl::StrFormat("the row count overflows 64 bits"));
      n_rows = *rows;
    }
  }
  const int64_t row_elements = ne.empty() ? 1 : ne[0];
  absl::StatusOr<uint64_t> row_bytes = RowBytes(type, row_elements);
  if (!row_bytes.ok()) return row_bytes.status();
  std::optional<int64_t> bytes = CheckedMul(static_cast<int64_t>(*row_bytes), n_rows);
  if (!bytes) return absl::InvalidArgumentError("the tensor's byte size overflows 64 bits");
  return static_cast<uint64_t>(*bytes);
}

absl::Status Dequantize(GgmlType type, const void* src, float* dst, int64_t n) {
  const uint32_t id = static_cast<uint32_t>(type);
  absl::StatusOr<GgmlTypeInfo> info = GetTypeInfo(id);
  if (!info.ok()) return info.status();
  absl::StatusOr<uint64_t> bytes = RowBytes(type, n);
  if (!bytes.ok()) return bytes.status();
  if (n == 0) return absl::OkStatus();
  if (!internal::DequantizeBlocks(type, static_cast<const uint8_t*>(src), dst, n / info->block_size)) {
    return absl::InternalError(absl::StrCat("no decoder for ggml type ", std::string(info->name)));
  }
  return absl::OkStatus();
}

absl::Status Quantize(GgmlType type, const float* src, void* dst, int64_t n) {
  const uint32_t id = static_cast<uint32_t>(type);
  absl::StatusOr<GgmlTypeInfo> info = LookupType(id);
  if (!info.ok()) return info.status();
  switch (type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
    case GgmlType::kMXFP4:
      break;
    default:
      return absl::UnimplementedError(absl::StrCat("Strata cannot encode ggml type ", std::string(info->name)));
  }
  absl::StatusOr<uint64_t> bytes = RowBytes(type, n);
  if (!bytes.ok()) return bytes.status();
  if (type != GgmlType::kF32) {
    for (int64_t i = 0; i < n; ++i) {
      if (!std::isfinite(src[i])) {
        return absl::InvalidArgumentError(
            absl::StrFormat("element %d is %f; only finite values can be encoded as %s", i, src[i], info->name));
      }
    }
  }
  if (n == 0) return absl::OkStatus();
  if (!internal::QuantizeBlocks(type, src, static_cast<uint8_t*>(dst), n / info->block_size)) {
    return absl::InternalError(absl::StrCat("no encoder for ggml type ", std::string(info->name)));
  }
  return absl::OkStatus();
}

bool HasAffine4Codes(GgmlType type) {
  return type == GgmlType::kQ4_0 || type == GgmlType::kQ4_1 || type == GgmlType::kQ4_K;
}

absl::Status ReadAffine4Codes(GgmlType type, const void* src, int64_t n, uint8_t* codes, float* scale,
                              float* offset) {
  if (!HasAffine4Codes(type)) {
    return absl::InvalidArgumentError(absl::StrCat("ggml type ", TypeName(static_cast<uint32_t>(type)),
                                                   " does not store 4-bit affine codes (q4_0, q4_1 and q4_K do)"));
  }
  absl::StatusOr<uint64_t> bytes = RowBytes(type, n);
  if (!bytes.ok()) return bytes.status();
  const int64_t block = type == GgmlType::kQ4_K ? 256 : 32;
  if (!internal::ReadAffine4Blocks(type, static_cast<const uint8_t*>(src), n / block, codes, scale, offset)) {
    return absl::InternalError(absl::StrCat("no code reader for ggml type ", TypeName(static_cast<uint32_t>(type))));
  }
  return absl::OkStatus();
}

absl::Status ReadMxfp4Codes(const void* src, int64_t n, int8_t* values, int* exponents) {
  absl::StatusOr<uint64_t> bytes = RowBytes(GgmlType::kMXFP4, n);
  if (!bytes.ok()) return bytes.status();
  internal::ReadMxfp4Blocks(static_cast<const uint8_t*>(src), n / 32, values, exponents);
  return absl::OkStatus();
}

}  // namespace strata::gguf
