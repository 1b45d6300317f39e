#include "engine/pack/expert_source.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/log.h"
#include "engine/status_macros.h"
#include "engine/exec/thread_pool.h"

namespace strata::pack {
namespace {

absl::Status CheckIndex(const Pack& pack, int64_t moe_layer, int64_t expert) {
  const v1::Geometry& g = pack.manifest().geometry();
  if (moe_layer < 0 || moe_layer >= g.n_moe_layers() || expert < 0 || expert >= g.n_expert()) {
    return absl::OutOfRangeError(absl::StrCat("expert blob (moe layer ", moe_layer, ", expert ", expert,
                                              ") is not in the pack (", g.n_moe_layers(), " moe layers x ",
                                              g.n_expert(), " experts)"));
  }
  return absl::OkStatus();
}

// experts.bin read into anonymous memory; every blob resident for the source's lifetime.
class ArenaExpertSource : public ExpertSource {
 public:
  // `pinner`: what page-locked the arena (null when it is not locked).
  ArenaExpertSource(const Pack& pack, uint8_t* data, size_t bytes, HostPinner* pinner)
      : pack_(pack), data_(data), bytes_(bytes), pinner_(pinner) {}
  ~ArenaExpertSource() override {
    if (pinner_ != nullptr) pinner_->Unpin(data_);
    munmap(data_, bytes_);
  }
  absl::StatusOr<const uint8_t*> Blob(int64_t moe_layer, int64_t expert) override {
    RETURN_IF_ERROR(CheckIndex(pack_, moe_layer, expert));
    return data_ + BlobIndex(pack_.manifest(), moe_layer, expert) * pack_.manifest().blob_bytes();
  }
  std::string_view kind() const override { return "arena"; }
  bool pinned() const override { return pinner_ != nullptr; }
  uint64_t blob_bytes() const override { return pack_.manifest().blob_bytes(); }

 private:
  const Pack& pack_;
  uint8_t* data_;
  size_t bytes_;
  HostPinner* pinner_;
};

// experts.bin mapped read-only; with verification each blob's checksum is checked on first use.
class MmapExpertSource : public ExpertSource {
 public:
  MmapExpertSource(const Pack& pack, const uint8_t* data, size_t bytes, bool verify)
      : pack_(pack), data_(data), bytes_(bytes), verify_(verify), state_(verify ? pack.n_blobs() : 0) {}
  ~MmapExpertSource() override { munmap(const_cast<uint8_t*>(data_), bytes_); }
  absl::StatusOr<const uint8_t*> Blob(int64_t moe_layer, int64_t expert) override {
    RETURN_IF_ERROR(CheckIndex(pack_, moe_layer, expert));
    const uint64_t index = BlobIndex(pack_.manifest(), moe_layer, expert);
    const uint64_t blob_bytes = pack_.manifest().blob_bytes();
    const uint8_t* blob = data_ + index * blob_bytes;
    if (verify_) {
      // 0 unchecked, 1 good, 2 bad; racing checkers compute the same answer.
      uint8_t s = state_[index].load(std::memory_order_acquire);
      if (s == 0) {
        s = pack_.CheckBlob(index, blob).ok() ? 1 : 2;
        state_[index].store(s, std::memory_order_release);
      }
      if (s == 2) return pack_.CheckBlob(index, blob);
    }
    return blob;
  }
  std::string_view kind() const override { return "mmap"; }
  uint64_t blob_bytes() const override { return pack_.manifest().blob_bytes(); }

