#include "kernels/cuda/offload_kernels.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/device_buffer.h"

namespace strata::kernels::cuda {
namespace {

void Check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) throw std::runtime_error(what + ": " + cudaGetErrorString(e));
}

template <typename T>
T Unwrap(absl::StatusOr<T> v) {
  if (!v.ok()) throw std::runtime_error(std::string(v.status().message()));
  return *std::move(v);
}

// A layer of n_expert blobs: the first `resident` in VRAM, the others in page-locked host memory (the
// arena, which the device reads in place), each blob filled with bytes of its own.
class Layer {
 public:
  Layer(int n_expert, int resident, uint64_t blob_bytes) : n_expert_(n_expert), blob_bytes_(blob_bytes) {
    arena_ = Unwrap(PinnedBuffer::Allocate(n_expert * blob_bytes));
    vram_ = Unwrap(DeviceBuffer::Allocate(n_expert * blob_bytes));
    std::mt19937 rng(3);
    for (uint64_t i = 0; i < n_expert * blob_bytes; ++i) arena_.as<uint8_t>()[i] = static_cast<uint8_t>(rng());
    Check(cudaMemcpy(vram_.data(), arena_.data(), n_expert * blob_bytes, cudaMemcpyHostToDevice), "upload");
    for (int e = 0; e < n_expert; ++e) {
      table_.push_back(e < resident ? vram_.as<uint8_t>() + e * blob_bytes : arena_.as<uint8_t>() + e * blob_bytes);
    }
    device_table_ = Unwrap(DeviceBuffer::Allocate(n_expert * sizeof(void*)));
    Check(cudaMemcpy(device_table_.data(), table_.data(), n_expert * sizeof(void*), cudaMemcpyHostToDevice), "table");
  }

  const uint8_t* const* device_table() const { return device_table_.as<const uint8_t* const>(); }
  const uint8_t* entry(int e) const { return table_[e]; }
  const uint8_t* host_begin() const { return arena_.as<uint8_t>(); }
  const uint8_t* host_end() const { return arena_.as<uint8_t>() + n_expert_ * blob_bytes_; }
  std::vector<uint8_t> blob(int e) const {
    const uint8_t* p = arena_.as<uint8_t>() + e * blob_bytes_;
    return std::vector<uint8_t>(p, p + blob_bytes_);
  }

 private:
  int n_expert_;
  uint64_t blob_bytes_;
  PinnedBuffer arena_;
  DeviceBuffer vram_;
  std::vector<const uint8_t*> table_;
  DeviceBuffer device_table_;
};

