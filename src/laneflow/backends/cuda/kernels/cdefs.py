"""C++ building blocks shared by the kernel templates: storage and compute types per dtype, the
half-precision conversions (inline PTX, so no CUDA headers are needed under NVRTC) and the
numpy-compatible scalar helpers (wrapping integer arithmetic, floor division, NaN-propagating
max/min).

Every dtype has a *storage* C type (what a buffer holds: float16 and bfloat16 are 16-bit words) and a
*compute* C type (what expressions use: float16 and bfloat16 compute in float, as numpy's loops do).
"""

from __future__ import annotations

import numpy as np

from ....dtypes import bfloat16, float16

_HALF = (float16, bfloat16)

STORAGE = {
    "bool": "bool", "int8": "signed char", "uint8": "unsigned char", "int16": "short",
    "uint16": "unsigned short", "int32": "int", "uint32": "unsigned", "int64": "long long",
    "uint64": "unsigned long long", "float16": "unsigned short", "bfloat16": "unsigned short",
    "float32": "float", "float64": "double",
}
COMPUTE = dict(STORAGE, float16="float", bfloat16="float")
#: kernel-parameter type code (see launch.py) of each dtype's compute type
PARAM = {
    "bool": "?", "int8": "b", "uint8": "B", "int16": "h", "uint16": "H", "int32": "i", "uint32": "I",
    "int64": "q", "uint64": "Q", "float16": "f", "bfloat16": "f", "float32": "f", "float64": "d",
}


_NAMES: dict = {}


def dname(dt: np.dtype) -> str:
    """The dtype's name (``str(np.dtype(dt))`` costs about half a microsecond: kept per dtype)."""
    name = _NAMES.get(dt)
    if name is None:
        name = _NAMES[dt] = str(np.dtype(dt))
    return name


def storage(dt: np.dtype) -> str:
    return STORAGE[dname(dt)]


def compute(dt: np.dtype) -> str:
    return COMPUTE[dname(dt)]


def kind(dt: np.dtype) -> str:
    """'b' bool, 'i' signed, 'u' unsigned, 'f' floating (incl. bfloat16)."""
    dt = np.dtype(dt)
    if dt == bfloat16:
        return "f"
    return dt.kind


def is_half(dt: np.dtype) -> bool:
    return np.dtype(dt) in _HALF


def load(expr: str, dt: np.dtype) -> str:
    """Storage value -> compute value."""
    n = dname(dt)
    if n == "float16":
        return f"lf_h2f({expr})"
    if n == "bfloat16":
        return f"lf_b2f({expr})"
    return f"({expr})"


def store(expr: str, dt: np.dtype) -> str:
    """Compute value of dt -> storage value."""
    n = dname(dt)
    if n == "float16":
        return f"lf_f2h({expr})"
    if n == "bfloat16":
        return f"lf_f2b({expr})"
    return f"({expr})"


def conv(expr: str, src: np.dtype, dst: np.dtype) -> str:
    """Compute value of src -> compute value of dst, with numpy's casting (unsafe, x86 behaviour)."""
    s, d = dname(src), dname(dst)
    if s == d:
        return expr
    ks, kd = kind(src), kind(dst)
    if kd == "b":
        return f"(({expr}) != 0)"
    if d in ("float16", "bfloat16"):
        rt = "lf_h2f" if d == "float16" else "lf_b2f"
        if s in ("float16", "bfloat16", "float32"):
            to = "lf_f2h" if d == "float16" else "lf_f2b"
            return f"{rt}({to}((float)({expr})))"
        to = "lf_d2h" if d == "float16" else "lf_d2b"
        return f"{rt}({to}((double)({expr})))"
    if kd == "f":
        return f"(({compute(dst)})({expr}))"
    # integer destination
    if ks == "f":
        # float -> int: truncate through 64 bits, then wrap (what x86 numpy does for in-range values)
        return f"(({compute(dst)})(long long)({expr}))"
    return f"(({compute(dst)})({expr}))"


