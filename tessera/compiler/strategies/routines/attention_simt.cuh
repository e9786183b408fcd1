
/* ---- tsa_attention: flash attention for one block of query rows, see
   tessera/compiler/strategies/routines/gpu_attention.py ---- */

/* reg[t] = tile element e = threadIdx.x + t*NT of a ROWS x COLS tile, (r, c) = (e / COLS,
   e % COLS) at g[r*rs + c], zero past rl rows or cl columns (or past the tile). NT is a
   multiple of COLS: a thread's column is fixed and its rows are NT/COLS apart. */
template <int DT, int ROWS, int COLS, int NT, int N>
__device__ __forceinline__ void tsa_fetch(typename tsg_dt<DT>::R (&reg)[N],
                                          const typename tsg_dt<DT>::S* g, long long rs,
                                          long long rl, long long cl) {
  const int r0 = threadIdx.x / COLS, c = threadIdx.x % COLS;
  const typename tsg_dt<DT>::S* p = g + r0 * rs + c;
#pragma unroll
  for (int t = 0; t < N; ++t) {
    const int r = r0 + t * (NT / COLS);
    reg[t] = (ROWS % (NT / COLS) == 0 || r < ROWS) && r < rl && c < cl
                 ? tsg_dt<DT>::in(p[t * (NT / COLS) * rs]) : typename tsg_dt<DT>::R(0);
  }
}
/* ...and into shared memory: s[c*ld + r] (TRANS) or s[r*ld + c] */
template <int ROWS, int COLS, int NT, int N, bool TRANS, typename R>
__device__ __forceinline__ void tsa_put(R* s, int ld, const R (&reg)[N]) {
  const int r0 = threadIdx.x / COLS, c = threadIdx.x % COLS;
#pragma unroll
  for (int t = 0; t < N; ++t) {
    const int r = r0 + t * (NT / COLS);
    if (ROWS % (NT / COLS) == 0 || r < ROWS) s[TRANS ? c * ld + r : r * ld + c] = reg[t];
  }
}

/* Scores: BQ x BK as NY x NX threads of TMS x TNS (rows ty*TMS + i, keys tx + NX*j).
   Output: BQ x NC column chunks as NYO x NXO threads of TMO x TNO (rows ty*TMO + i, columns
   tx + NXO*j). DS: d slice; QD: Q resident when D <= QD; VS: keys per V slice. */
template <int DT, int BQ, int BK, int NT, int TMS, int TNS, int TMO, int TNO, int NC, int DS,
          int QD, int VS>
