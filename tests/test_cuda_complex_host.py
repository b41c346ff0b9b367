"""The CUDA kernels' complex math, checked without a GPU: the text NVRTC compiles (``cdefs.REAL_MATH`` and
``cdefs.COMPLEX_PREAMBLE``, the same strings ``PREAMBLE`` is built from) is built here with the host C++
compiler, behind a few macros that make CUDA's qualifiers plain C++, and run on points read from stdin.

Two checks per function and dtype:

- the array API standard's complex special cases (its tables for acos, acosh, asinh, atanh, cosh, sinh,
  tanh, exp, expm1, log, log1p and sqrt; asin, atan, sin, cos, tan through ``-1j * f(x*1j)`` as the
  standard defines them, log2 and log10 through log), extended by the symmetries the standard requires
  (``f(conj(z)) == conj(f(z))``; odd or even functions): NaN where it says NaN, the exact infinity and
  the sign of each zero it gives, either sign where it says "+-" or leaves the sign open;
- every other point, on a grid of special values and on random values of all magnitudes, against
  numpy computed in long double and rounded to the dtype (which sidesteps numpy's own overflow and
  rounding in its float and double loops): the same NaNs, infinities and zero signs (where the exact
  result is zero), and finite values within 1e-5 (complex64) or 1e-12 (complex128) of the result's
  magnitude. (They come out within about 3 ulps; the inverse functions, log and sqrt within 2 ulps
  in each part.)

The host's float functions (cosf, log1pf, ...) are not CUDA's libdevice ones; both are accurate to a few
ulps, well inside the tolerances. The build uses -O2 -ffp-contract=off (NVRTC runs with --fmad=false)
and never -ffast-math. Skips when no C++ compiler is installed.
"""

from __future__ import annotations

import math
import shutil
import subprocess

import numpy as np
import pytest

from laneflow.backends.cuda.kernels import cdefs

# CUDA's qualifiers as plain C++; <math.h> brings the C math functions and isfinite/isinf/signbit, which
# CUDA provides as device functions of the same names (INFINITY and NAN too, so the preamble's own
# definitions for NVRTC stay out).
_HOST_PREFIX = r"""
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <vector>
#define __device__
#define __host__
#define __forceinline__ inline
"""

FUNCTIONS = ("acos", "acosh", "asin", "asinh", "atan", "atanh", "cos", "cosh", "sin", "sinh", "tan", "tanh",
             "exp", "expm1", "log", "log1p", "log2", "log10", "sqrt")

# Reads (re, im) pairs of the dtype from stdin, applies lf_<argv[1]>, writes the results to stdout.
_HOST_MAIN = r"""
template <class T> static int lf_run(const char* fn) {
  std::vector<lf_cx<T>> v;
  lf_cx<T> z;
  while (fread(&z, sizeof z, 1, stdin) == 1) v.push_back(z);
  for (size_t i = 0; i < v.size(); ++i) {
#define LF_CASE(f) if (!strcmp(fn, #f)) v[i] = lf_##f(v[i]); else
    %s { fprintf(stderr, "unknown function %%s\n", fn); return 2; }
  }
  fwrite(v.data(), sizeof(lf_cx<T>), v.size(), stdout);
  return 0;
}
int main(int argc, char** argv) {
  if (argc != 3) return 2;
  return argv[2][0] == 'd' ? lf_run<double>(argv[1]) : lf_run<float>(argv[1]);
}
""" % " ".join(f"LF_CASE({f})" for f in FUNCTIONS)

_NUMPY = {"acos": "arccos", "acosh": "arccosh", "asin": "arcsin", "asinh": "arcsinh", "atan": "arctan",
          "atanh": "arctanh"}
DTYPES = ("complex64", "complex128")
_RTOL = {"complex64": 1e-5, "complex128": 1e-12}
# numpy's reference runs in long double; where that is double, numpy's complex128 loops overflow where
# ours do not (log1p of the largest numbers, expm1 just past exp's threshold), so complex128 is checked
# against the standard's tables only
_WIDE = np.finfo(np.longdouble).eps < np.finfo(np.float64).eps