 private:
  const Pack& pack_;
  const uint8_t* data_;
  size_t bytes_;
  bool verify_;
  std::vector<std::atomic<uint8_t>> state_;
};

// Reads experts.bin into `dst` with `threads` readers of 64 MiB chunks; with verify, checks each blob.
absl::Status LoadArena(const Pack& pack, uint8_t* dst, bool verify, int threads,
                       const std::function<void(uint64_t, uint64_t)>& on_progress) {
  const std::string path = pack.experts_path();
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat(path, ": ", std::strerror(errno)));
  const uint64_t total = pack.manifest().experts_bytes();
  const uint64_t chunk = uint64_t{64} << 20;
  const uint64_t n_chunks = (total + chunk - 1) / chunk;
  std::atomic<uint64_t> next{0};
  std::atomic<bool> failed{false};
  std::string error;
  std::mutex mu;
  uint64_t loaded = 0;  // guarded by mu
  auto reader = [&] {
    for (;;) {
      const uint64_t c = next.fetch_add(1);
      if (c >= n_chunks || failed.load()) return;
      uint64_t off = c * chunk;
      const uint64_t end = std::min(total, off + chunk);
      while (off < end) {
        const ssize_t n = pread(fd, dst + off, end - off, static_cast<off_t>(off));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          std::lock_guard<std::mutex> lock(mu);
          error = absl::StrCat(path, ": short read at offset ", off, " of ", total, " bytes: ",
                               n < 0 ? std::strerror(errno) : "unexpected end of file");
          failed = true;
          return;
        }
        off += static_cast<uint64_t>(n);
      }
      if (on_progress) {
        std::lock_guard<std::mutex> lock(mu);
        loaded += end - c * chunk;
        on_progress(loaded, total);
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(reader);
  for (std::thread& t : pool) t.join();
  close(fd);
  if (failed) return absl::DataLossError(error);
  if (!verify) return absl::OkStatus();
  std::atomic<uint64_t> next_blob{0};
  std::atomic<int64_t> bad{-1};
  const uint64_t blob_bytes = pack.manifest().blob_bytes();
  auto verifier = [&] {
    for (;;) {
      const uint64_t i = next_blob.fetch_add(1);
      if (i >= pack.n_blobs() || bad.load() >= 0) return;
      if (XXH3_64bits(dst + i * blob_bytes, blob_bytes) != pack.blob_hash(i)) bad = static_cast<int64_t>(i);
    }
  };
  pool.clear();
  for (int t = 0; t < threads; ++t) pool.emplace_back(verifier);
  for (std::thread& t : pool) t.join();
  if (bad >= 0) {
    const uint64_t i = static_cast<uint64_t>(bad.load());
    return pack.CheckBlob(i, dst + i * blob_bytes);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ExpertSource>> OpenExpertSource(const Pack& pack, const ExpertSourceOptions& options,
                                                               ExpertSourceStats* stats) {
  ExpertSourceStats local;
  if (stats == nullptr) stats = &local;
  const size_t bytes = pack.manifest().experts_bytes();
  stats->bytes = bytes;
  const auto start = std::chrono::steady_clock::now();
  if (options.kind == "mmap") {
    const std::string path = pack.experts_path();
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return absl::NotFoundError(absl::StrCat(path, ": ", std::strerror(errno)));
    // Pack::Open checked the size by path; this is the file being mapped, and reading past its end would
    // be a SIGBUS, so check again.
    struct stat st;
    if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != bytes) {
      close(fd);
      return absl::DataLossError(absl::StrCat(path, ": size changed since the pack was opened (expected ", bytes,
                                              " bytes)"));
    }
    void* map = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return absl::UnavailableError(absl::StrCat(path, ": mmap: ", std::strerror(errno)));
    return std::unique_ptr<ExpertSource>(
        new MmapExpertSource(pack, static_cast<const uint8_t*>(map), bytes, options.verify));
  }
  if (options.kind != "arena") {
    return absl::InvalidArgumentError(
        absl::StrCat("expert source '", options.kind, "' is unknown (expected arena or mmap)"));
  }
  void* map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (map == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot reserve ", bytes, " bytes of memory for the expert arena: ", std::strerror(errno)));
  }
  stats->huge_pages = madvise(map, bytes, MADV_HUGEPAGE) == 0;
  uint8_t* data = static_cast<uint8_t*>(map);
  if (absl::Status s = LoadArena(pack, data, options.verify, exec::ResolveThreads(options.threads),
                                   options.on_load_progress);
      !s.ok()) {
    munmap(map, bytes);
    return s;
  }
  stats->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stats->gb_per_second = stats->seconds > 0 ? static_cast<double>(bytes) / stats->seconds / 1e9 : 0.0;
  if (options.pinner == nullptr) {
    stats->pin_note = "not asked for (the experts are computed on the CPU)";
  } else if (absl::Status s = options.pinner->Pin(data, bytes); s.ok()) {
    stats->pinned = true;
  } else {
    stats->pin_note = std::string(s.message());
  }
  return std::unique_ptr<ExpertSource>(
      new ArenaExpertSource(pack, data, bytes, stats->pinned ? options.pinner : nullptr));
}

}  // namespace strata::pack