__device__ __forceinline__ void tsa_attention(
    const typename tsg_dt<DT>::S* __restrict__ Q, long long q_rs,
    const typename tsg_dt<DT>::S* __restrict__ K, long long k_rs,
    const typename tsg_dt<DT>::S* __restrict__ V, long long v_rs,
    const typename tsg_dt<DT>::S* __restrict__ M, long long m_rs, long long m_cs,
    typename tsg_dt<DT>::S* __restrict__ O, long long o_rs, long long q0, long long nq,
    long long Sk, long long D, long long Dv, typename tsg_dt<DT>::R scale, int causal,
    long long off) {
  TSG_NOCONTRACT
  typedef typename tsg_dt<DT>::S S;
  typedef typename tsg_dt<DT>::R R;
  enum { NX = BK / TNS, NXO = NC / TNO, LQ = (BQ * DS + NT - 1) / NT,
         LK = (BK * DS + NT - 1) / NT, LV = (VS * NC + NT - 1) / NT,
         GLOBAL_OK = sizeof(S) == sizeof(R) };    /* O's rows can hold the accumulator */
  __shared__ R Qs[QD][BQ + 1];         /* Q, d-major: all of it (D <= QD) or one d slice */
  __shared__ R Ks[DS][BK + 1];         /* one d slice of the key block, d-major */
  __shared__ R Vs[VS][NC];             /* one key slice of V's current column chunk */
  __shared__ R Ps[BQ][BK + 1];         /* the key block's probabilities */
  __shared__ R al[BQ], ls[BQ];         /* per row: the block's rescaling factor; running sum */
  const int tid = threadIdx.x, tx = tid % NX, ty = tid / NX, txo = tid % NXO, tyo = tid / NXO;
  const R ninf = tsg_dt<DT>::ninf();
  const S* Qb = Q + q0 * q_rs;
  S* Ob = O + q0 * o_rs;
  const long long kend = tsa_key_end(q0, nq, Sk, causal, off);
  __syncthreads();                     /* the previous call's last reads are done */
  if (kend <= 0) {                     /* no row sees a key */
    for (long long e = tid; e < nq * Dv; e += NT)
      Ob[e / Dv * o_rs + e % Dv] = tsg_dt<DT>::out(R(0));
    return;
  }
  const bool q_res = D <= QD;
  const int nd = D > DS ? (int)((D + DS - 1) / DS) : 1;     /* d slices (one even if D = 0) */
  const int nch = (int)((Dv + NC - 1) / NC);
  /* the accumulator: registers (one pass per column chunk, scores recomputed per pass) or,
     for f32/f64 with Dv > NC, O itself (one pass) */
  const bool in_regs = !GLOBAL_OK || Dv <= NC;
  const int npass = in_regs ? nch : 1;
  for (int pass = 0; pass < npass; ++pass) {
    __syncthreads();                   /* the previous pass's reads of ls and Qs are done */
    for (int r = tid; r < BQ; r += NT) ls[r] = R(0);
    if (q_res)
      for (int e = tid; e < BQ * QD; e += NT) {
        const int r = e / QD, d = e % QD;
        Qs[d][r] = r < nq && d < D ? tsg_dt<DT>::in(Qb[r * q_rs + d]) : R(0);
      }
    R mrow[TMS], o[TMO][TNO];
#pragma unroll
    for (int i = 0; i < TMS; ++i) mrow[i] = ninf;
#pragma unroll
    for (int i = 0; i < TMO; ++i)
#pragma unroll
      for (int j = 0; j < TNO; ++j) o[i][j] = R(0);
    for (long long kb = 0; kb < kend; kb += BK) {
      const long long bk = Sk - kb < BK ? Sk - kb : BK;
      const S* Kb = K + kb * k_rs;
      /* 1. scores s[i][j] = fma chain over d of K[key][d] * Q[row][d] */
      R s[TMS][TNS], rq[LQ], rk[LK];
#pragma unroll
      for (int i = 0; i < TMS; ++i)
#pragma unroll
        for (int j = 0; j < TNS; ++j) s[i][j] = R(0);
      if (!q_res) tsa_fetch<DT, BQ, DS, NT, LQ>(rq, Qb, q_rs, nq, D);
      tsa_fetch<DT, BK, DS, NT, LK>(rk, Kb, k_rs, bk, D);
      for (int sd = 0; sd < nd; ++sd) {
        __syncthreads();               /* everybody is done with Ks, Qs (and Ps, Vs) */
        if (!q_res) tsa_put<BQ, DS, NT, LQ, true>(&Qs[0][0], BQ + 1, rq);
        tsa_put<BK, DS, NT, LK, true>(&Ks[0][0], BK + 1, rk);
        __syncthreads();
        const long long d0 = (long long)sd * DS;
        if (sd + 1 < nd) {             /* the next slice, while this one is used */
          if (!q_res) tsa_fetch<DT, BQ, DS, NT, LQ>(rq, Qb + d0 + DS, q_rs, nq, D - d0 - DS);
          tsa_fetch<DT, BK, DS, NT, LK>(rk, Kb + d0 + DS, k_rs, bk, D - d0 - DS);
        }
        /* (d past D: q = k = 0, fma(0, 0, s) = s but for the sign of a zero score) */
        const R* qs = q_res ? &Qs[d0][0] : &Qs[0][0];
#pragma unroll
        for (int d = 0; d < DS; ++d) {
          R qv[TMS], kv[TNS];
#pragma unroll
          for (int i = 0; i < TMS; ++i) qv[i] = qs[d * (BQ + 1) + ty * TMS + i];
#pragma unroll
          for (int j = 0; j < TNS; ++j) kv[j] = Ks[d][tx + NX * j];
#pragma unroll
          for (int i = 0; i < TMS; ++i)
#pragma unroll
            for (int j = 0; j < TNS; ++j) s[i][j] = tsg_fma(kv[j], qv[i], s[i][j]);
        }
      }
      /* 2. scale, mask, causal; the block's row max; the online-softmax step. In-block
         indices are ints: key tx + NX*j is visible to row r when it is below `vis`. */
      const int bki = (int)bk;
#pragma unroll
      for (int i = 0; i < TMS; ++i) {
        const int r = ty * TMS + i;
        const long long h = q0 + r + off + 1 - kb;   /* the causal horizon, in block keys */
        const int vis = !causal || h >= bki ? bki : h > 0 ? (int)h : 0;
        const S* mp = M && r < nq ? M + (q0 + r) * m_rs + (kb + tx) * m_cs : (const S*)0;
        R bm = ninf;
#pragma unroll
        for (int j = 0; j < TNS; ++j) {
          const int key = tx + NX * j;
          R v = tsg_mul(s[i][j], scale);
          if (M)
            v = tsg_add(v, mp && key < bki ? tsg_dt<DT>::in(mp[j * NX * m_cs]) : R(0));
          if (key >= vis) v = ninf;
          s[i][j] = v;
          bm = tsg_max(bm, v);         /* NaN never wins, as on the CPU */
        }
#pragma unroll
        for (int x = NX / 2; x > 0; x >>= 1) bm = tsg_max(bm, TSG_SHFL_XOR(bm, x));
        const R mo = mrow[i], mn = tsg_max(mo, bm);
        const R mz = mn == ninf ? R(0) : mn;            /* nothing seen: exp(-inf - 0) = 0 */
        mrow[i] = mn;
#pragma unroll
        for (int j = 0; j < TNS; ++j) Ps[r][tx + NX * j] = tsa_exp<R>(s[i][j] - mz);
        if (tx == 0) al[r] = mn == mo ? R(1) : tsa_exp<R>(mo - mz);
      }
      __syncthreads();
      /* 3. the running sums: the block's probabilities added in key order, one row each */
      for (int r = tid; r < BQ; r += NT) {
        R blk = R(0);
        for (int j = 0; j < bk; ++j) blk = tsg_add(blk, Ps[r][j]);
        ls[r] = tsg_fma(ls[r], al[r], blk);
      }
      /* 4. o = o * alpha + P V over the block's keys in order, chunk by chunk */
      const bool last = kb + BK >= kend;
      const int nvs = (int)((bk + VS - 1) / VS);
      for (int ch = in_regs ? pass : 0; ch < (in_regs ? pass + 1 : nch); ++ch) {
        const long long c0 = (long long)ch * NC;
        const int ncol = Dv - c0 < NC ? (int)(Dv - c0) : NC;     /* columns of this chunk */
#pragma unroll
        for (int i = 0; i < TMO; ++i) {
          const int r = tyo * TMO + i;
          const R a = al[r];
          const S* orow = Ob + r * o_rs + c0;
#pragma unroll
          for (int j = 0; j < TNO; ++j) {
            const int c = txo + NXO * j;
            if (!in_regs)              /* f32/f64 only: S is R */
              o[i][j] = kb > 0 && r < nq && c < ncol ? tsg_dt<DT>::in(orow[c]) : R(0);
            o[i][j] = tsg_mul(o[i][j], a);
          }
        }
        R rv[LV];
        tsa_fetch<DT, VS, NC, NT, LV>(rv, V + kb * v_rs + c0, v_rs, bk, Dv - c0);
        for (int sv = 0; sv < nvs; ++sv) {
          __syncthreads();             /* Vs is free; (first time) ls is written */
          tsa_put<VS, NC, NT, LV, false>(&Vs[0][0], NC, rv);
          __syncthreads();
          const int j0 = sv * VS;
          if (sv + 1 < nvs)
            tsa_fetch<DT, VS, NC, NT, LV>(rv, V + (kb + j0 + VS) * v_rs + c0, v_rs,
                                          bk - j0 - VS, Dv - c0);
          /* (keys past Sk: p = v = 0, and o is never -0: fma(0, 0, o) = o) */
#pragma unroll
          for (int j = 0; j < VS; ++j) {
            R pv[TMO], vv[TNO];
#pragma unroll
            for (int i = 0; i < TMO; ++i) pv[i] = Ps[tyo * TMO + i][j0 + j];
#pragma unroll
            for (int jj = 0; jj < TNO; ++jj) vv[jj] = Vs[j][txo + NXO * jj];
#pragma unroll
            for (int i = 0; i < TMO; ++i)
#pragma unroll
              for (int jj = 0; jj < TNO; ++jj) o[i][jj] = tsg_fma(pv[i], vv[jj], o[i][jj]);
          }
        }
        if (last || !in_regs) {        /* store: the final o / l, or the running accumulator */
#pragma unroll
          for (int i = 0; i < TMO; ++i) {
            const int r = tyo * TMO + i;
            const R l = ls[r];
            S* orow = Ob + r * o_rs + c0;
            if (r < nq)
#pragma unroll
              for (int j = 0; j < TNO; ++j) {
                const int c = txo + NXO * j;
                if (c < ncol)
                  orow[c] = tsg_dt<DT>::out(!last ? o[i][j]
                                                  : l == R(0) ? R(0) : tsg_div(o[i][j], l));
              }
          }
        }
      }
    }
  }
}

