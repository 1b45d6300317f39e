#ifndef STRATA_KERNELS_CPU_QUANTIZE_FIT_SIMD_H_
#define STRATA_KERNELS_CPU_QUANTIZE_FIT_SIMD_H_

// The fits of quantize_fit.h with one group per SIMD lane, written once over a vector type V (the AVX2 and
// AVX-512 files each instantiate it with theirs). Include only from a file compiled for V's instruction set
// and with -ffp-contract=off.
//
// Each lane runs exactly the scalar fit's operations in the scalar fit's order, so the results are the
// scalar reference's bit for bit; V::SolveAffine does SolveAffine's double operations, lane by lane. Two
// batches of lanes are interleaved (kUnroll) so that the float sums, which must stay sequential per group,
// do not stall on the adder's latency.

#include <cstdint>
#include <cstring>

#include "kernels/cpu/quantize_fit.h"

namespace strata::kernels::internal {

template <class V>
class SimdFitter {
 public:
  using F = typename V::F;
  using I = typename V::I;
  using M = typename V::M;
  static constexpr int kLanes = V::kLanes;
  static constexpr int kUnroll = 2;
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
  SimdFitter(int n, const float* w) : n_(n) {
    for (int u = 0; u < kUnroll; ++u) {
      for (int lane = 0; lane < kLanes; ++lane) {
        const float* g = w + static_cast<int64_t>(u * kLanes + lane) * n;
        for (int i = 0; i < n; ++i) wt_[u][i][lane] = g[i];
      }
    }
  }

  F X(int u, int i) const { return V::Load(wt_[u][i]); }
  static F Inverse(F d) { return V::Select(V::Eq(d, V::Set(0.0f)), V::Set(0.0f), V::Div(V::Set(1.0f), d)); }
  static F InverseS2(F d) { return V::Select(V::Eq(d, V::Set(0.0f)), V::Set(0.0f), V::Div(V::Set(0.5f), d)); }

  static I CodeS8(F x, F inv) {
    const F t = V::Min(V::Max(V::Mul(x, inv), V::Set(-127.0f)), V::Set(127.0f));
    return V::Cvtt(V::Add(t, V::CopySignHalf(t)));
  }
  static I CodeS4(F x, F inv, F m) {
    return V::Cvtt(V::Add(V::Min(V::Max(V::Mul(V::Sub(x, m), inv), V::Set(0.0f)), V::Set(15.0f)), V::Set(0.5f)));
  }
  static I CodeS2(F x, F inv) {
    return V::Cvtt(V::Min(V::Max(V::Add(V::Mul(x, inv), V::Set(2.0f)), V::Set(0.0f)), V::Set(3.0f)));
  }
  static F LevelS2(I q) { return V::ToFloat(V::SubI(V::AddI(q, q), V::SetI(3))); }

  // Squared errors of the codes for (d, m) (m ignored but for s4), per lane, summed in order.
  template <Scheme S>
  void Sse(const F* d, const F* m, F* sse) const {
    F inv[kUnroll];
    for (int u = 0; u < kUnroll; ++u) {
      inv[u] = S == Scheme::kS2 ? InverseS2(d[u]) : Inverse(d[u]);
      sse[u] = V::Set(0.0f);
    }
    for (int i = 0; i < n_; ++i) {
      for (int u = 0; u < kUnroll; ++u) {
        const F x = X(u, i);
        F back;
        if constexpr (S == Scheme::kS8) back = V::Mul(d[u], V::ToFloat(CodeS8(x, inv[u])));
        if constexpr (S == Scheme::kS4) back = V::Add(V::Mul(d[u], V::ToFloat(CodeS4(x, inv[u], m[u]))), m[u]);
        if constexpr (S == Scheme::kS2) back = V::Mul(d[u], LevelS2(CodeS2(x, inv[u])));
        const F e = V::Sub(back, x);
        sse[u] = V::Add(sse[u], V::Mul(e, e));
      }
    }
  }

