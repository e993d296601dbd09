// Spherical-harmonic colour per splat, forward and backward: see sh.h. The bases are render/sh.py's sh_basis.
#include "sh.h"

#include <type_traits>

namespace bytesplat {
namespace {

constexpr int kShThreads = 128;  // shared memory: 128 x 49 floats at K = 16
constexpr int kShBases = (kShMaxDegree + 1) * (kShMaxDegree + 1);
constexpr float kNormMin = 1e-12f;  // render/sh.py: the direction's length clamped at this

constexpr float kY0 = 0.28209479177387814f;
constexpr float kY1 = 0.4886025119029199f;
constexpr float kY2a = 1.0925484305920792f, kY2b = 0.31539156525252005f, kY2c = 0.5462742152960396f;
constexpr float kY3a = 0.5900435899266435f, kY3b = 2.890611442640554f, kY3c = 0.4570457994644658f;
constexpr float kY3d = 0.3731763325901154f, kY3e = 1.445305721320277f;

// A splat's direction normalised: u = d / max(|d|, kNormMin); returns max(|d|, kNormMin).
__device__ inline float unit(const float* d, float u[3]) {
  const float length = fmaxf(sqrtf(d[0] * d[0] + d[1] * d[1] + d[2] * d[2]), kNormMin);
  for (int a = 0; a < 3; ++a) u[a] = d[a] / length;
  return length;
}

// The (degree + 1)^2 bases up to `degree` at the unit direction u.
__device__ inline void bases(int degree, const float u[3], float b[kShBases]) {
  const float x = u[0], y = u[1], z = u[2];
  b[0] = kY0;
  if (degree < 1) return;
  b[1] = -kY1 * y;
  b[2] = kY1 * z;
  b[3] = -kY1 * x;
  if (degree < 2) return;
  const float xx = x * x, yy = y * y, zz = z * z;
  b[4] = kY2a * x * y;
  b[5] = -kY2a * y * z;
  b[6] = kY2b * (3.f * zz - 1.f);
  b[7] = -kY2a * x * z;
  b[8] = kY2c * (xx - yy);
  if (degree < 3) return;
  b[9] = -kY3a * y * (3.f * xx - yy);
  b[10] = kY3b * x * y * z;
  b[11] = -kY3c * y * (5.f * zz - 1.f);
  b[12] = kY3d * z * (5.f * zz - 3.f);
  b[13] = -kY3c * x * (5.f * zz - 1.f);
  b[14] = kY3e * z * (xx - yy);
  b[15] = -kY3a * x * (xx - 3.f * yy);
}

// sum_k w[k] * d basis_k / du at the unit direction u (each basis a polynomial in x, y, z), into g[3].
__device__ inline void bases_vjp(int degree, const float u[3], const float w[kShBases], float g[3]) {
  const float x = u[0], y = u[1], z = u[2];
  g[0] = g[1] = g[2] = 0.f;
  if (degree < 1) return;
  g[0] += -kY1 * w[3];
  g[1] += -kY1 * w[1];
  g[2] += kY1 * w[2];
  if (degree < 2) return;
  const float xx = x * x, yy = y * y, zz = z * z;
  g[0] += kY2a * (y * w[4] - z * w[7]) + 2.f * kY2c * x * w[8];
  g[1] += kY2a * (x * w[4] - z * w[5]) - 2.f * kY2c * y * w[8];
  g[2] += -kY2a * (y * w[5] + x * w[7]) + 6.f * kY2b * z * w[6];
  if (degree < 3) return;
  g[0] += -6.f * kY3a * x * y * w[9] + kY3b * y * z * w[10] - kY3c * (5.f * zz - 1.f) * w[13] +
          2.f * kY3e * x * z * w[14] - 3.f * kY3a * (xx - yy) * w[15];
  g[1] += -3.f * kY3a * (xx - yy) * w[9] + kY3b * x * z * w[10] - kY3c * (5.f * zz - 1.f) * w[11] -
          2.f * kY3e * y * z * w[14] + 6.f * kY3a * x * y * w[15];
  g[2] += kY3b * x * y * w[10] - 10.f * kY3c * y * z * w[11] + kY3d * (15.f * zz - 3.f) * w[12] -
          10.f * kY3c * x * z * w[13] + kY3e * (xx - yy) * w[14];
}

// Each warp moves its 32 splats' coefficient rows (K * 3 floats each: dc's 3, then rest's) through shared memory:
// device memory is read and written in whole rows, consecutive lanes on consecutive floats, instead of each thread
// striding through its own 192-byte row (one 4-byte access per cache sector: the backward's writes so took 50 us of
// a lego step). Staged rows sit `pitch` floats apart, odd, so the threads' own-row accesses fall in 32 different
// banks.
struct WarpRows {
  float* stage;    // [32, pitch] this warp's part of the block's shared memory
  int64_t first;   // the warp's first splat
  int count;       // its splats (32, fewer in the last warp, 0 past the end)
  int row;         // floats per staged splat, K * 3
  int pitch;       // row, made odd
  unsigned seen;   // bit s: the warp's splat s is evaluated (ShParams::radii; culled splats' rows are not read)
};

// Whether splat i is evaluated: every splat without radii, else those with a radius.
__device__ inline bool seen(const int32_t* radii, int64_t i) { return radii == nullptr || radii[i] > 0; }

// The staged rows' pitch for K coefficients per splat (the kernels' and the launch's shared memory).
__host__ __device__ inline int row_pitch(int k) { return (3 * k) | 1; }

__device__ inline WarpRows warp_rows(float* shared, int64_t n, int k, const int32_t* radii) {
  WarpRows w;
  w.row = 3 * k;
  w.pitch = row_pitch(k);
  w.stage = shared + (threadIdx.x / 32) * 32 * w.pitch;
  w.first = static_cast<int64_t>(blockIdx.x) * blockDim.x + (threadIdx.x / 32) * 32;
  w.count = static_cast<int>(max(static_cast<int64_t>(0), min(static_cast<int64_t>(32), n - w.first)));
  const int lane = static_cast<int>(threadIdx.x % 32);  // one radius read per lane, shared by the warp's loads
  w.seen = __ballot_sync(0xffffffffu, lane < w.count && seen(radii, w.first + lane));
  return w;
}

// The first kWidth floats of the warp's splats' device rows, `stride` floats apart, into staged columns
// [col, col + kWidth). Each lane first loads all its kWidth floats, then stores them: the loads are in flight
// together instead of one at a time (a loop of load-then-store waits out the memory's latency at each step).
template <int kWidth>
__device__ inline void load_part(const WarpRows& w, const float* __restrict__ rows, int stride, int col) {
  const float* src = rows + w.first * stride;
  const int lane = static_cast<int>(threadIdx.x % 32);
  float v[kWidth];
#pragma unroll
  for (int t = 0; t < kWidth; ++t) {
    const int j = lane + 32 * t;  // of the warp's 32 kWidth floats: splat j / kWidth, float j % kWidth
    v[t] = (w.seen >> (j / kWidth)) & 1u ? src[j / kWidth * stride + j % kWidth] : 0.f;  // j / kWidth < 32
  }
#pragma unroll
  for (int t = 0; t < kWidth; ++t) {
    const int j = lane + 32 * t;
    if (j / kWidth < w.count) w.stage[j / kWidth * w.pitch + col + j % kWidth] = v[t];
  }
}

// Staged columns [col, col + width) into the warp's splats' device rows of `width` floats.
__device__ inline void store_part(const WarpRows& w, float* __restrict__ rows, int width, int col) {
  float* dst = rows + w.first * width;
  for (int j = threadIdx.x % 32; j < w.count * width; j += 32) dst[j] = w.stage[j / width * w.pitch + col + j % width];
}

// Stages the coefficients the degree reads: dc's 3 floats and rest's first 3 (kCount - 1).
template <int kCount>
__device__ inline void load_coefficients(const WarpRows& w, const ShParams& p) {
  load_part<3>(w, p.dc, 3, 0);
  if constexpr (kCount > 1) load_part<3 * (kCount - 1)>(w, p.rest, 3 * (p.k - 1), 3);
  __syncwarp();
}

unsigned shared_bytes(int k) { return kShThreads * row_pitch(k) * sizeof(float); }

// sum_k b[k] * c[3 k + ch] over the degree's kCount bases: channel ch of a splat's colour before the +0.5.
template <int kCount>
__device__ inline float basis_sum(const float b[kShBases], const float* c, int ch) {
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < kCount; ++k) sum += b[k] * c[3 * k + ch];
  return sum;
}

// The kernels are instantiated per degree, so the bases and their loops unroll and stay in registers.
template <int kDegree>
__global__ void __launch_bounds__(kShThreads) sh_forward_kernel(const ShParams p, float* __restrict__ rgb) {
  constexpr int kCount = (kDegree + 1) * (kDegree + 1);
  extern __shared__ float shared[];
  const WarpRows w = warp_rows(shared, p.n, p.k, p.radii);
  load_coefficients<kCount>(w, p);
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.n) return;
  if (!((w.seen >> (threadIdx.x % 32)) & 1u)) {
    for (int ch = 0; ch < 3; ++ch) rgb[3 * i + ch] = 0.f;
    return;
  }
  float u[3], b[kShBases];
  unit(p.dirs + 3 * i, u);
  bases(kDegree, u, b);
  const float* c = w.stage + threadIdx.x % 32 * w.pitch;
#pragma unroll
  for (int ch = 0; ch < 3; ++ch) rgb[3 * i + ch] = fmaxf(basis_sum<kCount>(b, c, ch) + 0.5f, 0.f);
}