// SplitForHost gives the host the first round(share * misses) missed experts in expert order with all their
// pairs and posts a request; a share of fewer than min_host_experts goes to the GPU whole and posts nothing.
TEST(SplitForHostTest, GivesTheHostTheFirstMissesAndNothingBelowTheMinimum) {
  constexpr int kExperts = 8, kResident = 4, kTokens = 2, kK = 3, kPairs = kTokens * kK;
  constexpr int64_t kEmbd = 32;
  Layer layer(kExperts, kResident, 256);  // experts 4..7 live in host memory
  // Missed experts 5, 6 and 7 (in expert order), in four pairs.
  const std::vector<int32_t> ids = {1, 5, 6, 6, 2, 7};
  DeviceBuffer d_ids = Unwrap(DeviceBuffer::Allocate(kPairs * sizeof(int32_t)));
  DeviceBuffer gpu_ids = Unwrap(DeviceBuffer::Allocate(kPairs * sizeof(int32_t)));
  DeviceBuffer host_ids = Unwrap(DeviceBuffer::Allocate(kPairs * sizeof(int32_t)));
  DeviceBuffer sequence = Unwrap(DeviceBuffer::Allocate(sizeof(int64_t)));
  DeviceBuffer host_pairs = Unwrap(DeviceBuffer::Allocate(sizeof(int32_t)));
  DeviceBuffer share = Unwrap(DeviceBuffer::Allocate(sizeof(float)));
  DeviceBuffer x = Unwrap(DeviceBuffer::Allocate(kTokens * kEmbd * sizeof(float)));
  PinnedBuffer mailbox = Unwrap(PinnedBuffer::Allocate(sizeof(HostMailbox)));
  PinnedBuffer mailbox_ids = Unwrap(PinnedBuffer::Allocate(kPairs * sizeof(int32_t)));
  PinnedBuffer mailbox_x = Unwrap(PinnedBuffer::Allocate(kTokens * kEmbd * sizeof(float)));
  Check(cudaMemcpy(d_ids.data(), ids.data(), kPairs * sizeof(int32_t), cudaMemcpyHostToDevice), "ids");
  Check(cudaMemset(x.data(), 0, kTokens * kEmbd * sizeof(float)), "x");
  struct Case {
    float share;
    int min_host_experts;
    std::vector<int32_t> host;  // the expected host_ids
  };
  const Case cases[] = {
      {0.5f, 1, {-1, 5, 6, 6, -1, -1}},    // round(1.5) = 2 experts: 5 and 6, three pairs
      {0.5f, 2, {-1, 5, 6, 6, -1, -1}},    // 2 is not below the minimum
      {0.3f, 1, {-1, 5, -1, -1, -1, -1}},  // round(0.9) = 1: expert 5
      {0.3f, 2, {-1, -1, -1, -1, -1, -1}}, // 1 is below the minimum: all on the GPU
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat("share ", c.share, ", min_host_experts ", c.min_host_experts));
    Check(cudaMemcpy(share.data(), &c.share, sizeof(float), cudaMemcpyHostToDevice), "share");
    Check(cudaMemset(sequence.data(), 0, sizeof(int64_t)), "sequence");
    std::memset(mailbox.data(), 0, sizeof(HostMailbox));
    HostSplitArgs a;
    a.ids = d_ids.as<int32_t>();
    a.n_tokens = kTokens;
    a.k = kK;
    a.blobs = layer.device_table();
    a.n_expert = kExperts;
    a.host_begin = layer.host_begin();
    a.host_end = layer.host_end();
    a.x = x.as<float>();
    a.n_embd = kEmbd;
    a.host_share = share.as<float>();
    a.min_host_experts = c.min_host_experts;
    a.gpu_ids = gpu_ids.as<int32_t>();
    a.host_ids = host_ids.as<int32_t>();
    a.sequence = sequence.as<int64_t>();
    a.host_pairs = host_pairs.as<int32_t>();
    a.mailbox = mailbox.as<HostMailbox>();
    a.mailbox_ids = mailbox_ids.as<int32_t>();
    a.mailbox_x = mailbox_x.as<float>();
    const absl::Status s = SplitForHost(a, nullptr);
    ASSERT_TRUE(s.ok()) << s;
    Check(cudaDeviceSynchronize(), "split");
    std::vector<int32_t> got_host(kPairs), got_gpu(kPairs);
    int32_t got_pairs = -1;
    Check(cudaMemcpy(got_host.data(), host_ids.data(), kPairs * sizeof(int32_t), cudaMemcpyDeviceToHost), "host_ids");
    Check(cudaMemcpy(got_gpu.data(), gpu_ids.data(), kPairs * sizeof(int32_t), cudaMemcpyDeviceToHost), "gpu_ids");
    Check(cudaMemcpy(&got_pairs, host_pairs.data(), sizeof(int32_t), cudaMemcpyDeviceToHost), "host_pairs");
    EXPECT_EQ(got_host, c.host);
    int expected_pairs = 0;
    for (int p = 0; p < kPairs; ++p) {
      expected_pairs += c.host[p] >= 0;
      EXPECT_EQ(got_gpu[p], c.host[p] >= 0 ? -1 : ids[p]) << "pair " << p;
    }
    EXPECT_EQ(got_pairs, expected_pairs);
    // A request is posted exactly when the host has pairs.
    EXPECT_EQ(mailbox.as<HostMailbox>()->request, expected_pairs > 0 ? 1 : 0);
  }
}

