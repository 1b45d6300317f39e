// strata-pack-bench: conversion and validation throughput on the `small` preset, beside the rate at which
// this machine reads the same GGUF file (through the page cache and with O_DIRECT), measured in one run.
//
//   strata-pack-bench [--dir DIR] [--model FILE.gguf] [--scheme s4] [--threads N] [--keep]
//
// --model converts that GGUF instead of the `small` preset synthesized into DIR. The load average is printed
// before and after: the machine's cores may be shared. Beside the rates: the CPU path the fits ran on,
// convert's CPU seconds (every thread) and the fit alone on one core, in ns a weight.

#include <fcntl.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "kernels/cpu/role_gemv.h"
#include "packtool/convert.h"
#include "packtool/pack_writer.h"
#include "packtool/synth.h"
#include "packtool/validate.h"

namespace {

namespace fs = std::filesystem;
using strata::packtool::ResolveThreads;

// User plus system CPU seconds of this process so far (every thread).
double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Reads the whole file once and returns GB/s; with O_DIRECT the page cache is bypassed.
double ReadRate(const std::string& path, bool direct) {
  const int fd = open(path.c_str(), O_RDONLY | (direct ? O_DIRECT : 0));
  if (fd < 0) return 0;
  const size_t chunk = 8 << 20;
  void* buf = nullptr;
  if (posix_memalign(&buf, 4096, chunk) != 0) return 0;
  uint64_t total = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    const ssize_t n = read(fd, buf, chunk);
    if (n <= 0) break;
    total += static_cast<uint64_t>(n);
  }
  const double s = Seconds(t0);
  close(fd);
  free(buf);
  return s > 0 ? static_cast<double>(total) / s / 1e9 : 0;
}

// Nanoseconds of this thread's CPU a weight that QuantizeRole takes on the best path, on a gate-shaped role
// (512 x 1024) of seeded gaussian weights: the fit alone, without reading or writing; the least of 5 runs.
double FitNsPerWeight(strata::kernels::Scheme scheme) {
  const int64_t rows = 512, cols = 1024;
  std::vector<float> w(rows * cols);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (float& v : w) v = normal(rng);
  std::vector<uint8_t> role(strata::kernels::RoleBytes(scheme, rows, cols));
  double best = 1e30;
  for (int run = 0; run < 5; ++run) {
    timespec t0{}, t1{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    strata::kernels::QuantizeRole(scheme, w.data(), rows, cols, role.data());
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    best = std::min(best, 1e9 * static_cast<double>(t1.tv_sec - t0.tv_sec) + static_cast<double>(t1.tv_nsec - t0.tv_nsec));
  }
  return best / static_cast<double>(rows * cols);
}

void PrintLoad(const char* when) {
  double load[3] = {0, 0, 0};
  if (getloadavg(load, 3) == 3) std::printf("load average %s: %.2f %.2f %.2f\n", when, load[0], load[1], load[2]);
}

}  // namespace

int main(int argc, char** argv) {
  strata::bench::Flags flags(argc, argv,
                            "usage: strata-pack-bench [--dir DIR] [--model FILE.gguf] [--scheme s4] [--threads N] "
                            "[--keep]");
  const std::string dir = flags.String("dir", "/tmp/strata-pack-bench");
  const std::string model_arg = flags.String("model", "");
  const std::string scheme_name = flags.String("scheme", "s4");
  int threads = static_cast<int>(flags.Int("threads", 0));
  const bool keep = flags.Bool("keep", false);
  flags.CheckNoUnknown();
  auto scheme = strata::kernels::ParseScheme(scheme_name);
  if (!scheme.ok()) {
    std::fprintf(stderr, "strata-pack-bench: %s\n", std::string(scheme.status().message()).c_str());
    return 2;
  }
  threads = ResolveThreads(threads);
  fs::create_directories(dir);
  const std::string model = model_arg.empty() ? dir + "/small.gguf" : model_arg;
  const std::string pack = dir + "/" + fs::path(model).stem().string() + "-" + scheme_name;
  fs::remove_all(pack);
  if (!fs::exists(model) && model_arg.empty()) {
    strata::packtool::SynthOptions o;
    o.geometry = *strata::packtool::PresetGeometry("qwen3moe", "small");
    o.output = model;
    o.threads = threads;
    const auto t0 = std::chrono::steady_clock::now();
    if (absl::Status s = strata::packtool::SynthesizeGguf(o); !s.ok()) {
      std::fprintf(stderr, "synth: %s\n", std::string(s.message()).c_str());
      return 1;
    }
    std::printf("synthesized %s (%.2f GB) in %.1f s\n", model.c_str(), fs::file_size(model) / 1e9, Seconds(t0));
  }
  std::error_code size_error;
  const double model_gb = static_cast<double>(fs::file_size(model, size_error)) / 1e9;
  if (size_error) {
    std::fprintf(stderr, "strata-pack-bench: --model %s: %s\n", model.c_str(), size_error.message().c_str());
    return 2;
  }
  PrintLoad("before");
  const double cached = ReadRate(model, false);
  const double direct = ReadRate(model, true);
  std::printf("model %.2f GB, %d threads, scheme %s, CPU path %s\n", model_gb, threads, scheme_name.c_str(),
              std::string(strata::kernels::CpuPathName(strata::kernels::BestCpuPath())).c_str());
  std::printf("  read, page cache        %7.2f GB/s\n", cached);
  std::printf("  read, O_DIRECT (disk)   %7.2f GB/s\n", direct);

  strata::packtool::ConvertOptions c;
  c.input = model;
  c.output_dir = pack;
  c.scheme = *scheme;
  c.threads = threads;
  auto t0 = std::chrono::steady_clock::now();
  const double cpu0 = CpuSeconds();
  auto manifest = strata::packtool::ConvertGguf(c, nullptr, nullptr);
  const double convert_s = Seconds(t0), convert_cpu_s = CpuSeconds() - cpu0;
  if (!manifest.ok()) {
    std::fprintf(stderr, "convert: %s\n", std::string(manifest.status().message()).c_str());
    return 1;
  }
  std::printf("  convert                 %7.2f GB/s of source (%.1f s, %.1f s of CPU)  = %.2fx the cached read rate, "
              "%.2fx the disk's\n",
              model_gb / convert_s, convert_s, convert_cpu_s, model_gb / convert_s / cached, model_gb / convert_s / direct);
  for (const auto& e : manifest->quant_error()) {
    std::printf("    error %-6s rel_rms %.6e  max_abs %.6e\n", e.role().c_str(), e.rel_rms(), e.max_abs());
  }

  t0 = std::chrono::steady_clock::now();
  auto report = strata::packtool::ValidatePack(pack, {false, threads});
  const double validate_s = Seconds(t0);
  if (!report.ok() || !report->ok()) {
    std::fprintf(stderr, "validate failed\n");
    return 1;
  }
  const double pack_gb = static_cast<double>(report->bytes_checked) / 1e9;
  std::printf("  validate (checksums)    %7.2f GB/s of experts.bin (%.2f GB in %.2f s) = %.2fx the cached read rate\n",
              report->gb_per_second, pack_gb, validate_s, report->gb_per_second / cached);
  const double pack_cached = ReadRate(pack + "/experts.bin", false);
  std::printf("  read experts.bin, cache %7.2f GB/s\n", pack_cached);
  std::printf("  fit alone               %7.2f ns of one core's CPU a weight\n", FitNsPerWeight(*scheme));
  PrintLoad("after");
  if (!keep) fs::remove_all(pack);
  return 0;
}