  // Writes the codes for the chosen (d, m) and adds their error.
  template <Scheme S>
  void Finish(const F* d, const F* m, float* d_out, float* m_out, uint8_t* codes, QuantizeError* error) const {
    typename V::ErrorSums sums;
    alignas(64) int32_t q_lanes[kLanes];
    for (int u = 0; u < kUnroll; ++u) {
      const F inv = S == Scheme::kS2 ? InverseS2(d[u]) : Inverse(d[u]);
      for (int i = 0; i < n_; ++i) {
        const F x = X(u, i);
        I q;
        F back;
        if constexpr (S == Scheme::kS8) q = CodeS8(x, inv), back = V::Mul(d[u], V::ToFloat(q));
        if constexpr (S == Scheme::kS4) q = CodeS4(x, inv, m[u]), back = V::Add(V::Mul(d[u], V::ToFloat(q)), m[u]);
        if constexpr (S == Scheme::kS2) q = CodeS2(x, inv), back = V::Mul(d[u], LevelS2(q));
        sums.Add(x, back);
        V::StoreI(q_lanes, q);
        for (int lane = 0; lane < kLanes; ++lane) {
          codes[static_cast<int64_t>(u * kLanes + lane) * n_ + i] = static_cast<uint8_t>(q_lanes[lane]);
        }
      }
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
    F amax[kUnroll], best_d[kUnroll], best_sse[kUnroll], zero[kUnroll];
    for (int u = 0; u < kUnroll; ++u) amax[u] = Amax(u), zero[u] = V::Set(0.0f);
    for (int k = 0; k < kS8Candidates; ++k) {
      F d[kUnroll], sse[kUnroll];
      for (int u = 0; u < kUnroll; ++u) d[u] = V::RoundHalf(V::Mul(V::Div(amax[u], V::Set(127.0f)), V::Set(S8Factor(k))));
      Sse<Scheme::kS8>(d, zero, sse);
      for (int u = 0; u < kUnroll; ++u) {
        if (k == 0) {
          best_d[u] = d[u], best_sse[u] = sse[u];
          continue;
        }
        const M better = V::Lt(sse[u], best_sse[u]);
        best_d[u] = V::Select(better, d[u], best_d[u]);
        best_sse[u] = V::Select(better, sse[u], best_sse[u]);
      }
    }
    alignas(64) float m_unused[kBatch];
    Finish<Scheme::kS8>(best_d, zero, d_out, m_unused, codes, error);
  }

  void FitS4(float* d_out, float* m_out, uint8_t* codes, QuantizeError* error) const {
    F lo[kUnroll], hi[kUnroll], sum_w[kUnroll], best_d[kUnroll], best_m[kUnroll], best_sse[kUnroll];
    for (int u = 0; u < kUnroll; ++u) lo[u] = hi[u] = X(u, 0), sum_w[u] = V::Set(0.0f);
    for (int i = 0; i < n_; ++i) {
      for (int u = 0; u < kUnroll; ++u) {
        const F x = X(u, i);
        lo[u] = V::Min(lo[u], x);
        hi[u] = V::Max(hi[u], x);
        sum_w[u] = V::Add(sum_w[u], x);
      }
    }
    for (int u = 0; u < kUnroll; ++u) {
      best_d[u] = V::RoundHalf(V::Div(V::Sub(hi[u], lo[u]), V::Set(15.0f)));
      best_m[u] = V::RoundHalf(lo[u]);
    }
    Sse<Scheme::kS4>(best_d, best_m, best_sse);
    for (int k = 0; k < kS4Candidates; ++k) {
      F d[kUnroll], m[kUnroll], inv[kUnroll], sum_qw[kUnroll];
      I sum_q[kUnroll], sum_qq[kUnroll];
      for (int u = 0; u < kUnroll; ++u) {
        const F cut = V::Mul(V::Mul(V::Sub(hi[u], lo[u]), V::Set(S4Shrink(k))), V::Set(0.5f));
        const F clo = V::Add(lo[u], cut), chi = V::Sub(hi[u], cut);
        d[u] = V::RoundHalf(V::Div(V::Sub(chi, clo), V::Set(15.0f)));
        m[u] = V::RoundHalf(clo);
        inv[u] = Inverse(d[u]);
        sum_qw[u] = V::Set(0.0f);
        sum_q[u] = sum_qq[u] = V::SetI(0);
      }
      for (int i = 0; i < n_; ++i) {
        for (int u = 0; u < kUnroll; ++u) {
          const F x = X(u, i);
          const I q = CodeS4(x, inv[u], m[u]);
          sum_q[u] = V::AddI(sum_q[u], q);
          sum_qq[u] = V::AddI(sum_qq[u], V::MulI(q, q));
          sum_qw[u] = V::Add(sum_qw[u], V::Mul(V::ToFloat(q), x));
        }
      }
      M valid[kUnroll];
      for (int u = 0; u < kUnroll; ++u) {
        V::SolveAffine(n_, sum_q[u], sum_qq[u], sum_w[u], sum_qw[u], &d[u], &m[u]);
        d[u] = V::RoundHalf(d[u]);
        m[u] = V::RoundHalf(m[u]);
        valid[u] = V::And(V::Gt(d[u], V::Set(0.0f)), V::Lt(V::Abs(m[u]), V::Set(INFINITY)));
      }
      F sse[kUnroll];
      Sse<Scheme::kS4>(d, m, sse);
      for (int u = 0; u < kUnroll; ++u) {
        const M better = V::And(valid[u], V::Lt(sse[u], best_sse[u]));
        best_d[u] = V::Select(better, d[u], best_d[u]);
        best_m[u] = V::Select(better, m[u], best_m[u]);
        best_sse[u] = V::Select(better, sse[u], best_sse[u]);
      }
    }
    Finish<Scheme::kS4>(best_d, best_m, d_out, m_out, codes, error);
  }

  void FitS2(float* d_out, uint8_t* codes, QuantizeError* error) const {
    F amax[kUnroll], best_d[kUnroll], best_sse[kUnroll], zero[kUnroll];
    for (int u = 0; u < kUnroll; ++u) {
      amax[u] = Amax(u);
      zero[u] = V::Set(0.0f);
      best_d[u] = V::RoundHalf(V::Div(amax[u], V::Set(3.0f)));
    }
    Sse<Scheme::kS2>(best_d, zero, best_sse);
    for (int k = 1; k <= kS2Candidates; ++k) {
      F d[kUnroll], inv[kUnroll], sse[kUnroll], sum_lw[kUnroll];
      I sum_ll[kUnroll];
      M valid[kUnroll];
      for (int u = 0; u < kUnroll; ++u) {
        d[u] = V::RoundHalf(V::Div(amax[u], V::Set(S2Divisor(k))));
        valid[u] = V::Gt(d[u], V::Set(0.0f));
        inv[u] = InverseS2(d[u]);
        sse[u] = sum_lw[u] = V::Set(0.0f);
        sum_ll[u] = V::SetI(0);
      }
      for (int i = 0; i < n_; ++i) {
        for (int u = 0; u < kUnroll; ++u) {
          const F x = X(u, i);
          const I q = CodeS2(x, inv[u]);
          const I l = V::SubI(V::AddI(q, q), V::SetI(3));
          const F lf = V::ToFloat(l);
          const F e = V::Sub(V::Mul(d[u], lf), x);
          sse[u] = V::Add(sse[u], V::Mul(e, e));
          sum_lw[u] = V::Add(sum_lw[u], V::Mul(lf, x));
          sum_ll[u] = V::AddI(sum_ll[u], V::MulI(l, l));
        }
      }
      F refined[kUnroll], refined_sse[kUnroll];
      for (int u = 0; u < kUnroll; ++u) {
        const M better = V::And(valid[u], V::Lt(sse[u], best_sse[u]));
        best_d[u] = V::Select(better, d[u], best_d[u]);
        best_sse[u] = V::Select(better, sse[u], best_sse[u]);
        refined[u] = V::RoundHalf(V::Div(sum_lw[u], V::ToFloat(sum_ll[u])));
        valid[u] = V::And(valid[u], V::Gt(refined[u], V::Set(0.0f)));
      }
      Sse<Scheme::kS2>(refined, zero, refined_sse);
      for (int u = 0; u < kUnroll; ++u) {
        const M better = V::And(valid[u], V::Lt(refined_sse[u], best_sse[u]));
        best_d[u] = V::Select(better, refined[u], best_d[u]);
        best_sse[u] = V::Select(better, refined_sse[u], best_sse[u]);
      }
    }
    alignas(64) float m_unused[kBatch];
    Finish<Scheme::kS2>(best_d, zero, d_out, m_unused, codes, error);
  }

  int n_;
  alignas(64) float wt_[kUnroll][64][kLanes];  // wt_[u][i][lane]: weight i of group u * kLanes + lane
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
    SimdFitter<V>::Fit(s, w + g * n, d + g, m + g, codes + g * n, error);
  }
  return batches * kBatch;
}

}  // namespace strata::kernels::internal

#endif  // STRATA_KERNELS_CPU_QUANTIZE_FIT_SIMD_H_
