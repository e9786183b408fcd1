/* AMX's tile registers, for the GEMM routines that use them: Linux's permission for the tiles'
   8 KiB of state (requested once per process), and every tile configured 16 rows of 64 bytes.
   At x86-64-v4+amx the flags enable the tiles everywhere. At x86-64-v4+vnni (the host level of
   every AMX machine) they are enabled per function (TS_AMX_FN) for the int8 routine alone, whose
   exact integer sums give the same bits on the tiles as on VNNI: it runs where CPUID names the
   tiles and Linux grants them, and VNNI's routine elsewhere (TS_AMX_AT_RUN_TIME; a test builds
   the VNNI routine alone with -DTS_NO_AMX_AT_RUN_TIME). */
#if !defined(__AMX_TILE__) && !defined(TS_NO_AMX_AT_RUN_TIME) && defined(__x86_64__) && \
    defined(__linux__) && defined(__AVX512VNNI__) && defined(__AVX512BW__) && \
    ((defined(__clang__) && __clang_major__ >= 13) || (!defined(__clang__) && __GNUC__ >= 11))
#define TS_AMX_AT_RUN_TIME 1
#define TS_AMX_FN __attribute__((target("amx-tile,amx-int8")))
#elif defined(__AMX_TILE__)
#define TS_AMX_FN
#endif
#if defined(TS_AMX_FN) && !defined(TS_AMX_H)
#define TS_AMX_H 1
#include <immintrin.h>
#include <sys/syscall.h>
#if TS_AMX_AT_RUN_TIME
#include <cpuid.h>
#endif

static int ts_amx_permitted(void) {
  static int state;                  /* 0 unknown, 1 granted, -1 refused (a racing repeat of
                                        the request is harmless: it is idempotent) */
  if (!state) {
#if defined(__linux__) && defined(SYS_arch_prctl)
    extern long syscall(long number, ...);       /* (unistd.h hides it under -std=c11) */
    int has = 1;
#if TS_AMX_AT_RUN_TIME                 /* leaf 7's EDX: bit 24 AMX-TILE, bit 25 AMX-INT8 */
    unsigned int a, b, c, d;
    has = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 24 & 3) == 3;
#endif
    state = has && syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */,
                           18 /* XFEATURE_XTILEDATA */) == 0 ? 1 : -1;
#else
    state = -1;
#endif
  }
  return state == 1;
}

/* Tiles 0-7 as 16 rows of 64 bytes (the configuration is per thread: set at each call). */
TS_AMX_FN static void ts_amx_configure(void) {
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

/* One K block's products, defining `name` over the tile product DOT (an immediate per tile, so
   one function per instruction): each 32 x 32 block of C (4-byte elements, rows np apart) in
   tiles 0-3, from zero (first) or from c, then per 64-byte chunk of k A's two 16-row tiles
   (panels of 16 rows, a chunk 1 KiB) times B's two tiles side by side (panels of 32 columns, a
   chunk 2 KiB, rows of 128 bytes); the packings of each routine lay their bytes out so. The
   blocks go a group of B's column panels at a time (as many as fill L1: 3 of bf16's 256 k),
   each of A's row panels against the group's: A's panel is read from L2 once per group, not
   once per column panel (8% at 2048). */
#define TS_AMX_L1 49152
#define TS_AMX_BLOCKS(name, DOT)                                                              \
  TS_AMX_FN static void name(const unsigned char* pa, const unsigned char* pb, void* cv,      \
                             int64_t mp, int64_t np, int64_t chunks, int first) {             \
    int64_t group = TS_AMX_L1 / (chunks * 2048);                                              \
    group = 32 * (group > 1 ? group : 1);                                                     \
    for (int64_t jg = 0; jg < np; jg += group)                                                \
      for (int64_t ir = 0; ir < mp; ir += 32)                                                 \
        for (int64_t jr = jg; jr < jg + group && jr < np; jr += 32) {                         \
          const unsigned char* b = pb + jr * chunks * 64;                                     \
          const unsigned char* a0 = pa + ir * chunks * 64;                                    \
          const unsigned char* a1 = a0 + 16 * chunks * 64;                                    \
          char* c0 = (char*)cv + (ir * np + jr) * 4;                                          \
          if (first) {                                                                        \
            _tile_zero(0);                                                                    \
            _tile_zero(1);                                                                    \
            _tile_zero(2);                                                                    \
            _tile_zero(3);                                                                    \
          } else {                                                                            \
            _tile_loadd(0, c0, np * 4);                                                       \
            _tile_loadd(1, c0 + 64, np * 4);                                                  \
            _tile_loadd(2, c0 + 16 * np * 4, np * 4);                                         \
            _tile_loadd(3, c0 + 16 * np * 4 + 64, np * 4);                                    \
          }                                                                                   \
          for (int64_t q = 0; q < chunks; ++q) {                                              \
            _tile_loadd(4, a0 + q * 1024, 64);                                                \
            _tile_loadd(5, a1 + q * 1024, 64);                                                \
            _tile_loadd(6, b + q * 2048, 128);                                                \
            _tile_loadd(7, b + q * 2048 + 64, 128);                                           \
            DOT(0, 4, 6);                                                                     \
            DOT(1, 4, 7);                                                                     \
            DOT(2, 5, 6);                                                                     \
            DOT(3, 5, 7);                                                                     \
          }                                                                                   \
          _tile_stored(0, c0, np * 4);                                                        \
          _tile_stored(1, c0 + 64, np * 4);                                                   \
          _tile_stored(2, c0 + 16 * np * 4, np * 4);                                          \
          _tile_stored(3, c0 + 16 * np * 4 + 64, np * 4);                                     \
        }                                                                                     \
  }
#endif
