// Naive matmul, the plain statement of the contract and the path for shapes the fast kernels
// do not take (decode rows with K not a multiple of the vector width):
//   y[m, n] (+)= sum_k x[m, k] * W[n, k] (+ bias[n])
// One invocation per output element, a serial loop over K. W is [N, K] row-major in any weight
// dtype, bound as u32 words; 16-bit rows need not start on a word (odd K), so elements are
// addressed by their flat index.

override WG: u32 = 64u;
override WDTYPE: u32 = 1u; // 0 = f32, 1 = f16, 2 = bf16

struct Params {
  m: u32,
  n: u32,
  k: u32,
  groups_x: u32, // workgroups along x (the grid may be split over x and y)
  y_stride: u32, // elements between rows of y
  y_offset: u32, // element index of y[0, 0]
  // Bit 0: add bias[n]. Bit 1: y += result (the residual add, fused). Uniform flags rather
  // than overrides: one pipeline serves every projection of a shape.
  flags: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

fn weight_at(i: u32) -> f32 {
  if (WDTYPE == 0u) {
    return bitcast<f32>(w[i]);
  }
  let word = w[i >> 1u];
  if (WDTYPE == 1u) {
    return unpack2x16float(word)[i & 1u];
  }
  return bitcast<f32>(select(word << 16u, word & 0xffff0000u, (i & 1u) == 1u));
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  // Workgroups are laid out [m][ceil(N / WG)].
  let per_row = (p.n + WG - 1u) / WG;
  let g = wid.y * p.groups_x + wid.x;
  let m = g / per_row;
  let n = (g - m * per_row) * WG + lid;
  if (m >= p.m || n >= p.n) {
    return;
  }
  var acc = 0.0;
  for (var k = 0u; k < p.k; k++) {
    acc += x[m * p.k + k] * weight_at(n * p.k + k);
  }
  if ((p.flags & 1u) != 0u) {
    acc += bias[n];
  }
  let o = p.y_offset + m * p.y_stride + n;
  if ((p.flags & 2u) != 0u) {
    acc += y[o];
  }
  y[o] = acc;
}
