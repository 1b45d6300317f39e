#ifndef STRATA_KERNELS_CPU_QUANTIZE_FIT_SIMD_H_
#define STRATA_KERNELS_CPU_QUANTIZE_FIT_SIMD_H_

// The fits of quantize_fit.h with one group per SIMD lane, written once over a vector type V (the AVX2 and
// AVX-512 files each instantiate it with theirs). Include only from a file compiled for V's instruction set
// and with -ffp-contract=off.
//
// Each lane runs exactly the scalar fit's operations in the scalar fit's order, so the results are the
// scalar reference's bit for bit; V::SolveAffine does SolveAffine's double operations, lane by lane. Four
// batches of lanes (kUnroll) are interleaved step by step (Each), so that the long chain of operations
// behind each weight's code, and the float sums, which must stay sequential per group, do not stall on
// latency.

#include <cstdint>
#include <cstring>

#include "kernels/cpu/quantize_fit.h"

// Every loop over the kUnroll batches is unrolled whole, so that each batch's accumulators live in registers
// (GCC at -O2 kept them in arrays on the stack: a store and a reload on every weight's dependency chain).
#define STRATA_FIT_UNROLL _Pragma("GCC unroll 8")

namespace strata::kernels::internal {

template <class V>
class SimdFitter {
 public:
  using F = typename V::F;
  using I = typename V::I;
  using M = typename V::M;
  static constexpr int kLanes = V::kLanes;
  static constexpr int kUnroll = 4;
  static constexpr int kBatch = kLanes * kUnroll;  // groups one call fits

  // Fits kBatch groups of Group(s) weights at `w`, as FitGroupsScalar would.
  static void Fit(Scheme s, const float* w, float* d, float* m, uint8_t* codes, QuantizeError* error) {
    SimdFitter f(static_cast<int>(layout::Group(s)), w);
    switch (s) {
      case Scheme::kS8:
        f.FitS8(d, codes, error);
        std::memset(m, 0, sizeof(float) * kBatch);
        break;
      case Scheme::kS4:
        f.FitS4(d, m, codes, error);
        break;
      default:
        f.FitS2(d, codes, error);
        std::memset(m, 0, sizeof(float) * kBatch);
        break;
    }
  }

 private:
  using Lanes = F[kUnroll];

  SimdFitter(int n, const float* w) : n_(n) {
    for (int u = 0; u < kUnroll; ++u) V::Transpose(w + static_cast<int64_t>(u * kLanes) * n, n, wt_[u]);
  }

  // Runs op(u) for every batch, all of one step before the next (Each(a); Each(b)), so that the kUnroll
  // independent chains are interleaved instruction by instruction.
  template <class Op>
  static void Each(Op op) {
    STRATA_FIT_UNROLL for (int u = 0; u < kUnroll; ++u) op(u);
  }

  F X(int u, int i) const { return V::Load(wt_[u][i]); }
  static F Inverse(F d) { return V::Select(V::Eq(d, V::Set(0.0f)), V::Set(0.0f), V::Div(V::Set(1.0f), d)); }
  static F InverseS2(F d) { return V::Select(V::Eq(d, V::Set(0.0f)), V::Set(0.0f), V::Div(V::Set(0.5f), d)); }

  // The codes of weights x, as floats: the scalar Code* functions' Cvtt, whose argument here is always
  // within int32's range and never NaN, then converted back, which is truncation toward zero done in float
  // (V::Trunc; a code of -0.0 where Cvtt gives 0 changes no product, sum or byte written).
  template <Scheme S>
  static void Codes(const Lanes& x, const Lanes& inv, const Lanes& m, Lanes& q) {
    if constexpr (S == Scheme::kS8) {
      Each([&](int u) { q[u] = V::Mul(x[u], inv[u]); });
      Each([&](int u) { q[u] = V::Max(q[u], V::Set(-127.0f)); });
      Each([&](int u) { q[u] = V::Min(q[u], V::Set(127.0f)); });
      Each([&](int u) { q[u] = V::Add(q[u], V::CopySignHalf(q[u])); });
    }
    if constexpr (S == Scheme::kS4) {
      Each([&](int u) { q[u] = V::Sub(x[u], m[u]); });
      Each([&](int u) { q[u] = V::Mul(q[u], inv[u]); });
      Each([&](int u) { q[u] = V::Max(q[u], V::Set(0.0f)); });
      Each([&](int u) { q[u] = V::Min(q[u], V::Set(15.0f)); });
      Each([&](int u) { q[u] = V::Add(q[u], V::Set(0.5f)); });
    }
    if constexpr (S == Scheme::kS2) {
      Each([&](int u) { q[u] = V::Mul(x[u], inv[u]); });
      Each([&](int u) { q[u] = V::Add(q[u], V::Set(2.0f)); });
      Each([&](int u) { q[u] = V::Max(q[u], V::Set(0.0f)); });
      Each([&](int u) { q[u] = V::Min(q[u], V::Set(3.0f)); });
    }
    Each([&](int u) { q[u] = V::Trunc(q[u]); });
  }
  // s2's level 2q - 3 of a code, exact in float.
  static F LevelS2(F q) { return V::Sub(V::Add(q, q), V::Set(3.0f)); }