PREAMBLE = r"""
#ifndef INFINITY
#define INFINITY (__int_as_float(0x7f800000))
#endif
struct Dims { long long v[8]; };

__device__ __forceinline__ float lf_h2f(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short lf_f2h(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ unsigned short lf_d2h(double d) { unsigned short h; asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(d)); return h; }
__device__ __forceinline__ float lf_b2f(unsigned short b) { return __uint_as_float(((unsigned)b) << 16); }
__device__ __forceinline__ unsigned short lf_f2b(float f) { unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
// double -> bfloat16 through float, as ml_dtypes (the CPU reference) converts.
__device__ __forceinline__ unsigned short lf_d2b(double d) { return lf_f2b((float)d); }

template <class T> struct lf_u { typedef T t; };
template <> struct lf_u<signed char> { typedef unsigned char t; };
template <> struct lf_u<short> { typedef unsigned short t; };
template <> struct lf_u<int> { typedef unsigned t; };
template <> struct lf_u<long long> { typedef unsigned long long t; };
template <class T> __device__ __forceinline__ T lf_wadd(T a, T b) { typedef typename lf_u<T>::t U; return (T)(U)((U)a + (U)b); }
template <class T> __device__ __forceinline__ T lf_wsub(T a, T b) { typedef typename lf_u<T>::t U; return (T)(U)((U)a - (U)b); }
template <class T> __device__ __forceinline__ T lf_wmul(T a, T b) { typedef typename lf_u<T>::t U; return (T)(U)((U)a * (U)b); }

template <class T> __device__ __forceinline__ T lf_floordiv_i(T a, T b) {
  if (b == 0) return 0;
  if (b == (T)-1) return lf_wsub<T>((T)0, a);
  T q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
  return q;
}
template <class T> __device__ __forceinline__ T lf_mod_i(T a, T b) {
  if (b == 0 || b == (T)-1) return 0;
  T r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}
template <class T> __device__ __forceinline__ T lf_floordiv_u(T a, T b) { return b == 0 ? (T)0 : (T)(a / b); }
template <class T> __device__ __forceinline__ T lf_mod_u(T a, T b) { return b == 0 ? (T)0 : (T)(a % b); }
template <class T> __device__ __forceinline__ T lf_ipow(T a, T b) {
  typedef typename lf_u<T>::t U;
  U r = 1, x = (U)a;
  long long e = (long long)b;
  if (e < 0) return 0;
  while (e) { if (e & 1) r = (U)(r * x); x = (U)(x * x); e >>= 1; }
  return (T)r;
}

__device__ __forceinline__ float lf_exp(float x) { return expf(x); }
__device__ __forceinline__ double lf_exp(double x) { return exp(x); }
__device__ __forceinline__ float lf_log(float x) { return logf(x); }
__device__ __forceinline__ double lf_log(double x) { return log(x); }
__device__ __forceinline__ float lf_log1p(float x) { return log1pf(x); }
__device__ __forceinline__ double lf_log1p(double x) { return log1p(x); }
__device__ __forceinline__ float lf_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double lf_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float lf_sin(float x) { return sinf(x); }
__device__ __forceinline__ double lf_sin(double x) { return sin(x); }
__device__ __forceinline__ float lf_cos(float x) { return cosf(x); }
__device__ __forceinline__ double lf_cos(double x) { return cos(x); }
__device__ __forceinline__ float lf_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double lf_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float lf_erf(float x) { return erff(x); }
__device__ __forceinline__ double lf_erf(double x) { return erf(x); }
__device__ __forceinline__ float lf_pow(float a, float b) { return powf(a, b); }
__device__ __forceinline__ double lf_pow(double a, double b) { return pow(a, b); }
__device__ __forceinline__ float lf_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double lf_abs(double x) { return fabs(x); }
__device__ __forceinline__ float lf_fmod(float a, float b) { return fmodf(a, b); }
__device__ __forceinline__ double lf_fmod(double a, double b) { return fmod(a, b); }
__device__ __forceinline__ float lf_floor(float x) { return floorf(x); }
__device__ __forceinline__ double lf_floor(double x) { return floor(x); }
__device__ __forceinline__ float lf_copysign(float a, float b) { return copysignf(a, b); }
__device__ __forceinline__ double lf_copysign(double a, double b) { return copysign(a, b); }
__device__ __forceinline__ float lf_hypot(float a, float b) { return hypotf(a, b); }
__device__ __forceinline__ double lf_hypot(double a, double b) { return hypot(a, b); }
// nextafter of float16 (BF 0) or bfloat16 (BF 1) values held in floats: one step of the 16-bit word.
template <int BF> __device__ __forceinline__ float lf_nextafter16(float a, float b) {
  if (a != a || b != b) return a + b;
  if (a == b) return b;
  unsigned short h = BF ? lf_f2b(a) : lf_f2h(a);
  if (a == 0.0f) h = b > 0.0f ? 0x0001 : 0x8001;
  else if ((a < b) == (a > 0.0f)) h += 1;
  else h -= 1;
  return BF ? lf_b2f(h) : lf_h2f(h);
}
__device__ __forceinline__ bool lf_isfinite(float x) { return isfinite(x); }
__device__ __forceinline__ bool lf_isfinite(double x) { return isfinite(x); }

// numpy's npy_divmod: floor division and remainder of floats.
template <class T> __device__ __forceinline__ T lf_floordiv_f(T a, T b) {
  if (b == 0) return a / b;
  T mod = lf_fmod(a, b);
  T div = (a - mod) / b;
  if (mod != 0) { if ((b < 0) != (mod < 0)) div -= 1; }
  T fl;
  if (div != 0) { fl = lf_floor(div); if (div - fl > (T)0.5) fl += 1; }
  else fl = lf_copysign((T)0, a / b);
  return fl;
}
template <class T> __device__ __forceinline__ T lf_mod_f(T a, T b) {
  if (b == 0) return lf_fmod(a, b);
  T mod = lf_fmod(a, b);
  if (mod != 0) { if ((b < 0) != (mod < 0)) mod += b; }
  else mod = lf_copysign((T)0, b);
  return mod;
}
// numpy's npy_logaddexp: equal arguments (infinities of one sign included) give x + log(2).
template <class T> __device__ __forceinline__ T lf_logaddexp(T x, T y) {
  if (x == y) return x + (T)0.693147180559945309417232121458176568;
  T d = x - y;
  if (d > 0) return x + lf_log1p(lf_exp(-d));
  if (d <= 0) return y + lf_log1p(lf_exp(d));
  return d;  // a NaN
}
// lf.nn's activations, computed as the op table's CPU references compute them
template <class T> __device__ __forceinline__ T lf_gelu(T x) {
  return (T)0.5 * x * ((T)1 + lf_erf(x * (T)0.70710678118654752440));
}
template <class T> __device__ __forceinline__ T lf_gelu_tanh(T x) {
  return (T)0.5 * x * ((T)1 + lf_tanh((T)0.79788456080286535588 * (x + (T)0.044715 * x * x * x)));
}
template <class T> __device__ __forceinline__ T lf_silu(T x) { return x / ((T)1 + lf_exp(-x)); }
template <class T> __device__ __forceinline__ T lf_max_nan(T a, T b) { return (a != a) ? a : ((b != b) ? b : (a > b ? a : b)); }
template <class T> __device__ __forceinline__ T lf_min_nan(T a, T b) { return (a != a) ? a : ((b != b) ? b : (a < b ? a : b)); }
template <class T> __device__ __forceinline__ T lf_sign_f(T a) { return a > 0 ? (T)1 : (a < 0 ? (T)-1 : (a == 0 ? (T)0 : a)); }  // -0 gives +0 (numpy, the standard); NaN stays
"""


