"""C++ building blocks shared by the kernel templates: storage and compute types per dtype, the
half-precision conversions (inline PTX, so no CUDA headers are needed under NVRTC) and the
numpy-compatible scalar helpers (wrapping integer arithmetic, floor division, NaN-propagating
max/min).

Every dtype has a *storage* C type (what a buffer holds: float16 and bfloat16 are 16-bit words) and a
*compute* C type (what expressions use: float16 and bfloat16 compute in float, as numpy's loops do).
complex64 and complex128 are ``lf_c64`` and ``lf_c128`` (``lf_cx<float>``, ``lf_cx<double>``: a real and
an imaginary part, numpy's layout), with arithmetic operators and the math functions overloaded in
:data:`COMPLEX_PREAMBLE`, so most expressions of ``expressions.py`` serve them unchanged.
"""

from __future__ import annotations

import numpy as np

from ....dtypes import REAL_OF, bfloat16, float16

_HALF = (float16, bfloat16)

STORAGE = {
    "bool": "bool", "int8": "signed char", "uint8": "unsigned char", "int16": "short",
    "uint16": "unsigned short", "int32": "int", "uint32": "unsigned", "int64": "long long",
    "uint64": "unsigned long long", "float16": "unsigned short", "bfloat16": "unsigned short",
    "float32": "float", "float64": "double", "complex64": "lf_c64", "complex128": "lf_c128",
}
COMPUTE = dict(STORAGE, float16="float", bfloat16="float")
#: kernel-parameter type code (see launch.py) of each dtype's compute type
PARAM = {
    "bool": "?", "int8": "b", "uint8": "B", "int16": "h", "uint16": "H", "int32": "i", "uint32": "I",
    "int64": "q", "uint64": "Q", "float16": "f", "bfloat16": "f", "float32": "f", "float64": "d",
    "complex64": "F", "complex128": "Z",
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
    """'b' bool, 'i' signed, 'u' unsigned, 'f' floating (incl. bfloat16), 'c' complex."""
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
    if kd == "c":  # a real value has imaginary part 0; complex128 <-> complex64 converts each part
        part = REAL_OF[np.dtype(dst)]
        if ks == "c":
            return f"{compute(dst)}(lf_cre({expr}), lf_cim({expr}))"
        return f"{compute(dst)}({conv(expr, src, part)})"
    if ks == "c":  # complex -> real (astype refuses it; numpy's rule, the real part, for internal casts)
        return conv(f"lf_cre({expr})", REAL_OF[np.dtype(src)], dst)
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
// A NaN stores as numpy's quiet NaN with its sign (0x7e00; bfloat16 as ml_dtypes, 0x7fc0): cvt gives the
// GPU's canonical NaN (0x7fff), and the GPU's loads and arithmetic lose payloads anyway (cvt.f32.f16
// of 0x7e00 is 0x7fffffff), so numpy's usual NaN is the one bit pattern both sides can agree on.
__device__ __forceinline__ unsigned short lf_f2h(float f) {
  if (f != f) return (unsigned short)((__float_as_uint(f) >> 16 & 0x8000u) | 0x7e00u);
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
__device__ __forceinline__ unsigned short lf_d2h(double d) {
  if (d != d) return (unsigned short)(((unsigned long long)__double_as_longlong(d) >> 48 & 0x8000u) | 0x7e00u);
  unsigned short h; asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(d)); return h;
}
__device__ __forceinline__ float lf_b2f(unsigned short b) { return __uint_as_float(((unsigned)b) << 16); }
__device__ __forceinline__ unsigned short lf_f2b(float f) {
  if (f != f) return (__float_as_uint(f) >> 16 & 0x8000u) | 0x7fc0u;
  unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
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
// nextafter with numpy's (x86's) NaN: the NaN operand itself, payload kept (the GPU's a + b would give
// its canonical NaN, whose bits differ from numpy's).
__device__ __forceinline__ float lf_nextafter(float a, float b) { return a != a ? a : (b != b ? b : nextafterf(a, b)); }
__device__ __forceinline__ double lf_nextafter(double a, double b) { return a != a ? a : (b != b ? b : nextafter(a, b)); }
// nextafter of float16 (BF 0) or bfloat16 (BF 1) values held in floats: one step of the 16-bit word.
template <int BF> __device__ __forceinline__ float lf_nextafter16(float a, float b) {
  if (a != a) return a;
  if (b != b) return b;
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

# Complex numbers: numpy's layout (real part, then imaginary), operators as hidden friends so that a
# real operand converts (``z != 0``, ``(lf_c64)1 / z``); the default constructor stays trivial so the
# type may live in shared memory and vector structs. The functions follow C99 Annex G's formulas (what
# numpy's npy_c* compute) with the array API's special cases for infinities and zeros where marked.
COMPLEX_PREAMBLE = r"""
#ifndef NAN
#define NAN (__int_as_float(0x7fc00000))
#endif
template <class T> struct alignas(2 * sizeof(T)) lf_cx {
  T re, im;
  lf_cx() = default;
  __host__ __device__ lf_cx(T r, T i = T(0)) : re(r), im(i) {}
  friend __device__ __forceinline__ lf_cx operator+(lf_cx a, lf_cx b) { return lf_cx(a.re + b.re, a.im + b.im); }
  friend __device__ __forceinline__ lf_cx operator-(lf_cx a, lf_cx b) { return lf_cx(a.re - b.re, a.im - b.im); }
  friend __device__ __forceinline__ lf_cx operator*(lf_cx a, lf_cx b) {
    return lf_cx(a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re);
  }
  // Smith's division (numpy's): no overflow from squaring the divisor
  friend __device__ __forceinline__ lf_cx operator/(lf_cx a, lf_cx b) {
    T ar = lf_abs(b.re), ai = lf_abs(b.im);
    if (ar >= ai) {
      if (ar == 0 && ai == 0) return lf_cx(a.re / ar, a.im / ai);
      T rat = b.im / b.re, scl = T(1) / (b.re + b.im * rat);
      return lf_cx((a.re + a.im * rat) * scl, (a.im - a.re * rat) * scl);
    }
    T rat = b.re / b.im, scl = T(1) / (b.im + b.re * rat);
    return lf_cx((a.re * rat + a.im) * scl, (a.im * rat - a.re) * scl);
  }
  friend __device__ __forceinline__ bool operator==(lf_cx a, lf_cx b) { return a.re == b.re && a.im == b.im; }
  friend __device__ __forceinline__ bool operator!=(lf_cx a, lf_cx b) { return !(a == b); }
  __device__ __forceinline__ lf_cx operator-() const { return lf_cx(-re, -im); }
  __device__ __forceinline__ lf_cx& operator+=(lf_cx b) { re += b.re; im += b.im; return *this; }
  __device__ __forceinline__ lf_cx& operator-=(lf_cx b) { re -= b.re; im -= b.im; return *this; }
  __device__ __forceinline__ lf_cx& operator*=(lf_cx b) { return *this = *this * b; }
};
typedef lf_cx<float> lf_c64;
typedef lf_cx<double> lf_c128;
template <class T> __device__ __forceinline__ T lf_cre(lf_cx<T> z) { return z.re; }
template <class T> __device__ __forceinline__ T lf_cim(lf_cx<T> z) { return z.im; }
template <class T> __device__ __forceinline__ lf_cx<T> lf_conj(lf_cx<T> z) { return lf_cx<T>(z.re, -z.im); }
template <class T> __device__ __forceinline__ lf_cx<T> __shfl_down_sync(unsigned m, lf_cx<T> z, int s) {
  return lf_cx<T>(__shfl_down_sync(m, z.re, s), __shfl_down_sync(m, z.im, s));
}
template <class T> __device__ __forceinline__ T lf_abs(lf_cx<T> z) { return lf_hypot(z.re, z.im); }
template <class T> __device__ __forceinline__ bool lf_isnan(lf_cx<T> z) { return z.re != z.re || z.im != z.im; }
template <class T> __device__ __forceinline__ bool lf_isinf(lf_cx<T> z) { return lf_isinf(z.re) || lf_isinf(z.im); }
template <class T> __device__ __forceinline__ bool lf_isfinite(lf_cx<T> z) { return lf_isfinite(z.re) && lf_isfinite(z.im); }
// z / |z|; 0 gives 0, a NaN part NaN (the array API's sign of a complex number)
template <class T> __device__ __forceinline__ lf_cx<T> lf_sign(lf_cx<T> z) {
  if (lf_isnan(z)) return lf_cx<T>(T(NAN), T(NAN));
  if (z.re == 0 && z.im == 0) return lf_cx<T>(T(0), T(0));
  if (lf_isinf(z)) {  // an infinite part: its direction
    T r = lf_isinf(z.re) ? lf_copysign(T(1), z.re) : T(0), i = lf_isinf(z.im) ? lf_copysign(T(1), z.im) : T(0);
    T m = lf_hypot(r, i);
    return lf_cx<T>(r / m, i / m);
  }
  T m = lf_abs(z);
  return lf_cx<T>(z.re / m, z.im / m);
}
template <class T> __device__ __forceinline__ lf_cx<T> lf_exp(lf_cx<T> z) {
  if (z.im == 0) return lf_cx<T>(lf_exp(z.re), z.im);  // keeps the sign of a zero im (NaN + 0j too)
  if (lf_isinf(z.re) && !lf_isfinite(z.im)) {
    if (z.re < 0) return lf_cx<T>(T(0), T(0));
    return lf_cx<T>(z.re, T(NAN));
  }
  T e = lf_exp(z.re);
  return lf_cx<T>(e * lf_cos(z.im), e * lf_sin(z.im));
}
template <class T> __device__ __forceinline__ lf_cx<T> lf_expm1(lf_cx<T> z) {
  if (!lf_isfinite(z)) return lf_exp(z) - lf_cx<T>(T(1));
  T s = lf_sin(z.im / 2);
  return lf_cx<T>(lf_expm1(z.re) * lf_cos(z.im) - 2 * s * s, lf_exp(z.re) * lf_sin(z.im));
}
template <class T> __device__ __forceinline__ lf_cx<T> lf_log(lf_cx<T> z) {
  return lf_cx<T>(lf_log(lf_abs(z)), lf_atan2(z.im, z.re));
}
template <class T> __device__ __forceinline__ lf_cx<T> lf_log1p(lf_cx<T> z) {
  if (!lf_isfinite(z) || lf_abs(z.re) > T(0.5) || lf_abs(z.im) > T(0.5)) return lf_log(lf_cx<T>(T(1) + z.re, z.im));
  // log|1 + z| = log1p(2x + x^2 + y^2) / 2: no cancellation for small z
  return lf_cx<T>(lf_log1p(z.re * (2 + z.re) + z.im * z.im) / 2, lf_atan2(z.im, T(1) + z.re));
}
template <class T> __device__ __forceinline__ lf_cx<T> lf_log2(lf_cx<T> z) {
  lf_cx<T> l = lf_log(z); return lf_cx<T>(l.re * T(1.44269504088896340736), l.im * T(1.44269504088896340736));
}
template <class T> __device__ __forceinline__ lf_cx<T> lf_log10(lf_cx<T> z) {
  lf_cx<T> l = lf_log(z); return lf_cx<T>(l.re * T(0.434294481903251827651), l.im * T(0.434294481903251827651));
}
template <class T> __device__ __forceinline__ lf_cx<T> lf_sqrt(lf_cx<T> z) {
  if (z.re == 0 && z.im == 0) return lf_cx<T>(T(0), z.im);
  if (lf_isinf(z.im)) return lf_cx<T>(T(INFINITY), z.im);
  if (z.re != z.re) return lf_cx<T>(z.re, T(NAN));
  if (lf_isinf(z.re)) {
    if (z.re > 0) return lf_cx<T>(z.re, z.im != z.im ? z.im : lf_copysign(T(0), z.im));
    return lf_cx<T>(z.im != z.im ? z.im : T(0), lf_copysign(T(INFINITY), z.im));
  }
  T t = lf_sqrt((lf_abs(z.re) + lf_abs(z)) / 2);
  if (z.re >= 0) return lf_cx<T>(t, z.im / (2 * t));
  return lf_cx<T>(lf_abs(z.im) / (2 * t), lf_copysign(t, z.im));
}
template <class T> __device__ __forceinline__ lf_cx<T> lf_pow(lf_cx<T> a, lf_cx<T> b) {
  if (b.re == 0 && b.im == 0) return lf_cx<T>(T(1), T(0));
  if (a.re == 0 && a.im == 0 && b.im == 0 && b.re > 0) return lf_cx<T>(T(0), T(0));
  return lf_exp(b * lf_log(a));
}
// A real (im == 0) or imaginary (re == 0) argument takes the one-part formula, so an infinite or NaN part
// does not meet a zero in a product (inf * 0 is NaN): the standard's special cases for those axes.
template <class T> __device__ __forceinline__ lf_cx<T> lf_sinh(lf_cx<T> z) {
  if (z.im == 0) return lf_cx<T>(lf_sinh(z.re), z.im);
  if (z.re == 0 && !lf_isfinite(z.im)) return lf_cx<T>(z.re, z.im - z.im);  // +-0 + NaN j
  return lf_cx<T>(lf_sinh(z.re) * lf_cos(z.im), lf_cosh(z.re) * lf_sin(z.im));
}
template <class T> __device__ __forceinline__ lf_cx<T> lf_cosh(lf_cx<T> z) {
  if (z.im == 0) return lf_cx<T>(lf_cosh(z.re), lf_copysign(T(0), z.im) * (z.re < 0 ? T(-1) : T(1)));
  if (z.re == 0 && !lf_isfinite(z.im)) return lf_cx<T>(z.im - z.im, T(0));  // NaN + 0j
  return lf_cx<T>(lf_cosh(z.re) * lf_cos(z.im), lf_sinh(z.re) * lf_sin(z.im));
}
template <class T> __device__ __forceinline__ lf_cx<T> lf_tanh(lf_cx<T> z) {
  if (z.im == 0) return lf_cx<T>(lf_tanh(z.re), z.im);
  if (z.re == 0) return lf_cx<T>(z.re, lf_tan(z.im));  // tanh(iy) = i tan(y): +0 + NaN j at infinity
  // |re| > 22: tanh re is +-1 to the last bit; the imaginary part underflows with the sign of sin(2 im),
  // and at an infinite re the standard gives it the sign of im
  if (lf_abs(z.re) > T(22))
    return lf_cx<T>(lf_copysign(T(1), z.re), lf_copysign(T(0), lf_isinf(z.re) && lf_isfinite(z.im) ? z.im : lf_sin(2 * z.im)));
  T d = lf_cosh(2 * z.re) + lf_cos(2 * z.im);
  return lf_cx<T>(lf_sinh(2 * z.re) / d, lf_sin(2 * z.im) / d);
}
// the trigonometric functions through the hyperbolic ones: sin z = -i sinh(iz) and so on
template <class T> __device__ __forceinline__ lf_cx<T> lf_mul_i(lf_cx<T> z) { return lf_cx<T>(-z.im, z.re); }
template <class T> __device__ __forceinline__ lf_cx<T> lf_mul_negi(lf_cx<T> z) { return lf_cx<T>(z.im, -z.re); }
template <class T> __device__ __forceinline__ lf_cx<T> lf_sin(lf_cx<T> z) { return lf_mul_negi(lf_sinh(lf_mul_i(z))); }
template <class T> __device__ __forceinline__ lf_cx<T> lf_cos(lf_cx<T> z) { return lf_cosh(lf_mul_i(z)); }
template <class T> __device__ __forceinline__ lf_cx<T> lf_tan(lf_cx<T> z) { return lf_mul_negi(lf_tanh(lf_mul_i(z))); }
template <class T> __device__ __forceinline__ lf_cx<T> lf_asinh(lf_cx<T> z) {
  if (z.re < 0 || (z.re == 0 && lf_signbit(z.re))) return -lf_asinh(-z);  // odd: no cancellation for re < 0
  return lf_log(z + lf_sqrt(z * z + lf_cx<T>(T(1))));
}
template <class T> __device__ __forceinline__ lf_cx<T> lf_acosh(lf_cx<T> z) {
  return lf_log(z + lf_sqrt(z + lf_cx<T>(T(1))) * lf_sqrt(z - lf_cx<T>(T(1))));
}
template <class T> __device__ __forceinline__ lf_cx<T> lf_atanh(lf_cx<T> z) {
  lf_cx<T> d = lf_log1p(z) - lf_log1p(-z);
  return lf_cx<T>(d.re / 2, d.im / 2);
}
template <class T> __device__ __forceinline__ lf_cx<T> lf_asin(lf_cx<T> z) { return lf_mul_negi(lf_asinh(lf_mul_i(z))); }
template <class T> __device__ __forceinline__ lf_cx<T> lf_atan(lf_cx<T> z) { return lf_mul_negi(lf_atanh(lf_mul_i(z))); }
template <class T> __device__ __forceinline__ lf_cx<T> lf_acos(lf_cx<T> z) {
  lf_cx<T> a = lf_asin(z);
  return lf_cx<T>(T(1.57079632679489661923) - a.re, -a.im);
}
template <class T> __device__ __forceinline__ lf_cx<T> lf_rint(lf_cx<T> z) { return lf_cx<T>(lf_rint(z.re), lf_rint(z.im)); }
"""
PREAMBLE += COMPLEX_PREAMBLE
