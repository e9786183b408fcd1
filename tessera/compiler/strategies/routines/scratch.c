static _Thread_local {T}* ts_scratch_buf_{S} = 0;
static _Thread_local size_t ts_scratch_cap_{S} = 0;

/* Grow-only working memory for the routines, one per thread (kept for the thread's life). */
static {T}* ts_scratch_{S}(size_t n) {
  if (n > ts_scratch_cap_{S}) {
    void* p = 0;
    if (posix_memalign(&p, 64, n * sizeof({T}))) return 0;
    free(ts_scratch_buf_{S});
    ts_scratch_buf_{S} = ({T}*)p;
    ts_scratch_cap_{S} = n;
  }
  return ts_scratch_buf_{S};
}
