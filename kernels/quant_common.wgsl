// Quantized weights (prepended after matmul_common.wgsl to the matmul kernels that read them, and
// to quant_x.wgsl): the scales binding and the decoders of the layouts kernels/quant.ts draws.
// WDTYPE 3..8 = int8, e4m3, q8_0, q4_0, q4_k, q6_k. A weight is s * code - m with (s, m) of its
// group (group_scale); codes come from the including kernel's W binding, a word at a time.
// The including kernel defines q_k() (the depth K) and q_rows() (rows of W): plane offsets
// follow from them.
//
// Conversions avoid the two things that are slow or unreliable here: integer-to-float
// instructions (a quarter of the FMA rate on NVIDIA) and subnormal f16 (llvmpipe flushes some):
// 8- and 4-bit integers become floats through the exponent of 2^23 (0x4b000000 | u is
// 2^23 + u exactly), e4m3 through an f16 whose exponent field is the e4m3 one (value / 256, the
// 256 folded into the row scale; strata's e4m3 codes have no subnormals), f16 scales through
// integer arithmetic.

@group(0) @binding(7) var<storage, read> qs: array<u32>; // scales (kernels/quant.ts)

fn is_quant() -> bool {
  return WDTYPE >= 3u;
}

// 4-bit codes (q4_0, q4_k): 8 per word; else 4.
fn q_bits() -> u32 {
  return select(8u, 4u, WDTYPE == 6u || WDTYPE == 7u);
}

// Values per scale group (0: one scale per row: int8, e4m3).
fn q_group() -> u32 {
  if (WDTYPE <= 4u) {
    return 0u;
  }
  return select(32u, 16u, WDTYPE == 8u);
}

// An IEEE half (low 16 bits of h) as f32, subnormals exact, without f16 arithmetic.
fn f16_exact(h: u32) -> f32 {
  let e = (h >> 10u) & 31u;
  let m = h & 1023u;
  var v = f32(m) * 5.9604644775390625e-8; // 2^-24: a subnormal half
  if (e != 0u) {
    v = bitcast<f32>(((e + 112u) << 23u) | (m << 13u));
  }
  return select(v, -v, (h & 0x8000u) != 0u);
}

// (s, m) of group g (of q_group() values) of row `row` of W; per-row formats: the row's (s, 0).
fn group_scale(row: u32, g: u32) -> vec2<f32> {
  let k = q_k();
  if (WDTYPE == 3u) {
    return vec2<f32>(bitcast<f32>(qs[row]), 0.0);
  }
  if (WDTYPE == 4u) {
    return vec2<f32>(256.0 * bitcast<f32>(qs[row]), 0.0); // e4m3 codes decode to value / 256
  }
  if (WDTYPE == 5u || WDTYPE == 6u) {
    let h = qs[row * ((k + 63u) / 64u) + g / 2u] >> (16u * (g & 1u));
    return vec2<f32>(f16_exact(h & 0xffffu), 0.0); // q4_0's - 8 is in its codes
  }
  let plane_b = q_rows() * select((k + 511u) / 512u, k / 256u, WDTYPE == 7u);
  if (WDTYPE == 7u) {
    let dd = qs[row * (k / 256u) + g / 8u];
    let sm = qs[plane_b + row * (k / 64u) + g / 2u] >> (16u * (g & 1u));
    let d = f16_exact(dd & 0xffffu);
    let dmin = f16_exact(dd >> 16u);
    return vec2<f32>(d * f32(sm & 0xffu), dmin * f32((sm >> 8u) & 0xffu));
  }
  // q6_k: f16 d per 256 values (16 groups), then one i8 scale per group of 16.
  let b = g / 16u;
  let d = f16_exact((qs[row * ((k + 511u) / 512u) + b / 2u] >> (16u * (b & 1u))) & 0xffffu);
  let sc = bitcast<i32>(qs[plane_b + row * (k / 64u) + g / 4u] << (24u - 8u * (g & 3u))) >> 24u;
  return vec2<f32>(d * f32(sc), 0.0);
}

// The 4 codes of an 8-bit word as floats (int8, q8_0, q6_k: signed; e4m3: value / 256), k order.
fn decode8(w: u32) -> vec4<f32> {
  if (WDTYPE == 4u) {
    let even = unpack2x16float(((w & 0x007f007fu) << 7u) | ((w & 0x00800080u) << 8u));
    let v = w >> 8u;
    let odd = unpack2x16float(((v & 0x007f007fu) << 7u) | ((v & 0x00800080u) << 8u));
    return vec4<f32>(even.x, odd.x, even.y, odd.y);
  }
  let t = w ^ 0x80808080u; // bytes + 128, unsigned
  let u = (vec4<u32>(t, t >> 8u, t >> 16u, t >> 24u) & vec4<u32>(0xffu)) | vec4<u32>(0x4b000000u);
  return bitcast<vec4<f32>>(u) - vec4<f32>(8388736.0); // 2^23 + 128
}

// The 8 codes of a 4-bit word as floats, k order: lo holds k 0..3, hi 4..7 (q4_0: q - 8).
struct Nibbles {
  lo: vec4<f32>,
  hi: vec4<f32>,
}

fn decode4(w: u32) -> Nibbles {
  let mask = vec4<u32>(0xfu);
  let magic = vec4<u32>(0x4b000000u);
  let off = vec4<f32>(select(8388608.0, 8388616.0, WDTYPE == 6u)); // 2^23 (+ 8 for q4_0)
  var n: Nibbles;
  n.lo = bitcast<vec4<f32>>(((vec4<u32>(w, w >> 4u, w >> 8u, w >> 12u)) & mask) | magic) - off;
  n.hi = bitcast<vec4<f32>>(((vec4<u32>(w >> 16u, w >> 20u, w >> 24u, w >> 28u)) & mask) | magic) -
    off;
  return n;
}

// Code i (k within its word) of word w as a float.
fn code_at(w: u32, i: u32) -> f32 {
  if (q_bits() == 4u) {
    let n = decode4(w);
    return select(n.lo[i & 3u], n.hi[i & 3u], i >= 4u);
  }
  return decode8(w)[i];
}

// Weight (row, k) given the word holding it: s * code - m.
fn q_weight(row: u32, k: u32, w: u32) -> f32 {
  let per = 32u / q_bits();
  var g = 0u;
  if (q_group() != 0u) {
    g = k / q_group();
  }
  let sm = group_scale(row, g);
  return sm.x * code_at(w, k % per) - sm.y;
}