def _float_overloads(names: tuple, arity: int) -> str:
    """``lf_<name>`` for float and double, calling CUDA's ``<name>f`` and ``<name>`` (math functions)."""
    out = []
    args = "ab"[:arity]
    for n in names:
        for T, f in (("float", n + "f"), ("double", n)):
            ps = ", ".join(f"{T} {v}" for v in args)
            out.append(f"__device__ __forceinline__ {T} lf_{n}({ps}) {{ return {f}({', '.join(args)}); }}\n")
    return "".join(out)


# The array API's elementwise functions: float and double overloads, and the integer shifts and
# tests with numpy's results (a shift by the bit width or more, or by a negative count: 0, or -1 for a
# negative number shifted right; C leaves those undefined).
PREAMBLE += _float_overloads(("acos", "acosh", "asin", "asinh", "atan", "atanh", "cosh", "sinh", "tan", "expm1",
                              "log2", "log10", "ceil", "trunc", "rint"), 1)
PREAMBLE += _float_overloads(("atan2",), 2)
PREAMBLE += r"""
template <class T> __device__ __forceinline__ T lf_shl(T a, T b) {
  typedef typename lf_u<T>::t U;
  return ((unsigned long long)(long long)b < sizeof(T) * 8) ? (T)(U)((U)a << (int)b) : (T)0;
}
template <class T> __device__ __forceinline__ T lf_shr(T a, T b) {
  if ((unsigned long long)(long long)b < sizeof(T) * 8) return (T)(a >> (int)b);
  return a < (T)0 ? (T)-1 : (T)0;
}
__device__ __forceinline__ bool lf_isinf(float x) { return isinf(x); }
__device__ __forceinline__ bool lf_isinf(double x) { return isinf(x); }
__device__ __forceinline__ bool lf_signbit(float x) { return signbit(x); }
__device__ __forceinline__ bool lf_signbit(double x) { return signbit(x); }
"""
