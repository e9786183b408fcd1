/* stochastic rounding of a float32 x to a narrow format, given w (x rounded to nearest), o (the
   format's other neighbour of x) and u (uniform in [0, 1), 24 bits): the neighbour farther
   from zero with probability |x - nearer to zero| / |the two's distance| (an exact quotient),
   so the expected result is x. Beyond the largest finite value, and for NaN, as nearest. The
   choices are selects on bits, so a loop rounding this way vectorises. */
{Q} float {P}_sround_pick(float x, float w, float o, float u) {
  const {U32} wb = {P}_f32_bits(w), ob = {P}_f32_bits(o);
  const {U32} up = (wb & 0x7fffffffu) < (ob & 0x7fffffffu);  /* |w| < |o| (same signs) */
  const {U32} lb = {P}_pick(up, wb, ob), hb = {P}_pick(up, ob, wb);
  const float lo = {P}_bits_f32(lb), hi = {P}_bits_f32(hb);
  const {U32} plain = ({P}_f32_bits(w) == {P}_f32_bits(x)) | ((wb & 0x7fffffffu) >= 0x7f800000u)
                      | ((ob & 0x7fffffffu) >= 0x7f800000u);
  const {U32} far = u < fabsf(x - lo) / fabsf(hi - lo);
  return {P}_bits_f32({P}_pick(plain, wb, {P}_pick(far, hb, lb)));
}
