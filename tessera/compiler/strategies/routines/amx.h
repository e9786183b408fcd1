/* AMX's tile registers (x86-64-v4+amx), for the GEMM routines that use them: Linux's permission
   for the tiles' 8 KiB of state (requested once per process), and every tile configured 16 rows
   of 64 bytes. */
#if defined(__AMX_TILE__) && !defined(TS_AMX_H)
#define TS_AMX_H 1
#include <immintrin.h>
#include <sys/syscall.h>

static int ts_amx_permitted(void) {
  static int state;                  /* 0 unknown, 1 granted, -1 refused (a racing repeat of
                                        the request is harmless: it is idempotent) */
  if (!state) {
#if defined(__linux__) && defined(SYS_arch_prctl)
    extern long syscall(long number, ...);       /* (unistd.h hides it under -std=c11) */
    state = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */,
                    18 /* XFEATURE_XTILEDATA */) == 0 ? 1 : -1;
#else
    state = -1;
#endif
  }
  return state == 1;
}

/* Tiles 0-7 as 16 rows of 64 bytes (the configuration is per thread: set at each call). */
static void ts_amx_configure(void) {
  struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
  } cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
}
#endif
