// GgufModel: a model in one GGUF file or in shards written by llama.cpp's gguf-split
// ("<prefix>-00001-of-00003.gguf" ...; split.no counts from 0, file numbers from 1).

#include <charconv>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/gguf/gguf_file.h"
#include "engine/status_macros.h"

namespace strata::gguf {
namespace {

constexpr char kSplitNo[] = "split.no";
constexpr char kSplitCount[] = "split.count";
constexpr char kSplitTensorsCount[] = "split.tensors.count";

// "-NNNNN-of-MMMMM.gguf"
constexpr size_t kSuffixLength = 20;

bool ParseDigits(std::string_view s, int* out) {
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

// Checks the split.* keys of shard `index` (0-based) of `count`, given the model's total tensor count.
absl::Status CheckSplitKeys(const GgufFile& shard, uint64_t index, uint64_t count, uint64_t total_tensors) {
  const Metadata& md = shard.metadata();
  auto fail = [&](std::string detail) { return absl::InvalidArgumentError(absl::StrCat(shard.path(), ": ", detail)); };
  const std::string where = absl::StrFormat("shard %05d of %05d", index + 1, count);

  absl::StatusOr<uint64_t> split_count = md.GetUintOr(kSplitCount, 0);
  if (!split_count.ok()) return WithContext(split_count.status(), shard.path());
  if (count > 1 && !md.Has(kSplitCount)) return fail(absl::StrCat(kSplitCount, " is missing (", where, ")"));
  if (*split_count != count && !(count == 1 && *split_count == 0)) {
    return fail(absl::StrFormat("%s is %d, expected %d (%s)", kSplitCount, *split_count, count, where));
  }

  absl::StatusOr<uint64_t> split_no = md.GetUintOr(kSplitNo, 0);
  if (!split_no.ok()) return WithContext(split_no.status(), shard.path());
  if (count > 1 && !md.Has(kSplitNo)) return fail(absl::StrCat(kSplitNo, " is missing (", where, ")"));
  if (*split_no != index) {
    return fail(absl::StrFormat("%s is %d, expected %d (%s; split.no counts from 0)", kSplitNo, *split_no, index,
                                where));
  }

  if (count > 1 && index == 0 && !md.Has(kSplitTensorsCount)) {
    return fail(absl::StrCat(kSplitTensorsCount, " is missing from the first shard"));
  }
  if (md.Has(kSplitTensorsCount)) {
    absl::StatusOr<uint64_t> declared = md.GetUint(kSplitTensorsCount);
    if (!declared.ok()) return WithContext(declared.status(), shard.path());
    if (*declared != total_tensors) {
      return fail(absl::StrFormat("%s is %d but the %d shards hold %d tensors", kSplitTensorsCount, *declared, count,
                                  total_tensors));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> SplitShardPaths(const std::string& path) {
  if (path.size() < kSuffixLength) return {};
  const std::string_view tail = std::string_view(path).substr(path.size() - kSuffixLength);
  if (tail[0] != '-' || tail.substr(6, 4) != "-of-" || tail.substr(15) != ".gguf") return {};
  int number = 0, count = 0;
  if (!ParseDigits(tail.substr(1, 5), &number) || !ParseDigits(tail.substr(10, 5), &count)) return {};
  if (count < 1 || number < 1 || number > count) return {};
  const std::string prefix = path.substr(0, path.size() - kSuffixLength);
  std::vector<std::string> paths;
  paths.reserve(count);
  for (int i = 1; i <= count; ++i) paths.push_back(absl::StrFormat("%s-%05d-of-%05d.gguf", prefix, i, count));
  return paths;
}

absl::StatusOr<std::unique_ptr<GgufModel>> GgufModel::Open(const std::string& path) {
  auto model = std::make_unique<GgufModel>();
  std::vector<std::string> paths = SplitShardPaths(path);
  if (paths.empty()) {
    ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
    absl::StatusOr<uint64_t> split_count = file->metadata().GetUintOr(kSplitCount, 1);
    if (!split_count.ok()) return WithContext(split_count.status(), path);
    if (*split_count > 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: %s is %d but the file name does not follow <prefix>-NNNNN-of-MMMMM.gguf, so the other shards "
          "cannot be found",
          path, kSplitCount, *split_count));
    }
    model->shards_.push_back(std::move(file));
  } else {
    for (size_t i = 0; i < paths.size(); ++i) {
      absl::StatusOr<std::unique_ptr<GgufFile>> shard = GgufFile::Open(paths[i]);
      if (!shard.ok()) {
        return WithContext(shard.status(),
                        absl::StrFormat("%s: shard %d of %d", path, i + 1, paths.size()));
      }
      model->shards_.push_back(*std::move(shard));
    }
  }

  uint64_t total = 0;
  for (const auto& shard : model->shards_) total += shard->tensors().size();
  for (size_t i = 0; i < model->shards_.size(); ++i) {
    RETURN_IF_ERROR(CheckSplitKeys(*model->shards_[i], i, model->shards_.size(), total));
  }

  model->tensors_.reserve(total);
  for (size_t i = 0; i < model->shards_.size(); ++i) {
    for (const TensorInfo& t : model->shards_[i]->tensors()) {
      auto [it, inserted] = model->tensor_index_.emplace(t.name, model->tensors_.size());
      if (!inserted) {
        const TensorInfo& first = model->tensors_[it->second];
        return absl::InvalidArgumentError(absl::StrFormat("%s: tensor '%s' is also in %s", model->shards_[i]->path(),
                                                          t.name, model->shards_[first.shard]->path()));
      }
      TensorInfo copy = t;
      copy.shard = static_cast<int>(i);
      model->tensors_.push_back(std::move(copy));
    }
  }
  return model;
}

const TensorInfo* GgufModel::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(absl::string_view(name.data(), name.size()));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

uint64_t GgufModel::total_bytes() const {
  uint64_t total = 0;
  for (const auto& shard : shards_) total += shard->file_size();
  return total;
}

}  // namespace strata::gguf