  // The decoded values of codes q.
  template <Scheme S>
  static void Decode(const Lanes& d, const Lanes& m, const Lanes& q, Lanes& back) {
    if constexpr (S == Scheme::kS8) Each([&](int u) { back[u] = V::Mul(d[u], q[u]); });
    if constexpr (S == Scheme::kS4) {
      Each([&](int u) { back[u] = V::Mul(d[u], q[u]); });
      Each([&](int u) { back[u] = V::Add(back[u], m[u]); });
    }
    if constexpr (S == Scheme::kS2) {
      Each([&](int u) { back[u] = LevelS2(q[u]); });
      Each([&](int u) { back[u] = V::Mul(d[u], back[u]); });
    }
  }

  template <Scheme S>
  static void Inverses(const Lanes& d, Lanes& inv) {
    Each([&](int u) { inv[u] = S == Scheme::kS2 ? InverseS2(d[u]) : Inverse(d[u]); });
  }

  // Squared errors of the codes for (d, m) (m ignored but for s4), per lane, summed in order.
  template <Scheme S>
  void Sse(const Lanes& d, const Lanes& m, Lanes& sse) const {
    Lanes inv;
    Inverses<S>(d, inv);
    Each([&](int u) { sse[u] = V::Set(0.0f); });
    for (int i = 0; i < n_; ++i) {
      Lanes x, q, e;
      Each([&](int u) { x[u] = X(u, i); });
      Codes<S>(x, inv, m, q);
      Decode<S>(d, m, q, e);
      Each([&](int u) { e[u] = V::Sub(e[u], x[u]); });
      Each([&](int u) { e[u] = V::Mul(e[u], e[u]); });
      Each([&](int u) { sse[u] = V::Add(sse[u], e[u]); });
    }
  }

  // Writes the codes for the chosen (d, m) and adds their error. Codes go out eight weights of a group at a
  // time (V::StoreCodes8), not a byte at a time.
  template <Scheme S>
  void Finish(const Lanes& d, const Lanes& m, float* d_out, float* m_out, uint8_t* codes, QuantizeError* error) const {
    typename V::ErrorSums sums;
    Lanes inv;
    Inverses<S>(d, inv);
    for (int i0 = 0; i0 < n_; i0 += 8) {
      I q_int[kUnroll][8];
      for (int j = 0; j < 8; ++j) {
        Lanes x, q, back;
        Each([&](int u) { x[u] = X(u, i0 + j); });
        Codes<S>(x, inv, m, q);
        Decode<S>(d, m, q, back);
        for (int u = 0; u < kUnroll; ++u) {
          sums.Add(x[u], back[u]);
          q_int[u][j] = V::Cvtt(q[u]);
        }
      }
      for (int u = 0; u < kUnroll; ++u) {
        V::StoreCodes8(q_int[u], codes + static_cast<int64_t>(u * kLanes) * n_ + i0, n_);
      }
    }
    for (int u = 0; u < kUnroll; ++u) {
      V::StoreUnaligned(d_out + u * kLanes, d[u]);
      V::StoreUnaligned(m_out + u * kLanes, m[u]);
    }
    sums.Flush(error);
  }

  F Amax(int u) const {
    F amax = V::Set(0.0f);
    for (int i = 0; i < n_; ++i) amax = V::Max(amax, V::Abs(X(u, i)));
    return amax;
  }

