// matmul_common.wgsl and quant_common.wgsl (prepended): WDTYPE, NORM, SWIGLU, Params, p, bias,
// y, w_row, store_out; q_weight.
// Naive matmul, the plain statement of the contract and the path for shapes the fast kernels
// do not take (decode rows with K not a multiple of the vector width):
//   y[m, n] (+)= sum_k x[m, k] * W[n, k] (+ bias[n])
// One invocation per output element, a serial loop over K. W is [N, K] row-major in any weight
// format, bound as u32 words; 16-bit rows need not start on a word (odd K), so elements are
// addressed by their flat index; quantized codes are decoded one at a time with their group's
// scale (kernels/quant.ts).
//
// Optional fusions (override constants):
// - NORM: y = (x / rms(x) * nw) . W^T. A workgroup's invocations share one row of x, so the
//   workgroup reduces its sum of squares once and every invocation scales its sum by 1 / rms.
// - SWIGLU: W is gate/up interleaved in blocks of p.block rows (see w_row); an invocation
//   computes both rows of its output and writes silu(gate) * up.

override WG: u32 = 64u; // a power of two (the tree reduction halves it)

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(4) var<storage, read> nw: array<f32>; // RMSNorm weights [K] (NORM)

var<workgroup> red: array<f32, WG>;

fn weight_at(i: u32) -> f32 {
  if (is_quant()) {
    return q_weight(i / p.k, i % p.k, w[i / (32u / q_bits())]);
  }
  if (WDTYPE == 0u) {
    return bitcast<f32>(w[i]);
  }
  let word = w[i >> 1u];
  if (WDTYPE == 1u) {
    return unpack2x16float(word)[i & 1u];
  }
  return bitcast<f32>(select(word << 16u, word & 0xffff0000u, (i & 1u) == 1u));
}

// 1 / rms of row m of x, reduced over the workgroup (call in uniform control flow).
fn inv_rms(m: u32, lid: u32) -> f32 {
  var ss = 0.0;
  for (var k = lid; k < p.k; k += WG) {
    let v = x[m * p.k + k];
    ss += v * v;
  }
  red[lid] = ss;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s >>= 1u) {
    if (lid < s) {
      red[lid] += red[lid + s];
    }
    workgroupBarrier();
  }
  return inverseSqrt(red[0] / f32(p.k) + p.eps);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  // Workgroups are laid out [m][ceil(N / WG)].
  let per_row = (p.n + WG - 1u) / WG;
  let g = wid.y * p.groups_x + wid.x;
  let m = g / per_row;
  let n = (g - m * per_row) * WG + lid;
  if (m >= p.m) {
    return; // uniform: depends on the workgroup id only
  }
  var inv = 1.0;
  if (NORM) {
    inv = inv_rms(m, lid);
  }
  if (n >= p.n) {
    return;
  }
  let gate = w_row(n, 0u) * p.k;
  let up = w_row(n, 1u) * p.k;
  var acc = 0.0;
  var acc_up = 0.0;
  for (var k = 0u; k < p.k; k++) {
    var xv = x[m * p.k + k];
    if (NORM) {
      xv *= nw[k];
    }
    acc += xv * weight_at(gate + k);
    if (SWIGLU) {
      acc_up += xv * weight_at(up + k);
    }
  }
  store_out(m, n, acc * inv, acc_up * inv);
}
