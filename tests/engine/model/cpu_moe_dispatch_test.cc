#include "engine/model/cpu_moe_dispatch.h"

#include <cmath>
#include <cstring>
#include <string>
#include <memory>
#include <random>
#include <vector>

#include "engine/exec/thread_pool.h"
#include "gtest/gtest.h"
#include "kernels/cpu/quantize.h"

namespace strata::model {
namespace {

using kernels::ExpertJob;
using kernels::ExpertLayout;
using kernels::QuantizedActivation;
using kernels::Scheme;

// Blobs of random Gaussian weights quantized to `scheme`, one per expert.
std::vector<std::vector<uint8_t>> RandomExperts(const ExpertLayout& l, int n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 0.05f);
  std::vector<std::vector<uint8_t>> blobs(n);
  for (std::vector<uint8_t>& blob : blobs) {
    blob.assign(l.blob_bytes, 0);
    for (int role = 0; role < 3; ++role) {
      const bool down = role == kernels::kDown;
      const int64_t rows = down ? l.n_embd : l.expert_ff, cols = down ? l.expert_ff : l.n_embd;
      std::vector<float> w(static_cast<size_t>(rows * cols));
      for (float& v : w) v = dist(rng);
      kernels::QuantizeRole(l.scheme, w.data(), rows, cols, blob.data() + l.role_offset[role]);
    }
  }
  return blobs;
}

// The pipelined schedule (down rows of a job start once that job's gate/up rows are done, while other
// jobs' gate/up rows still run) must give the bits of the two-phase one, on any pool size, call after call.
TEST(RunExpertJobsTest, PipelinedPhasesGiveTheBitsOfTheBarrier) {
  std::mt19937 rng(5);
  for (Scheme scheme : {Scheme::kS2, Scheme::kS8, Scheme::kF16}) {
    const ExpertLayout l = *kernels::ComputeExpertLayout(scheme, 512, 192);
    const int n_jobs = 9;
    const std::vector<std::vector<uint8_t>> blobs = RandomExperts(l, n_jobs, rng);
    std::vector<QuantizedActivation> acts(4);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (QuantizedActivation& a : acts) {
      std::vector<float> x(static_cast<size_t>(l.n_embd));
      for (float& v : x) v = dist(rng);
      kernels::QuantizeActivation(x.data(), l.n_embd, &a);
    }
    const std::vector<const QuantizedActivation*> xs = {&acts[0], &acts[1], &acts[2], &acts[3]};
    auto run = [&](exec::ThreadPool* pool, ExpertPhases phases) {
      std::vector<std::vector<float>> out(static_cast<size_t>(n_jobs) * 4, std::vector<float>(l.n_embd, NAN));
      std::vector<std::vector<float*>> outs(n_jobs);
      std::vector<ExpertJob> jobs;
      for (int j = 0; j < n_jobs; ++j) {
        const int tokens = 1 + j % 4;
        for (int t = 0; t < tokens; ++t) outs[j].push_back(out[static_cast<size_t>(j) * 4 + t].data());
        jobs.push_back(ExpertJob{blobs[j].data(), xs.data(), tokens, outs[j].data()});
      }
      kernels::ExpertWork work;
      RunExpertJobs(l, jobs, pool, &work, kernels::ExpertActivation::kSwiGlu, phases);
      return out;
    };
    const std::vector<std::vector<float>> want = run(nullptr, ExpertPhases::kBarrier);
    for (int j = 0; j < n_jobs; ++j) {
      for (int t = 0; t < 4; ++t) {
        const std::vector<float>& row = want[static_cast<size_t>(j) * 4 + t];
        // Rows of tokens a job does not have stay unwritten; the others are computed and finite.
        EXPECT_EQ(std::isnan(row[0]), t >= 1 + j % 4) << "job " << j << " token " << t;
        if (t < 1 + j % 4) {
          for (float v : row) ASSERT_TRUE(std::isfinite(v));
        }
      }
    }
    // Bitwise, NaN rows included.
    auto expect_same = [&](const std::vector<std::vector<float>>& got, const std::string& what) {
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(0, std::memcmp(got[i].data(), want[i].data(), want[i].size() * sizeof(float)))
            << kernels::SchemeName(scheme) << " " << what << " row " << i;
      }
    };
    expect_same(run(nullptr, ExpertPhases::kPipelined), "no pool");
    for (int threads : {2, 3, 5}) {
      std::unique_ptr<exec::ThreadPool> pool = *exec::ThreadPool::Create(threads);
      for (int repeat = 0; repeat < 20; ++repeat) {
        expect_same(run(pool.get(), ExpertPhases::kPipelined),
                    "threads " + std::to_string(threads) + " repeat " + std::to_string(repeat));
      }
      expect_same(run(pool.get(), ExpertPhases::kBarrier), "barrier threads " + std::to_string(threads));
    }
  }
}

}  // namespace
}  // namespace strata::model