def test_the_host_build_uses_the_text_nvrtc_compiles():
    assert cdefs.PREAMBLE.endswith(cdefs.REAL_MATH + cdefs.COMPLEX_PREAMBLE)


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    cxx = next((c for c in (shutil.which("g++"), shutil.which("c++"), shutil.which("clang++")) if c), None)
    if cxx is None:
        pytest.skip("no host C++ compiler (g++, c++ or clang++) to build the CUDA complex math with")
    d = tmp_path_factory.mktemp("cx_host")
    src, exe = d / "cx_host.cpp", d / "cx_host"
    src.write_text(_HOST_PREFIX + cdefs.REAL_MATH + cdefs.COMPLEX_PREAMBLE + _HOST_MAIN)
    r = subprocess.run([cxx, "-std=c++17", "-O2", "-ffp-contract=off", "-o", str(exe), str(src)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]

    def run(fn: str, z: np.ndarray) -> np.ndarray:
        z = np.ascontiguousarray(z)
        out = subprocess.run([str(exe), fn, "f" if z.dtype == np.complex64 else "d"], input=z.tobytes(),
                             capture_output=True, check=True)
        return np.frombuffer(out.stdout, dtype=z.dtype)

    return run


# --- the standard's special cases -----------------------------------------------------------------------

_COND = {
    "+0": lambda v: v == 0 and not math.copysign(1, v) < 0,
    "-0": lambda v: v == 0 and math.copysign(1, v) < 0,
    "0": lambda v: v == 0,
    "1": lambda v: v == 1,
    "-1": lambda v: v == -1,
    "+inf": lambda v: v == math.inf,
    "-inf": lambda v: v == -math.inf,
    "inf": math.isinf,
    "nan": math.isnan,
    "finite": math.isfinite,
    "nzfinite": lambda v: math.isfinite(v) and v != 0,
    "posfinite": lambda v: math.isfinite(v) and v > 0,
    "nz": lambda v: v != 0,  # "not equal to 0" (NaN included)
    "nznum": lambda v: v != 0 and not math.isnan(v),  # "a nonzero number"
    "any": lambda v: True,
}
_VALUE = {"+0": 0.0, "-0": -0.0, "0": 0.0, "1": 1.0, "-1": -1.0, "+inf": math.inf, "-inf": -math.inf, "inf": math.inf,
          "nan": math.nan, "pi": math.pi, "pi/2": math.pi / 2, "pi/4": math.pi / 4, "3pi/4": 3 * math.pi / 4}
_NN = ("nan", "nan")


def _inf_cis(a, b):  # +infinity * cis(b)
    return ((math.copysign(math.inf, math.cos(b)), False), (math.copysign(math.inf, math.sin(b)), False))


def _zero_cis(a, b):  # +0 * cis(b)
    return ((math.copysign(0.0, math.cos(b)), False), (math.copysign(0.0, math.sin(b)), False))


def _zero_cis_m1(a, b):  # +0 * cis(b) - 1
    return ((-1.0, False), (math.copysign(0.0, math.sin(b)), False))


# Each function's complex special cases as the standard lists them (a's condition, b's condition, result);
# "±" marks a sign the standard leaves open. Then the symmetries it requires besides conjugation.
STANDARD = {
    "acos": [("0", "+0", ("pi/2", "-0")), ("0", "nan", ("pi/2", "nan")), ("finite", "+inf", ("pi/2", "-inf")),
             ("nzfinite", "nan", _NN), ("-inf", "posfinite", ("pi", "-inf")), ("+inf", "posfinite", ("+0", "-inf")),
             ("-inf", "+inf", ("3pi/4", "-inf")), ("+inf", "+inf", ("pi/4", "-inf")), ("inf", "nan", ("nan", "±inf")),
             ("nan", "finite", _NN), ("nan", "+inf", ("nan", "-inf")), ("nan", "nan", _NN)],
    "acosh": [("0", "+0", ("+0", "pi/2")), ("finite", "+inf", ("+inf", "pi/2")), ("nzfinite", "nan", _NN),
              ("+0", "nan", ("nan", "±pi/2")), ("-inf", "posfinite", ("+inf", "pi")),
              ("+inf", "posfinite", ("+inf", "+0")), ("-inf", "+inf", ("+inf", "3pi/4")),
              ("+inf", "+inf", ("+inf", "pi/4")), ("inf", "nan", ("+inf", "nan")), ("nan", "finite", _NN),
              ("nan", "+inf", ("+inf", "nan")), ("nan", "nan", _NN)],
    "asinh": [("+0", "+0", ("+0", "+0")), ("posfinite", "+inf", ("+inf", "pi/2")), ("finite", "nan", _NN),
              ("+inf", "posfinite", ("+inf", "+0")), ("+inf", "+inf", ("+inf", "pi/4")), ("nan", "+0", ("nan", "+0")),
              ("nan", "nzfinite", _NN), ("nan", "+inf", ("±inf", "nan")), ("nan", "nan", _NN)],
    "atanh": [("+0", "+0", ("+0", "+0")), ("+0", "nan", ("+0", "nan")), ("1", "+0", ("+inf", "+0")),
              ("posfinite", "+inf", ("+0", "pi/2")), ("nzfinite", "nan", _NN), ("+inf", "posfinite", ("+0", "pi/2")),
              ("+inf", "+inf", ("+0", "pi/2")), ("+inf", "nan", ("+0", "nan")), ("nan", "finite", _NN),
              ("nan", "+inf", ("±0", "pi/2")), ("nan", "nan", _NN)],
    "cosh": [("+0", "+0", ("1", "+0")), ("+0", "+inf", ("nan", "±0")), ("+0", "nan", ("nan", "±0")),
             ("nzfinite", "+inf", _NN), ("nzfinite", "nan", _NN), ("+inf", "+0", ("+inf", "+0")),
             ("+inf", "nzfinite", _inf_cis), ("+inf", "+inf", ("±inf", "nan")), ("+inf", "nan", ("+inf", "nan")),
             ("nan", "0", ("nan", "±0")), ("nan", "nzfinite", _NN), ("nan", "nan", _NN)],
    "sinh": [("+0", "+0", ("+0", "+0")), ("+0", "+inf", ("±0", "nan")), ("+0", "nan", ("±0", "nan")),
             ("posfinite", "+inf", _NN), ("posfinite", "nan", _NN), ("+inf", "+0", ("+inf", "+0")),
             ("+inf", "posfinite", _inf_cis), ("+inf", "+inf", ("±inf", "nan")), ("+inf", "nan", ("±inf", "nan")),
             ("nan", "+0", ("nan", "+0")), ("nan", "nzfinite", _NN), ("nan", "nan", _NN)],
    "tanh": [("+0", "+0", ("+0", "+0")), ("nzfinite", "+inf", _NN), ("+0", "+inf", ("+0", "nan")),
             ("nzfinite", "nan", _NN), ("+0", "nan", ("+0", "nan")), ("+inf", "posfinite", ("1", "+0")),
             ("+inf", "+inf", ("1", "±0")), ("+inf", "nan", ("1", "±0")), ("nan", "+0", ("nan", "+0")),
             ("nan", "nznum", _NN), ("nan", "nan", _NN)],
    "exp": [("0", "+0", ("1", "+0")), ("finite", "+inf", _NN), ("finite", "nan", _NN), ("+inf", "+0", ("+inf", "+0")),
            ("-inf", "finite", _zero_cis), ("+inf", "nzfinite", _inf_cis), ("-inf", "+inf", ("±0", "±0")),
            ("+inf", "+inf", ("±inf", "nan")), ("-inf", "nan", ("±0", "±0")), ("+inf", "nan", ("±inf", "nan")),
            ("nan", "+0", ("nan", "+0")), ("nan", "nz", _NN), ("nan", "nan", _NN)],
    "expm1": [("0", "+0", ("+0", "+0")), ("finite", "+inf", _NN), ("finite", "nan", _NN),
              ("+inf", "+0", ("+inf", "+0")), ("-inf", "finite", _zero_cis_m1), ("+inf", "nzfinite", _inf_cis),
              ("-inf", "+inf", ("-1", "±0")), ("+inf", "+inf", ("±inf", "nan")), ("-inf", "nan", ("-1", "±0")),
              ("+inf", "nan", ("±inf", "nan")), ("nan", "+0", ("nan", "+0")), ("nan", "nz", _NN), ("nan", "nan", _NN)],
    "log": [("-0", "+0", ("-inf", "pi")), ("+0", "+0", ("-inf", "+0")), ("finite", "+inf", ("+inf", "pi/2")),
            ("finite", "nan", _NN), ("-inf", "posfinite", ("+inf", "pi")), ("+inf", "posfinite", ("+inf", "+0")),
            ("-inf", "+inf", ("+inf", "3pi/4")), ("+inf", "+inf", ("+inf", "pi/4")), ("inf", "nan", ("+inf", "nan")),
            ("nan", "finite", _NN), ("nan", "+inf", ("+inf", "nan")), ("nan", "nan", _NN)],
    "log1p": [("-1", "+0", ("-inf", "+0")), ("finite", "+inf", ("+inf", "pi/2")), ("finite", "nan", _NN),
              ("-inf", "posfinite", ("+inf", "pi")), ("+inf", "posfinite", ("+inf", "+0")),
              ("-inf", "+inf", ("+inf", "3pi/4")), ("+inf", "+inf", ("+inf", "pi/4")), ("inf", "nan", ("+inf", "nan")),
              ("nan", "finite", _NN), ("nan", "+inf", ("+inf", "nan")), ("nan", "nan", _NN)],
    "sqrt": [("0", "+0", ("+0", "+0")), ("any", "+inf", ("+inf", "+inf")), ("finite", "nan", _NN),
             ("-inf", "posfinite", ("+0", "+inf")), ("+inf", "posfinite", ("+inf", "+0")),
             ("-inf", "nan", ("nan", "±inf")), ("+inf", "nan", ("+inf", "nan")), ("nan", "any", _NN),
             ("nan", "nan", _NN)],
}
_ODD = {"asinh", "atanh", "sinh", "tanh"}
_EVEN = {"cosh"}
# the functions the standard defines through others: f(z) = -1j * g(1j * z) (or cos z = cosh(1j * z))
_ROTATED = {"asin": "asinh", "atan": "atanh", "sin": "sinh", "tan": "tanh"}


def _part(token: str):
    """(value, any sign) of a result part written like '-inf', '±0' or '3pi/4'."""
    return (_VALUE[token.lstrip("±")], token.startswith("±"))


def _direct(fn: str, a: float, b: float):
    """The index of the first rule of fn's table that applies to a + bj, and its result."""
    for n, (ca, cb, res) in enumerate(STANDARD[fn]):
        if _COND[ca](a) and _COND[cb](b):
            return n, (res(a, b) if callable(res) else (_part(res[0]), _part(res[1])))
    return None


def _neg(p):
    return (-p[0], p[1])


def _tabled(fn: str, a: float, b: float):
    """The standard's result for a + bj from fn's table and its symmetries: of the images of a + bj that a
    rule applies to, the one whose rule comes first (the tables overlap once: sqrt's "NaN and any value"
    and "any value and +infinity")."""
    images = [((a, b), lambda r: r), ((a, -b), lambda r: (r[0], _neg(r[1])))]  # conjugation
    if fn in _ODD:
        images += [((-a, -b), lambda r: (_neg(r[0]), _neg(r[1]))), ((-a, b), lambda r: (_neg(r[0]), r[1]))]
    if fn in _EVEN:
        images += [((-a, -b), lambda r: r), ((-a, b), lambda r: (r[0], _neg(r[1])))]
    found = []
    for (ia, ib), back in images:
        hit = _direct(fn, ia, ib)
        if hit is not None:
            found.append((hit[0], back(hit[1])))
    return min(found, key=lambda f: f[0])[1] if found else None


def standard_result(fn: str, a: float, b: float):
    """((re, any sign), (im, any sign)) the standard gives f(a + bj), or None."""
    if fn in _ROTATED or fn == "cos":  # w = 1j * z = -b + aj
        r = _tabled(_ROTATED.get(fn, "cosh"), -b, a)
        if r is None or fn == "cos":
            return r
        return (r[1], _neg(r[0]))  # -1j * (p + qj) = q - pj
    if fn in ("log2", "log10"):
        r = _tabled("log", a, b)
        if r is None:
            return None
        k = 1 / math.log(2.0 if fn == "log2" else 10.0)
        return ((r[0][0] * k, r[0][1]), (r[1][0] * k, r[1][1]))
    return _tabled(fn, a, b)


def _part_ok(got: float, want: float, any_sign: bool, rtol: float) -> bool:
    if math.isnan(want):
        return math.isnan(got)
    if any_sign:
        got, want = abs(got), abs(want)
    if want == 0 or math.isinf(want):
        return got == want and (any_sign or math.copysign(1, got) == math.copysign(1, want))
    return abs(got - want) <= rtol * abs(want)


# --- inputs ----------------------------------------------------------------------------------------------

def _grid_values(dtype: str) -> np.ndarray:
    f = np.float32 if dtype == "complex64" else np.float64
    fi = np.finfo(f)
    big = 1e19 if f is np.float32 else 1e300
    den = 1e-40 if f is np.float32 else 1e-310  # subnormal
    mags = [0.0, 1.0, 0.5, 2.0, math.inf, 1e-30, big, den, float(fi.smallest_subnormal), float(fi.max),
            float(fi.smallest_normal), 1 - float(fi.eps) / 2, 1 + float(fi.eps), 3.0]
    return np.array([s * m for m in mags for s in (1.0, -1.0)] + [math.nan], dtype=f)


def grid(dtype: str) -> np.ndarray:
    v = _grid_values(dtype)
    re, im = np.meshgrid(v, v)
    return _complex(re.ravel(), im.ravel(), dtype)


def _complex(re, im, dtype: str) -> np.ndarray:
    z = np.empty(len(re), dtype=dtype)
    z.real, z.imag = re, im  # (re + 1j * im would turn an infinite part's partner into NaN)
    return z


def random_points(dtype: str, n: int = 3000, seed: int = 7) -> np.ndarray:
    """Uniform values, values of every magnitude (subnormal to near the largest), and the neighbourhoods
    where the formulas cancel: near +-1 and +-i, on the unit circle and near |z| = 1/eps."""
    rng = np.random.default_rng(seed)
    f = np.float32 if dtype == "complex64" else np.float64
    lo, hi = (-44.0, 38.0) if f is np.float32 else (-322.0, 307.5)
    eps = float(np.finfo(f).eps)

    def sign(k):
        return rng.choice([-1.0, 1.0], k)

    def logu(a, b, k):
        return 10.0 ** rng.uniform(a, b, k)

    parts = [
        (rng.uniform(-4, 4, n), rng.uniform(-4, 4, n)),
        (sign(n) * logu(lo, hi, n), sign(n) * logu(lo, hi, n)),
        (sign(n) * logu(-3, 3, n), sign(n) * logu(lo, hi, n)),
        (sign(n) * logu(lo, hi, n), sign(n) * logu(-3, 3, n)),
        (sign(n) * (1 + sign(n) * logu(math.log10(eps), -1, n)), sign(n) * logu(lo, 0, n)),  # near +-1
        (sign(n) * logu(lo, 0, n), sign(n) * (1 + sign(n) * logu(math.log10(eps), -1, n))),  # near +-i
        (sign(n) * logu(-9, 2, n), sign(n) * logu(-9, 2, n)),
        (sign(n) * logu(math.log10(1 / eps) - 2, math.log10(1 / eps) + 2, n), rng.uniform(-4, 4, n)),
        (rng.uniform(-100, 100, n), rng.uniform(-100, 100, n)),  # exp and friends past their overflow
        (sign(n) * rng.uniform(80, 200, n) * (8 if f is np.float64 else 1), sign(n) * logu(lo, 1, n)),
    ]
    theta = rng.uniform(-math.pi, math.pi, n)
    r = 1 + sign(n) * logu(math.log10(eps), -2, n)
    parts.append((r * np.cos(theta), r * np.sin(theta)))  # near the unit circle
    re = np.concatenate([p[0] for p in parts]).astype(f)
    im = np.concatenate([p[1] for p in parts]).astype(f)
    return _complex(re, im, dtype)


# --- checks ----------------------------------------------------------------------------------------------

def numpy_reference(fn: str, z: np.ndarray) -> np.ndarray:
    """numpy's f in the widest complex type (x87 extended on x86-64 Linux: 11 more bits than double and
    a far wider range, so neither dtype's results meet numpy's own overflow or rounding), with two fixes
    where numpy's complex loops are naive: log1p takes log(1 + z), 0 for z = 1e-30, so small z get
    Re = log1p(2x + x^2 + y^2) / 2 and Im = atan2(y, 1 + x); expm1 of a real x takes exp(x) * sin(0) for
    the imaginary part, NaN once exp(x) overflows, where the real axis gives expm1(x) + 0j (C99's and
    the standard's exp(+inf + 0j) = +inf + 0j, less one)."""
    w = z.astype(np.clongdouble)
    x, y = w.real, w.imag
    with np.errstate(all="ignore"):
        if fn == "log1p":
            w1 = w.copy()
            w1.real += 1  # (1 + w would add 0j to the imaginary part, turning -0 into +0)
            ref = np.log(w1)
            small = np.abs(w) < 0.5
            ref.real[small] = np.log1p(x[small] * (2 + x[small]) + y[small] * y[small]) / 2
            ref.imag[small] = np.arctan2(y[small], 1 + x[small])
            return ref
        ref = getattr(np, _NUMPY.get(fn, fn))(w)
        if fn == "expm1":
            axis = (y == 0) & ~np.isnan(x)
            ref.real[axis], ref.imag[axis] = np.expm1(x[axis]), y[axis]
    return ref


def _numpy_mismatches(fn: str, z, got, refw, rtol: float) -> list[str]:
    """Points where got and numpy disagree: NaN parts, infinities, the sign of a zero where the exact
    result is zero (zeros that the wider reference rounds to carry no meaningful sign), or finite values
    further apart than rtol times the result's magnitude."""
    dt = z.dtype
    with np.errstate(all="ignore"):
        ref = refw.astype(dt)
    tiny = float(np.finfo(np.float32 if dt == np.complex64 else np.float64).smallest_normal)
    bad = np.zeros(len(z), dtype=bool)
    for g, w, exact in ((got.real, ref.real, refw.real), (got.imag, ref.imag, refw.imag)):
        bad |= np.isnan(g) != np.isnan(w)
        inf = np.isinf(w) | np.isinf(g)
        bad |= inf & (g != w)
        zero = (g == 0) & (exact == 0)
        bad |= zero & (np.signbit(g) != np.signbit(exact))
    fin = np.isfinite(ref.real) & np.isfinite(ref.imag) & np.isfinite(got.real) & np.isfinite(got.imag)
    with np.errstate(all="ignore"):
        err = np.abs(got.astype(np.clongdouble) - ref.astype(np.clongdouble))
        bad |= fin & (err > rtol * np.abs(ref.astype(np.clongdouble)) + tiny)
        # an infinite part beside a finite one: the finite part on its own
        for g, w, other in ((got.real, ref.real, ref.imag), (got.imag, ref.imag, ref.real)):
            lone = np.isfinite(w) & np.isinf(other)
            e = np.abs(g.astype(np.longdouble) - w.astype(np.longdouble))
            bad |= lone & (e > rtol * np.abs(w.astype(np.longdouble)) + tiny)
    return [f"{fn}({z[i]!r}) = {got[i]!r}, numpy {refw[i]!r}" for i in np.flatnonzero(bad)]


def check(fn: str, z: np.ndarray, got: np.ndarray) -> list[str]:
    rtol = _RTOL[str(z.dtype)]
    ref = numpy_reference(fn, z)
    tabled = np.zeros(len(z), dtype=bool)
    problems = []
    for i, (a, b) in enumerate(zip(z.real.tolist(), z.imag.tolist())):
        want = standard_result(fn, a, b)
        if want is None:
            continue
        tabled[i] = True
        g = got[i]
        if not (_part_ok(float(g.real), *want[0], 1e-6) and _part_ok(float(g.imag), *want[1], 1e-6)):
            problems.append(f"{fn}({z[i]!r}) = {g!r}, the standard: {want}")
    if _WIDE or z.dtype == np.complex64:
        rest = ~tabled
        problems += _numpy_mismatches(fn, z[rest], got[rest], ref[rest], rtol)
    return problems


def _report(problems: list[str]) -> str:
    return f"{len(problems)} mismatches:\n" + "\n".join(problems[:40])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn", FUNCTIONS)
def test_special_values_follow_the_standard_and_numpy(harness, fn, dtype):
    z = grid(dtype)
    problems = check(fn, z, harness(fn, z))
    assert not problems, _report(problems)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn", FUNCTIONS)
def test_values_of_every_magnitude_match_numpy(harness, fn, dtype):
    if dtype == "complex128" and not _WIDE:
        pytest.skip("numpy's long double is double here: no reference wider than complex128")
    z = random_points(dtype)
    problems = check(fn, z, harness(fn, z))
    assert not problems, _report(problems)


def test_inverse_functions_past_the_overflow_of_their_squares(harness):
    """The array API suite's GPU failure: z = 1 + 1.3043819e19j, whose square overflows complex64, gave
    infinite parts (acos z = 1.5707963 - 44.708j, asin z = 7.67e-20 + 44.708j, asinh z = 44.708 +
    1.5707963j)."""
    z = np.array([1 + 1.3043819e19j], dtype=np.complex64)
    for fn in ("acos", "asin", "asinh", "acosh", "atanh", "atan", "log", "sqrt"):
        got = harness(fn, z)
        want = numpy_reference(fn, z).astype(np.complex128)
        assert np.isfinite(got).all(), (fn, got)
        np.testing.assert_allclose(got.real, want.real, rtol=1e-6, err_msg=fn)
        np.testing.assert_allclose(got.imag, want.imag, rtol=1e-6, err_msg=fn)
