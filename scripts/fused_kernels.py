"""The C++ kernels `scripts/bench_fused_scorer.py` measures, and their compiling: the
decoder loop's concat scorer forward and backward, the GRU gates forward and backward, and
decoding's scorer, each one pass over its tensors where torch's operators make several.
float32 CPU tensors only. Compiled at run time by `torch.utils.cpp_extension.load_inline`
(g++ with OpenMP, for this CPU's own instructions) into a folder the caller gives.
"""

from __future__ import annotations

from typing import Any

# sig = σ(2qp + 2k) (B, S, A), the form the loop keeps (`nmt.attention.additive_hidden`), and
# scores = 2 vᵀsig − Σv (B, S) = vᵀ tanh(qp + k), in one pass over (B, S, A). The backward
# from the scores' gradient ds (B, S): slope = ds σ(1 − σ) added into the keys' gradient
# (summed over steps; `first` writes it), d_qp = 4v ⊙ Σ_s slope (B, A) returned, and
# d_v += 2 sigᵀds − Σds, in one pass. Rows are split over ATen's threads (OpenMP).
KERNELS = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>

std::vector<torch::Tensor> fwd(torch::Tensor qp, torch::Tensor keys, torch::Tensor v) {
  const int64_t S = keys.size(1), A = keys.size(2), rows = keys.size(0) * S;
  auto sig = torch::empty_like(keys);
  auto scores = torch::empty({keys.size(0), S}, keys.options());
  const float *q = qp.data_ptr<float>(), *k = keys.data_ptr<float>(), *vv = v.data_ptr<float>();
  float *sg = sig.data_ptr<float>(), *sc = scores.data_ptr<float>(), vsum = 0.f;
  for (int64_t a = 0; a < A; ++a) vsum += vv[a];  // Σv, here rather than read back a step
  at::parallel_for(0, rows, 8, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const float *qr = q + (i / S) * A, *kr = k + i * A;
      float *o = sg + i * A, acc = 0.f;
      for (int64_t a = 0; a < A; ++a) o[a] = 1.f / (1.f + expf(-2.f * (qr[a] + kr[a])));
      for (int64_t a = 0; a < A; ++a) acc += vv[a] * o[a];
      sc[i] = 2.f * acc - vsum;
    }
  });
  return {sig, scores};
}

torch::Tensor bwd(torch::Tensor ds, torch::Tensor sig, torch::Tensor dk, torch::Tensor dv,
                  torch::Tensor v4, bool first) {
  const int64_t B = sig.size(0), S = sig.size(1), A = sig.size(2);
  auto dqp = torch::zeros({B, A}, sig.options());
  auto part = torch::zeros({at::get_num_threads(), A}, sig.options());  // each thread's Σ ds σ
  const float *d = ds.data_ptr<float>(), *sg = sig.data_ptr<float>(), *f = v4.data_ptr<float>();
  float *k = dk.data_ptr<float>(), *dq = dqp.data_ptr<float>(), *pp = part.data_ptr<float>();
  at::parallel_for(0, B, 1, [&](int64_t lo, int64_t hi) {
    float *p = pp + at::get_thread_num() * A;
    for (int64_t b = lo; b < hi; ++b) {
      float *out = dq + b * A;
      for (int64_t s = 0; s < S; ++s) {
        const int64_t i = b * S + s;
        const float g = d[i], *sr = sg + i * A;
        float *kr = k + i * A;
        for (int64_t a = 0; a < A; ++a) {
          const float x = sr[a], slope = g * x * (1.f - x);
          kr[a] = first ? slope : kr[a] + slope;
          out[a] += slope;
          p[a] += g * x;
        }
      }
      for (int64_t a = 0; a < A; ++a) out[a] *= f[a];
    }
  });
  dv.add_(part.sum(0), 2).sub_(ds.sum());
  return dqp;
}

