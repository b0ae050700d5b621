// ccl's GPU kernels: copy, reduce and the fused receive-reduce-send step,
// for every element type and operator the CPU kernels have. Compiled at
// run time with NVRTC (ccl_kernels::cuda), for the device's architecture.
//
// Names: ccl_copy_<type>, ccl_reduce_<op>_<type> (dst = a op b, dst may be
// a or b), ccl_recv_reduce_send_<op>_<type> (out = slot op local, written
// to both the output and the next slot; either may be null).
// Grid-stride loops: any launch shape covers any n. Where every pointer is
// 16-byte aligned and the type's size divides 16, each thread moves 16
// bytes at a time (one vector load or store per operand); the tail, and
// other types or alignments, go element by element.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

typedef signed char i8;
typedef unsigned char u8;
typedef short i16;
typedef unsigned short u16;
typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;
typedef float f32;
typedef double f64;
typedef __half f16;
typedef __nv_bfloat16 bf16;

template <typename T> struct Sum { __device__ static T f(T a, T b) { return a + b; } };
template <typename T> struct Prod { __device__ static T f(T a, T b) { return a * b; } };
template <typename T> struct Min { __device__ static T f(T a, T b) { return b < a ? b : a; } };
template <typename T> struct Max { __device__ static T f(T a, T b) { return a < b ? b : a; } };
template <typename T> struct BitAnd { __device__ static T f(T a, T b) { return a & b; } };
template <typename T> struct BitOr { __device__ static T f(T a, T b) { return a | b; } };
template <typename T> struct BitXor { __device__ static T f(T a, T b) { return a ^ b; } };

// half and bfloat16 through their intrinsics
template <> struct Sum<f16> { __device__ static f16 f(f16 a, f16 b) { return __hadd(a, b); } };
template <> struct Prod<f16> { __device__ static f16 f(f16 a, f16 b) { return __hmul(a, b); } };
template <> struct Min<f16> { __device__ static f16 f(f16 a, f16 b) { return __hlt(b, a) ? b : a; } };
template <> struct Max<f16> { __device__ static f16 f(f16 a, f16 b) { return __hlt(a, b) ? b : a; } };
template <> struct Sum<bf16> { __device__ static bf16 f(bf16 a, bf16 b) { return __hadd(a, b); } };
template <> struct Prod<bf16> { __device__ static bf16 f(bf16 a, bf16 b) { return __hmul(a, b); } };
template <> struct Min<bf16> { __device__ static bf16 f(bf16 a, bf16 b) { return __hlt(b, a) ? b : a; } };
template <> struct Max<bf16> { __device__ static bf16 f(bf16 a, bf16 b) { return __hlt(a, b) ? b : a; } };

// Avg's finishing pass: the sum divided by the rank count (integers truncate
// in 64 bits, so no rank count wraps; half types divide in float and round
// once, like the CPU kernels)
template <typename T> struct Div { __device__ static T f(T a, u64 n) { return (T)((i64)a / (i64)n); } };
#define CCL_UDIV(T) \
    template <> struct Div<T> { __device__ static T f(T a, u64 n) { return (T)((u64)a / n); } };
CCL_UDIV(u8) CCL_UDIV(u16) CCL_UDIV(u32) CCL_UDIV(u64)
template <> struct Div<f32> { __device__ static f32 f(f32 a, u64 n) { return a / (f32)n; } };
template <> struct Div<f64> { __device__ static f64 f(f64 a, u64 n) { return a / (f64)n; } };
template <> struct Div<f16> { __device__ static f16 f(f16 a, u64 n) { return __float2half(__half2float(a) / (float)n); } };
template <> struct Div<bf16> {
    __device__ static bf16 f(bf16 a, u64 n) { return __float2bfloat16(__bfloat162float(a) / (float)n); }
};

// 16 bytes of T: how many elements (W), and whether T packs into them at all
template <typename T> struct Pack {
    enum { fits = sizeof(T) <= 16 && 16 % sizeof(T) == 0, W = fits ? 16 / sizeof(T) : 1 };
    union V { uint4 raw; T e[W]; };
};

__device__ inline bool aligned16(const void* p) { return p == 0 || ((u64)p & 15) == 0; }
__device__ inline u64 first_thread() { return blockIdx.x * (u64)blockDim.x + threadIdx.x; }
__device__ inline u64 all_threads() { return (u64)gridDim.x * blockDim.x; }

// the elements [0, done) that go 16 bytes at a time, when they may
template <typename T>
__device__ inline u64 packed(u64 n, const void* a, const void* b, const void* c, const void* d) {
    return Pack<T>::fits && aligned16(a) && aligned16(b) && aligned16(c) && aligned16(d)
               ? n / Pack<T>::W * Pack<T>::W : 0;
}