  void FitS8(float* d_out, uint8_t* codes, QuantizeError* error) const {
    Lanes amax, best_d, best_sse, zero;
    Each([&](int u) { amax[u] = Amax(u), zero[u] = V::Set(0.0f); });
    const auto candidate = [&](int k, Lanes& d) {
      Each([&](int u) { d[u] = V::RoundHalf(V::Mul(V::Div(amax[u], V::Set(127.0f)), V::Set(S8Factor(k)))); });
    };
    candidate(0, best_d);
    Sse<Scheme::kS8>(best_d, zero, best_sse);
    for (int k = 1; k < kS8Candidates; ++k) {
      Lanes d, sse;
      candidate(k, d);
      Sse<Scheme::kS8>(d, zero, sse);
      Each([&](int u) {
        const M better = V::Lt(sse[u], best_sse[u]);
        best_d[u] = V::Select(better, d[u], best_d[u]);
        best_sse[u] = V::Select(better, sse[u], best_sse[u]);
      });
    }
    alignas(64) float m_unused[kBatch];
    Finish<Scheme::kS8>(best_d, zero, d_out, m_unused, codes, error);
  }

  // The sums of a candidate's s4 codes that its least-squares (d, m) needs, per lane. sum_q and sum_qq are
  // exact in float (at most 32 x 15 and 32 x 225); sum_qw is summed in order, as RefitS4 does.
  struct CodeSumsS4 {
    Lanes q, qq, qw;
  };

  // Codes for (d, m) per weight, with (kSums) the sums of the codes and (kSse) their squared errors: the pass
  // of RefitS4 (quantize_fit.cc) and that of Sse in one. The sums live in locals, so in registers.
  template <bool kSums, bool kSse>
  void CodeSumsAndSseS4(const Lanes& d, const Lanes& m, CodeSumsS4& sums_out, Lanes& sse_out) const {
    Lanes inv, sum_q, sum_qq, sum_qw, sse;
    Inverses<Scheme::kS4>(d, inv);
    Each([&](int u) { sum_q[u] = sum_qq[u] = sum_qw[u] = sse[u] = V::Set(0.0f); });
    for (int i = 0; i < n_; ++i) {
      Lanes x, q, t;
      Each([&](int u) { x[u] = X(u, i); });
      Codes<Scheme::kS4>(x, inv, m, q);
      if constexpr (kSums) {
        Each([&](int u) { sum_q[u] = V::Add(sum_q[u], q[u]); });
        Each([&](int u) { t[u] = V::Mul(q[u], q[u]); });
        Each([&](int u) { sum_qq[u] = V::Add(sum_qq[u], t[u]); });
        Each([&](int u) { t[u] = V::Mul(q[u], x[u]); });
        Each([&](int u) { sum_qw[u] = V::Add(sum_qw[u], t[u]); });
      }
      if constexpr (kSse) {
        Decode<Scheme::kS4>(d, m, q, t);
        Each([&](int u) { t[u] = V::Sub(t[u], x[u]); });
        Each([&](int u) { t[u] = V::Mul(t[u], t[u]); });
        Each([&](int u) { sse[u] = V::Add(sse[u], t[u]); });
      }
    }
    Each([&](int u) {
      if constexpr (kSums) sums_out.q[u] = sum_q[u], sums_out.qq[u] = sum_qq[u], sums_out.qw[u] = sum_qw[u];
      if constexpr (kSse) sse_out[u] = sse[u];
    });
  }

  // The rest of RefitS4 on every lane: (d, m) becomes the least-squares fit of the codes whose sums are given,
  // rounded to half; `valid` says where it is a usable candidate.
  void SolveS4(const Lanes& sum_w, const CodeSumsS4& sums, Lanes& d, Lanes& m, M* valid) const {
    Each([&](int u) {
      V::SolveAffine(n_, V::Cvtt(sums.q[u]), V::Cvtt(sums.qq[u]), sum_w[u], sums.qw[u], &d[u], &m[u]);
      d[u] = V::RoundHalf(d[u]);
      m[u] = V::RoundHalf(m[u]);
      valid[u] = V::And(V::Gt(d[u], V::Set(0.0f)), V::Lt(V::Abs(m[u]), V::Set(INFINITY)));
    });
  }

