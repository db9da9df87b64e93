// kernels/matmul.ts prepends matmul_common.wgsl: WDTYPE, NORM, SWIGLU, unpack2, w_row, store_out.
// Tiled matmul for prefill (M > 8 rows): y[m, n] (+)= sum_k x[m, k] * W[n, k] (+ bias[n]).
// A workgroup of 16 x 16 threads owns a 64 x 64 tile of y; each thread a 4 x 4 block of it.
// K advances in steps of BK: the x and W tiles of the step are loaded into workgroup memory
// (transposed to [k][m] and [k][n], W widened to f32), then per k every thread reads two vec4
// and does 16 FMAs. Loads are bounds-checked element by element, so any M, N and K work (odd K:
// W rows not word-aligned). The accumulators are four named vec4, not an array: WebGPU bounds
// every loop (naga's termination guard), which can keep a driver from unrolling it, and an
// array indexed by a loop counter then lives in local memory.
//
// Sizes are kept small for llvmpipe, where the CPU tests run: naga's GL backend zero-fills
// workgroup arrays with one constructor term per element, and compile time there grows steeply
// with array length and workgroup size.
//
// Optional fusions (override constants):
// - NORM: y = (x / rms(x) * nw) . W^T. The loaders scale x by nw as they stage it and sum x^2
//   as they go (each element of the x tile is loaded by one thread); after the K loop the four
//   partial sums of each row meet in workgroup memory and 1 / rms scales the accumulators.
// - SWIGLU: W is gate/up interleaved in blocks of p.block rows (see w_row). The tile's columns
//   alternate gate, up of consecutive outputs (the loaders map them to rows of W), so each
//   thread's four columns are two whole pairs and y[m, n] = silu(gate) * up needs no exchange.

override BK: u32 = 8u; // k per step, a multiple of 8
// 16-bit W with K even: rows start on a word, so a thread's pairs of k are single u32 loads.
override PAIRS: bool = false;

const BM: u32 = 64u; // tile rows (m)
const BN: u32 = 64u; // tile columns (n)
const WG: u32 = 256u;

