#include "packtool/validate.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/gguf/gguf_file.h"
#include "engine/model/model_config.h"
#include "engine/pack/pack_format.h"
#include "engine/pack/routing_profile.h"
#include "engine/status_macros.h"
#include "packtool/pack_writer.h"

namespace strata::packtool {
namespace {

namespace fs = std::filesystem;
constexpr size_t kMaxListedBlobs = 20;

class Reporter {
 public:
  explicit Reporter(ValidationReport* report) : report_(report) {}
  void Add(std::string_view file, std::string message) {
    report_->problems.push_back({std::string(file), std::move(message)});
  }

 private:
  ValidationReport* report_;
};

bool Cancelled(const std::atomic<bool>* cancel) { return cancel != nullptr && cancel->load(std::memory_order_relaxed); }

// Reads every blob and compares its xxh3 with the manifest, `threads` ways; stops early once `cancel` is set.
void CheckBlobs(const std::string& path, const pack::v1::Manifest& m, int threads, const std::atomic<bool>* cancel,
                ValidationReport* report) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    report->problems.push_back({std::string(pack::kExpertsFile), absl::StrCat("cannot open: ", std::strerror(errno))});
    return;
  }
  const uint64_t n_blobs = static_cast<uint64_t>(m.blob_xxh3_size());
  const uint64_t blob_bytes = m.blob_bytes();
  std::vector<uint64_t> expected(n_blobs);
  for (uint64_t i = 0; i < n_blobs; ++i) expected[i] = *pack::ParseHashHex(m.blob_xxh3(static_cast<int>(i)));
  std::atomic<uint64_t> next{0}, checked{0};
  std::mutex mu;
  std::vector<std::pair<uint64_t, std::string>> bad;  // blob index, message
  auto worker = [&] {
    std::vector<uint8_t> buf(blob_bytes);
    for (;;) {
      if (Cancelled(cancel)) break;
      const uint64_t i = next.fetch_add(1);
      if (i >= n_blobs) break;
      uint64_t got = 0;
      std::string error;
      while (got < blob_bytes) {
        const ssize_t n = pread(fd, buf.data() + got, blob_bytes - got, static_cast<off_t>(i * blob_bytes + got));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          error = n < 0 ? std::strerror(errno) : "unexpected end of file";
          break;
        }
        got += static_cast<uint64_t>(n);
      }
      const uint64_t layer = i / m.geometry().n_expert(), expert = i % m.geometry().n_expert();
      std::string message;
      if (!error.empty()) {
        message = absl::StrCat("blob ", i, " (moe layer ", layer, ", expert ", expert, "): read failed: ", error);
      } else if (const uint64_t h = XXH3_64bits(buf.data(), blob_bytes); h != expected[i]) {
        message = absl::StrCat("blob ", i, " (moe layer ", layer, ", expert ", expert, ") at offset ", i * blob_bytes,
                               ": checksum ", pack::HashHex(h), ", manifest says ", pack::HashHex(expected[i]));
      }
      if (!message.empty()) {
        std::lock_guard<std::mutex> lock(mu);
        bad.emplace_back(i, std::move(message));
      }
      checked.fetch_add(1);
    }
  };
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  const int n = static_cast<int>(std::min<uint64_t>(ResolveThreads(threads), std::max<uint64_t>(n_blobs, 1)));
  for (int t = 0; t < n; ++t) pool.emplace_back(worker);
  for (std::thread& t : pool) t.join();
  close(fd);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  report->blobs_checked = checked.load();
  report->bytes_checked = report->blobs_checked * blob_bytes;
  report->seconds += secs;
  report->gb_per_second = secs > 0 ? static_cast<double>(report->bytes_checked) / secs / 1e9 : 0.0;
  std::sort(bad.begin(), bad.end());
  for (size_t i = 0; i < bad.size() && i < kMaxListedBlobs; ++i) {
    report->problems.push_back({std::string(pack::kExpertsFile), bad[i].second});
  }
  if (bad.size() > kMaxListedBlobs) {
    report->problems.push_back(
        {std::string(pack::kExpertsFile), absl::StrCat("and ", bad.size() - kMaxListedBlobs, " more bad blobs")});
  }
}