  void FitS4(float* d_out, float* m_out, uint8_t* codes, QuantizeError* error) const {
    Lanes lo, hi, sum_w, best_d, best_m, best_sse;
    Each([&](int u) { lo[u] = hi[u] = X(u, 0), sum_w[u] = V::Set(0.0f); });
    for (int i = 0; i < n_; ++i) {
      Each([&](int u) {
        const F x = X(u, i);
        lo[u] = V::Min(lo[u], x);
        hi[u] = V::Max(hi[u], x);
        sum_w[u] = V::Add(sum_w[u], x);
      });
    }
    Each([&](int u) {
      best_d[u] = V::RoundHalf(V::Div(V::Sub(hi[u], lo[u]), V::Set(15.0f)));
      best_m[u] = V::RoundHalf(lo[u]);
    });
    // The full range's error, and the sums of its codes: the first candidate (k = 0) shrinks the range by
    // nothing, so its refit starts from the same (d, m) wherever hi - lo is finite.
    CodeSumsS4 full_range_sums;
    Lanes unused_sse;
    CodeSumsAndSseS4<true, true>(best_d, best_m, full_range_sums, best_sse);
    // The squared error of candidate (d, m), which replaces the best so far where it is valid and less; when
    // best_sums is set, the sums of the best's codes are kept there (the next refit then needs no pass).
    const auto try_candidate = [&](Lanes& d, Lanes& m, const M* valid, CodeSumsS4* best_sums) {
      Lanes sse;
      CodeSumsS4 sums;
      if (best_sums != nullptr) {
        CodeSumsAndSseS4<true, true>(d, m, sums, sse);
      } else {
        CodeSumsAndSseS4<false, true>(d, m, sums, sse);
      }
      Each([&](int u) {
        const M better = V::And(valid[u], V::Lt(sse[u], best_sse[u]));
        best_d[u] = V::Select(better, d[u], best_d[u]);
        best_m[u] = V::Select(better, m[u], best_m[u]);
        best_sse[u] = V::Select(better, sse[u], best_sse[u]);
        if (best_sums != nullptr) {
          best_sums->q[u] = V::Select(better, sums.q[u], best_sums->q[u]);
          best_sums->qq[u] = V::Select(better, sums.qq[u], best_sums->qq[u]);
          best_sums->qw[u] = V::Select(better, sums.qw[u], best_sums->qw[u]);
        }
      });
    };
    for (int k = 0; k < kS4Candidates; ++k) {
      Lanes d, m;
      Each([&](int u) {
        const F cut = V::Mul(V::Mul(V::Sub(hi[u], lo[u]), V::Set(S4Shrink(k))), V::Set(0.5f));
        const F clo = V::Add(lo[u], cut), chi = V::Sub(hi[u], cut);
        d[u] = V::RoundHalf(V::Div(V::Sub(chi, clo), V::Set(15.0f)));
        m[u] = V::RoundHalf(clo);
      });
      CodeSumsS4 sums;
      bool same_as_full_range = k == 0;
      for (int u = 0; u < kUnroll; ++u) {
        same_as_full_range = same_as_full_range && V::AllTrue(V::And(V::Eq(d[u], best_d[u]), V::Eq(m[u], best_m[u])));
      }
      if (same_as_full_range) {
        sums = full_range_sums;
      } else {
        CodeSumsAndSseS4<true, false>(d, m, sums, unused_sse);
      }
      M valid[kUnroll];
      SolveS4(sum_w, sums, d, m, valid);
      try_candidate(d, m, valid, nullptr);
    }
    // The refinements refit the best so far: the first one's codes take a pass, the later ones' codes are
    // those of a candidate whose squared-error pass also summed them.
    CodeSumsS4 best_sums;
    CodeSumsAndSseS4<true, false>(best_d, best_m, best_sums, unused_sse);
    for (int r = 0; r < kS4Refinements; ++r) {
      Lanes d, m;
      Each([&](int u) { d[u] = best_d[u], m[u] = best_m[u]; });
      M valid[kUnroll];
      SolveS4(sum_w, best_sums, d, m, valid);
      try_candidate(d, m, valid, r + 1 < kS4Refinements ? &best_sums : nullptr);
    }
    Finish<Scheme::kS4>(best_d, best_m, d_out, m_out, codes, error);
  }

