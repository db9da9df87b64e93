// Quantized W in the tiled kernel (kernels/matmul.wgsl, which this is prepended to with
// matmul_common.wgsl and quant_common.wgsl): a W slot is one word of codes (4 8-bit or 8 4-bit),
// fetched with its group's scale and minimum and decoded to f32 as it is staged, so the inner
// loop is the f32 one. Staging decodes each weight once per workgroup, which the tile's BM rows
// share. Every format, every adapter: the prefill path of formats without an int8 matmul.

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

// The weights of the word q (from fetch_wq), k order: lo the first 4, hi the next 4 (4-bit
// codes). put_w (matmul.wgsl) stores them: a helper here that wrote the workgroup tile itself
// made naga 29.0.3 panic when the pipeline was created (pipeline_constants.rs:371).
fn decode_wq(q: vec4<u32>) -> Nibbles {
  let s = bitcast<f32>(q.y);
  let m = bitcast<f32>(q.z);
  var d: Nibbles;
  if (q_bits() == 8u) {
    d.lo = s * decode8(q.x) - m;
  } else {
    let n = decode4(q.x);
    d.lo = s * n.lo - m;
    d.hi = s * n.hi - m;
  }
  return d;
}
