#include "bench/bench_util.h"

#include <emmintrin.h>
#include <xmmintrin.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "engine/log.h"

namespace strata::bench {

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ---- Flags

Flags::Flags(int argc, char** argv, std::string usage) : usage_(std::move(usage)) {
  TurnOffMutexDeadlockDetection();  // as the binaries do, to measure what they run
  for (int i = 0; i < argc; ++i) {
    if (i > 0) command_line_ += ' ';
    command_line_ += argv[i];
  }
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "-h") arg = "--help";
    if (arg.substr(0, 2) != "--" || arg.size() == 2) Fail("unexpected argument '" + std::string(arg) + "'");
    arg.remove_prefix(2);
    const size_t eq = arg.find('=');
    if (eq != std::string_view::npos) {
      values_[std::string(arg.substr(0, eq))] = std::string(arg.substr(eq + 1));
    } else if (i + 1 < argc && std::string_view(argv[i + 1]).substr(0, 2) != "--") {
      values_[std::string(arg)] = argv[++i];
    } else {
      values_[std::string(arg)] = "true";
    }
  }
}

void Flags::Fail(const std::string& message) const {
  std::fprintf(stderr, "error: %s\n%s\n", message.c_str(), usage_.c_str());
  std::exit(2);
}

const std::string* Flags::Find(std::string_view name, std::string shown_default) {
  if (!known_[std::string(name)]) defaults_.emplace_back(std::string(name), std::move(shown_default));
  known_[std::string(name)] = true;
  const auto it = values_.find(name);
  return it == values_.end() ? nullptr : &it->second;
}

std::string Flags::String(std::string_view name, std::string_view def) {
  const std::string* v = Find(name, def.empty() ? "none" : std::string(def));
  return v == nullptr ? std::string(def) : *v;
}

int64_t Flags::Int(std::string_view name, int64_t def) {
  const std::string* v = Find(name, std::to_string(def));
  if (v == nullptr) return def;
  char* end = nullptr;
  const long long x = std::strtoll(v->c_str(), &end, 10);
  if (v->empty() || *end != '\0') Fail("--" + std::string(name) + "=" + *v + " is not an integer");
  return x;
}

double Flags::Double(std::string_view name, double def) {
  char shown[32];
  std::snprintf(shown, sizeof(shown), "%g", def);
  const std::string* v = Find(name, shown);
  if (v == nullptr) return def;
  char* end = nullptr;
  const double x = std::strtod(v->c_str(), &end);
  if (v->empty() || *end != '\0') Fail("--" + std::string(name) + "=" + *v + " is not a number");
  return x;
}

bool Flags::Bool(std::string_view name, bool def) {
  const std::string* v = Find(name, def ? "true" : "false");
  if (v == nullptr) return def;
  if (*v == "true" || *v == "1") return true;
  if (*v == "false" || *v == "0") return false;
  Fail("--" + std::string(name) + "=" + *v + " is not true or false");
}

