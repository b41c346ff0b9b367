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


def _float_overloads(names: tuple, arity: int) -> str:
    """``lf_<name>`` for float and double, calling CUDA's ``<name>f`` and ``<name>`` (math functions)."""
    out = []
    args = "abc"[:arity]
    for n in names:
        for T, f in (("float", n + "f"), ("double", n)):
            ps = ", ".join(f"{T} {v}" for v in args)
            out.append(f"__device__ __forceinline__ {T} lf_{n}({ps}) {{ return {f}({', '.join(args)}); }}\n")
    return "".join(out)


# The pieces of PREAMBLE. _DEVICE_ONLY needs a CUDA compiler: the kernels' shape struct, INFINITY (NVRTC
# has no headers) and the half-precision conversions in inline PTX. REAL_MATH (integer helpers, the float
# and double math overloads) and COMPLEX_PREAMBLE are plain C++ over the CUDA math functions, so that
# tests/test_cuda_complex_host.py can build them, unchanged, with a host compiler.
_DEVICE_ONLY = r"""
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
"""

REAL_MATH = r"""
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

# The array API's elementwise functions: float and double overloads, and the integer shifts and
# tests with numpy's results (a shift by the bit width or more, or by a negative count: 0, or -1 for a
# negative number shifted right; C leaves those undefined).
REAL_MATH += _float_overloads(("acos", "acosh", "asin", "asinh", "atan", "atanh", "cosh", "sinh", "tan", "expm1",
                              "log2", "log10", "ceil", "trunc", "rint"), 1)
REAL_MATH += _float_overloads(("atan2",), 2)
REAL_MATH += _float_overloads(("fma",), 3)
REAL_MATH += r"""
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
# type may live in shared memory and vector structs. The functions give C99 Annex G's values (what
# numpy's npy_c* compute) and the array API standard's special cases; the comment at the top of the
# string says how.
COMPLEX_PREAMBLE = r"""
// Complex math of lf_cx<float> and lf_cx<double>. NVRTC compiles this text for the kernels, and
// tests/test_cuda_complex_host.py builds the same text with the host compiler and checks it against
// numpy and the array API standard's special cases.
//
// - Each function first settles non-finite operands (and the zeros the standard pins down) as C99
//   Annex G and the standard list them, so the formulas after that see finite numbers only.
// - exp, expm1, sinh, cosh: the textbook formulas; where e^x alone would overflow but e^x cos(y) need
//   not, e^x is applied in four quarters. tanh: (sinh x cosh x + i sin y cos y) / (sinh^2 x + cos^2 y),
//   which has no cancellation near its poles; past |x| = 22 the real part is +-1 to the last bit.
// - log: log|z| through log1p of |z|^2 - 1 where |z| is near 1 (log of a rounded |z| keeps only its
//   rounding error there), that difference formed with the squares' exact rounding errors (fma);
//   elsewhere |z| is scaled where it would overflow or lose bits to subnormals.
// - sqrt: t = sqrt((|x| + |z|) / 2), the other part y / 2t (nothing cancels), the same scaling.
// - asin, acos, asinh, acosh: Hull, Fairgrieve and Tang, "Implementing the complex arcsine and
//   arccosine functions using exception handling" (ACM TOMS 1997). For x, y >= 0 let R = |z + 1|,
//   S = |z - 1|, A = (R + S) / 2 >= 1 and B = x / A; then asin z = asin B + i log(A + sqrt(A^2 - 1))
//   and acos z = acos B - i (the same). Past B = 0.6417 the real parts come from atan2 of x and
//   sqrt(A^2 - x^2), below A = 1.5 the imaginary part from log1p of A - 1 (the paper's crossovers);
//   both are written with R - (x + 1) = y^2 / (R + x + 1) and the like, so no nearly equal numbers are
//   subtracted, and for y far below 1 - x (where y^2 may underflow) Im = y / sqrt(1 - x^2). Past |x| or
//   |y| = 1/eps, where those squares head for overflow, the asymptotic forms are exact to rounding
//   (their error is O(1/|z|^2)): Re asin z = atan2(x, y), Re acos z = atan2(y, x), and the imaginary
//   part log 2 + log|z|. The other signs follow by symmetry; asinh z = i asin(-i z), and
//   acosh z = +-i acos z, the sign giving a real part >= 0.
// - atanh: Re = log1p(4x / ((1 - x)^2 + y^2)) / 4 (near z = 1, where those squares may underflow, the
//   difference of log|1 + z| and log|1 - z|), Im = atan2(2y, (1 - x)(1 + x) - y^2) / 2; past 1/eps,
//   atanh z = 1/z +- i pi/2 to rounding.
// - sin, cos, tan, asin, atan: the standard defines them through the hyperbolic ones (sin z =
//   -i sinh(iz), ...); multiplying by +-i only swaps parts and flips signs, so the special cases carry
//   over exactly.
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
template <class T> __device__ __forceinline__ lf_cx<T> lf_cnan() { return lf_cx<T>(T(NAN), T(NAN)); }

// Thresholds of each precision. eps: half an ulp of 1. big: 1/eps, past which the inverse functions'
// asymptotic forms are exact to rounding. huge: a quarter of the largest finite number. tiny: the
// smallest normal number. exp_max: below the largest x whose exp(x) is finite. up: 2^k (k even) that
// lifts a subnormal above tiny, with up_sqrt = 2^(k/2) and up_log = k log 2.
template <class T> struct lf_fp;
template <> struct lf_fp<float> {
  static __device__ __forceinline__ float sqrt_eps() { return 2.44140625e-4f; }  // 2^-12
  static __device__ __forceinline__ float big() { return 16777216.0f; }  // 2^24
  static __device__ __forceinline__ float huge() { return 8.50705917e37f; }  // 2^125
  static __device__ __forceinline__ float tiny() { return 1.17549435e-38f; }  // 2^-126
  static __device__ __forceinline__ float exp_max() { return 88.0f; }
  static __device__ __forceinline__ float up() { return 67108864.0f; }  // 2^26
  static __device__ __forceinline__ float up_sqrt() { return 8192.0f; }
  static __device__ __forceinline__ float up_log() { return 18.0218266945585770f; }
};
template <> struct lf_fp<double> {
  static __device__ __forceinline__ double sqrt_eps() { return 7.4505805969238281e-9; }  // 2^-27
  static __device__ __forceinline__ double big() { return 9007199254740992.0; }  // 2^53
  static __device__ __forceinline__ double huge() { return 4.4942328371557898e307; }  // 2^1021
  static __device__ __forceinline__ double tiny() { return 2.2250738585072014e-308; }  // 2^-1022
  static __device__ __forceinline__ double exp_max() { return 709.0; }
  static __device__ __forceinline__ double up() { return 18014398509481984.0; }  // 2^54
  static __device__ __forceinline__ double up_sqrt() { return 134217728.0; }
  static __device__ __forceinline__ double up_log() { return 37.429947750237048; }
};
#define LF_LN2 0.693147180559945309417232121458176568
#define LF_PI 3.14159265358979323846264338327950288
#define LF_PI_2 1.57079632679489661923132169163975144

// z / |z|; 0 gives 0, a NaN part NaN (the array API's sign of a complex number)
template <class T> __device__ __forceinline__ lf_cx<T> lf_sign(lf_cx<T> z) {
  if (lf_isnan(z)) return lf_cnan<T>();
  if (z.re == 0 && z.im == 0) return lf_cx<T>(T(0), T(0));
  if (lf_isinf(z)) {  // an infinite part: its direction
    T r = lf_isinf(z.re) ? lf_copysign(T(1), z.re) : T(0), i = lf_isinf(z.im) ? lf_copysign(T(1), z.im) : T(0);
    T m = lf_hypot(r, i);
    return lf_cx<T>(r / m, i / m);
  }
  T m = lf_abs(z);
  return lf_cx<T>(z.re / m, z.im / m);
}

// e^x * k * c for a power of two k, where e^x alone may overflow and the product need not (a subnormal
// c takes x up to about twice exp_max): past exp_max, c is multiplied by e^(x/4) four times (x/4 is
// exact, and each product only grows, so none overflows unless the result does)
template <class T> __device__ __forceinline__ T lf_exp_mul(T x, T c, T k) {
  if (x <= lf_fp<T>::exp_max()) return lf_exp(x) * k * c;
  T q = lf_exp(x / 4);
  return c * q * k * q * q * q;  // (c * q is normal: k cannot round a subnormal c away)
}
template <class T> __device__ __forceinline__ lf_cx<T> lf_exp(lf_cx<T> z) {
  if (z.im == 0) return lf_cx<T>(lf_exp(z.re), z.im);  // keeps the sign of a zero im (NaN + 0j too)
  if (!lf_isfinite(z.im)) {  // cos and sin of an infinity or NaN are NaN; e^-inf takes them to 0
    if (z.re == -T(INFINITY)) return lf_cx<T>(T(0), T(0));
    if (z.re == T(INFINITY)) return lf_cx<T>(z.re, T(NAN));
    return lf_cnan<T>();
  }
  return lf_cx<T>(lf_exp_mul(z.re, lf_cos(z.im), T(1)), lf_exp_mul(z.re, lf_sin(z.im), T(1)));
}
template <class T> __device__ __forceinline__ lf_cx<T> lf_expm1(lf_cx<T> z) {
  // exp(+-0) - 1 is +0 (the standard's 0 + 0j for either zero)
  if (z.im == 0) return lf_cx<T>(z.re == 0 ? T(0) : lf_expm1(z.re), z.im);
  if (!lf_isfinite(z) || z.re > lf_fp<T>::exp_max()) {  // (the - 1 is below e^x's last bit there)
    lf_cx<T> e = lf_exp(z);
    return lf_cx<T>(e.re - 1, e.im);
  }
  // cos(y) - 1 = -2 sin^2(y/2): no cancellation for small z
  T s = lf_sin(z.im / 2);
  return lf_cx<T>(lf_expm1(z.re) * lf_cos(z.im) - 2 * s * s, lf_exp(z.re) * lf_sin(z.im));
}

// log|x + iy| without overflow or subnormal loss in |z|, and through log1p where |z| is near 1
template <class T> __device__ __forceinline__ T lf_log_hypot(T x, T y) {
  if (lf_isinf(x) || lf_isinf(y)) return T(INFINITY);
  if (x != x || y != y) return x + y;
  T a = lf_abs(x), b = lf_abs(y);
  if (a < b) { T t = a; a = b; b = t; }
  if (a >= T(0.5) && a <= T(2)) {
    // |z|^2 - 1 where it cancels: a^2 + b^2 = p + q + (the squares' rounding errors, by fma), p + q = s + e
    // exactly (Fast2Sum, p >= q), and s - 1 is exact for s in [1/2, 2]
    T p = a * a, q = b * b, s = p + q;
    T e = q - (s - p);
    return lf_log1p((s - 1) + (e + lf_fma(a, a, -p) + lf_fma(b, b, -q))) / 2;
  }
  if (a > lf_fp<T>::huge()) return lf_log(lf_hypot(a / 4, b / 4)) + T(2 * LF_LN2);
  if (a < lf_fp<T>::tiny()) return lf_log(lf_hypot(a * lf_fp<T>::up(), b * lf_fp<T>::up())) - lf_fp<T>::up_log();
  return lf_log(lf_hypot(a, b));
}
template <class T> __device__ __forceinline__ lf_cx<T> lf_log(lf_cx<T> z) {
  return lf_cx<T>(lf_log_hypot(z.re, z.im), lf_atan2(z.im, z.re));
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
  T x = z.re, y = z.im;
  if (x == 0 && y == 0) return lf_cx<T>(T(0), y);
  if (lf_isinf(y)) return lf_cx<T>(T(INFINITY), y);
  if (x != x) return lf_cx<T>(x, T(NAN));
  if (lf_isinf(x)) {
    if (x > 0) return lf_cx<T>(x, y != y ? y : lf_copysign(T(0), y));
    return lf_cx<T>(y != y ? y : T(0), lf_copysign(T(INFINITY), y));
  }
  // sqrt(z) = 2 sqrt(z / 4) keeps |x| + |z| finite; sqrt(z) = sqrt(z * 2^2k) / 2^k keeps it normal
  T k = 1;
  if (lf_abs(x) > lf_fp<T>::huge() || lf_abs(y) > lf_fp<T>::huge()) { x /= 4; y /= 4; k = 2; }
  else if (lf_abs(x) < lf_fp<T>::tiny() && lf_abs(y) < lf_fp<T>::tiny()) {
    x *= lf_fp<T>::up(); y *= lf_fp<T>::up(); k = 1 / lf_fp<T>::up_sqrt();
  }
  T t = lf_sqrt((lf_abs(x) + lf_hypot(x, y)) / 2);
  if (x >= 0) return lf_cx<T>(t * k, y / (2 * t) * k);
  return lf_cx<T>(lf_abs(y) / (2 * t) * k, lf_copysign(t * k, y));
}
template <class T> __device__ __forceinline__ lf_cx<T> lf_pow(lf_cx<T> a, lf_cx<T> b) {
  if (b.re == 0 && b.im == 0) return lf_cx<T>(T(1), T(0));
  if (a.re == 0 && a.im == 0 && b.im == 0 && b.re > 0) return lf_cx<T>(T(0), T(0));
  return lf_exp(b * lf_log(a));
}
// A real (im == 0) or imaginary (re == 0) argument takes the one-part formula, so an infinite or NaN part
// does not meet a zero in a product (inf * 0 is NaN): the standard's special cases for those axes.
template <class T> __device__ __forceinline__ lf_cx<T> lf_sinh(lf_cx<T> z) {
  T x = z.re, y = z.im;
  if (y == 0) return lf_cx<T>(lf_sinh(x), y);
  if (!lf_isfinite(y)) {  // sin and cos of an infinity or NaN are NaN
    if (x == 0) return lf_cx<T>(x, y - y);  // +-0 + NaN j
    if (lf_isinf(x)) return lf_cx<T>(x, T(NAN));  // +-inf + NaN j
    return lf_cnan<T>();
  }
  if (lf_abs(x) > lf_fp<T>::exp_max()) {  // sinh and cosh are e^|x| / 2 there (with x's sign for sinh)
    T re = lf_exp_mul(lf_abs(x), lf_cos(y), T(0.5)), im = lf_exp_mul(lf_abs(x), lf_sin(y), T(0.5));
    return lf_cx<T>(x < 0 ? -re : re, im);
  }
  return lf_cx<T>(lf_sinh(x) * lf_cos(y), lf_cosh(x) * lf_sin(y));
}
template <class T> __device__ __forceinline__ lf_cx<T> lf_cosh(lf_cx<T> z) {
  T x = z.re, y = z.im;
  if (y == 0) return lf_cx<T>(lf_cosh(x), lf_copysign(T(0), x) * y);  // the zero has sinh(x) sin(y)'s sign
  if (!lf_isfinite(y)) {
    if (x == 0) return lf_cx<T>(y - y, T(0));  // NaN + 0j
    if (lf_isinf(x)) return lf_cx<T>(T(INFINITY), T(NAN));
    return lf_cnan<T>();
  }
  if (lf_abs(x) > lf_fp<T>::exp_max()) {
    T re = lf_exp_mul(lf_abs(x), lf_cos(y), T(0.5)), im = lf_exp_mul(lf_abs(x), lf_sin(y), T(0.5));
    return lf_cx<T>(re, x < 0 ? -im : im);
  }
  return lf_cx<T>(lf_cosh(x) * lf_cos(y), lf_sinh(x) * lf_sin(y));
}
template <class T> __device__ __forceinline__ lf_cx<T> lf_tanh(lf_cx<T> z) {
  T x = z.re, y = z.im;
  if (y == 0) return lf_cx<T>(lf_tanh(x), y);
  if (x == 0) return lf_cx<T>(x, lf_tan(y));  // tanh(iy) = i tan(y): +0 + NaN j at infinity
  if (!lf_isfinite(y)) {
    if (lf_isinf(x)) return lf_cx<T>(lf_copysign(T(1), x), lf_copysign(T(0), y));
    return lf_cnan<T>();
  }
  // |x| > 22: tanh x is +-1 to the last bit, Im = sin(2y) / (cosh 2x + cos 2y) = 4 sin y cos y e^-2|x|;
  // at an infinite x the standard gives the zero the sign of y
  if (lf_abs(x) > T(22)) {
    T im = lf_isinf(x) ? lf_copysign(T(0), y) : 4 * lf_sin(y) * lf_cos(y) * lf_exp(-2 * lf_abs(x));
    return lf_cx<T>(lf_copysign(T(1), x), im);
  }
  T s = lf_sinh(x), cy = lf_cos(y), d = s * s + cy * cy;  // cosh 2x + cos 2y = 2 (sinh^2 x + cos^2 y)
  return lf_cx<T>(s * lf_cosh(x) / d, lf_sin(y) * cy / d);
}
// the trigonometric functions through the hyperbolic ones: sin z = -i sinh(iz) and so on
template <class T> __device__ __forceinline__ lf_cx<T> lf_mul_i(lf_cx<T> z) { return lf_cx<T>(-z.im, z.re); }
template <class T> __device__ __forceinline__ lf_cx<T> lf_mul_negi(lf_cx<T> z) { return lf_cx<T>(z.im, -z.re); }
template <class T> __device__ __forceinline__ lf_cx<T> lf_sin(lf_cx<T> z) { return lf_mul_negi(lf_sinh(lf_mul_i(z))); }
template <class T> __device__ __forceinline__ lf_cx<T> lf_cos(lf_cx<T> z) { return lf_cosh(lf_mul_i(z)); }
template <class T> __device__ __forceinline__ lf_cx<T> lf_tan(lf_cx<T> z) { return lf_mul_negi(lf_tanh(lf_mul_i(z))); }

// The parts of asin(x + iy) and acos(x + iy) for finite x, y >= 0 (Hull et al.; see the top): the real
// part of asin and of acos (both in [0, pi/2]) and the imaginary part of asin (>= 0, minus acos's).
template <class T> struct lf_asin_parts { T re_asin, re_acos, im; };
template <class T> __device__ __forceinline__ lf_asin_parts<T> lf_asin_core(T x, T y) {
  lf_asin_parts<T> p;
  if (x > lf_fp<T>::big() || y > lf_fp<T>::big()) {  // asin z = -i log(2iz) + O(1/z^2)
    p.re_asin = lf_atan2(x, y);
    p.re_acos = lf_atan2(y, x);
    p.im = lf_log_hypot(x, y) + T(LF_LN2);
    return p;
  }
  T r = lf_hypot(x + 1, y), s = lf_hypot(x - 1, y);
  T a = (r + s) / 2, b;
  if (a < 1) a = 1;  // (rounding)
  b = x / a;
  if (b <= T(0.6417)) {  // asin and acos of b are well conditioned
    p.re_asin = lf_asin(b);
    p.re_acos = lf_acos(b);
  } else {  // d = sqrt(A^2 - x^2) = sqrt((A + x)(A - x)), A - x without cancellation
    T d;
    if (x <= 1) d = lf_sqrt((a + x) * (y * y / (r + x + 1) + (s + (1 - x))) / 2);
    else d = y * lf_sqrt((a + x) * (1 / (r + x + 1) + 1 / (s + (x - 1))) / 2);
    p.re_asin = lf_atan2(x, d);
    p.re_acos = lf_atan2(d, x);
  }
  if (a > T(1.5)) {
    p.im = lf_log(a + lf_sqrt(a * a - 1));
    return p;
  }
  // near A = 1: log1p of A - 1 = t / 2, from R - (x + 1) = y^2 / (R + x + 1) and S - |x - 1| likewise
  // (t is not halved before the sqrt: at x = 1 and a subnormal y, t / 2 would round away)
  T t;
  if (x < 1) {
    // y far below 1 - x: Im = y / sqrt(1 - x^2) to rounding (y^2 may underflow in the general form)
    if (y < (1 - x) * lf_fp<T>::sqrt_eps()) {
      p.im = y / lf_sqrt((1 - x) * (1 + x));
      return p;
    }
    t = y * y / (r + x + 1) + y * y / (s + (1 - x));
  } else {
    t = y * y / (r + x + 1) + (s + (x - 1));
  }
  p.im = lf_log1p(t / 2 + lf_sqrt(t * ((a + 1) / 2)));
  return p;
}
template <class T> __device__ __forceinline__ lf_cx<T> lf_asinh(lf_cx<T> z) {
  T x = z.re, y = z.im;
  if (x != x || y != y) {
    if (x != x && y == 0) return lf_cx<T>(x, y);  // NaN + 0j
    if (lf_isinf(x)) return lf_cx<T>(x, T(NAN));
    if (lf_isinf(y)) return lf_cx<T>(T(INFINITY), T(NAN));  // (the standard leaves the sign open)
    return lf_cnan<T>();
  }
  // asinh z = i asin(-i z), and -i z = y - ix
  lf_asin_parts<T> p = lf_asin_core(lf_abs(y), lf_abs(x));
  return lf_cx<T>(lf_copysign(p.im, x), lf_copysign(p.re_asin, y));
}
template <class T> __device__ __forceinline__ lf_cx<T> lf_acos(lf_cx<T> z) {
  T x = z.re, y = z.im;
  if (x != x || y != y) {
    if (lf_isinf(x)) return lf_cx<T>(T(NAN), -T(INFINITY));  // (the standard leaves the sign open)
    if (lf_isinf(y)) return lf_cx<T>(T(NAN), -y);
    if (x == 0) return lf_cx<T>(T(LF_PI_2), y);
    return lf_cnan<T>();
  }
  lf_asin_parts<T> p = lf_asin_core(lf_abs(x), lf_abs(y));
  return lf_cx<T>(lf_signbit(x) ? T(LF_PI) - p.re_acos : p.re_acos, lf_signbit(y) ? p.im : -p.im);
}
// acosh z = +-i acos z, the sign that makes the real part >= 0
template <class T> __device__ __forceinline__ lf_cx<T> lf_acosh(lf_cx<T> z) {
  lf_cx<T> a = lf_acos(z);
  return lf_cx<T>(lf_abs(a.im), lf_copysign(a.re, z.im));
}
template <class T> __device__ __forceinline__ lf_cx<T> lf_atanh(lf_cx<T> z) {
  T x = z.re, y = z.im, ax = lf_abs(x), ay = lf_abs(y);
  if (x != x || y != y) {
    if (lf_isinf(y)) return lf_cx<T>(lf_copysign(T(0), x), lf_copysign(T(LF_PI_2), y));
    if (lf_isinf(x) || x == 0) return lf_cx<T>(lf_copysign(T(0), x), y);
    return lf_cnan<T>();
  }
  if (ax > lf_fp<T>::big() || ay > lf_fp<T>::big()) {  // atanh z = 1/z + i pi/2 + O(1/z^3)
    T re;  // Re 1/z = x / (x^2 + y^2), without squaring the larger part
    if (lf_isinf(x) || lf_isinf(y)) re = 0;
    else if (ax >= ay) re = 1 / (ax + ay * (ay / ax));
    else re = (ax / ay) / (ay + ax * (ax / ay));
    return lf_cx<T>(lf_copysign(re, x), lf_copysign(T(LF_PI_2), y));
  }
  T d = (1 - ax) * (1 - ax) + y * y, re;  // |1 - z|^2
  if (d < T(0.25)) re = (lf_log_hypot(1 + ax, y) - lf_log_hypot(1 - ax, y)) / 2;
  else re = lf_log1p(4 * ax / d) / 4;
  return lf_cx<T>(lf_copysign(re, x), lf_atan2(2 * y, (1 - ax) * (1 + ax) - y * y) / 2);
}
template <class T> __device__ __forceinline__ lf_cx<T> lf_asin(lf_cx<T> z) { return lf_mul_negi(lf_asinh(lf_mul_i(z))); }
template <class T> __device__ __forceinline__ lf_cx<T> lf_atan(lf_cx<T> z) { return lf_mul_negi(lf_atanh(lf_mul_i(z))); }
template <class T> __device__ __forceinline__ lf_cx<T> lf_rint(lf_cx<T> z) { return lf_cx<T>(lf_rint(z.re), lf_rint(z.im)); }
"""
PREAMBLE = _DEVICE_ONLY + REAL_MATH + COMPLEX_PREAMBLE
