// ccl's GPU kernels: copy, reduce and the fused receive-reduce-send step,
// for every element type and operator the CPU kernels have. Compiled at
// run time with NVRTC (ccl_kernels::cuda), for the device's architecture.
//
// Names: ccl_copy_<type>, ccl_reduce_<op>_<type> (dst = a op b, dst may be
// a or b), ccl_recv_reduce_send_<op>_<type> (out = slot op local, written
// to both the output and the next slot; either may be null).
// Grid-stride loops: any launch shape covers any n.

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

template <typename T>
__device__ void div_by(T* buf, u64 ranks, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        buf[i] = Div<T>::f(buf[i], ranks);
}

template <typename T>
__device__ void copy(T* dst, const T* src, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) dst[i] = src[i];
}

template <typename T, typename Op>
__device__ void reduce(T* dst, const T* a, const T* b, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        dst[i] = Op::f(a[i], b[i]);
}

template <typename T, typename Op>
__device__ void recv_reduce_send(T* out, T* next, const T* slot, const T* local, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        T v = Op::f(slot[i], local[i]);
        if (out) out[i] = v;
        if (next) next[i] = v;
    }
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
