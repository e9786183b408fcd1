/* stochastic rounding of a float32 x to a narrow format, given w (x rounded to nearest), o (the
   format's other neighbour of x) and u (uniform in [0, 1), 24 bits): the neighbour farther
   from zero with probability |x - nearer to zero| / |the two's distance| (an exact quotient),
   so the expected result is x. Beyond the largest finite value, and for NaN, as nearest. */
{Q} float {P}_sround_pick(float x, float w, float o, float u) {
  if (w == x || !(fabsf(w) <= 3.40282347e38f) || !(fabsf(o) <= 3.40282347e38f)) return w;
  const int up = fabsf(w) < fabsf(o);
  const float lo = up ? w : o, hi = up ? o : w;
  return u < fabsf(x - lo) / fabsf(hi - lo) ? hi : lo;
}
{Q} float {P}_sround_f16(float x, float u) {
  const {U16} b = {P}_f32_to_f16(x);
  const float w = {P}_f16_to_f32(b);
  return {P}_sround_pick(x, w, {P}_f16_to_f32(({U16})(fabsf(w) < fabsf(x) ? b + 1u : b - 1u)), u);
}
{Q} float {P}_sround_bf16(float x, float u) {
  const {U16} b = {P}_f32_to_bf16(x);
  const float w = {P}_bf16_to_f32(b);
  return {P}_sround_pick(x, w, {P}_bf16_to_f32(({U16})(fabsf(w) < fabsf(x) ? b + 1u : b - 1u)), u);
}
{Q} float {P}_sround_f8e4m3(float x, float u) {
  const {U8} b = {P}_f32_to_f8e4m3(x);
  const float w = {P}_f8e4m3_to_f32(b);
  return {P}_sround_pick(x, w, {P}_f8e4m3_to_f32(({U8})(fabsf(w) < fabsf(x) ? b + 1u : b - 1u)), u);
}
{Q} float {P}_sround_f8e5m2(float x, float u) {
  const {U8} b = {P}_f32_to_f8e5m2(x);
  const float w = {P}_f8e5m2_to_f32(b);
  return {P}_sround_pick(x, w, {P}_f8e5m2_to_f32(({U8})(fabsf(w) < fabsf(x) ? b + 1u : b - 1u)), u);
}
