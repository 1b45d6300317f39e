#include "kernels/cuda/offload_kernels.h"

#include <cuda_runtime.h>

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
      if (!routed) EXPECT_EQ(out[e], kUntouched) << "expert " << e << " is not routed";
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

}  // namespace
}  // namespace strata::kernels::cuda
