"""Matrix-vector kernels compiled on the user's machine, for its own vector unit.

A decode step multiplies every weight matrix by one row (a verifying pass: a few), so it is as
fast as the weights stream. torch's kernels for 8- and 16-bit weights are written for other
shapes: on a 2-core AMD EPYC (Zen 3, AVX2) ``_weight_int8pack_mm`` streamed a d12 layer's int8
weights at 6-14 GB/s, and fbgemm's int8 (faster) quantises the activations too, which put its
error past int8 mode's bound on random weights (docs/PERFORMANCE.md, "Native kernels").

The loops below are plain C++ written so that a compiler vectorises them: each dot product keeps
:data:`LANES` independent sums (four AVX2 registers, two AVX-512 ones, eight NEON ones), so
multiply-adds never wait on each other, and the weight is read once for all rows of a pass. They
are compiled here with ``-O3 -march=native``: the compiler emits the instructions this CPU has
(AVX-512, AVX2, NEON), with no table of CPUs. The products sum in another order than torch's,
which the lossy modes allow (they promise an error bound, not bits), and whether they are used is
decided as for every kernel: timed against the others on the real shapes
(:mod:`.tuning`), and checked against the mode's error bound on the real weights.

The build (~50 s on two cores) happens once per machine, CPU and torch version, at the first load
in a lossy mode: the library is kept in the cache folder beside the kernel timings, under a name
that holds a digest of the source, the compiler flags, torch's version and the CPU. Where no
compiler is found (a frozen app, no C++ toolchain) or the build fails, there are no native
kernels, and the log says why; the modes keep torch's kernels.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
import sysconfig
import threading
from pathlib import Path
from typing import Any

import torch

from desktop.engine.kernels.machine import machine_id
from desktop.engine.text_lines import error_text

logger = logging.getLogger(__name__)

LANES = 32  # independent partial sums per dot product (see the module docstring)
# OpenMP: at::parallel_for is inline in torch's headers, and runs on torch's OpenMP threads only
# when compiled with it (torch's Linux builds use OpenMP; Apple's clang has no -fopenmp, so a
# Mac's kernels run on one thread, and are used only where timed faster all the same).
FLAGS = ("-O3", "-march=native", "-fno-math-errno", *(() if sys.platform == "darwin" else ("-fopenmp",)))
# Rows a native product takes (rows_times has a case for each); longer passes (a prompt) are a
# GEMM, which torch's BLAS does well.
MAX_ROWS = 8

SOURCE = r"""
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <cstdint>
#include <cstring>
#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t LANES = @LANES@;

inline void widen(const int8_t* w, float* out) {
#if defined(__AVX2__)  // one load-and-extend a lane of 8 (the vectoriser splits a 32-byte load)
  for (int j = 0; j < LANES; j += 8)
    _mm256_storeu_ps(out + j, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + j)))));
#else
  for (int j = 0; j < LANES; ++j) out[j] = static_cast<float>(w[j]);
#endif
}

inline float half_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  if (exp == 0) {
    if (man == 0) { bits = sign; }
    else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((man & 0x400u) == 0) { man <<= 1; --exp; }
      bits = sign | (exp << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) { bits = sign | 0x7f800000u | (man << 13); }
  else { bits = sign | ((exp + 127 - 15) << 23) | (man << 13); }
  float f; std::memcpy(&f, &bits, 4); return f;
}

inline void widen(const uint16_t* w, float* out) {
#if defined(__F16C__)
  for (int j = 0; j < LANES; j += 8)
    _mm256_storeu_ps(out + j, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + j))));
#elif defined(__aarch64__)
  const __fp16* h = reinterpret_cast<const __fp16*>(w);
  for (int j = 0; j < LANES; ++j) out[j] = static_cast<float>(h[j]);
#else
  for (int j = 0; j < LANES; ++j) out[j] = half_to_float(w[j]);
#endif
}

inline float widen_one(int8_t w) { return static_cast<float>(w); }
inline float widen_one(uint16_t w) { return half_to_float(w); }

inline float total(float* acc) {
  for (int width = LANES / 2; width >= 8; width /= 2)  // a tree of vector adds, then 7 scalar ones
    for (int j = 0; j < width; ++j) acc[j] += acc[j + width];
  float sum = 0;
  for (int j = 0; j < 8; ++j) sum += acc[j];
  return sum;
}

