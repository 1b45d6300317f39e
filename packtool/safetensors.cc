#include "packtool/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"
#include "nlohmann/json.hpp"

namespace strata::packtool {
namespace {

using nlohmann::json;

absl::Status Bad(const std::string& name, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(name, ": ", what));
}

// The element size of a dtype Strata reads, and its ggml type where it has one.
absl::StatusOr<std::pair<uint64_t, std::optional<gguf::GgmlType>>> DtypeOf(const std::string& dtype) {
  using Kind = std::pair<uint64_t, std::optional<gguf::GgmlType>>;
  if (dtype == "F16") return Kind{2, gguf::GgmlType::kF16};
  if (dtype == "BF16") return Kind{2, gguf::GgmlType::kBF16};
  if (dtype == "F32") return Kind{4, gguf::GgmlType::kF32};
  if (dtype == "F8_E4M3" || dtype == "U8") return Kind{1, std::nullopt};
  return absl::UnimplementedError(
      absl::StrCat("dtype '", dtype, "' is not supported (expected F16, BF16, F32, F8_E4M3 or U8)"));
}

absl::StatusOr<SafetensorsTensor> ParseTensor(const std::string& tname, const json& entry, const uint8_t* data,
                                              uint64_t data_size, const std::string& name) {
  const std::string where = absl::StrCat(name, ": tensor '", tname, "'");
  if (!entry.is_object()) return Bad(where, "expected an object with dtype, shape and data_offsets");
  SafetensorsTensor t;
  t.name = tname;
  auto dtype = entry.find("dtype");
  if (dtype == entry.end() || !dtype->is_string()) return Bad(where, "dtype: expected a string");
  t.dtype = dtype->get<std::string>();
  absl::StatusOr<std::pair<uint64_t, std::optional<gguf::GgmlType>>> kind = DtypeOf(t.dtype);
  if (!kind.ok()) return WithContext(kind.status(), where);
  t.type = kind->second;

  auto shape = entry.find("shape");
  if (shape == entry.end() || !shape->is_array()) return Bad(where, "shape: expected an array of dimensions");
  uint64_t elements = 1;
  for (const json& d : *shape) {
    if (!d.is_number_unsigned()) return Bad(where, "shape: expected non-negative integers");
    const uint64_t v = d.get<uint64_t>();
    // Dimensions and their product must fit in int64 (and so in any size computed from them).
    if (v > (uint64_t{1} << 40) || (v != 0 && elements > (uint64_t{1} << 60) / v)) {
      return Bad(where, "shape: too many elements");
    }
    elements *= v;
    t.shape.push_back(static_cast<int64_t>(v));
  }

  auto offsets = entry.find("data_offsets");
  if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
      !(*offsets)[1].is_number_unsigned()) {
    return Bad(where, "data_offsets: expected [begin, end], two non-negative integers");
  }
  const uint64_t begin = (*offsets)[0].get<uint64_t>(), end = (*offsets)[1].get<uint64_t>();
  if (begin > end) return Bad(where, absl::StrCat("data_offsets: begin ", begin, " is past end ", end));
  if (end > data_size) {
    return Bad(where, absl::StrCat("data_offsets: end ", end, " is past the data section's ", data_size,
                                   " bytes (truncated file?)"));
  }
  const uint64_t expected = elements * kind->first;
  if (end - begin != expected) {
    return Bad(where, absl::StrCat("data_offsets: ", end - begin, " bytes, expected ", expected, " for ", t.dtype,
                                   " of ", elements, " elements"));
  }
  if (data != nullptr) t.data = std::span<const uint8_t>(data + begin, end - begin);
  return t;
}

}  // namespace

int64_t SafetensorsTensor::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<std::vector<SafetensorsTensor>> ParseSafetensorsHeader(std::string_view text, const uint8_t* data,
                                                                      uint64_t data_size, const std::string& name) {
  const json header = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) return Bad(name, "header: not valid JSON");
  if (!header.is_object()) return Bad(name, "header: expected a JSON object of tensors");
  std::vector<SafetensorsTensor> tensors;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) return Bad(name, "__metadata__: expected an object of strings");
      continue;
    }
    ASSIGN_OR_RETURN(SafetensorsTensor t, ParseTensor(it.key(), it.value(), data, data_size, name));
    tensors.push_back(std::move(t));
  }
  return tensors;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat(path, ": cannot stat: ", std::strerror(e)));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->size_ = static_cast<uint64_t>(st.st_size);
  if (file->size_ < 8) {
    ::close(fd);
    return Bad(path, absl::StrCat("file of ", file->size_, " bytes is too short for the 8-byte header length"));
  }
  void* map = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (map == MAP_FAILED) return absl::InternalError(absl::StrCat(path, ": cannot map: ", std::strerror(map_errno)));
  file->map_ = map;
  const auto* bytes = static_cast<const uint8_t*>(map);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > kMaxSafetensorsHeader) {
    return Bad(path, absl::StrCat("header length ", header_len, " exceeds the limit of ", kMaxSafetensorsHeader,
                                  " bytes"));
  }
  if (header_len > file->size_ - 8) {
    return Bad(path, absl::StrCat("header length ", header_len, " is past the end of the file (", file->size_ - 8,
                                  " bytes follow the length)"));
  }
  const std::string_view text(reinterpret_cast<const char*>(bytes + 8), header_len);
  ASSIGN_OR_RETURN(file->tensors_,
                   ParseSafetensorsHeader(text, bytes + 8 + header_len, file->size_ - 8 - header_len, path));
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::Open(const std::string& dir) {
  std::error_code ec;
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".safetensors") paths.push_back(entry.path().string());
  }
  if (ec) return absl::NotFoundError(absl::StrCat(dir, ": cannot list: ", ec.message()));
  if (paths.empty()) return absl::InvalidArgumentError(absl::StrCat(dir, ": no *.safetensors files"));
  std::sort(paths.begin(), paths.end());
  auto checkpoint = std::make_unique<SafetensorsCheckpoint>();
  for (const std::string& path : paths) {
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
    const int shard = static_cast<int>(checkpoint->files_.size());
    for (SafetensorsTensor& t : file->tensors_) t.shard = shard;
    for (const SafetensorsTensor& t : file->tensors()) {
      auto [it, inserted] = checkpoint->index_.emplace(t.name, &t);
      if (!inserted) {
        return Bad(path, absl::StrCat("tensor '", t.name, "' is also in ",
                                      checkpoint->files_[static_cast<size_t>(it->second->shard)]->path()));
      }
    }
    checkpoint->files_.push_back(std::move(file));
  }
  return checkpoint;
}

const SafetensorsTensor* SafetensorsCheckpoint::Find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : it->second;
}

std::vector<const SafetensorsTensor*> SafetensorsCheckpoint::tensors() const {
  std::vector<const SafetensorsTensor*> all;
  for (const auto& f : files_) {
    for (const SafetensorsTensor& t : f->tensors()) all.push_back(&t);
  }
  return all;
}

}  // namespace strata::packtool