// dense.gguf must parse, hold no routed-expert tensors, and agree with the manifest's geometry.
// False when `cancel` stopped it before it was done.
bool CheckDense(const std::string& path, const pack::v1::Manifest& m, bool quick, const std::atomic<bool>* cancel,
                Reporter* out) {
  const std::string name(pack::kDenseFile);
  // The size is checked in quick mode too: the engine refuses a pack whose dense.gguf has another size.
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec) {
    out->Add(name, absl::StrCat("cannot stat: ", ec.message()));
    return true;
  }
  if (absl::Status s = pack::CheckDenseBytes(m, size); !s.ok()) {
    out->Add(name, std::string(s.message()));
  } else if (!quick && !m.dense_xxh3().empty()) {
    auto hash = HashFile(path, cancel);
    if (absl::IsCancelled(hash.status())) return false;
    if (!hash.ok()) {
      out->Add(name, std::string(hash.status().message()));
      return true;
    }
    if (pack::HashHex(hash->second) != m.dense_xxh3()) {
      out->Add(name, absl::StrCat("checksum ", pack::HashHex(hash->second), ", manifest says ", m.dense_xxh3()));
    }
  }
  auto file = gguf::GgufFile::Open(path);
  if (!file.ok()) {
    out->Add(name, std::string(file.status().message()));
    return true;
  }
  const gguf::Metadata& meta = (*file)->metadata();
  auto arch = meta.GetString("general.architecture");
  if (!arch.ok()) {
    out->Add(name, std::string(arch.status().message()));
    return true;
  }
  if (*arch != m.architecture()) {
    out->Add(name, absl::StrCat("general.architecture is '", *arch, "', manifest says '", m.architecture(), "'"));
    return true;
  }
  // What the engine reads at load time, so that a pack the engine would refuse does not pass.
  if (auto config = model::ReadModelConfig(meta); !config.ok()) {
    out->Add(name, std::string(config.status().message()));
  }
  const pack::v1::Geometry& g = m.geometry();
  // The geometry counts the blocks that run: block_count less any multi-token-prediction blocks.
  if (auto blocks = model::ReadBlockCount(meta, *arch); !blocks.ok()) {
    out->Add(name, std::string(blocks.status().message()));
  } else if (blocks->run() != static_cast<int64_t>(g.n_layer())) {
    out->Add(name, absl::StrCat(*arch, ".block_count is ", blocks->total,
                                blocks->mtp > 0 ? absl::StrCat(" less ", blocks->mtp, " multi-token-prediction") : "",
                                ", manifest geometry says ", g.n_layer()));
  }
  const std::pair<std::string, uint64_t> keys[] = {{".embedding_length", g.n_embd()},
                                                   {".expert_count", g.n_expert()},
                                                   {".expert_used_count", g.n_expert_used()}};
  for (const auto& [suffix, expected] : keys) {
    const std::string key = *arch + suffix;
    auto v = meta.GetUint(key);
    if (!v.ok()) {
      out->Add(name, std::string(v.status().message()));
    } else if (*v != expected) {
      out->Add(name, absl::StrCat(key, " is ", *v, ", manifest geometry says ", expected));
    }
  }
  for (const gguf::TensorInfo& t : (*file)->tensors()) {
    // Per-expert biases (gpt-oss's blk.N.ffn_*_exps.bias) are small and belong here; the weights do not.
    if (t.name.find("_exps.weight") != std::string::npos) {
      out->Add(name, absl::StrCat("holds routed-expert tensor '", t.name, "', which belongs in experts.bin"));
    }
  }
  for (uint32_t block : g.moe_layers()) {
    const std::string router = absl::StrCat("blk.", block, ".ffn_gate_inp.weight");
    const gguf::TensorInfo* t = (*file)->FindTensor(router);
    if (t == nullptr) {
      out->Add(name, absl::StrCat("lacks router tensor '", router, "'"));
    } else if (t->ne.size() != 2 || t->ne[0] != g.n_embd() || t->ne[1] != g.n_expert()) {
      out->Add(name, absl::StrCat("router tensor '", router, "' has shape [", t->ne[0], ", ",
                                  t->ne.size() > 1 ? t->ne[1] : 0, "], expected [", g.n_embd(), ", ", g.n_expert(), "]"));
    }
  }
  return true;
}

