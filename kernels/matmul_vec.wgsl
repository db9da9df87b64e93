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
// Accumulators and loaded units are named variables, not arrays indexed in loops: WebGPU
// implementations bound every loop (naga's loop-termination guard), which can keep a driver
// from unrolling it, and an array indexed by a loop counter then lives in local memory.
//
// Requires K % 8 == 0 (16-bit W) or K % 4 == 0 (f32 W); the wrapper falls back otherwise.

override WDTYPE: u32 = 1u; // 0 = f32, 1 = f16, 2 = bf16
override K: u32 = 64u; // columns of W and x
override MROWS: u32 = 1u; // rows of x, 1..8
override TPR: u32 = 64u; // threads per row of W, a power of two
override RPW: u32 = 4u; // rows of W per workgroup
override UNROLL: u32 = 4u; // units loaded per thread per step: 1, 2 or 4

struct Params {
  n: u32,
  groups_x: u32, // workgroups along x (the grid may be split over x and y)
  y_stride: u32, // elements between rows of y
  y_offset: u32, // element index of y[0, 0]
  // Bit 0: add bias[n]. Bit 1: y += result (the residual add, fused). Uniform flags rather
  // than overrides: one pipeline serves every projection of a shape.
  flags: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

// Partial sums, rows m0..m0+3 of x packed in one vec4. Kept to TPR * RPW elements: naga's GL
// backend zero-fills workgroup arrays with one constructor term per element, and llvmpipe's
// compile time grows steeply with the total.
var<workgroup> red: array<vec4<f32>, TPR * RPW>;

// Two 16-bit weights of one word, even element first.
fn unpack2(word: u32) -> vec2<f32> {
  if (WDTYPE == 1u) {
    return unpack2x16float(word);
  }
  return vec2<f32>(bitcast<f32>(word << 16u), bitcast<f32>(word & 0xffff0000u));
}

// Dot product of unit u of a row of W with the matching elements of row m of x; 0 past the row.
fn unit_dot(wv: vec4<u32>, m: u32, u: u32) -> f32 {
  let units = K / select(8u, 4u, WDTYPE == 0u);
  if (units % (UNROLL * TPR) != 0u && u >= units) {
    return 0.0;
  }
  if (WDTYPE == 0u) {
    return dot(bitcast<vec4<f32>>(wv), x[m * (K / 4u) + u]);
  }
  let xi = m * (K / 4u) + 2u * u;
  return dot(vec4<f32>(unpack2(wv.x), unpack2(wv.y)), x[xi]) +
    dot(vec4<f32>(unpack2(wv.z), unpack2(wv.w)), x[xi + 1u]);
}

// The step's four units against row m of x.
fn step_dot(w0: vec4<u32>, w1: vec4<u32>, w2: vec4<u32>, w3: vec4<u32>, m: u32, u: u32) -> f32 {
  var s = unit_dot(w0, m, u);
  if (UNROLL > 1u) {
    s += unit_dot(w1, m, u + TPR);
  }
  if (UNROLL > 2u) {
    s += unit_dot(w2, m, u + 2u * TPR) + unit_dot(w3, m, u + 3u * TPR);
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

fn store(n: u32, m: u32, sum: f32) {
  var v = sum;
  if ((p.flags & 1u) != 0u) {
    v += bias[n];
  }
  let o = p.y_offset + m * p.y_stride + n;
  if ((p.flags & 2u) != 0u) {
    v += y[o];
  }
  y[o] = v;
}

@compute @workgroup_size(TPR * RPW)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let j = lid % TPR;
  let n = (wid.y * p.groups_x + wid.x) * RPW + lid / TPR;
  let units = K / select(8u, 4u, WDTYPE == 0u); // units per row of W
  // Rows past N re-read row N - 1 (in bounds, uniform control flow) and write nothing; units
  // past the row are clamped to its last one and contribute 0 (unit_dot).
  let base = min(n, p.n - 1u) * units;
  let last = base + units - 1u;

  var a0 = 0.0;
  var a1 = 0.0;
  var a2 = 0.0;
  var a3 = 0.0;
  var a4 = 0.0;
  var a5 = 0.0;
  var a6 = 0.0;
  var a7 = 0.0;
  for (var u = j; u < units; u += UNROLL * TPR) {
    let w0 = w[min(base + u, last)];
    var w1 = vec4<u32>();
    var w2 = vec4<u32>();
    var w3 = vec4<u32>();
    if (UNROLL > 1u) {
      w1 = w[min(base + u + TPR, last)];
    }
    if (UNROLL > 2u) {
      w2 = w[min(base + u + 2u * TPR, last)];
      w3 = w[min(base + u + 3u * TPR, last)];
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

  let lo = reduce(lid, j, vec4<f32>(a0, a1, a2, a3));
  if (j == 0u && n < p.n) {
    for (var m = 0u; m < min(MROWS, 4u); m++) {
      store(n, m, lo[m]);
    }
  }
  if (MROWS > 4u) {
    let hi = reduce(lid, j, vec4<f32>(a4, a5, a6, a7));
    if (j == 0u && n < p.n) {
      for (var m = 4u; m < MROWS; m++) {
        store(n, m, hi[m - 4u]);
      }
    }
  }
}