std::vector<std::string> Flags::StringList(std::string_view name, const std::vector<std::string>& def) {
  std::string shown;
  for (const std::string& item : def) shown += (shown.empty() ? "" : ",") + item;
  const std::string* v = Find(name, shown.empty() ? "none" : shown);
  if (v == nullptr) return def;
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= v->size()) {
    const size_t comma = std::min(v->find(',', start), v->size());
    if (comma == start) Fail("--" + std::string(name) + "=" + *v + " has an empty item");
    out.push_back(v->substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

std::vector<int64_t> Flags::IntList(std::string_view name, const std::vector<int64_t>& def) {
  std::string shown;
  for (const int64_t item : def) shown += (shown.empty() ? "" : ",") + std::to_string(item);
  if (shown.empty()) shown = "none";
  if (values_.find(name) == values_.end()) {
    Find(name, shown);
    return def;
  }
  Find(name, shown);
  std::vector<int64_t> out;
  for (const std::string& item : StringList(name, {})) {
    char* end = nullptr;
    const long long x = std::strtoll(item.c_str(), &end, 10);
    if (*end != '\0') Fail("--" + std::string(name) + " item '" + item + "' is not an integer");
    out.push_back(x);
  }
  return out;
}

void Flags::CheckNoUnknown() const {
  if (values_.count("help") != 0) {
    std::printf("%s\n\nflags (each also as --name value):\n", usage_.c_str());
    for (const auto& [name, shown] : defaults_) std::printf("  --%s  (default: %s)\n", name.c_str(), shown.c_str());
    std::printf("\nexit codes: 0 ok, 1 failure, 2 usage error\n");
    std::exit(0);
  }
  for (const auto& [name, value] : values_) {
    if (known_.count(name) == 0) Fail("unknown flag --" + name);
  }
}

// ---- Memory

void MappedDeleter::operator()(uint8_t* p) const {
  if (p != nullptr) munmap(p, bytes);
}

MappedBuffer AllocateTouched(size_t bytes, int threads) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::fprintf(stderr, "error: cannot map %zu bytes: %s\n", bytes, std::strerror(errno));
    std::exit(1);
  }
  madvise(p, bytes, MADV_HUGEPAGE);
  uint8_t* base = static_cast<uint8_t*>(p);
  threads = std::max(1, threads);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([=] {
      const size_t begin = bytes / threads * t, end = t + 1 == threads ? bytes : bytes / threads * (t + 1);
      std::memset(base + begin, 0x5A, end - begin);
    });
  }
  for (std::thread& w : workers) w.join();
  return MappedBuffer(base, MappedDeleter{bytes});
}

uint64_t LastLevelCacheBytes() {
  const long sc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (sc > 0) return static_cast<uint64_t>(sc);
  uint64_t best = 0;
  for (int index = 0; index < 8; ++index) {
    std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size");
    std::string text;
    if (!(f >> text) || text.empty()) continue;
    uint64_t v = std::strtoull(text.c_str(), nullptr, 10);
    if (text.back() == 'K') v <<= 10;
    if (text.back() == 'M') v <<= 20;
    best = std::max(best, v);
  }
  return best > 0 ? best : uint64_t{32} << 20;
}

uint64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

double LoadAverage() {
  std::ifstream f("/proc/loadavg");
  double load = -1.0;
  if (!(f >> load)) return -1.0;
  return load;
}

// ---- DRAM probe

namespace {

// Reads [p, p + bytes) with 16-byte loads into four accumulators; returns a value that depends on all.
// Lines are also prefetched 4 KiB ahead: on many-core hosts the hardware prefetchers alone leave a core
// short of misses in flight (9 vs 13 GB/s a core measured on a 16-core EPYC), and the kernels prefetch too.
uint64_t ReadAll(const uint8_t* p, size_t bytes) {
  __m128i a0 = _mm_setzero_si128(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t off = 0; off + 64 <= bytes; off += 64) {
    // Integer arithmetic: the address may lie past the buffer, which a prefetch tolerates.
    _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) + off + 4096), _MM_HINT_T0);
    const __m128i* v = reinterpret_cast<const __m128i*>(p + off);
    a0 = _mm_add_epi64(a0, _mm_load_si128(v));
    a1 = _mm_add_epi64(a1, _mm_load_si128(v + 1));
    a2 = _mm_add_epi64(a2, _mm_load_si128(v + 2));
    a3 = _mm_add_epi64(a3, _mm_load_si128(v + 3));
  }
  const __m128i s = _mm_add_epi64(_mm_add_epi64(a0, a1), _mm_add_epi64(a2, a3));
  return static_cast<uint64_t>(_mm_cvtsi128_si64(s)) ^ static_cast<uint64_t>(_mm_extract_epi16(s, 7));
}

}  // namespace

