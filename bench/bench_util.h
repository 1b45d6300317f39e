#ifndef STRATA_BENCH_BENCH_UTIL_H_
#define STRATA_BENCH_BENCH_UTIL_H_

// Helpers shared by the benchmarks: flags, timers, memory, the DRAM read-bandwidth probe every result is
// printed beside, and the result line format. Single-threaded use except where noted.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace strata::bench {

// Seconds on a monotonic clock.
double NowSeconds();

class Timer {
 public:
  Timer() : start_(NowSeconds()) {}
  void Reset() { start_ = NowSeconds(); }
  double Seconds() const { return NowSeconds() - start_; }

 private:
  double start_;
};

// Flags of the form --name=value or --name value (and --name alone for booleans). A getter marks its
// flag known and records its default; CheckNoUnknown() then answers --help (or -h) with the usage, every
// flag a getter asked for with its default, and the exit codes, on stdout, exit 0; and exits with a usage
// error (2) naming any flag that no getter asked for. Malformed values exit 2 with an error naming the flag.
// So that --help lists every flag, call every getter before CheckNoUnknown().
class Flags {
 public:
  Flags(int argc, char** argv, std::string usage);

  std::string String(std::string_view name, std::string_view def);
  int64_t Int(std::string_view name, int64_t def);
  double Double(std::string_view name, double def);
  bool Bool(std::string_view name, bool def);
  // Comma-separated integers, e.g. --threads-list=1,2,4.
  std::vector<int64_t> IntList(std::string_view name, const std::vector<int64_t>& def);
  // Comma-separated strings.
  std::vector<std::string> StringList(std::string_view name, const std::vector<std::string>& def);

  // Prints the help and exits 0 for --help / -h; exits 2 when a flag was never asked for.
  void CheckNoUnknown() const;

  // The command line as given, for reports.
  const std::string& command_line() const { return command_line_; }

 private:
  [[noreturn]] void Fail(const std::string& message) const;
  const std::string* Find(std::string_view name, std::string shown_default);

  std::string usage_;
  std::string command_line_;
  std::map<std::string, std::string, std::less<>> values_;
  std::map<std::string, bool, std::less<>> known_;
  std::vector<std::pair<std::string, std::string>> defaults_;  // name, default as shown; in asking order
};

// Page-aligned anonymous memory, backed by transparent huge pages where the kernel allows, with every
// page written (so reads hit DRAM, not the shared zero page). The writes are spread over `threads`.
struct MappedDeleter {
  size_t bytes = 0;
  void operator()(uint8_t* p) const;
};
using MappedBuffer = std::unique_ptr<uint8_t[], MappedDeleter>;
MappedBuffer AllocateTouched(size_t bytes, int threads);

// Size of the last-level cache: sysconf(_SC_LEVEL3_CACHE_SIZE), else /sys/devices/system/cpu/cpu0/cache,
// else 32 MiB.
uint64_t LastLevelCacheBytes();
// Physical memory, or 0 if unknown.
uint64_t PhysicalMemoryBytes();
// The 1-minute load average from /proc/loadavg, or -1; printed with results so that runs on a busy
// machine can be told apart.
double LoadAverage();

// Measures DRAM read bandwidth: `threads` threads each read a slice of one buffer; the result is the best
// pass over the whole buffer (bytes / wall time).
class DramProbe {
 public:
  // The buffer is 64x the last-level cache, capped at cap_mb MiB when cap_mb > 0 and in any case at a
  // quarter of physical memory; note() says when the cap made it smaller than 64x.
  DramProbe(int64_t cap_mb, int threads);
  double ReadGBps(int threads, double min_seconds = 0.4);
  uint64_t buffer_bytes() const { return bytes_; }
  const std::string& note() const { return note_; }

 private:
  uint64_t bytes_ = 0;
  std::string note_;
  MappedBuffer buffer_;
};

// CPU use of this process's threads, from /proc/self/task (Linux; zeros elsewhere): on-CPU time, time
// spent runnable but waiting for a core, and involuntary context switches (preemptions).
struct ThreadUsage {
  std::string name;
  double cpu_seconds = 0;
  double wait_seconds = 0;
  int64_t preempted = 0;

  ThreadUsage& operator+=(const ThreadUsage& o) {
    cpu_seconds += o.cpu_seconds;
    wait_seconds += o.wait_seconds;
    preempted += o.preempted;
    return *this;
  }
  ThreadUsage& operator-=(const ThreadUsage& o) {
    cpu_seconds -= o.cpu_seconds;
    wait_seconds -= o.wait_seconds;
    preempted -= o.preempted;
    return *this;
  }
};
// The live threads by thread id.
std::map<int, ThreadUsage> SnapshotThreads();
// What each thread name used between two snapshots (threads that exited in between are not counted),
// summed over the threads of that name.
std::map<std::string, ThreadUsage> UsageByName(const std::map<int, ThreadUsage>& before,
                                               const std::map<int, ThreadUsage>& after);

// Prints "<name>  <value> <unit>  | <bound_name> <bound> <unit>  | <value/bound> of bound" on one line.
void PrintResult(std::string_view name, double value, std::string_view unit, double bound,
                 std::string_view bound_name);

}  // namespace strata::bench

#endif  // STRATA_BENCH_BENCH_UTIL_H_
