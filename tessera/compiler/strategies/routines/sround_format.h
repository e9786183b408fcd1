/* stochastic rounding to the format {F} (bits {B}): the nearest value, the neighbour on x's other
   side (the next pattern away from zero or towards it: sign and magnitude), and the pick */
{Q} float {P}_sround_{F}(float x, float u) {
  const {B} b = {P}_f32_to_{F}(x);
  const float w = {P}_{F}_to_f32(b);
  const {B} o = ({B})(({P}_f32_bits(w) & 0x7fffffffu) < ({P}_f32_bits(x) & 0x7fffffffu)
                      ? b + 1u : b - 1u);
  return {P}_sround_pick(x, w, {P}_{F}_to_f32(o), u);
}
