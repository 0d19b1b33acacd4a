// The decode GEMV of chapters/05-cuda-kernels/gemv-bytes-in-flight (lib.kernels.latency_hiding.gemv), timed by
// tools/device/gemv_probe.py on one H200. Compiled once per configuration:
//   GV_T threads per row, GV_V bytes per weight load (4, 8, 16), GV_U loads each thread issues before it uses the
//   first, GV_B sequences in the batch.
// y[b, n] = sum_k W[n, k] x[b, k]; W and x bf16 (stored as unsigned short), fp32 accumulators. 256-thread blocks own
// 256 / GV_T rows; each block stages the batch's x (GV_B x K) in shared memory, then streams its rows. K x 2 / GV_V
// must be a multiple of GV_T x GV_U and N a multiple of 256 / GV_T (no bounds checks: the probe's shapes are).
#ifndef GV_T
#define GV_T 32
#endif
#ifndef GV_V
#define GV_V 16
#endif
#ifndef GV_U
#define GV_U 4
#endif
#ifndef GV_B
#define GV_B 1
#endif
template <int Vb> struct Vec;
template <> struct Vec<16> { int4 v; };
template <> struct Vec<8> { int2 v; };
template <> struct Vec<4> { int v; };
// Weight loads in inline PTX, as in kernels.cu's load16: ptxas keeps volatile asm in order.
__device__ __forceinline__ Vec<16> ld(const Vec<16>* p) {
    Vec<16> r;
    asm volatile("ld.global.nc.v4.s32 {%0,%1,%2,%3}, [%4];" : "=r"(r.v.x), "=r"(r.v.y), "=r"(r.v.z), "=r"(r.v.w) : "l"(p));
    return r;
}
__device__ __forceinline__ Vec<8> ld(const Vec<8>* p) {
    Vec<8> r;
    asm volatile("ld.global.nc.v2.s32 {%0,%1}, [%2];" : "=r"(r.v.x), "=r"(r.v.y) : "l"(p));
    return r;
}
__device__ __forceinline__ Vec<4> ld(const Vec<4>* p) {
    Vec<4> r;
    asm volatile("ld.global.nc.s32 %0, [%1];" : "=r"(r.v) : "l"(p));
    return r;
}
__device__ __forceinline__ float bf16(unsigned short h) { return __uint_as_float(((unsigned)h) << 16); }

extern "C" __global__ void gemv(const unsigned short* __restrict__ W, const unsigned short* __restrict__ x,
                                float* __restrict__ y, int N, int K) {
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned short* xs = reinterpret_cast<unsigned short*>(smem);
    const int4* x4 = reinterpret_cast<const int4*>(x);
    int4* xs4 = reinterpret_cast<int4*>(xs);
#pragma unroll 4
    for (int i = threadIdx.x; i < GV_B * K / 8; i += blockDim.x) xs4[i] = x4[i];  // x: 16-byte loads
    __syncthreads();
    constexpr int E = GV_V / 2;  // bf16 values per weight load
    const int row = blockIdx.x * (256 / GV_T) + threadIdx.x / GV_T;
    const int lane = threadIdx.x % GV_T;
    float acc[GV_B];
#pragma unroll
    for (int b = 0; b < GV_B; ++b) acc[b] = 0.f;
    const Vec<GV_V>* wr = reinterpret_cast<const Vec<GV_V>*>(W + (size_t)row * K);
    const int nvec = K / E;
    for (int k0 = lane; k0 < nvec; k0 += GV_T * GV_U) {
        Vec<GV_V> w[GV_U];
#pragma unroll
        for (int u = 0; u < GV_U; ++u) w[u] = ld(wr + k0 + u * GV_T);
#pragma unroll
        for (int u = 0; u < GV_U; ++u) {
            const unsigned short* we = reinterpret_cast<const unsigned short*>(&w[u]);
            const int kk = (k0 + u * GV_T) * E;  // lanes GV_V bytes apart: a 4-way bank conflict at 16 B
#pragma unroll
            for (int b = 0; b < GV_B; ++b)
#pragma unroll
                for (int e = 0; e < E; ++e) acc[b] += bf16(we[e]) * bf16(xs[b * K + kk + e]);
        }
    }
    constexpr int W32 = GV_T < 32 ? GV_T : 32;
#pragma unroll
    for (int b = 0; b < GV_B; ++b)
#pragma unroll
        for (int o = W32 / 2; o > 0; o /= 2) acc[b] += __shfl_down_sync(0xffffffff, acc[b], o, W32);
    if constexpr (GV_T <= 32) {
        if (lane == 0)
            for (int b = 0; b < GV_B; ++b) y[(size_t)b * N + row] = acc[b];
    } else {  // several warps per row: add the warps' partial sums through shared memory
        constexpr int WPR = GV_T / 32;
        float* red = reinterpret_cast<float*>(smem + GV_B * K * 2);  // [rows][WPR][GV_B]
        const int r = threadIdx.x / GV_T, w = lane / 32;
        if (lane % 32 == 0)
            for (int b = 0; b < GV_B; ++b) red[(r * WPR + w) * GV_B + b] = acc[b];
        __syncthreads();
        if (lane == 0)
            for (int b = 0; b < GV_B; ++b) {
                float s = 0.f;
                for (int j = 0; j < WPR; ++j) s += red[(r * WPR + j) * GV_B + b];
                y[(size_t)b * N + row] = s;
            }
    }
}