// sum_k x[k] * w[k], the weight widened to fp32 on the fly.
template <typename W>
inline float dot(const float* x, const W* w, int64_t K) {
  alignas(64) float wide[LANES];
  alignas(64) float acc[LANES] = {0};
  int64_t k = 0;
  for (; k + LANES <= K; k += LANES) {
    widen(w + k, wide);
    for (int j = 0; j < LANES; ++j) acc[j] += x[k + j] * wide[j];
  }
  float sum = total(acc);
  for (; k < K; ++k) sum += x[k] * widen_one(w[k]);
  return sum;
}

// Eight floats as one value (GCC's and clang's vector extension: a register of AVX2, half of
// AVX-512's, two of NEON's), so that a pass's row sums stay in registers.
typedef float v8 __attribute__((vector_size(32)));

inline v8 load8(const float* p) {
  v8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// R rows of x times one weight row: each block of the weight is widened once, and every row's
// sums use it while it is in registers (R independent chains of multiply-adds).
template <int R, typename W>
inline void rows_dot(const float* x, const W* w, int64_t K, float factor, float* y, int64_t stride) {
  v8 acc[R] = {};
  alignas(64) float wide[LANES];
  int64_t k = 0;
  for (; k + LANES <= K; k += LANES) {
    widen(w + k, wide);
    for (int b = 0; b < LANES; b += 8) {
      v8 weights = load8(wide + b);
      for (int r = 0; r < R; ++r) acc[r] += load8(x + r * K + k + b) * weights;
    }
  }
  for (int r = 0; r < R; ++r) {
    float sum = 0;
    for (int j = 0; j < 8; ++j) sum += acc[r][j];
    for (int64_t t = k; t < K; ++t) sum += x[r * K + t] * widen_one(w[t]);
    y[r * stride] = sum * factor;
  }
}

// y[r][n] = scale[n] * sum_k x[r][k] * w[n][k] for every row r of x (at most 8): the weight is
// read from memory once for all rows.
template <typename W>
void rows_times(const float* x, const W* w, const float* scale, float* y, int64_t R, int64_t N, int64_t K) {
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const W* row = w + n * K;
      float factor = scale != nullptr ? scale[n] : 1.0f;
      switch (R) {
        case 1: y[n] = dot(x, row, K) * factor; break;
        case 2: rows_dot<2>(x, row, K, factor, y + n, N); break;
        case 3: rows_dot<3>(x, row, K, factor, y + n, N); break;
        case 4: rows_dot<4>(x, row, K, factor, y + n, N); break;
        case 5: rows_dot<5>(x, row, K, factor, y + n, N); break;
        case 6: rows_dot<6>(x, row, K, factor, y + n, N); break;
        case 7: rows_dot<7>(x, row, K, factor, y + n, N); break;
        default: rows_dot<8>(x, row, K, factor, y + n, N); break;
      }
    }
  });
}

void check(const at::Tensor& x, const at::Tensor& w, at::ScalarType dtype) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && x.dim() == 2, "x: contiguous fp32 rows");
  TORCH_CHECK(w.scalar_type() == dtype && w.is_contiguous() && w.dim() == 2, "w: contiguous matrix");
  TORCH_CHECK(x.size(1) == w.size(1), "x and w differ in columns");
}

at::Tensor int8_rows(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale) {
  check(x, w, at::kChar);
  TORCH_CHECK(x.size(0) >= 1 && x.size(0) <= @MAX_ROWS@, "1 to @MAX_ROWS@ rows");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous(), "scale: contiguous fp32");
  TORCH_CHECK(scale.numel() == w.size(0), "one scale per row of w");
  auto y = at::empty({x.size(0), w.size(0)}, x.options());
  rows_times<int8_t>(x.data_ptr<float>(), w.data_ptr<int8_t>(), scale.data_ptr<float>(), y.data_ptr<float>(),
                     x.size(0), w.size(0), w.size(1));
  return y;
}

at::Tensor fp16_rows(const at::Tensor& x, const at::Tensor& w) {
  check(x, w, at::kHalf);
  TORCH_CHECK(x.size(0) >= 1 && x.size(0) <= @MAX_ROWS@, "1 to @MAX_ROWS@ rows");
  auto y = at::empty({x.size(0), w.size(0)}, x.options());
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(w.data_ptr<at::Half>());
  rows_times<uint16_t>(x.data_ptr<float>(), bits, nullptr, y.data_ptr<float>(),
                       x.size(0), w.size(0), w.size(1));
  return y;
}

}  // namespace