struct Params {
  m: u32,
  n: u32, // columns of y (F with SWIGLU)
  k: u32,
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
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>; // per row of W
@group(0) @binding(4) var<storage, read> nw: array<f32>; // RMSNorm weights [K] (NORM)
@group(0) @binding(5) var<storage, read_write> y: array<f32>;

var<workgroup> xt: array<vec4<f32>, BK * BM / 4u>; // [k][m / 4]
var<workgroup> wt: array<vec4<f32>, BK * BN / 4u>; // [k][n / 4]

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

// Columns of the product: N, or 2F with SWIGLU (gate, up of output c / 2 at c even, odd).
fn cols() -> u32 {
  return select(p.n, 2u * p.n, SWIGLU);
}

// Row of W behind column c of the product.
fn col_row(c: u32) -> u32 {
  if (SWIGLU) {
    return w_row(c / 2u, c % 2u);
  }
  return c;
}

// Writes row m of the thread's 4 product columns c0.. (c0 a multiple of 4).
fn store(m: u32, c0: u32, v: vec4<f32>) {
  if (m >= p.m) {
    return;
  }
  if (SWIGLU) {
    store_out(m, c0 / 2u, v.x, v.y);
    store_out(m, c0 / 2u + 1u, v.z, v.w);
    return;
  }
  for (var c = 0u; c < 4u; c++) {
    store_out(m, c0 + c, v[c], 0.0);
  }
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  // Workgroups are laid out [tile_m][tile_n]: neighbours share the x tile and walk W.
  let tiles_n = (cols() + BN - 1u) / BN;
  let g = wid.y * p.groups_x + wid.x;
  let m0 = (g / tiles_n) * BM;
  let n0 = (g % tiles_n) * BN;
  let tx = lid % (BN / 4u); // this thread's columns: n0 + 4 tx ..
  let ty = lid / (BN / 4u); // this thread's rows: m0 + 4 ty ..

  // Loader roles: each thread fetches LK consecutive k of one row of each tile.
  let lk = BK * BM / WG;
  let lr = lid / (BK / lk); // tile row 0..63
  let lk0 = (lid % (BK / lk)) * lk; // its first k in the step
  let xm = m0 + lr;
  let wn = n0 + lr; // column of the product
  let wrow = col_row(min(wn, cols() - 1u)); // its row of W (used when wn < cols())

  var acc0 = vec4<f32>(0.0); // row m0 + 4 ty, columns n0 + 4 tx ..
  var acc1 = vec4<f32>(0.0);
  var acc2 = vec4<f32>(0.0);
  var acc3 = vec4<f32>(0.0);
  var ss = 0.0; // NORM: this loader's share of sum(x[xm, :]^2)
  for (var k0 = 0u; k0 < p.k; k0 += BK) {
    for (var c = 0u; c < lk; c += 2u) {
      let kt = lk0 + c;
      let k = k0 + kt;
      var xv = vec2<f32>(0.0);
      if (xm < p.m) {
        if (k + 1u < p.k) {
          xv = vec2<f32>(x[xm * p.k + k], x[xm * p.k + k + 1u]);
        } else if (k < p.k) {
          xv.x = x[xm * p.k + k];
        }
      }
      if (NORM) {
        ss += dot(xv, xv);
        if (k + 1u < p.k) {
          xv *= vec2<f32>(nw[k], nw[k + 1u]);
        } else if (k < p.k) {
          xv.x *= nw[k];
        }
      }
      var wv = vec2<f32>(0.0);
      if (wn < cols()) {
        if (PAIRS && k + 1u < p.k) {
          // K even: elements k, k + 1 (k even) share one u32 word.
          wv = unpack2(w[(wrow * p.k + k) >> 1u]);
        } else if (k + 1u < p.k) {
          wv = vec2<f32>(weight_at(wrow * p.k + k), weight_at(wrow * p.k + k + 1u));
        } else if (k < p.k) {
          wv.x = weight_at(wrow * p.k + k);
        }
      }
      xt[(kt * BM + lr) / 4u][lr % 4u] = xv.x;
      xt[((kt + 1u) * BM + lr) / 4u][lr % 4u] = xv.y;
      wt[(kt * BN + lr) / 4u][lr % 4u] = wv.x;
      wt[((kt + 1u) * BN + lr) / 4u][lr % 4u] = wv.y;
    }
    workgroupBarrier();
    for (var kt = 0u; kt < BK; kt++) {
      let a = xt[kt * (BM / 4u) + ty];
      let b = wt[kt * (BN / 4u) + tx];
      acc0 += a.x * b;
      acc1 += a.y * b;
      acc2 += a.z * b;
      acc3 += a.w * b;
    }
    workgroupBarrier();
  }

  if (NORM) {
    // Loader lid owns row lid / 4 (WG / BM = 4 loaders per row): its partial sum goes to lane
    // lid % 4 of xt[lid / 4], so xt[r] holds the four partials of row m0 + r.
    xt[lid / 4u][lid % 4u] = ss;
    workgroupBarrier();
    let one = vec4<f32>(1.0);
    let r = 4u * ty;
    let sums = vec4<f32>(dot(xt[r], one), dot(xt[r + 1u], one), dot(xt[r + 2u], one),
      dot(xt[r + 3u], one));
    let inv = inverseSqrt(sums / f32(p.k) + p.eps);
    acc0 *= inv.x;
    acc1 *= inv.y;
    acc2 *= inv.z;
    acc3 *= inv.w;
  }

  store(m0 + 4u * ty, n0 + 4u * tx, acc0);
  store(m0 + 4u * ty + 1u, n0 + 4u * tx, acc1);
  store(m0 + 4u * ty + 2u, n0 + 4u * tx, acc2);
  store(m0 + 4u * ty + 3u, n0 + 4u * tx, acc3);
}