template <typename T>
__device__ void div_by(T* buf, u64 ranks, u64 n) {
    typedef typename Pack<T>::V V;
    const u64 done = packed<T>(n, buf, 0, 0, 0);
    for (u64 p = first_thread(); p < done / Pack<T>::W; p += all_threads()) {
        V v;
        v.raw = ((const uint4*)buf)[p];
#pragma unroll
        for (int k = 0; k < Pack<T>::W; k++) v.e[k] = Div<T>::f(v.e[k], ranks);
        ((uint4*)buf)[p] = v.raw;
    }
    for (u64 i = done + first_thread(); i < n; i += all_threads()) buf[i] = Div<T>::f(buf[i], ranks);
}

template <typename T>
__device__ void copy(T* dst, const T* src, u64 n) {
    const u64 done = packed<T>(n, dst, src, 0, 0);
    for (u64 p = first_thread(); p < done / Pack<T>::W; p += all_threads()) ((uint4*)dst)[p] = ((const uint4*)src)[p];
    for (u64 i = done + first_thread(); i < n; i += all_threads()) dst[i] = src[i];
}

template <typename T, typename Op>
__device__ void recv_reduce_send(T* out, T* next, const T* slot, const T* local, u64 n) {
    typedef typename Pack<T>::V V;
    const u64 done = packed<T>(n, out, next, slot, local);
    for (u64 p = first_thread(); p < done / Pack<T>::W; p += all_threads()) {
        V x, y;
        x.raw = ((const uint4*)slot)[p];
        y.raw = ((const uint4*)local)[p];
#pragma unroll
        for (int k = 0; k < Pack<T>::W; k++) x.e[k] = Op::f(x.e[k], y.e[k]);
        if (out) ((uint4*)out)[p] = x.raw;
        if (next) ((uint4*)next)[p] = x.raw;
    }
    for (u64 i = done + first_thread(); i < n; i += all_threads()) {
        T v = Op::f(slot[i], local[i]);
        if (out) out[i] = v;
        if (next) next[i] = v;
    }
}

// dst = a op b (dst may be a or b: each element is read before written)
template <typename T, typename Op>
__device__ void reduce(T* dst, const T* a, const T* b, u64 n) {
    recv_reduce_send<T, Op>(dst, 0, a, b, n);
}

#define CCL_COPY(T) \
    extern "C" __global__ void ccl_copy_##T(T* dst, const T* src, u64 n) { copy<T>(dst, src, n); }
#define CCL_OP(OP, T)                                                                                         \
    extern "C" __global__ void ccl_reduce_##OP##_##T(T* dst, const T* a, const T* b, u64 n) {                 \
        reduce<T, OP<T> >(dst, a, b, n);                                                                      \
    }                                                                                                         \
    extern "C" __global__ void ccl_recv_reduce_send_##OP##_##T(T* out, T* next, const T* slot, const T* local, \
                                                              u64 n) {                                        \
        recv_reduce_send<T, OP<T> >(out, next, slot, local, n);                                              \
    }
#define CCL_DIV(T) \
    extern "C" __global__ void ccl_div_##T(T* buf, u64 ranks, u64 n) { div_by<T>(buf, ranks, n); }
// what a derived struct gets (its field-wise Sum, Prod, Min and Max are specialised before)
#define CCL_STRUCT(T) CCL_COPY(T) CCL_OP(Sum, T) CCL_OP(Prod, T) CCL_OP(Min, T) CCL_OP(Max, T)
#define CCL_ARITH(T) CCL_STRUCT(T) CCL_DIV(T)
#define CCL_INT(T) CCL_ARITH(T) CCL_OP(BitAnd, T) CCL_OP(BitOr, T) CCL_OP(BitXor, T)

// ---- the primitive types (a derived type's source ends here and adds its own)

// Flags where a stream cannot wait on memory itself: one thread polls the
// word (how: 0 at least value, the difference taken as signed as CUDA's
// GEQ takes it, 1 some bit of value set, 2 some bit of value clear), or
// stores it after a system-wide fence, so that what the stream wrote
// before is visible to every GPU and process first.
extern "C" __global__ void ccl_wait_flag(const volatile u64* flag, u64 value, u64 how) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    for (;;) {
        u64 w = *flag;
        if (how == 0 ? (long long)(w - value) >= 0 : how == 1 ? (w & value) != 0 : (w & value) != value) break;
    }
    __threadfence_system();
}
extern "C" __global__ void ccl_set_flag(volatile u64* flag, u64 value) {
    __threadfence_system();
    *flag = value;
    __threadfence_system();
}

CCL_INT(i8)
CCL_INT(u8)
CCL_INT(i16)
CCL_INT(u16)
CCL_INT(i32)
CCL_INT(u32)
CCL_INT(i64)
CCL_INT(u64)
CCL_ARITH(f32)
CCL_ARITH(f64)
CCL_ARITH(f16)
CCL_ARITH(bf16)
