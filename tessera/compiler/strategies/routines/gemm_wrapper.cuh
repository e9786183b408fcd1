/* {doc} */
static __device__ __forceinline__ void {name}(const {T}* A, long long a_rs, long long a_cs,
    const {T}* B, long long b_rs, long long b_cs, {TC}* C, long long ldc, long long K, long long mt,
    long long nt) {
  {call}(A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, K, mt, nt);
}

