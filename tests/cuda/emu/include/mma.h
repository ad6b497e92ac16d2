/* mma.h of the CUDA-on-CPU test emulator (tests/cuda/emu/README.md): the nvcuda::wmma subset
 * a tensor-core kernel uses, so its numerics can be checked without a GPU.
 *
 * Shapes and types: m16n16k16, m32n8k16 and m8n32k16 with __half or __nv_bfloat16 matrix_a /
 * matrix_b fragments (row_major or col_major) and float or __half accumulators; m16n16k8 with
 * precision::tf32 inputs and float accumulators. fill_fragment, load_matrix_sync (with the
 * documented requirements checked: a 256-bit aligned pointer, ldm a multiple of 16 bytes),
 * mma_sync (d may be c), store_matrix_sync, __float_to_tf32.
 *
 * Each lane holds the whole tile (num_elements = rows x cols, element (r, c) at x[r * cols + c]):
 * a program may only apply the same element-wise operation to every element of a fragment (the
 * element-to-lane mapping is unspecified), so the results are the same as on the device. The
 * *_sync functions first wait for the 32 lanes of the warp, as the device's do; a store writes
 * each element once (lane l the elements i with i % 32 == l); mma_sync computes once per warp
 * and stops with a message when the lanes' operands differ (a lane-dependent change to a fragment
 * is not portable). mma_sync multiplies in f32 and adds over k in order, in f32 (tf32 inputs: the low 13 mantissa bits dropped, as the tensor cores
 * read them), then rounds to the accumulator type: the device's internal accumulation order and
 * rounding are not reproduced, so compare with a tolerance (exact for small integers). */
#ifndef CPLAN_CUDA_EMU_MMA_H
#define CPLAN_CUDA_EMU_MMA_H

#include "../cuda_emu.h"

