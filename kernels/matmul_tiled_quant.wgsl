// Quantized W in the tiled kernel (kernels/matmul.wgsl, which this is prepended to with
// matmul_common.wgsl and quant_common.wgsl), decoded to f32 as it is staged, so the inner loop is
// the f32 one; staging decodes each weight once per workgroup, which the tile's BM rows share.
// Every format, every adapter: the prefill path of formats without an int8 matmul.
// - QROW (int8 and e4m3, one scale per row, K % 8 == 0): a slot is 8 codes, half of one 16-byte
//   load, the f16 slot's 8 weights: e4m3 becomes f16 halves by shifts and then f32 as f16 W does
//   (int8 through 2^23's exponent), without its scale, which multiplies the finished sums of each
//   column once (scale_cols). No division, no scale load, no multiply per weight.
// - Otherwise (the GGUF types' group scales; an odd K / 4): a slot is one word of codes (4 8-bit
//   or 8 4-bit), fetched with its group's scale and minimum.

override QROW: bool = false;

// Word of codes holding element e of W (at k), with its group's (s, m) as bits: (word, s, m, 0).
// Zeros past K.
fn fetch_wq(e: u32, k: u32) -> vec4<u32> {
  if (k >= p.k) {
    return vec4<u32>(0u);
  }
  let i = e / (32u / q_bits()); // word index in the codes
  var g = 0u;
  if (q_group() != 0u) {
    g = k / q_group();
  }
  let sm = group_scale(e / p.k, g);
  return vec4<u32>(w[i / 4u][i % 4u], bitcast<u32>(sm.x), bitcast<u32>(sm.y), 0u);
}

// QROW: the 8 codes of W from element e (a multiple of 8) in q.x, q.y; zeros past K.
fn fetch_wrow(e: u32, k: u32) -> vec4<u32> {
  if (k >= p.k) {
    return vec4<u32>(0u);
  }
  let v = w[e / 16u];
  return select(vec4<u32>(v.x, v.y, 0u, 0u), vec4<u32>(v.z, v.w, 0u, 0u), (e & 8u) != 0u);
}

// The weights of q (from fetch_wq or fetch_wrow), k order: lo the first 4, hi the next 4 (4-bit
// codes, QROW). put_w (matmul.wgsl) stores them: a helper here that wrote the workgroup tile
// itself made naga 29.0.3 panic when the pipeline was created (pipeline_constants.rs:371).
fn decode_wq(q: vec4<u32>) -> Nibbles {
  var d: Nibbles;
  if (QROW) {
    d.lo = decode8(q.x);
    d.hi = decode8(q.y);
    return d;
  }
  let s = bitcast<f32>(q.y);
  let m = bitcast<f32>(q.z);
  if (q_bits() == 8u) {
    d.lo = s * decode8(q.x) - m;
  } else {
    let n = decode4(q.x);
    d.lo = s * n.lo - m;
    d.hi = s * n.hi - m;
  }
  return d;
}

// QROW: the row scales of product columns c .. c + 3 (past the edge: the last column's).
fn col_scales(c: u32) -> vec4<f32> {
  let n = cols() - 1u;
  return vec4<f32>(group_scale(col_row(min(c, n)), 0u).x,
    group_scale(col_row(min(c + 1u, n)), 0u).x, group_scale(col_row(min(c + 2u, n)), 0u).x,
    group_scale(col_row(min(c + 3u, n)), 0u).x);
}

// QROW: the thread's sums times their columns' row scales (columns c0 .., and c1 .. with TN 8).
fn scale_cols(a: Acc, c0: u32, c1: u32) -> Acc {
  var r = a;
  let s0 = col_scales(c0);
  r.s00 *= s0;
  r.s10 *= s0;
  r.s20 *= s0;
  r.s30 *= s0;
  r.s40 *= s0;
  r.s50 *= s0;
  r.s60 *= s0;
  r.s70 *= s0;
  if (TN == 8u) {
    let s1 = col_scales(c1);
    r.s01 *= s1;
    r.s11 *= s1;
    r.s21 *= s1;
    r.s31 *= s1;
    r.s41 *= s1;
    r.s51 *= s1;
    r.s61 *= s1;
    r.s71 *= s1;
  }
  return r;
}