TORCH_LIBRARY(@LIBRARY@, m) {
  m.def("int8_rows(Tensor x, Tensor w, Tensor scale) -> Tensor");
  m.def("fp16_rows(Tensor x, Tensor w) -> Tensor");
}

TORCH_LIBRARY_IMPL(@LIBRARY@, CPU, m) {
  m.impl("int8_rows", &int8_rows);
  m.impl("fp16_rows", &fp16_rows);
}
"""

# A folder named here holds the build instead (the tests: one build per machine, not per home).
BUILD_DIR_VARIABLE = "NANOSCOPE_NATIVE_DIR"
_lock = threading.Lock()
_state: dict[str, object] = {}  # "ops": the loaded operators, or "why": why there are none


def _digest(library: str) -> str:
    text = "\n".join((SOURCE, library, " ".join(FLAGS), machine_id(), sys.version))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def why_no_toolchain() -> str | None:
    """Why no C++ code can be built for this Python here (one line), or None when it can: what
    this module and inductor's CPU code generation (decode/compiled_draft.py) both need."""
    if getattr(sys, "frozen", False):
        return "a frozen app has no compiler toolchain"
    # CXX may carry a launcher or flags ("ccache g++"): its first word is the program.
    compiler = (os.environ.get("CXX") or ("clang++" if sys.platform == "darwin" else "g++")).split()[0]
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler}) on the PATH"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        return "Python's headers (Python.h) are not installed"
    return None


def why_no_compiler() -> str | None:
    """Why the native kernels cannot be built here (one line), or None when they can."""
    why = why_no_toolchain()
    if why is not None:
        return why
    if not _ninja_on_path():
        return "ninja (the build tool torch's extensions need) is not installed"
    return None


def _ninja_on_path() -> bool:
    """Whether torch's extension builder finds ninja: on the PATH, or the ``ninja`` wheel's
    program (a dependency), whose folder is put on this process's PATH (an app started by
    double-click does not have its venv's bin folder there)."""
    if shutil.which("ninja") is not None:
        return True
    try:
        import ninja
    except ImportError:
        return False
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    return shutil.which("ninja") is not None


def native_ops(folder: Path | None) -> Any:
    """The native operators (``int8_rows``, ``fp16_rows``), built on first use in ``folder``
    (kept there across sessions; None: torch's own folder for extensions) and loaded; None where
    they cannot be (the log says why, once)."""
    with _lock:
        if "ops" in _state or "why" in _state:
            return _state.get("ops")
        why = why_no_compiler()
        if why is None:
            try:
                _state["ops"] = _build(folder)
                return _state["ops"]
            except Exception as exc:  # a failed build leaves torch's kernels, as no compiler does
                why = error_text(exc, named=True)
        _state["why"] = why
        logger.info("no native matrix kernels: %s", why)
        return None


def _build(root: Path | None) -> Any:
    from torch.utils import cpp_extension

    library = "nanoscope_native"
    digest = _digest(library)
    named = os.environ.get(BUILD_DIR_VARIABLE)
    if named:
        root = Path(named)
    elif root is None:
        root = Path(cpp_extension._get_build_directory("nanoscope", verbose=False)).parent
    folder = root / f"native-{digest}"
    folder.mkdir(parents=True, exist_ok=True)
    source = SOURCE.replace("@LANES@", str(LANES)).replace("@LIBRARY@", library)
    source = source.replace("@MAX_ROWS@", str(MAX_ROWS))
    logger.info("building the native matrix kernels in %s (once per machine)", folder)
    cpp_extension.load_inline(
        name=f"nanoscope_native_{digest}",
        cpp_sources=[source],
        extra_cflags=list(FLAGS),
        build_directory=str(folder),
        is_python_module=False,
        verbose=False,
    )
    _register_shapes(library)
    return getattr(torch.ops, library)


def _register_shapes(library: str) -> None:
    """What the operators return, without running them: compiled code (torch.compile) and the
    meta device plan with it."""

    def int8_rows(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return x.new_empty(x.shape[0], w.shape[0])

    def fp16_rows(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x.new_empty(x.shape[0], w.shape[0])

    torch.library.register_fake(f"{library}::int8_rows", int8_rows)
    torch.library.register_fake(f"{library}::fp16_rows", fp16_rows)
