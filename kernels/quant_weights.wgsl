// Quantizes a float weight [rows, cols] (WDTYPE 0 = f32, 1 = f16, 2 = bf16, cols % 4 == 0) to
// int8 (FMT 0) or e4m3 (FMT 1) codes with one f32 scale per row, as kernels/quant.ts
// `packRowScaled` does on the host: s = absmax * (1/127 or 1/448), codes the nearest to v / s
// (half to even; int8 clamped to +-127, e4m3 without subnormals, saturating at 448). One
// workgroup per row: a pass for the absmax, a pass writing a word of four codes per thread step.

override WG: u32 = 256u;
override WDTYPE: u32 = 1u;
override FMT: u32 = 0u;

struct Params {
  rows: u32,
  cols: u32,
  groups_x: u32,
  pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read_write> codes: array<u32>; // [rows, cols / 4]
@group(0) @binding(3) var<storage, read_write> scales: array<f32>; // [rows]

var<workgroup> red: array<f32, WG>;

// Elements e .. e + 3 (e % 4 == 0) of the flat weight.
fn weights4(e: u32) -> vec4<f32> {
  if (WDTYPE == 0u) {
    return vec4<f32>(bitcast<f32>(w[e]), bitcast<f32>(w[e + 1u]), bitcast<f32>(w[e + 2u]),
      bitcast<f32>(w[e + 3u]));
  }
  let a = w[e / 2u];
  let b = w[e / 2u + 1u];
  if (WDTYPE == 1u) {
    return vec4<f32>(unpack2x16float(a), unpack2x16float(b));
  }
  return vec4<f32>(bitcast<f32>(a << 16u), bitcast<f32>(a & 0xffff0000u), bitcast<f32>(b << 16u),
    bitcast<f32>(b & 0xffff0000u));
}

// The e4m3 byte nearest to v (gpu/dtype.ts e4m3Bits, the same steps on the f32 bits).
fn e4m3(v: f32) -> u32 {
  let u = bitcast<u32>(v);
  let sign = (u >> 24u) & 0x80u;
  let a = u & 0x7fffffffu;
  if (a < 0x3c800000u) {
    return select(sign, sign | 0x08u, a > 0x3c000000u); // below 2^-6: 0 or 2^-6
  }
  let r = (a + 0x7ffffu + ((a >> 20u) & 1u)) >> 20u; // 3 mantissa bits, half to even
  let e = (r >> 3u) - 120u;
  if (e > 15u || (e == 15u && (r & 7u) == 7u) || a > 0x7f800000u) {
    return sign | 0x7eu;
  }
  return sign | (e << 3u) | (r & 7u);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let row = wid.y * p.groups_x + wid.x;
  if (row >= p.rows) {
    return;
  }
  let words = p.cols / 4u;
  var amax = 0.0;
  for (var i = lid; i < words; i += WG) {
    let a = abs(weights4(row * p.cols + 4u * i));
    amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
  }
  red[lid] = amax;
  for (var s = WG / 2u; s > 0u; s >>= 1u) {
    workgroupBarrier();
    if (lid < s) {
      red[lid] = max(red[lid], red[lid + s]);
    }
  }
  workgroupBarrier();
  let scale = red[0] * select(1.0 / 127.0, 1.0 / 448.0, FMT == 1u);
  let inv = select(0.0, 1.0 / scale, scale > 0.0);
  if (lid == 0u) {
    scales[row] = scale;
  }
  for (var i = lid; i < words; i += WG) {
    let q = weights4(row * p.cols + 4u * i) * inv;
    var word: u32;
    if (FMT == 0u) {
      word = pack4xI8(vec4<i32>(clamp(round(q), vec4<f32>(-127.0), vec4<f32>(127.0))));
    } else {
      word = e4m3(q.x) | (e4m3(q.y) << 8u) | (e4m3(q.z) << 16u) | (e4m3(q.w) << 24u);
    }
    codes[row * words + i] = word;
  }
}
