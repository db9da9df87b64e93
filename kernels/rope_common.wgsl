// RoPE arithmetic shared by rope_kv.wgsl and attention_decode.wgsl (prepended to each as a
// prelude), so the k a decode step writes is computed exactly as a prefill's.
// Hugging Face rotate-half: for i < D/2 with angle = pos * inv_freq[i] (f32, as HF computes it),
//   x'[i] = x[i] cos - x[i + D/2] sin,   x'[i + D/2] = x[i + D/2] cos + x[i] sin.

// pi/2 in 6-bit pieces: k * PIO2_1..4 is exact for |k| < 2^18, so the reduction below loses
// nothing for |a| < 4e5 (positions up to ~400k). The built-in cos/sin are only specified to
// ~2^-11 on [-pi, pi] and get worse with larger arguments on real GPUs.
const PIO2_1: f32 = 1.5625;
const PIO2_2: f32 = 0.00830078125;
const PIO2_3: f32 = -0.000004410743713378906;
const PIO2_4: f32 = -4.377216100692749e-8;
const PIO2_5: f32 = 6.077094383272197e-11;

// (sin a, cos a) to ~1e-7 absolute: Cody-Waite reduction to r in [-pi/4, pi/4] and quadrant,
// then the Cephes single-precision polynomials.
fn sin_cos(a: f32) -> vec2<f32> {
  let k = round(a * 0.63661977236);
  var r = a - k * PIO2_1;
  r = r - k * PIO2_2;
  r = r - k * PIO2_3;
  r = r - k * PIO2_4;
  r = r - k * PIO2_5;
  let z = r * r;
  let s = r + r * z * (-1.6666654611e-1 + z * (8.3321608736e-3 + z * -1.9515295891e-4));
  let c = 1.0 - 0.5 * z +
    z * z * (4.166664568298827e-2 + z * (-1.388731625493765e-3 + z * 2.443315711809948e-5));
  switch (u32(i32(k)) & 3u) {
    case 0u: { return vec2<f32>(s, c); }
    case 1u: { return vec2<f32>(c, -s); }
    case 2u: { return vec2<f32>(-s, -c); }
    default: { return vec2<f32>(-c, s); }
  }
}

// The rotated pair (x'[i], x'[i + D/2]) of (x0, x1) = (x[i], x[i + D/2]) at `position`, where
// `freq` = inv_freq[i].
fn rope_pair(x0: f32, x1: f32, position: u32, freq: f32) -> vec2<f32> {
  let sc = sin_cos(f32(position) * freq);
  return vec2<f32>(x0 * sc.y - x1 * sc.x, x1 * sc.y + x0 * sc.x);
}

// Index of the other element of e's pair in a head of 2 * half: e + half or e - half.
fn rope_partner(e: u32, half: u32) -> u32 {
  return select(e - half, e + half, e < half);
}

// Element e of the rotated head, from xe = x[e] and partner = x[rope_partner(e, half)], where
// `freq` = inv_freq[e % half]: one side of `rope_pair` (so a writer that stores elements one by
// one, or in runs that split pairs, gets exactly the values of one that stores whole pairs).
fn rope_elem(e: u32, half: u32, xe: f32, partner: f32, position: u32, freq: f32) -> f32 {
  if (e < half) {
    return rope_pair(xe, partner, position, freq).x;
  }
  return rope_pair(partner, xe, position, freq).y;
}
