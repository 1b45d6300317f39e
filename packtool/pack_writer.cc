#include "packtool/pack_writer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"
#include "engine/exec/thread_pool.h"
#include "kernels/cpu/quantize.h"
#include "packtool/version.h"

namespace strata::packtool {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

absl::Status ErrnoError(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

absl::Status WriteAll(int fd, const uint8_t* data, uint64_t size, uint64_t offset, const std::string& path) {
  while (size > 0) {
    const ssize_t n = pwrite(fd, data, size, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(absl::StrCat(path, ": write at offset ", offset));
    }
    data += n;
    size -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// Size and xxh3-64 of the chunks `next` yields (StatusOr of a span; an empty one ends them), CANCELLED naming
// `name` between chunks once `cancel` (may be null) is set.
template <typename Next>
absl::StatusOr<std::pair<uint64_t, uint64_t>> HashChunks(const std::string& name, const std::atomic<bool>* cancel,
                                                         Next&& next) {
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), &XXH3_freeState);
  XXH3_64bits_reset(state.get());
  uint64_t total = 0;
  for (;;) {
    if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
      return absl::CancelledError(absl::StrCat(name, ": cancelled while hashing"));
    }
    ASSIGN_OR_RETURN(const std::span<const uint8_t> chunk, next());
    if (chunk.empty()) break;
    XXH3_64bits_update(state.get(), chunk.data(), chunk.size());
    total += chunk.size();
  }
  return std::make_pair(total, static_cast<uint64_t>(XXH3_64bits_digest(state.get())));
}

}  // namespace

absl::StatusOr<std::pair<uint64_t, uint64_t>> HashFile(const std::string& path, const std::atomic<bool>* cancel) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(absl::StrCat(path, ": open"));
  std::vector<uint8_t> buf(1 << 20);
  auto result = HashChunks(path, cancel, [&]() -> absl::StatusOr<std::span<const uint8_t>> {
    for (;;) {
      const ssize_t n = read(fd, buf.data(), buf.size());
      if (n >= 0) return std::span<const uint8_t>(buf.data(), static_cast<size_t>(n));
      if (errno != EINTR) return ErrnoError(absl::StrCat(path, ": read"));
    }
  });
  close(fd);
  return result;
}

absl::StatusOr<std::pair<uint64_t, uint64_t>> HashMapped(std::span<const uint8_t> bytes, const std::string& name,
                                                         const std::atomic<bool>* cancel) {
  constexpr uint64_t kStep = 1 << 20;
  uint64_t at = 0;
  std::span<const uint8_t> previous;
  return HashChunks(name, cancel, [&]() -> absl::StatusOr<std::span<const uint8_t>> {
    ReleaseMappedRange(previous.data(), previous.size());  // hashed: drop its pages
    previous = bytes.subspan(at, std::min<uint64_t>(kStep, bytes.size() - at));
    at += previous.size();
    return previous;
  });
}

void ReleaseMappedRange(const uint8_t* data, uint64_t size) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t begin = (reinterpret_cast<uint64_t>(data) + page - 1) / page * page;
  const uint64_t end = (reinterpret_cast<uint64_t>(data) + size) / page * page;
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

void PrefetchMappedRange(const uint8_t* data, uint64_t size) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t begin = reinterpret_cast<uint64_t>(data) / page * page;
  const uint64_t end = reinterpret_cast<uint64_t>(data) + size;
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_WILLNEED);
}

namespace {

absl::Status SyncPath(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(absl::StrCat(path, ": open for sync"));
  const int rc = fsync(fd);
  close(fd);
  if (rc != 0) return ErrnoError(absl::StrCat(path, ": fsync"));
  return absl::OkStatus();
}

// Removes the partial directory unless Commit() was called.
class PartialDirGuard {
 public:
  explicit PartialDirGuard(std::string path) : path_(std::move(path)) {}
  ~PartialDirGuard() {
    if (!committed_) {
      std::error_code ec;
      fs::remove_all(path_, ec);
    }
  }
  void Commit() { committed_ = true; }