template <int kDegree>
__global__ void __launch_bounds__(kShThreads)
    sh_backward_kernel(const ShParams p, const float* __restrict__ v_rgb, float* __restrict__ v_dc,
                       float* __restrict__ v_rest, float* __restrict__ v_dirs) {
  constexpr int kCount = (kDegree + 1) * (kDegree + 1);
  extern __shared__ float shared[];
  const WarpRows w = warp_rows(shared, p.n, p.k, p.radii);
  load_coefficients<kCount>(w, p);
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < p.n && !((w.seen >> (threadIdx.x % 32)) & 1u)) {  // culled: zero gradients (the warp stores the rows)
    float* c = w.stage + threadIdx.x % 32 * w.pitch;
    for (int j = 0; j < w.row; ++j) c[j] = 0.f;
    for (int a = 0; a < 3; ++a) v_dirs[3 * i + a] = 0.f;
  } else if (i < p.n) {  // no early return: the whole warp stores the rows below
    float u[3], b[kShBases];
    const float length = unit(p.dirs + 3 * i, u);
    bases(kDegree, u, b);
    float* c = w.stage + threadIdx.x % 32 * w.pitch;  // this splat's coefficients, replaced by their gradient
    float g[3];  // dL/d(sum + 0.5) where the clamp passes it (torch's clamp_min: where the input is >= 0)
#pragma unroll
    for (int ch = 0; ch < 3; ++ch) g[ch] = basis_sum<kCount>(b, c, ch) + 0.5f >= 0.f ? v_rgb[3 * i + ch] : 0.f;
    float wb[kShBases];  // dL/d basis_k
#pragma unroll
    for (int k = 0; k < kCount; ++k) {
      wb[k] = c[3 * k] * g[0] + c[3 * k + 1] * g[1] + c[3 * k + 2] * g[2];
      for (int ch = 0; ch < 3; ++ch) c[3 * k + ch] = b[k] * g[ch];
    }
    for (int j = 3 * kCount; j < w.row; ++j) c[j] = 0.f;  // bases past the degree
    float gu[3];
    bases_vjp(kDegree, u, wb, gu);
    // u = d / max(|d|, min): du/dd = (I - u u^T) / |d| above the clamp, I / min below it
    const bool clamped = length <= kNormMin;
    const float along = clamped ? 0.f : u[0] * gu[0] + u[1] * gu[1] + u[2] * gu[2];
#pragma unroll
    for (int a = 0; a < 3; ++a) v_dirs[3 * i + a] = (gu[a] - along * u[a]) / length;
  }
  __syncwarp();
  store_part(w, v_dc, 3, 0);
  if (p.k > 1) store_part(w, v_rest, 3 * (p.k - 1), 3);
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kShThreads - 1) / kShThreads); }

// f(std::integral_constant<int, degree>) for the run-time degree 0-3 (sh_params checked it).
template <typename F>
cudaError_t with_degree(int degree, F&& f) {
  switch (degree) {
    case 0: return f(std::integral_constant<int, 0>{});
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t launch_sh_forward(const ShParams& p, float* rgb, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  return with_degree(p.degree, [&](auto degree) {
    sh_forward_kernel<degree()><<<blocks_for(p.n), kShThreads, shared_bytes(p.k), stream>>>(p, rgb);
    return cudaGetLastError();
  });
}

cudaError_t launch_sh_backward(const ShParams& p, const float* v_rgb, float* v_dc, float* v_rest, float* v_dirs,
                               cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  return with_degree(p.degree, [&](auto degree) {
    sh_backward_kernel<degree()><<<blocks_for(p.n), kShThreads, shared_bytes(p.k), stream>>>(p, v_rgb, v_dc, v_rest,
                                                                                             v_dirs);
    return cudaGetLastError();
  });
}

}  // namespace bytesplat
