// kernels/matmul.ts prepends matmul_common.wgsl: WDTYPE, NORM, SWIGLU, unpack2, w_row, store_out.
// Matmul for decode (M = 1..8 rows of x): y[m, n] (+)= sum_k x[m, k] * W[n, k] (+ bias[n]).
// Memory bound: W is read exactly once, in 16-byte vec4<u32> loads ("units": 8 halves or 4 f32),
// and each unit is applied to all M rows of x.
//
// A workgroup has RPW rows of W, TPR threads per row. Per step, thread j of a row loads the
// UNROLL units j, j + TPR, ...: consecutive threads read consecutive units (coalesced) and
// every thread has UNROLL independent loads in flight. The TPR partial sums of a
// row are then reduced as a tree in workgroup memory (no subgroups on our targets), four rows
// of x at a time.
//
// Two optional fusions (override constants, so the plain kernel compiles exactly as before):
// - NORM: RMSNorm of x folded in, y = (x / rms(x) * nw) . W^T. The norm weights scale the
//   widened W units (once per unit, shared by all rows of x); each row's threads also sum x^2
//   over K (x is tiny and cached) and the 1 / rms factor scales the reduced sums.
// - SWIGLU: W is gate/up interleaved in blocks of p.block rows (see w_row). The workgroup's
//   rows come in pairs, gate then up of one output, and y[m, n] = silu(gate) * up.
//
// Accumulators and loaded units are named variables, not arrays indexed in loops: WebGPU
// implementations bound every loop (naga's loop-termination guard), which can keep a driver
// from unrolling it, and an array indexed by a loop counter then lives in local memory.
//
// Requires K % 8 == 0 (16-bit W) or K % 4 == 0 (f32 W); the wrapper falls back otherwise.

override K: u32 = 64u; // columns of W and x
override MROWS: u32 = 1u; // rows of x, 1..8
override TPR: u32 = 64u; // threads per row of W, a power of two
override RPW: u32 = 4u; // rows of W per workgroup (even with SWIGLU)
override UNROLL: u32 = 4u; // units loaded per thread per step: 1, 2 or 4

struct Params {
  n: u32, // columns of y (F with SWIGLU)
  groups_x: u32, // workgroups along x (the grid may be split over x and y)
  y_stride: u32, // elements between rows of y
  y_offset: u32, // element index of y[0, 0]
  // Bit 0: add bias[n]. Bit 1: y += result (the residual add, fused). Uniform flags rather
  // than overrides: one pipeline serves every projection of a shape.
  flags: u32,
  eps: f32, // RMSNorm epsilon (NORM)
  block: u32, // gate/up rows per block of the interleaved W (SWIGLU)
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> bias: array<f32>; // per row of W
@group(0) @binding(4) var<storage, read> nw: array<vec4<f32>>; // RMSNorm weights [K] (NORM)
@group(0) @binding(5) var<storage, read_write> y: array<f32>;

// Partial sums, rows m0..m0+3 of x packed in one vec4. Kept to TPR * RPW elements: naga's GL
// backend zero-fills workgroup arrays with one constructor term per element, and llvmpipe's
// compile time grows steeply with the total.
var<workgroup> red: array<vec4<f32>, TPR * RPW>;

// Unit u of a row of W widened to f32 (columns 0, 1: 8 halves; column 0: 4 f32), times the
// norm weights of its columns with NORM. Widened once, applied to every row of x.
fn widen(wv: vec4<u32>, u: u32) -> mat2x4<f32> {
  if (WDTYPE == 0u) {
    var a = bitcast<vec4<f32>>(wv);
    if (NORM) {
      a *= nw[min(u, K / 4u - 1u)];
    }
    return mat2x4<f32>(a, vec4<f32>());
  }
  var a = vec4<f32>(unpack2(wv.x), unpack2(wv.y));
  var b = vec4<f32>(unpack2(wv.z), unpack2(wv.w));
  if (NORM) {
    let i = min(2u * u, K / 4u - 2u);
    a *= nw[i];
    b *= nw[i + 1u];
  }
  return mat2x4<f32>(a, b);
}

// Dot product of widened unit u of a row of W with the matching elements of row m of x; 0 past
// the row.
fn unit_dot(wu: mat2x4<f32>, m: u32, u: u32) -> f32 {
  let units = K / select(8u, 4u, WDTYPE == 0u);
  if (units % (UNROLL * TPR) != 0u && u >= units) {
    return 0.0;
  }
  if (WDTYPE == 0u) {
    return dot(wu[0], x[m * (K / 4u) + u]);
  }
  let xi = m * (K / 4u) + 2u * u;
  return dot(wu[0], x[xi]) + dot(wu[1], x[xi + 1u]);
}

// The step's four widened units against row m of x.
fn step_dot(w0: mat2x4<f32>, w1: mat2x4<f32>, w2: mat2x4<f32>, w3: mat2x4<f32>, m: u32, u: u32) -> f32 {
  var s = unit_dot(w0, m, u);
  if (UNROLL > 1u) {
    s += unit_dot(w1, m, u + TPR);
  }
  if (UNROLL > 2u) {
    s += unit_dot(w2, m, u + 2u * TPR) + unit_dot(w3, m, u + 3u * TPR);
  }
  return s;
}

// This thread's share of sum(x^2) over rows m0..m0+3 of x (0 for rows past MROWS).
fn squares(m0: u32, j: u32) -> vec4<f32> {
  var s = vec4<f32>();
  for (var i = j; i < K / 4u; i += TPR) {
    let v0 = x[m0 * (K / 4u) + i];
    s.x += dot(v0, v0);
    if (MROWS > m0 + 1u) {
      let v1 = x[(m0 + 1u) * (K / 4u) + i];
      s.y += dot(v1, v1);
    }
    if (MROWS > m0 + 2u) {
      let v2 = x[(m0 + 2u) * (K / 4u) + i];
      s.z += dot(v2, v2);
    }
    if (MROWS > m0 + 3u) {
      let v3 = x[(m0 + 3u) * (K / 4u) + i];
      s.w += dot(v3, v3);
    }
  }
  return s;
}

// Tree-reduces red over the TPR threads of each row; the total lands in red[row * TPR].
fn reduce(lid: u32, j: u32, v: vec4<f32>) -> vec4<f32> {
  red[lid] = v;
  workgroupBarrier();
  for (var s = TPR / 2u; s > 0u; s >>= 1u) {
    if (j < s) {
      red[lid] += red[lid + s];
    }
    workgroupBarrier();
  }
  // Only this thread writes red[lid] next, so a second round needs no extra barrier.
  return red[lid];
}

// 1 / rms of rows m0..m0+3 of x (valid in the thread with j == 0); 1 without NORM.
fn inv_rms(lid: u32, j: u32, m0: u32) -> vec4<f32> {
  if (!NORM) {
    return vec4<f32>(1.0);
  }
  return inverseSqrt(reduce(lid, j, squares(m0, j)) / f32(K) + p.eps);
}

// Stores rows m0..m0+3 (those below MROWS) of output n from this row's reduced sums `s`, scaled
// by `inv` (1 / rms of the rows). With SWIGLU, the gate row's thread takes the up sums from the
// next row of the workgroup.
fn finish(lid: u32, n: u32, m0: u32, s: vec4<f32>, inv: vec4<f32>) {
  var up = vec4<f32>();
  if (SWIGLU) {
    up = red[lid + TPR] * inv; // reduce() ended with a barrier: the up row's total is there
  }
  let a = s * inv;
  for (var m = m0; m < min(MROWS, m0 + 4u); m++) {
    store_out(m, n, a[m - m0], up[m - m0]);
  }
}

@compute @workgroup_size(TPR * RPW)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let j = lid % TPR;
  let slot = lid / TPR; // row of the workgroup
  let g = wid.y * p.groups_x + wid.x;
  // Output column: one per row of the workgroup, or one per gate/up pair of rows.
  let n = select(g * RPW + slot, g * (RPW / 2u) + slot / 2u, SWIGLU);
  let units = K / select(8u, 4u, WDTYPE == 0u); // units per row of W
  // Rows past N re-read row N - 1 (in bounds, uniform control flow) and write nothing; units
  // past the row are clamped to its last one and contribute 0 (unit_dot).
  let base = w_row(min(n, p.n - 1u), slot % 2u) * units;
  let last = base + units - 1u;
  // The thread that stores: thread 0 of the row (of the gate row with SWIGLU).
  let storer = j == 0u && n < p.n && (!SWIGLU || slot % 2u == 0u);