  // The pass of EvaluateS2 (quantize_fit.cc) on every lane: how many weights are outer for scale d and the
  // sum of their magnitudes. Each weight costs a compare, a count and a masked sum (keys_ and abs_ hold its
  // key and magnitude).
  void CountOuterS2(const Lanes& d, I* outer, Lanes& outer_abs) const {
    I last_inner[kUnroll];
    Each([&](int u) {
      last_inner[u] = V::BiasedKeyS2(V::Mul(V::Set(-2.0f), d[u]));
      outer[u] = V::SetI(0);
      outer_abs[u] = V::Set(0.0f);
    });
    for (int i = 0; i < n_; ++i) {
      Each([&](int u) {
        const M is_outer = V::GtI(V::LoadI(keys_[u][i]), last_inner[u]);
        outer[u] = V::CountIf(outer[u], is_outer);
        outer_abs[u] = V::AddIf(outer_abs[u], is_outer, V::Load(abs_[u][i]));
      });
    }
  }

  // s2: FitS2 of quantize_fit.cc on every lane, the candidates scored and chosen by V::S2Choice (ScoreS2's
  // double operations).
  void FitS2(float* d_out, uint8_t* codes, QuantizeError* error) {
    Lanes amax, sum_abs, d, outer_abs, zero;
    I outer[kUnroll];
    Each([&](int u) { amax[u] = sum_abs[u] = zero[u] = V::Set(0.0f); });
    for (int i = 0; i < n_; ++i) {
      Each([&](int u) {
        const F x = X(u, i), a = V::Abs(x);
        V::StoreI(keys_[u][i], V::BiasedKeyS2(x));
        V::Store(abs_[u][i], a);
        amax[u] = V::Max(amax[u], a);
        sum_abs[u] = V::Add(sum_abs[u], a);
      });
    }
    typename V::S2Choice choice[kUnroll];
    Each([&](int u) { d[u] = V::RoundHalf(V::Div(amax[u], V::Set(S2Divisor(0)))); });
    CountOuterS2(d, outer, outer_abs);
    Each([&](int u) { choice[u].First(n_, d[u], sum_abs[u], outer_abs[u], outer[u]); });
    for (int k = 1; k <= kS2Candidates; ++k) {
      Each([&](int u) { d[u] = V::RoundHalf(V::Div(amax[u], V::Set(S2Divisor(k)))); });
      CountOuterS2(d, outer, outer_abs);
      Lanes refined;
      Each([&](int u) { refined[u] = V::RoundHalf(choice[u].Offer(n_, d[u], sum_abs[u], outer_abs[u], outer[u])); });
      CountOuterS2(refined, outer, outer_abs);
      Each([&](int u) { choice[u].Offer(n_, refined[u], sum_abs[u], outer_abs[u], outer[u]); });
    }
    Each([&](int u) { d[u] = choice[u].Best(); });
    alignas(64) float m_unused[kBatch];
    Finish<Scheme::kS2>(d, zero, d_out, m_unused, codes, error);
  }

  int n_;
  alignas(64) float wt_[kUnroll][64][kLanes];  // wt_[u][i][lane]: weight i of group u * kLanes + lane
  // s2's search: V::BiasedKeyS2 and |x| of each weight, laid out as wt_.
  alignas(64) uint32_t keys_[kUnroll][64][kLanes];
  alignas(64) float abs_[kUnroll][64][kLanes];
};

// FitGroupsAvx2 / FitGroupsAvx512 over V: whole batches only.
template <class V>
int64_t FitGroupsSimd(Scheme s, const float* w, int64_t n_groups, float* d, float* m, uint8_t* codes,
                      QuantizeError* error) {
  constexpr int64_t kBatch = SimdFitter<V>::kBatch;
  const int64_t n = layout::Group(s);
  const int64_t batches = n_groups / kBatch;
  for (int64_t b = 0; b < batches; ++b) {
    const int64_t g = b * kBatch;
    // The next batch's weights, a cache line at a time, while this one is fitted: they come from memory
    // (a role's f32 weights are megabytes, decoded from the source just before), and the fit of a batch
    // takes far longer than fetching them.
    if (b + 1 < batches) {
      const char* next = reinterpret_cast<const char*>(w + (g + kBatch) * n);
      for (int64_t off = 0; off < static_cast<int64_t>(sizeof(float)) * kBatch * n; off += 64) {
        _mm_prefetch(next + off, _MM_HINT_T0);
      }
    }
    SimdFitter<V>::Fit(s, w + g * n, d + g, m + g, codes + g * n, error);
  }
  return batches * kBatch;
}

}  // namespace strata::kernels::internal

#undef STRATA_FIT_UNROLL

#endif  // STRATA_KERNELS_CPU_QUANTIZE_FIT_SIMD_H_