// The GRU's gates after its two products (`nmt.gru_cell.gru_gates`), one pass over rows of
// 3H: tensors (P, N, ·) whose last dimension is contiguous (a step's slots, the encoder's
// two directions). r, z = σ(gi + gh) (first 2H), n = tanh(gi_n + r gh_n), h' = n + z (h − n)
// into `out`; rz and n are returned for the backward.
#define ROW(t, p, i) ((t).data_ptr<float>() + (p) * (t).stride(0) + (i) * (t).stride(1))
std::vector<torch::Tensor> gates(torch::Tensor gi, torch::Tensor gh, torch::Tensor h,
                                 torch::Tensor out) {
  const int64_t P = h.size(0), N = h.size(1), H = h.size(2);
  auto rz = torch::empty({P, N, 2 * H}, h.options()), n = torch::empty({P, N, H}, h.options());
  at::parallel_for(0, P * N, 4, [&](int64_t lo, int64_t hi) {
    for (int64_t j = lo; j < hi; ++j) {
      const int64_t p = j / N, i = j % N;
      const float *x = ROW(gi, p, i), *y = ROW(gh, p, i), *hr = ROW(h, p, i);
      float *g = ROW(rz, p, i), *nr = ROW(n, p, i), *o = ROW(out, p, i);
      for (int64_t a = 0; a < 2 * H; ++a) g[a] = 1.f / (1.f + expf(-(x[a] + y[a])));
      for (int64_t a = 0; a < H; ++a) {
        const float e = expf(2.f * (x[2 * H + a] + g[a] * y[2 * H + a]));
        nr[a] = 1.f - 2.f / (1.f + e);
        o[a] = nr[a] + g[H + a] * (hr[a] - nr[a]);
      }
    }
  });
  return {rz, n};
}

// `gru_gates_back`: from dh (P, N, H) the gates' gradients written into d_gi and d_gh (P, N,
// 3H) and h's own share dh ⊙ z returned.
torch::Tensor gates_back(torch::Tensor dh, torch::Tensor rz, torch::Tensor n, torch::Tensor h,
                         torch::Tensor gh, torch::Tensor d_gi, torch::Tensor d_gh) {
  const int64_t P = h.size(0), N = h.size(1), H = h.size(2);
  auto dh_z = torch::empty({P, N, H}, h.options());
  at::parallel_for(0, P * N, 4, [&](int64_t lo, int64_t hi) {
    for (int64_t j = lo; j < hi; ++j) {
      const int64_t p = j / N, i = j % N;
      const float *d = ROW(dh, p, i), *g = ROW(rz, p, i), *nr = ROW(n, p, i);
      const float *hr = ROW(h, p, i), *y = ROW(gh, p, i) + 2 * H;
      float *dx = ROW(d_gi, p, i), *dy = ROW(d_gh, p, i), *dz = ROW(dh_z, p, i);
      for (int64_t a = 0; a < H; ++a) {
        const float r = g[a], z = g[H + a], m = nr[a];
        const float dn = d[a] * (1.f - z) * (1.f - m * m);
        const float dr = dn * y[a] * r * (1.f - r), dzp = d[a] * (hr[a] - m) * z * (1.f - z);
        dx[2 * H + a] = dn; dx[a] = dr; dx[H + a] = dzp;
        dy[a] = dr; dy[H + a] = dzp; dy[2 * H + a] = dn * r;
        dz[a] = d[a] * z;
      }
    }
  });
  return dh_z;
}

// Decoding, no gradient: scores[r, s] = vᵀ tanh(q[r] + keys[r / group, s]) (R, S), as
// Σv − 2 Σ v / (1 + exp(2x)); `group` rows of q a sentence (a beam's hypotheses).
torch::Tensor dec(torch::Tensor q, torch::Tensor keys, torch::Tensor v, int64_t group) {
  const int64_t R = q.size(0), S = keys.size(1), A = keys.size(2);
  auto scores = torch::empty({R, S}, q.options());
  const float *qq = q.data_ptr<float>(), *k = keys.data_ptr<float>(), *vv = v.data_ptr<float>();
  float *sc = scores.data_ptr<float>(), vsum = 0.f;
  for (int64_t a = 0; a < A; ++a) vsum += vv[a];
  at::parallel_for(0, R * S, 8, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t r = i / S;
      const float *qr = qq + r * A, *kr = k + ((r / group) * S + i % S) * A;
      float acc = 0.f;
      for (int64_t a = 0; a < A; ++a) acc += vv[a] / (1.f + expf(2.f * (qr[a] + kr[a])));
      sc[i] = vsum - 2.f * acc;
    }
  });
  return scores;
}
"""


# What KERNELS defines, and the extension exposes.
NAMES = ("fwd", "bwd", "dec", "gates", "gates_back")


def compiled(build: str) -> Any:
    """The kernels, compiled into `build`; a one-line exit where no compiler can."""
    from torch.utils.cpp_extension import load_inline

    flags = ["-O3", "-march=native", "-ffast-math", "-fopenmp"]
    try:
        return load_inline(
            "nmt_fused_scorer",
            cpp_sources=KERNELS,
            functions=list(NAMES),
            extra_cflags=flags,
            extra_ldflags=["-fopenmp"],
            build_directory=build,
        )
    except (RuntimeError, OSError) as e:
        first = (str(e).strip().splitlines() or ["no message"])[0]
        raise SystemExit(f"error: the fused kernels need a C++ compiler: {first}") from None