TEST(StageMissesTest, CopiesTheRoutedMissesInExpertOrderAndPointsTheTableAtThem) {
  constexpr int kExperts = 24, kResident = 6;
  constexpr uint64_t kBlobBytes = 4096 + 48;  // not a multiple of the copy's stride
  Layer layer(kExperts, kResident, kBlobBytes);
  // Misses 20, 7, 13 (twice), 9; hits 2, 5; -1 skipped. In expert order the misses are 7, 9, 13, 20.
  const std::vector<int32_t> ids = {20, 2, 7, -1, 13, 5, 13, 9};
  cudaStream_t stream;
  Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  DeviceBuffer d_ids = Unwrap(DeviceBuffer::Allocate(ids.size() * sizeof(int32_t)));
  Check(cudaMemcpy(d_ids.data(), ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice), "ids");
  const uint8_t* const kUntouched = reinterpret_cast<const uint8_t*>(uintptr_t{0x5a5a5a5a5a5a});
  for (int max_slots : {8, 3, 1}) {
    SCOPED_TRACE(absl::StrCat("max_slots ", max_slots));
    DeviceBuffer staging = Unwrap(DeviceBuffer::Allocate(max_slots * kBlobBytes));
    Check(cudaMemset(staging.data(), 0, max_slots * kBlobBytes), "clear staging");
    std::vector<const uint8_t*> out(kExperts, kUntouched);
    DeviceBuffer d_out = Unwrap(DeviceBuffer::Allocate(kExperts * sizeof(void*)));
    Check(cudaMemcpy(d_out.data(), out.data(), kExperts * sizeof(void*), cudaMemcpyHostToDevice), "out table");
    StageMissesArgs a;
    a.ids = d_ids.as<int32_t>();
    a.n_pairs = static_cast<int>(ids.size());
    a.table = layer.device_table();
    a.n_expert = kExperts;
    a.host_begin = layer.host_begin();
    a.host_end = layer.host_end();
    a.staging = staging.as<uint8_t>();
    a.max_slots = max_slots;
    a.blob_bytes = kBlobBytes;
    a.out_table = d_out.as<const uint8_t*>();
    ASSERT_TRUE(StageMisses(a, stream).ok());
    Check(cudaStreamSynchronize(stream), "sync");
    Check(cudaMemcpy(out.data(), d_out.data(), kExperts * sizeof(void*), cudaMemcpyDeviceToHost), "read table");
    std::vector<uint8_t> staged(max_slots * kBlobBytes);
    Check(cudaMemcpy(staged.data(), staging.data(), staged.size(), cudaMemcpyDeviceToHost), "read staging");

    const int misses_in_order[] = {7, 9, 13, 20};
    for (int slot = 0; slot < 4; ++slot) {
      const int e = misses_in_order[slot];
      if (slot < max_slots) {
        EXPECT_EQ(out[e], staging.as<uint8_t>() + slot * kBlobBytes) << "expert " << e;
        EXPECT_EQ(std::vector<uint8_t>(staged.begin() + slot * kBlobBytes, staged.begin() + (slot + 1) * kBlobBytes),
                  layer.blob(e))
            << "slot " << slot;
      } else {
        EXPECT_EQ(out[e], layer.entry(e)) << "expert " << e << " past the slots is read in place";
      }
    }
    for (int e : {2, 5}) EXPECT_EQ(out[e], layer.entry(e)) << "hit " << e;
    for (int e = 0; e < kExperts; ++e) {
      const bool routed = e == 2 || e == 5 || e == 7 || e == 9 || e == 13 || e == 20;
      if (!routed) {
        EXPECT_EQ(out[e], kUntouched) << "expert " << e << " is not routed";
      }
    }
  }
  Check(cudaStreamDestroy(stream), "stream");
}

