// Shared by the matmul kernels (kernels/matmul_common.ts prepends it to each of matmul_small,
// matmul_rows, matmul (tiled), matmul_naive and matmul_reduce): the override switches, the one
// Params layout (packed by kernels/matmul_common.ts, field for field), the bindings every kernel
// shares, weight unpacking, the gate/up row map and the epilogue (store_out, store4).

override WDTYPE: u32 = 1u; // 0 = f32, 1 = f16, 2 = bf16; 3.. quantized (quant_common.wgsl)
override NORM: bool = false; // fold RMSNorm(x) * nw into the product
override SWIGLU: bool = false; // W is gate/up interleaved; y = silu(gate) * up

struct Params {
  m: u32, // rows of x
  n: u32, // columns of y (F with SWIGLU)
  k: u32, // columns of x and W (the small kernel has it as the override K)
  groups_x: u32, // workgroups along x (the grid may be split over x and y)
  y_stride: u32, // elements between rows of y
  y_offset: u32, // element index of y[0, 0]
  // Bit 0: add bias[n]. Bit 1: y += result (the residual add, fused). Uniform flags rather
  // than overrides: one pipeline serves every projection of a shape.
  flags: u32,
  eps: f32, // RMSNorm epsilon (NORM)
  block: u32, // gate/up rows per block of the interleaved W (SWIGLU)
  kspan: u32, // K per split (split-K launches of `tiled` and `rows`; >= K when unsplit)
  splits: u32, // K splits: workgroup g takes split g / tiles (1 when unsplit)
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(3) var<storage, read> bias: array<f32>; // per row of W
@group(0) @binding(5) var<storage, read_write> y: array<f32>;

// Columns of the product: N, or 2F with SWIGLU (gate, up of output c / 2 at c even, odd).
fn cols() -> u32 {
  return select(p.n, 2u * p.n, SWIGLU);
}

// The depth and the rows of W, for quant_common.wgsl's scale planes.
fn q_k() -> u32 {
  return p.k;
}

fn q_rows() -> u32 {
  return cols();
}

// Row of W behind column c of the product.
fn col_row(c: u32) -> u32 {
  if (SWIGLU) {
    return w_row(c / 2u, c % 2u);
  }
  return c;
}

// Two 16-bit weights of one word, even element first.
fn unpack2(word: u32) -> vec2<f32> {
  if (WDTYPE == 1u) {
    return unpack2x16float(word);
  }
  return vec2<f32>(bitcast<f32>(word << 16u), bitcast<f32>(word & 0xffff0000u));
}

// Row of W holding the gate (half 0) or up (half 1) weights of output n: blocks of p.block
// gate rows, then the matching p.block up rows; the last block may be partial (F % p.block).
fn w_row(n: u32, half: u32) -> u32 {
  if (!SWIGLU) {
    return n;
  }
  let b0 = n - n % p.block; // first output of n's block
  return 2u * b0 + half * min(p.block, p.n - b0) + (n - b0);
}

// Writes y[m, n] from the finished sum `a` (the gate's with SWIGLU) and `b` (the up's with
// SWIGLU): bias, SiLU(gate) * up, and the residual add (flag bit 1). Outputs past N are skipped.
fn store_out(m: u32, n: u32, a: f32, b: f32) {
  if (n >= p.n) {
    return;
  }
  var r = a;
  if (SWIGLU) {
    var g = a;
    var u = b;
    if ((p.flags & 1u) != 0u) {
      g += bias[w_row(n, 0u)];
      u += bias[w_row(n, 1u)];
    }
    // silu(g) = g * sigmoid(g); exp(-g) overflows to inf for g << 0, giving -0, the right limit.
    r = g / (1.0 + exp(-g)) * u;
  } else if ((p.flags & 1u) != 0u) {
    r += bias[n];
  }
  let o = p.y_offset + m * p.y_stride + n;
  if ((p.flags & 2u) != 0u) {
    r += y[o];
  }
  y[o] = r;
}

// Writes row m of the 4 product columns c0.. (c0 a multiple of 4; with SWIGLU two whole
// gate, up pairs) through store_out.
fn store4(m: u32, c0: u32, v: vec4<f32>) {
  if (SWIGLU) {
    store_out(m, c0 / 2u, v.x, v.y);
    store_out(m, c0 / 2u + 1u, v.z, v.w);
    return;
  }
  store_out(m, c0, v.x, 0.0);
  store_out(m, c0 + 1u, v.y, 0.0);
  store_out(m, c0 + 2u, v.z, 0.0);
  store_out(m, c0 + 3u, v.w, 0.0);
}