namespace nvcuda {
namespace wmma {

struct row_major;
struct col_major;
struct matrix_a;
struct matrix_b;
struct accumulator;
namespace precision {
struct tf32;
}

enum layout_t { mem_row_major, mem_col_major };

template <typename T> struct helper_traits {
  typedef T element_type;
  typedef T storage_element_type;
  typedef T fill_argument_type;
};
template <> struct helper_traits<precision::tf32> {
  typedef precision::tf32 element_type;
  typedef float storage_element_type;
  typedef float fill_argument_type;
};

template <typename T, int size> struct __frag_base {
  enum { num_elements = size };
  enum { num_storage_elements = size };
  typedef T element_type;
  typedef typename helper_traits<T>::storage_element_type storage_element_type;
  storage_element_type x[size];
};

namespace detail {
template <typename Use, int m, int n, int k> struct dims;
template <int m, int n, int k> struct dims<matrix_a, m, n, k> { enum { rows = m, cols = k }; };
template <int m, int n, int k> struct dims<matrix_b, m, n, k> { enum { rows = k, cols = n }; };
template <int m, int n, int k> struct dims<accumulator, m, n, k> { enum { rows = m, cols = n }; };

template <int m, int n, int k> struct shape16 {
  static const bool value = (m == 16 && n == 16 && k == 16) || (m == 32 && n == 8 && k == 16) || (m == 8 && n == 32 && k == 16);
};
template <typename Use, int m, int n, int k, typename T> struct valid {
  static const bool value = false;
};
template <int m, int n, int k> struct valid<matrix_a, m, n, k, __half> : shape16<m, n, k> {};
template <int m, int n, int k> struct valid<matrix_b, m, n, k, __half> : shape16<m, n, k> {};
template <int m, int n, int k> struct valid<matrix_a, m, n, k, __nv_bfloat16> : shape16<m, n, k> {};
template <int m, int n, int k> struct valid<matrix_b, m, n, k, __nv_bfloat16> : shape16<m, n, k> {};
template <int m, int n, int k> struct valid<accumulator, m, n, k, float> {
  static const bool value = shape16<m, n, k>::value || (m == 16 && n == 16 && k == 8);
};
template <int m, int n, int k> struct valid<accumulator, m, n, k, __half> : shape16<m, n, k> {};
template <> struct valid<matrix_a, 16, 16, 8, precision::tf32> { static const bool value = true; };
template <> struct valid<matrix_b, 16, 16, 8, precision::tf32> { static const bool value = true; };

template <typename Use, typename Layout> struct layout_ok { static const bool value = false; };
template <> struct layout_ok<matrix_a, row_major> { static const bool value = true; };
template <> struct layout_ok<matrix_a, col_major> { static const bool value = true; };
template <> struct layout_ok<matrix_b, row_major> { static const bool value = true; };
template <> struct layout_ok<matrix_b, col_major> { static const bool value = true; };
template <> struct layout_ok<accumulator, void> { static const bool value = true; };

inline float to_f32(float v) { return v; }
inline float to_f32(__half v) { return __half2float(v); }
inline float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> inline T from_f32(float v);
template <> inline float from_f32<float>(float v) { return v; }
template <> inline __half from_f32<__half>(float v) { return __float2half_rn(v); }

/* an input element as the tensor cores read it */
template <typename T> inline float input(typename helper_traits<T>::storage_element_type v) { return to_f32(v); }
template <> inline float input<precision::tf32>(float v) {
  return __uint_as_float(__float_as_uint(v) & 0xffffe000u);
}

/* out = c + a b over whole fragments, in f32, over k in order for every (i, j). Emulator-internal
 * arithmetic on fragments already loaded: not worth AddressSanitizer's checks. */
template <int m, int n, int k, typename TA, typename TC>
__attribute__((no_sanitize_address)) void mma_compute(float *out, const typename helper_traits<TA>::storage_element_type *a,
                                                      const typename helper_traits<TA>::storage_element_type *b,
                                                      const TC *c) {
  float fa[m * k], fb[k * n];
  for (int i = 0; i < m * k; i++) fa[i] = input<TA>(a[i]);
  for (int i = 0; i < k * n; i++) fb[i] = input<TA>(b[i]);
  for (int i = 0; i < m * n; i++) out[i] = to_f32(c[i]);
  for (int i = 0; i < m; i++)
    for (int kk = 0; kk < k; kk++) {
      float x = fa[i * k + kk];
      for (int j = 0; j < n; j++) out[i * n + j] += x * fb[kk * n + j];
    }
}
} // namespace detail

template <typename Use, int m, int n, int k, typename T, typename Layout = void>
class fragment : public __frag_base<T, detail::dims<Use, m, n, k>::rows * detail::dims<Use, m, n, k>::cols> {
  static_assert(detail::valid<Use, m, n, k, T>::value, "wmma emulator: no such fragment shape and type");
  static_assert(detail::layout_ok<Use, Layout>::value,
                "wmma emulator: matrix_a / matrix_b take row_major or col_major, accumulators no layout");
};

template <typename Use, int m, int n, int k, typename T, typename L>
inline void fill_fragment(fragment<Use, m, n, k, T, L> &f, const typename helper_traits<T>::fill_argument_type &v) {
  for (int i = 0; i < f.num_elements; i++) f.x[i] = v;
}

template <typename Use, int m, int n, int k, typename T, typename L>
inline void load_matrix_sync(fragment<Use, m, n, k, T, L> &f, const typename helper_traits<T>::storage_element_type *p,
                             unsigned ldm) {
  static_assert(!std::is_same<Use, accumulator>::value, "wmma: an accumulator load takes a layout_t");
  typedef detail::dims<Use, m, n, k> D;
  __syncwarp();
  if ((uintptr_t)p % 32 != 0) ::cuemu::trap("wmma::load_matrix_sync: the pointer is not 256-bit aligned");
  if (((size_t)ldm * sizeof(*p)) % 16 != 0) ::cuemu::trap("wmma::load_matrix_sync: ldm is not a multiple of 16 bytes");
  if (std::is_same<L, row_major>::value)
    for (int r = 0; r < (int)D::rows; r++) memcpy((void *)&f.x[r * D::cols], p + (size_t)r * ldm, sizeof(*p) * D::cols);
  else
    for (int r = 0; r < (int)D::rows; r++)
      for (int c = 0; c < (int)D::cols; c++) f.x[r * D::cols + c] = p[(size_t)c * ldm + r];
}

template <int m, int n, int k, typename T>
inline void load_matrix_sync(fragment<accumulator, m, n, k, T> &f, const T *p, unsigned ldm, layout_t layout) {
  __syncwarp();
  if ((uintptr_t)p % 32 != 0) ::cuemu::trap("wmma::load_matrix_sync: the pointer is not 256-bit aligned");
  if (((size_t)ldm * sizeof(T)) % 16 != 0) ::cuemu::trap("wmma::load_matrix_sync: ldm is not a multiple of 16 bytes");
  if (layout == mem_row_major)
    for (int r = 0; r < m; r++) memcpy((void *)&f.x[r * n], p + (size_t)r * ldm, sizeof(T) * n);
  else
    for (int r = 0; r < m; r++)
      for (int c = 0; c < n; c++) f.x[r * n + c] = p[(size_t)c * ldm + r];
}

template <int m, int n, int k, typename T>
inline void store_matrix_sync(T *p, const fragment<accumulator, m, n, k, T> &f, unsigned ldm, layout_t layout) {
  __syncwarp();
  if ((uintptr_t)p % 32 != 0) ::cuemu::trap("wmma::store_matrix_sync: the pointer is not 256-bit aligned");
  if (((size_t)ldm * sizeof(T)) % 16 != 0) ::cuemu::trap("wmma::store_matrix_sync: ldm is not a multiple of 16 bytes");
  for (int i = ::cuemu::lane_id(); i < m * n; i += 32) {
    int r = i / n, c = i % n;
    p[layout == mem_row_major ? (size_t)r * ldm + c : (size_t)c * ldm + r] = f.x[i];
  }
}

/* The warp computes the product once: lane 0 does, the other lanes check that they hold the same
 * operands (a program may only change fragments with uniform element-wise operations, so they
 * must) and copy the result after the second barrier. */
template <int m, int n, int k, typename TA, typename LA, typename LB, typename TC>
inline void mma_sync(fragment<accumulator, m, n, k, TC> &d, const fragment<matrix_a, m, n, k, TA, LA> &a,
                     const fragment<matrix_b, m, n, k, TA, LB> &b, const fragment<accumulator, m, n, k, TC> &c,
                     bool satf = false) {
  static_assert(m * n * sizeof(float) <= 4096, "warp scratch");
  struct Operands {
    const void *a, *b, *c;
  } mine = {&a, &b, &c};
  /* the device's mma_sync waits for the warp; this barrier also hands every lane lane 0's operands */
  const Operands *first = (const Operands *)(uintptr_t)::cuemu::warp_exchange(
      0xffffffffu, (uint64_t)(uintptr_t)&mine, 0, 0, nullptr);
  float *out = (float *)::cuemu::warp_scratch();
  if (::cuemu::lane_id() == 0) {
    detail::mma_compute<m, n, k, TA, TC>(out, a.x, b.x, c.x);
    if (satf) {
      float big = std::is_same<TC, __half>::value ? 65504.0f : 3.402823466e38f;
      for (int i = 0; i < m * n; i++) {
        float v = out[i];
        out[i] = v != v ? 0.0f : v > big ? big : v < -big ? -big : v;
      }
    }
  } else if (memcmp(&a, first->a, sizeof a) || memcmp(&b, first->b, sizeof b) || memcmp(&c, first->c, sizeof c)) {
    ::cuemu::trap("wmma::mma_sync: the lanes of the warp hold different fragments (only uniform element-wise "
                  "operations on fragments are portable: the element-to-lane mapping is unspecified)");
  }
  __syncwarp();
  if (std::is_same<TC, float>::value) memcpy((void *)d.x, out, sizeof d.x);
  else
    for (int i = 0; i < m * n; i++) d.x[i] = detail::from_f32<TC>(out[i]);
}

/* cvt.rna.tf32.f32: to 10 mantissa bits, to nearest, ties away from zero */
inline float __float_to_tf32(float in) {
  unsigned u = __float_as_uint(in);
  if ((u & 0x7f800000u) == 0x7f800000u) return in;
  return __uint_as_float((u + 0x1000u) & 0xffffe000u);
}

} // namespace wmma
} // namespace nvcuda

#endif