DramProbe::DramProbe(int64_t cap_mb, int threads) {
  const uint64_t llc = LastLevelCacheBytes();
  const uint64_t want = 64 * llc;
  uint64_t cap = PhysicalMemoryBytes() / 4;
  if (cap_mb > 0) cap = cap == 0 ? uint64_t(cap_mb) << 20 : std::min(cap, uint64_t(cap_mb) << 20);
  if (cap == 0) cap = want;
  bytes_ = std::min(want, cap) / 4096 * 4096;
  if (bytes_ < want) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "probe buffer %.0f MiB is capped below 64 x LLC (%.0f MiB reported)",
                  bytes_ / 1048576.0, llc / 1048576.0);
    note_ = buf;
  }
  buffer_ = AllocateTouched(bytes_, threads);
}

double DramProbe::ReadGBps(int threads, double min_seconds) {
  threads = std::max(1, threads);
  std::atomic<uint64_t> sink{0};
  double best = 0.0;
  const Timer total;
  int passes = 0;
  while (passes < 2 || total.Seconds() < min_seconds) {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        const size_t slice = bytes_ / threads / 64 * 64;
        ready.fetch_add(1);
        while (!go.load(std::memory_order_acquire)) _mm_pause();
        sink.fetch_xor(ReadAll(buffer_.get() + slice * t, slice), std::memory_order_relaxed);
      });
    }
    while (ready.load() != threads) _mm_pause();
    const Timer pass;
    go.store(true, std::memory_order_release);
    for (std::thread& w : workers) w.join();
    const double s = pass.Seconds();
    best = std::max(best, static_cast<double>(bytes_ / threads / 64 * 64 * threads) / s / 1e9);
    ++passes;
  }
  if (sink.load() == 0x1234567) std::fputs("", stderr);  // keeps the reads observable
  return best;
}

void PrintResult(std::string_view name, double value, std::string_view unit, double bound,
                 std::string_view bound_name) {
  std::printf("%-44.*s %9.2f %-5.*s | %.*s %8.2f %.*s | %.3f of bound\n", static_cast<int>(name.size()),
              name.data(), value, static_cast<int>(unit.size()), unit.data(),
              static_cast<int>(bound_name.size()), bound_name.data(), bound, static_cast<int>(unit.size()),
              unit.data(), bound > 0 ? value / bound : 0.0);
  std::fflush(stdout);
}

// ---- Thread usage

std::map<int, ThreadUsage> SnapshotThreads() {
  std::map<int, ThreadUsage> threads;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    const std::string dir = entry.path().string();
    int tid = 0;
    try {
      tid = std::stoi(entry.path().filename().string());
    } catch (...) {
      continue;
    }
    ThreadUsage u;
    std::ifstream comm(dir + "/comm");
    std::getline(comm, u.name);
    // schedstat: nanoseconds on a CPU, nanoseconds runnable on a run queue, time slices.
    std::ifstream schedstat(dir + "/schedstat");
    uint64_t run_ns = 0, wait_ns = 0;
    if (!(schedstat >> run_ns >> wait_ns)) continue;  // the thread exited meanwhile
    u.cpu_seconds = static_cast<double>(run_ns) * 1e-9;
    u.wait_seconds = static_cast<double>(wait_ns) * 1e-9;
    std::ifstream status(dir + "/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("nonvoluntary_ctxt_switches:", 0) == 0) {
        std::istringstream(line.substr(line.find(':') + 1)) >> u.preempted;
      }
    }
    threads[tid] = std::move(u);
  }
  return threads;
}

std::map<std::string, ThreadUsage> UsageByName(const std::map<int, ThreadUsage>& before,
                                               const std::map<int, ThreadUsage>& after) {
  std::map<std::string, ThreadUsage> by_name;
  for (const auto& [tid, now] : after) {
    ThreadUsage then;
    if (auto it = before.find(tid); it != before.end() && it->second.name == now.name) then = it->second;
    ThreadUsage& sum = by_name[now.name];
    sum.name = now.name;
    sum += now;
    sum -= then;
  }
  return by_name;
}

}  // namespace strata::bench