 private:
  std::string path_;
  bool committed_ = false;
};

using RoleStats = kernels::QuantizeError;

}  // namespace

absl::Status CheckThreads(int64_t threads, std::string_view field) {
  if (threads >= 0 && threads <= kMaxThreads) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(std::string(field), ": ", threads, " is not in 0 .. ", kMaxThreads));
}

absl::Status CheckOutputFree(const std::string& output_dir) {
  std::error_code ec;
  if (fs::exists(fs::symlink_status(output_dir, ec))) {
    return absl::AlreadyExistsError(absl::StrCat(output_dir, ": already exists; choose another output"));
  }
  const std::string partial = output_dir + ".partial";
  if (fs::exists(fs::symlink_status(partial, ec))) {
    return absl::FailedPreconditionError(absl::StrCat(
        partial, ": exists: another job is writing it, or one was interrupted (remove it by hand)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<pack::v1::Manifest> WritePack(const PackWriteJob& job, const ConvertProgressFn& progress,
                                             const std::atomic<bool>* cancel) {
  auto cancelled = [cancel] { return cancel != nullptr && cancel->load(std::memory_order_relaxed); };
  if (static_cast<bool>(job.fill_expert) == static_cast<bool>(job.fill_blob)) {
    return absl::InternalError("pack writer: set exactly one of fill_expert and fill_blob");
  }
  const bool measure_error = static_cast<bool>(job.fill_expert);
  RETURN_IF_ERROR(CheckOutputFree(job.output_dir));
  const std::string partial = job.output_dir + ".partial";
  if (mkdir(partial.c_str(), 0755) != 0) {
    if (errno == EEXIST) {
      return absl::FailedPreconditionError(absl::StrCat(partial, ": exists: another conversion is writing it"));
    }
    return ErrnoError(absl::StrCat(partial, ": mkdir"));
  }
  PartialDirGuard guard(partial);
  const auto start = Clock::now();

  const pack::v1::Geometry& g = job.manifest.geometry();
  const pack::BlobLayout& layout = job.layout;
  const uint64_t n_blobs = static_cast<uint64_t>(g.n_moe_layers()) * g.n_expert();
  const uint64_t total_bytes = n_blobs * layout.blob_bytes;

  ConvertProgress report;
  report.bytes_total = total_bytes;
  report.experts_total = n_blobs;
  auto emit = [&](const std::string& phase) {
    report.phase = phase;
    if (progress) progress(report);
  };

  emit("dense");
  const std::string dense_path = absl::StrCat(partial, "/", pack::kDenseFile);
  std::vector<pack::v1::RoleError> dense_errors;
  RETURN_IF_ERROR(job.write_dense(dense_path, &dense_errors));
  if (cancelled()) return absl::CancelledError("conversion cancelled");
  ASSIGN_OR_RETURN(auto dense_hash, HashFile(dense_path));

  emit("experts");
  const std::string experts_path = absl::StrCat(partial, "/", pack::kExpertsFile);
  const int fd = open(experts_path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(absl::StrCat(experts_path, ": create"));
  if (ftruncate(fd, static_cast<off_t>(total_bytes)) != 0) {
    const absl::Status s = ErrnoError(absl::StrCat(experts_path, ": size to ", total_bytes, " bytes"));
    close(fd);
    return s;
  }

  std::vector<uint64_t> checksums(n_blobs, 0);
  std::atomic<uint64_t> next{0}, done{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::condition_variable finished;
  int running = 0;  // workers not yet through; guarded by mu
  absl::Status first_error;
  RoleStats totals[3];
  const int64_t rows[3] = {layout.expert_ff, layout.expert_ff, layout.n_embd};
  const int64_t cols[3] = {layout.n_embd, layout.n_embd, layout.expert_ff};
  const uint64_t role_elems = static_cast<uint64_t>(layout.n_embd) * layout.expert_ff;

  // Fills `blob` from f32 weights, quantizing them and adding the error to `local` in the same pass.
  auto quantize_expert = [&](int64_t moe_layer, int64_t expert, std::vector<float>* f32, std::vector<uint8_t>& blob,
                             RoleStats* local) -> absl::Status {
    const bool without_values =
        job.transcode_role && job.transcodes_without_values && job.transcodes_without_values(moe_layer, expert);
    absl::Status s = without_values ? absl::OkStatus()
                                    : job.fill_expert(moe_layer, expert, f32[0].data(), f32[1].data(), f32[2].data());
    // A transcoder reads the source bytes too: they are released after it.
    if (job.release_expert && !job.transcode_role) job.release_expert(moe_layer, expert);
    for (int r = 0; s.ok() && r < 3; ++r) {
      uint8_t* dst = blob.data() + layout.role_offset[r];
      if (job.transcode_role) {
        const float* values = without_values ? nullptr : f32[r].data();
        absl::StatusOr<bool> transcoded = job.transcode_role(moe_layer, expert, r, values, dst, &local[r]);
        s = transcoded.status();
        if (s.ok() && without_values && !*transcoded) {
          s = absl::InternalError("pack writer: a role said to need no values was not transcoded");
        }
        if (!s.ok() || *transcoded) continue;
      }
      kernels::QuantizeRole(layout.scheme, f32[r].data(), rows[r], cols[r], dst, &local[r]);
    }
    if (job.release_expert && job.transcode_role) job.release_expert(moe_layer, expert);
    return s;
  };

  const uint64_t n_workers =
      std::min<uint64_t>(ResolveThreads(job.threads), std::max<uint64_t>(n_blobs, 1));
  auto worker = [&] {
    std::vector<float> f32[3];
    if (measure_error) {
      for (auto& v : f32) v.resize(role_elems);
    }
    std::vector<uint8_t> blob(layout.blob_bytes);
    RoleStats local[3];
    for (;;) {
      if (failed.load(std::memory_order_relaxed) || cancelled()) break;
      const uint64_t index = next.fetch_add(1);
      if (index >= n_blobs) break;
      const int64_t moe_layer = static_cast<int64_t>(index / g.n_expert());
      const int64_t expert = static_cast<int64_t>(index % g.n_expert());
      if (job.prefetch_expert && index + n_workers < n_blobs) {
        job.prefetch_expert(static_cast<int64_t>((index + n_workers) / g.n_expert()),
                            static_cast<int64_t>((index + n_workers) % g.n_expert()));
      }
      // QuantizeRole assigns every byte of each role, and the bytes between roles stay as the vector was
      // made (zero): only a filler or a transcoder, which may leave bytes alone, needs a cleared blob.
      if (!measure_error || job.transcode_role) std::memset(blob.data(), 0, blob.size());
      absl::Status s = measure_error ? quantize_expert(moe_layer, expert, f32, blob, local)
                                     : job.fill_blob(moe_layer, expert, std::span<uint8_t>(blob));
      if (s.ok()) {
        checksums[index] = XXH3_64bits(blob.data(), blob.size());
        s = WriteAll(fd, blob.data(), blob.size(), index * layout.blob_bytes, experts_path);
      }
      if (s.ok()) {
        // The disk writes the blob while the workers go on: otherwise the whole file waited for the final
        // fdatasync (0.8 GB of f16 on this VM: 1.0-1.6 s after the last expert). Only starts the
        // write (waiting, at most, while the disk's queue is full); an I/O error surfaces at that fdatasync.
        (void)sync_file_range(fd, static_cast<off_t>(index * layout.blob_bytes), static_cast<off_t>(blob.size()),
                              SYNC_FILE_RANGE_WRITE);
      }
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first_error.ok()) first_error = s;
        failed = true;
        break;
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        for (int r = 0; r < 3; ++r) totals[r].Merge(local[r]);
        local[0] = local[1] = local[2] = RoleStats{};
      }
      done.fetch_add(1);
    }
    // Wake the reporting loop as soon as the last worker is through.
    std::lock_guard<std::mutex> lock(mu);
    if (--running == 0) finished.notify_all();
  };

  const int n_threads = static_cast<int>(n_workers);
  running = n_threads;
  std::vector<std::thread> threads;
  threads.reserve(n_threads);
  for (int t = 0; t < n_threads; ++t) threads.emplace_back(worker);
  const auto experts_start = Clock::now();
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu);
      finished.wait_for(lock, std::chrono::milliseconds(100), [&] { return running == 0; });
      if (running == 0) break;
    }
    const uint64_t d = done.load();
    report.experts_done = d;
    report.bytes_done = d * layout.blob_bytes;
    const double secs = std::chrono::duration<double>(Clock::now() - experts_start).count();
    if (secs > 0 && n_blobs > 0) {
      report.bytes_per_second = static_cast<double>(job.source_expert_bytes) * (static_cast<double>(d) / n_blobs) / secs;
    }
    if (measure_error) {
      std::lock_guard<std::mutex> lock(mu);
      double e = 0, r = 0;
      for (const RoleStats& t : totals) {
        e += t.err2;
        r += t.ref2;
      }
      report.rel_rms_error = r > 0 ? std::sqrt(e / r) : 0.0;
    } else {
      report.rel_rms_error = std::nan("");  // not measured
    }
    if (progress) progress(report);
  }
  for (std::thread& t : threads) t.join();
  if (!first_error.ok()) {
    close(fd);
    return first_error;
  }
  if (cancelled()) {
    close(fd);
    return absl::CancelledError("conversion cancelled");
  }

  report.experts_done = n_blobs;
  report.bytes_done = total_bytes;
  emit("finish");
  const int sync_rc = fdatasync(fd);
  const int close_rc = close(fd);
  if (sync_rc != 0 || close_rc != 0) return ErrnoError(absl::StrCat(experts_path, ": sync"));

  pack::v1::Manifest manifest = job.manifest;
  if (job.complete_manifest) RETURN_IF_ERROR(job.complete_manifest(&manifest));
  manifest.set_format_version(pack::kFormatVersion);
  pack::SetManifestLayout(layout, &manifest);
  manifest.set_experts_bytes(total_bytes);
  manifest.clear_blob_xxh3();
  for (uint64_t c : checksums) manifest.add_blob_xxh3(pack::HashHex(c));
  manifest.set_dense_file(std::string(pack::kDenseFile));
  manifest.set_dense_bytes(dense_hash.first);
  manifest.set_dense_xxh3(pack::HashHex(dense_hash.second));
  manifest.clear_quant_error();
  double e_all = 0, r_all = 0;
  for (int r = 0; measure_error && r < 3; ++r) {
    pack::v1::RoleError* err = manifest.add_quant_error();
    err->set_role(std::string(pack::kRoleNames[r]));
    err->set_rel_rms(totals[r].ref2 > 0 ? std::sqrt(totals[r].err2 / totals[r].ref2) : 0.0);
    err->set_max_abs(totals[r].max_abs);
    e_all += totals[r].err2;
    r_all += totals[r].ref2;
  }
  for (const pack::v1::RoleError& e : dense_errors) *manifest.add_quant_error() = e;
  manifest.set_tool_version(ToolVersion());
  RETURN_IF_ERROR(pack::CheckManifest(manifest));
  RETURN_IF_ERROR(pack::WriteManifest(manifest, partial));
  RETURN_IF_ERROR(SyncPath(absl::StrCat(partial, "/", pack::kManifestFile)));
  RETURN_IF_ERROR(SyncPath(dense_path));
  RETURN_IF_ERROR(SyncPath(partial));
  if (cancelled()) return absl::CancelledError("conversion cancelled");
  if (rename(partial.c_str(), job.output_dir.c_str()) != 0) {
    return ErrnoError(absl::StrCat("rename ", partial, " to ", job.output_dir));
  }
  guard.Commit();
  const std::string parent = fs::path(job.output_dir).parent_path().string();
  (void)SyncPath(parent.empty() ? "." : parent);

  report.rel_rms_error = !measure_error ? std::nan("") : r_all > 0 ? std::sqrt(e_all / r_all) : 0.0;
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  if (secs > 0) report.bytes_per_second = static_cast<double>(job.source_expert_bytes) / secs;
  emit("done");
  return manifest;
}

}  // namespace strata::packtool