  var a0 = 0.0;
  var a1 = 0.0;
  var a2 = 0.0;
  var a3 = 0.0;
  var a4 = 0.0;
  var a5 = 0.0;
  var a6 = 0.0;
  var a7 = 0.0;
  for (var u = j; u < units; u += UNROLL * TPR) {
    let w0 = widen(w[min(base + u, last)], u);
    var w1 = mat2x4<f32>();
    var w2 = mat2x4<f32>();
    var w3 = mat2x4<f32>();
    if (UNROLL > 1u) {
      w1 = widen(w[min(base + u + TPR, last)], u + TPR);
    }
    if (UNROLL > 2u) {
      w2 = widen(w[min(base + u + 2u * TPR, last)], u + 2u * TPR);
      w3 = widen(w[min(base + u + 3u * TPR, last)], u + 3u * TPR);
    }
    a0 += step_dot(w0, w1, w2, w3, 0u, u);
    if (MROWS > 1u) {
      a1 += step_dot(w0, w1, w2, w3, 1u, u);
    }
    if (MROWS > 2u) {
      a2 += step_dot(w0, w1, w2, w3, 2u, u);
    }
    if (MROWS > 3u) {
      a3 += step_dot(w0, w1, w2, w3, 3u, u);
    }
    if (MROWS > 4u) {
      a4 += step_dot(w0, w1, w2, w3, 4u, u);
    }
    if (MROWS > 5u) {
      a5 += step_dot(w0, w1, w2, w3, 5u, u);
    }
    if (MROWS > 6u) {
      a6 += step_dot(w0, w1, w2, w3, 6u, u);
    }
    if (MROWS > 7u) {
      a7 += step_dot(w0, w1, w2, w3, 7u, u);
    }
  }

  // With NORM every row of the workgroup finds the 1 / rms factors itself, through the same
  // tree as the sums; the factor of a row of x is the same for the gate and up rows.
  let inv_lo = inv_rms(lid, j, 0u);
  let lo = reduce(lid, j, vec4<f32>(a0, a1, a2, a3));
  if (storer) {
    finish(lid, n, 0u, lo, inv_lo);
  }
  if (MROWS > 4u) {
    if (SWIGLU) {
      workgroupBarrier(); // the gate rows have read their up totals from red
    }
    let inv_hi = inv_rms(lid, j, 4u);
    let hi = reduce(lid, j, vec4<f32>(a4, a5, a6, a7));
    if (storer) {
      finish(lid, n, 4u, hi, inv_hi);
    }
  }
}
