// Shared by the three matmul kernels (kernels/matmul.ts prepends it to each): the override
// switches, weight unpacking, the gate/up row map and the epilogue (store_out, store4). Each
// kernel declares `p: Params` (with n, y_stride, y_offset, flags, block), `bias: array<f32>`
// and `y: array<f32>`.

override WDTYPE: u32 = 1u; // 0 = f32, 1 = f16, 2 = bf16
override NORM: bool = false; // fold RMSNorm(x) * nw into the product
override SWIGLU: bool = false; // W is gate/up interleaved; y = silu(gate) * up

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