// routing_profile.bin, when the pack has one: what Pack::Open checks (ParseRoutingProfile).
void CheckProfileFile(const std::string& pack_dir, const pack::v1::Manifest& m, Reporter* out) {
  const std::string path = absl::StrCat(pack_dir, "/", pack::kRoutingProfileFile);
  std::error_code ec;
  if (!fs::exists(path, ec)) return;
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  if (in) bytes << in.rdbuf();
  if (!in || in.bad()) {
    out->Add(pack::kRoutingProfileFile, absl::StrCat("cannot read: ", std::strerror(errno)));
    return;
  }
  if (auto profile = pack::ParseRoutingProfile(bytes.view(), m); !profile.ok()) {
    out->Add(pack::kRoutingProfileFile, std::string(profile.status().message()));
  }
}

}  // namespace

absl::StatusOr<ValidationReport> ValidatePack(const std::string& pack_dir, const ValidateOptions& options) {
  std::error_code ec;
  if (!fs::is_directory(pack_dir, ec)) {
    if (fs::exists(pack_dir, ec)) return absl::InvalidArgumentError(absl::StrCat(pack_dir, ": not a directory"));
    return absl::NotFoundError(absl::StrCat(pack_dir, ": no such pack directory"));
  }
  ValidationReport report;
  Reporter out(&report);
  const auto start = std::chrono::steady_clock::now();
  const std::string manifest_name(pack::kManifestFile);
  for (const char* file : {pack::kManifestFile, pack::kExpertsFile, pack::kDenseFile}) {
    if (!fs::is_regular_file(absl::StrCat(pack_dir, "/", file), ec)) out.Add(file, "missing");
  }
  auto manifest = pack::ReadManifest(pack_dir);
  if (!manifest.ok()) {
    if (fs::exists(absl::StrCat(pack_dir, "/", pack::kManifestFile), ec)) {
      out.Add(manifest_name, std::string(manifest.status().message()));
    }
    return report;
  }
  if (absl::Status s = pack::CheckManifest(*manifest); !s.ok()) {
    out.Add(manifest_name, std::string(s.message()));
    return report;
  }
  CheckProfileFile(pack_dir, *manifest, &out);
  const std::string experts_path = absl::StrCat(pack_dir, "/", pack::kExpertsFile);
  bool experts_size_ok = false;
  if (fs::is_regular_file(experts_path, ec)) {
    const uint64_t size = fs::file_size(experts_path, ec);
    if (ec) {
      out.Add(pack::kExpertsFile, absl::StrCat("cannot stat: ", ec.message()));
    } else if (size != manifest->experts_bytes()) {
      const pack::v1::Geometry& g = manifest->geometry();
      out.Add(pack::kExpertsFile,
              absl::StrCat("size ", size, " bytes, expected n_moe_layers x n_expert x blob_bytes = ", g.n_moe_layers(),
                           " x ", g.n_expert(), " x ", manifest->blob_bytes(), " = ", manifest->experts_bytes()));
    } else {
      experts_size_ok = true;
    }
  }
  const std::string dense_path = absl::StrCat(pack_dir, "/", pack::kDenseFile);
  if (fs::is_regular_file(dense_path, ec) && !CheckDense(dense_path, *manifest, options.quick, options.cancel, &out)) {
    return absl::CancelledError(absl::StrCat("validation of ", pack_dir, " cancelled"));
  }
  if (experts_size_ok && !options.quick) {
    CheckBlobs(experts_path, *manifest, options.threads, options.cancel, &report);
    // A cancel that came after the last blob leaves a complete report.
    if (Cancelled(options.cancel) && report.blobs_checked < static_cast<uint64_t>(manifest->blob_xxh3_size())) {
      return absl::CancelledError(absl::StrCat("validation of ", pack_dir, " cancelled after ", report.blobs_checked,
                                               " of ", manifest->blob_xxh3_size(), " expert checksums"));
    }
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace strata::packtool