TEST(StageMissesTest, RefusesBadArguments) {
  StageMissesArgs a;
  EXPECT_EQ(StageMisses(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
  DeviceBuffer buf = Unwrap(DeviceBuffer::Allocate(1 << 16));
  a.ids = buf.as<int32_t>();
  a.table = buf.as<const uint8_t* const>();
  a.staging = buf.as<uint8_t>();
  a.out_table = buf.as<const uint8_t*>();
  a.n_pairs = 1;
  a.n_expert = 4;
  a.max_slots = 1;
  a.blob_bytes = 100;  // not a multiple of 16
  EXPECT_EQ(StageMisses(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
  a.blob_bytes = 128;
  a.max_slots = kMaxStageSlots + 1;
  EXPECT_EQ(StageMisses(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
  a.max_slots = 1;
  a.n_pairs = kMaxStagePairs + 1;
  EXPECT_EQ(StageMisses(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

// PrefetchGuessed records the guess's missed experts rank by rank (first choices of every token, then second
// choices, ...) with the step's stamp, copies the first `limit` of them and points the layer's table copy at
// their slots; with a limit of 0 it records the guess and copies nothing.
TEST(PrefetchGuessedTest, RecordsMissesRankByRankAndCopiesUpToTheLimit) {
  constexpr int kExperts = 24, kResident = 6, kTokens = 2, kK = 3, kSlots = 4;
  constexpr uint64_t kBlobBytes = 4096 + 48;
  Layer layer(kExperts, kResident, kBlobBytes);
  // Token 0 chose 20, 2, 9; token 1 chose 13, 20, 7. Rank by rank: 20, 13 | 2 (hit), 20 (again) | 9, 7.
  const std::vector<int32_t> guess = {20, 2, 9, 13, 20, 7};
  const std::vector<int32_t> recorded = {20, 13, 9, 7};
  cudaStream_t stream;
  Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  DeviceBuffer d_guess = Unwrap(DeviceBuffer::Allocate(guess.size() * sizeof(int32_t)));
  Check(cudaMemcpy(d_guess.data(), guess.data(), guess.size() * sizeof(int32_t), cudaMemcpyHostToDevice), "guess");
  DeviceBuffer d_control = Unwrap(DeviceBuffer::Allocate(2 * sizeof(int32_t)));
  PinnedBuffer record = Unwrap(PinnedBuffer::Allocate((2 + kSlots) * sizeof(int32_t)));
  int32_t* device_record = nullptr;
  Check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_record), record.data(), 0), "mapped record");
  auto Args = [&](int n_tokens, int k, const DeviceBuffer& slots, const DeviceBuffer& out) {
    PrefetchArgs a;
    a.guess = d_guess.as<int32_t>();
    a.n_tokens = n_tokens;
    a.k = k;
    a.table = layer.device_table();
    a.n_expert = kExperts;
    a.host_begin = layer.host_begin();
    a.host_end = layer.host_end();
    a.control = d_control.as<int32_t>();
    a.slots = slots.as<uint8_t>();
    a.max_slots = kSlots;
    a.blob_bytes = kBlobBytes;
    a.out_table = out.as<const uint8_t*>();
    a.record = device_record;
    return a;
  };
  for (int limit : {kSlots, 2, 0, 99, -3}) {
    SCOPED_TRACE(absl::StrCat("limit ", limit));
    const int copied = std::clamp(limit, 0, static_cast<int>(recorded.size()));
    const int32_t control[2] = {limit, 40 + limit};  // the limit and a stamp
    Check(cudaMemcpy(d_control.data(), control, sizeof(control), cudaMemcpyHostToDevice), "control");
    DeviceBuffer slots = Unwrap(DeviceBuffer::Allocate(kSlots * kBlobBytes));
    Check(cudaMemset(slots.data(), 0, kSlots * kBlobBytes), "clear slots");
    DeviceBuffer d_out = Unwrap(DeviceBuffer::Allocate(kExperts * sizeof(void*)));
    Check(cudaMemset(d_out.data(), 0x5a, kExperts * sizeof(void*)), "out table");
    std::fill(record.as<int32_t>(), record.as<int32_t>() + 2 + kSlots, 77);
    ASSERT_TRUE(PrefetchGuessed(Args(kTokens, kK, slots, d_out), stream).ok());
    Check(cudaStreamSynchronize(stream), "sync");
    const int32_t* r = record.as<int32_t>();
    EXPECT_EQ(r[0], 40 + limit);
    EXPECT_EQ(r[1], static_cast<int32_t>(recorded.size()));
    for (int j = 0; j < kSlots; ++j) EXPECT_EQ(r[2 + j], recorded[j]) << "record " << j;
    std::vector<const uint8_t*> out(kExperts);
    Check(cudaMemcpy(out.data(), d_out.data(), kExperts * sizeof(void*), cudaMemcpyDeviceToHost), "read table");
    std::vector<uint8_t> copies(kSlots * kBlobBytes);
    Check(cudaMemcpy(copies.data(), slots.data(), copies.size(), cudaMemcpyDeviceToHost), "read slots");
    for (int e = 0; e < kExperts; ++e) {
      const auto at = std::find(recorded.begin(), recorded.end(), e);
      const int slot = at == recorded.end() ? -1 : static_cast<int>(at - recorded.begin());
      if (slot >= 0 && slot < copied) {
        EXPECT_EQ(out[e], slots.as<uint8_t>() + slot * kBlobBytes) << "expert " << e;
        EXPECT_EQ(std::vector<uint8_t>(copies.begin() + slot * kBlobBytes, copies.begin() + (slot + 1) * kBlobBytes),
                  layer.blob(e))
            << "slot " << slot;
      } else {
        EXPECT_EQ(out[e], layer.entry(e)) << "expert " << e << " keeps its table entry";
      }
    }
    for (int slot = copied; slot < kSlots; ++slot) {
      EXPECT_EQ(std::count(copies.begin() + slot * kBlobBytes, copies.begin() + (slot + 1) * kBlobBytes, 0),
                static_cast<std::ptrdiff_t>(kBlobBytes))
          << "slot " << slot << " is not written";
    }
  }
  // More misses than slots: the first max_slots are recorded.
  const std::vector<int32_t> many = {6, 7, 8, 9, 10, 11};
  Check(cudaMemcpy(d_guess.data(), many.data(), many.size() * sizeof(int32_t), cudaMemcpyHostToDevice), "guess");
  DeviceBuffer slots = Unwrap(DeviceBuffer::Allocate(kSlots * kBlobBytes));
  DeviceBuffer d_out = Unwrap(DeviceBuffer::Allocate(kExperts * sizeof(void*)));
  ASSERT_TRUE(PrefetchGuessed(Args(1, 6, slots, d_out), stream).ok());
  Check(cudaStreamSynchronize(stream), "sync");
  EXPECT_EQ(record.as<int32_t>()[1], kSlots);
  for (int j = 0; j < kSlots; ++j) EXPECT_EQ(record.as<int32_t>()[2 + j], 6 + j);
  Check(cudaStreamDestroy(stream), "stream");
}

TEST(PrefetchGuessedTest, RefusesBadArguments) {
  PrefetchArgs a;
  EXPECT_EQ(PrefetchGuessed(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
  DeviceBuffer buf = Unwrap(DeviceBuffer::Allocate(1 << 16));
  a.guess = buf.as<int32_t>();
  a.table = buf.as<const uint8_t* const>();
  a.control = buf.as<int32_t>();
  a.slots = buf.as<uint8_t>();
  a.out_table = buf.as<const uint8_t*>();
  a.record = buf.as<int32_t>();
  a.n_tokens = 1;
  a.k = 2;
  a.n_expert = 4;
  a.max_slots = 1;
  a.blob_bytes = 100;  // not a multiple of 16
  EXPECT_EQ(PrefetchGuessed(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
  a.blob_bytes = 128;
  a.max_slots = kMaxPrefetchSlots + 1;
  EXPECT_EQ(PrefetchGuessed(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
  a.max_slots = 1;
  a.n_tokens = kMaxStagePairs;  // x 2 pairs
  EXPECT_EQ(PrefetchGuessed(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::kernels::cuda
