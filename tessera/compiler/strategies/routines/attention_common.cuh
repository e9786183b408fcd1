/* ts_expf / ts_exp for the attention routines: specialised per dtype, after them */
template <typename R> __device__ R tsa_exp(R x);
/* The keys rows q0 .. q0+nq-1 may see: past the last row's causal horizon all are masked. */
static __device__ __forceinline__ long long tsa_key_end(long long q0, long long nq,
                                                        long long Sk, int causal, long long off) {
  if (!causal) return Sk;
  const long long h = q0 + nq + off;
  return h < Sk ? (h > 0 ? h : 0) : Sk;
}

