// matmul_common.wgsl and quant_common.wgsl (prepended): SWIGLU, Params, p, bias, y, cols,
// col_row, store_out, store4; qs (W's row scales, WDTYPE 3 = int8).
// int8 x int8 matmul for prefill chunks and decode batches against int8 W (one f32 scale per row):
//   y[m, n] (+)= sx[m] * sw[n] * sum_k qx[m, k] * qw[n, k] (+ bias[n])
// qx is x quantized per row by quant_x.wgsl (the RMSNorm folded in there, so NORM is off here),
// both operands packed four int8 per u32 in k order. Products accumulate exactly in i32 through
// dot4I8Packed, 4 multiply-adds per instruction, and are rescaled once in f32 at the end.
//
// The shape is the tiled kernel's (matmul.wgsl): a workgroup of (BM / TM) x (BN / TN) threads
// owns a BM x BN tile, a thread a TM x TN block as one or two 4-row groups by one or two 4-column
// groups. K advances in steps of BKW words (4 BKW k); each step's x and W tiles (BM x BKW and
// BN x BKW words, fetched as 16-byte slots of 4 words of one row) go through two workgroup
// buffers, transposed to [k-word][m] and [k-word][n], with the next step's loads in flight. Per
// k-word a thread reads TM / 4 + TN / 4 vec4<u32> and issues TM * TN dot4I8Packed: per
// multiply-add a quarter of the f32 kernel's workgroup-memory traffic, which is what bounds it.
//
// Needs K % 16 == 0 (a slot is 16 k of one row; a slot is wholly inside or past K) and TM, TN in
// {4, 8}; the wrapper (kernels/matmul_q8.ts) checks. SPLIT as in matmul.wgsl: raw partial sums
// (already rescaled) to `part`, matmul_reduce.wgsl finishes.

override BM: u32 = 64u; // tile rows: 16, 32, 64 or 128
override BN: u32 = 64u; // tile columns (product columns)
override TM: u32 = 8u; // rows per thread: 4 or 8
override TN: u32 = 8u; // columns per thread: 4 or 8
override BKW: u32 = 8u; // k-words (4 k each) per step: 4 or 8
override SPLIT: bool = false;

const PAD: u32 = 4u; // words after each k-row of a staged tile

@group(0) @binding(1) var<storage, read> xq: array<vec4<u32>>; // [M, K / 4] packed int8
@group(0) @binding(2) var<storage, read> w: array<vec4<u32>>; // [rows, K / 4] packed int8
@group(0) @binding(6) var<storage, read_write> part: array<f32>;
@group(0) @binding(8) var<storage, read> xscale: array<f32>; // [M]

var<workgroup> xs: array<vec4<u32>, 2u * BKW * (BM + PAD) / 4u>;
var<workgroup> ws: array<vec4<u32>, 2u * BKW * (BN + PAD) / 4u>;

// sRH: row R (0..3: 4 ty + R; 4..7: BM / 2 + 4 ty + R - 4) by column group H, as in matmul.wgsl.
struct Acc {
  s00: vec4<i32>, s10: vec4<i32>, s20: vec4<i32>, s30: vec4<i32>,
  s40: vec4<i32>, s50: vec4<i32>, s60: vec4<i32>, s70: vec4<i32>,
  s01: vec4<i32>, s11: vec4<i32>, s21: vec4<i32>, s31: vec4<i32>,
  s41: vec4<i32>, s51: vec4<i32>, s61: vec4<i32>, s71: vec4<i32>,
}

struct Staged {
  x0: vec4<u32>, x1: vec4<u32>, x2: vec4<u32>, x3: vec4<u32>,
  w0: vec4<u32>, w1: vec4<u32>, w2: vec4<u32>, w3: vec4<u32>,
}

fn threads() -> u32 {
  return (BM / TM) * (BN / TN);
}

fn kw() -> u32 {
  return p.k / 4u; // words per row
}

// 16-byte slots per step: x (W) has BM (BN) rows of BKW / 4.
fn x_slots() -> u32 {
  return BM * BKW / 4u;
}

fn w_slots() -> u32 {
  return BN * BKW / 4u;
}

fn has_x(lid: u32, j: u32) -> bool {
  let t = threads();
  return j < (x_slots() + t - 1u) / t && lid + j * t < x_slots();
}

fn has_w(lid: u32, j: u32) -> bool {
  let t = threads();
  return j < (w_slots() + t - 1u) / t && lid + j * t < w_slots();
}

// Word index of slot s of the x tile at row m0, step 0 (rows past M clamped to the last).
fn x_origin(s: u32, m0: u32) -> u32 {
  return min(m0 + s / (BKW / 4u), p.m - 1u) * kw() + 4u * (s % (BKW / 4u));
}

fn w_origin(s: u32, n0: u32) -> u32 {
  return col_row(min(n0 + s / (BKW / 4u), cols() - 1u)) * kw() + 4u * (s % (BKW / 4u));
}

// The slot at word offset `o` of its row, at step word k0 (zeros past K).
fn fetch_x(s: u32, o: u32, k0: u32) -> vec4<u32> {
  if (k0 + 4u * (s % (BKW / 4u)) >= kw()) {
    return vec4<u32>(0u);
  }
  return xq[(o + k0) / 4u];
}

fn fetch_w(s: u32, o: u32, k0: u32) -> vec4<u32> {
  if (k0 + 4u * (s % (BKW / 4u)) >= kw()) {
    return vec4<u32>(0u);
  }
  return w[(o + k0) / 4u];
}

fn fetch(lid: u32, xo: vec4<u32>, wo: vec4<u32>, k0: u32) -> Staged {
  let t = threads();
  var g: Staged;
  if (has_x(lid, 0u)) {
    g.x0 = fetch_x(lid, xo.x, k0);
  }
  if (has_x(lid, 1u)) {
    g.x1 = fetch_x(lid + t, xo.y, k0);
  }
  if (has_x(lid, 2u)) {
    g.x2 = fetch_x(lid + 2u * t, xo.z, k0);
  }
  if (has_x(lid, 3u)) {
    g.x3 = fetch_x(lid + 3u * t, xo.w, k0);
  }
  if (has_w(lid, 0u)) {
    g.w0 = fetch_w(lid, wo.x, k0);
  }
  if (has_w(lid, 1u)) {
    g.w1 = fetch_w(lid + t, wo.y, k0);
  }
  if (has_w(lid, 2u)) {
    g.w2 = fetch_w(lid + 2u * t, wo.z, k0);
  }
  if (has_w(lid, 3u)) {
    g.w3 = fetch_w(lid + 3u * t, wo.w, k0);
  }
  return g;
}

// Slot s's 4 words into buffer b of xs, transposed: word i at k-row 4 (s % (BKW / 4)) + i.
fn put_x(s: u32, v: vec4<u32>, b: u32) {
  let r = s / (BKW / 4u);
  let o = (b * BKW + 4u * (s % (BKW / 4u))) * (BM + PAD) + r;
  let c = r % 4u;
  xs[o / 4u][c] = v.x;
  xs[(o + BM + PAD) / 4u][c] = v.y;
  xs[(o + 2u * (BM + PAD)) / 4u][c] = v.z;
  xs[(o + 3u * (BM + PAD)) / 4u][c] = v.w;
}

fn put_w(s: u32, v: vec4<u32>, b: u32) {
  let n = s / (BKW / 4u);
  let o = (b * BKW + 4u * (s % (BKW / 4u))) * (BN + PAD) + n;
  let c = n % 4u;
  ws[o / 4u][c] = v.x;
  ws[(o + BN + PAD) / 4u][c] = v.y;
  ws[(o + 2u * (BN + PAD)) / 4u][c] = v.z;
  ws[(o + 3u * (BN + PAD)) / 4u][c] = v.w;
}

fn stash(g: Staged, lid: u32, b: u32) {
  let t = threads();
  if (has_x(lid, 0u)) {
    put_x(lid, g.x0, b);
  }
  if (has_x(lid, 1u)) {
    put_x(lid + t, g.x1, b);
  }
  if (has_x(lid, 2u)) {
    put_x(lid + 2u * t, g.x2, b);
  }
  if (has_x(lid, 3u)) {
    put_x(lid + 3u * t, g.x3, b);
  }
  if (has_w(lid, 0u)) {
    put_w(lid, g.w0, b);
  }
  if (has_w(lid, 1u)) {
    put_w(lid + t, g.w1, b);
  }
  if (has_w(lid, 2u)) {
    put_w(lid + 2u * t, g.w2, b);
  }
  if (has_w(lid, 3u)) {
    put_w(lid + 3u * t, g.w3, b);
  }
}

// Row word a times the 4 columns' words b: 16 multiply-adds.
fn d4(a: u32, b: vec4<u32>) -> vec4<i32> {
  return vec4<i32>(dot4I8Packed(a, b.x), dot4I8Packed(a, b.y), dot4I8Packed(a, b.z),
    dot4I8Packed(a, b.w));
}

// One k-word: the thread's rows from xs[xa] (and xs[xa + BM / 8]), columns from ws[wa] (and
// ws[wa + BN / 8]).
fn step(c: Acc, xa: u32, wa: u32) -> Acc {
  var r = c;
  let a0 = xs[xa];
  let b0 = ws[wa];
  var a1 = vec4<u32>(0u);
  var b1 = vec4<u32>(0u);
  if (TM == 8u) {
    a1 = xs[xa + BM / 8u];
  }
  if (TN == 8u) {
    b1 = ws[wa + BN / 8u];
  }
  r.s00 += d4(a0.x, b0);
  r.s10 += d4(a0.y, b0);
  r.s20 += d4(a0.z, b0);
  r.s30 += d4(a0.w, b0);
  if (TN == 8u) {
    r.s01 += d4(a0.x, b1);
    r.s11 += d4(a0.y, b1);
    r.s21 += d4(a0.z, b1);
    r.s31 += d4(a0.w, b1);
  }
  if (TM == 8u) {
    r.s40 += d4(a1.x, b0);
    r.s50 += d4(a1.y, b0);
    r.s60 += d4(a1.z, b0);
    r.s70 += d4(a1.w, b0);
  }
  if (TM == 8u && TN == 8u) {
    r.s41 += d4(a1.x, b1);
    r.s51 += d4(a1.y, b1);
    r.s61 += d4(a1.z, b1);
    r.s71 += d4(a1.w, b1);
  }
  return r;
}

// Rescales row m's sums over the 4 product columns c0.. and stores them (or, with SPLIT, the
// split's partial sums).
fn store(m: u32, c0: u32, v: vec4<i32>, split: u32) {
  if (m >= p.m) {
    return;
  }
  let last = cols() - 1u;
  let sw = bitcast<vec4<f32>>(vec4<u32>(qs[col_row(min(c0, last))], qs[col_row(min(c0 + 1u, last))],
    qs[col_row(min(c0 + 2u, last))], qs[col_row(min(c0 + 3u, last))]));
  let f = vec4<f32>(v) * sw * xscale[m];
  if (SPLIT) {
    let o = (split * p.m + m) * cols() + c0;
    if (c0 < cols()) {
      part[o] = f.x;
    }
    if (c0 + 1u < cols()) {
      part[o + 1u] = f.y;
    }
    if (c0 + 2u < cols()) {
      part[o + 2u] = f.z;
    }
    if (c0 + 3u < cols()) {
      part[o + 3u] = f.w;
    }
    return;
  }
  store4(m, c0, f);
}

@compute @workgroup_size((BM / TM) * (BN / TN))
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let tiles_n = (cols() + BN - 1u) / BN;
  let tiles = ((p.m + BM - 1u) / BM) * tiles_n;
  let g = wid.y * p.groups_x + wid.x;
  let split = g / tiles;
  let m0 = ((g % tiles) / tiles_n) * BM;
  let n0 = (g % tiles % tiles_n) * BN;
  let kb = split * (p.kspan / 4u); // this workgroup's words: [kb, ke)
  let ke = min(kw(), kb + p.kspan / 4u);
  let tx = lid % (BN / TN);
  let ty = lid / (BN / TN);
  let t = threads();
  let xo = vec4<u32>(x_origin(lid, m0), x_origin(lid + t, m0), x_origin(lid + 2u * t, m0),
    x_origin(lid + 3u * t, m0));
  let wo = vec4<u32>(w_origin(lid, n0), w_origin(lid + t, n0), w_origin(lid + 2u * t, n0),
    w_origin(lid + 3u * t, n0));

  var acc: Acc;
  var staged = fetch(lid, xo, wo, kb);
  var b = 0u;
  for (var k0 = kb; k0 < ke; k0 += BKW) {
    stash(staged, lid, b);
    workgroupBarrier();
    if (k0 + BKW < ke) {
      staged = fetch(lid, xo, wo, k0 + BKW); // in flight during this step's arithmetic
    }
    let xa = b * BKW * (BM + PAD) / 4u + ty;
    let wa = b * BKW * (BN + PAD) / 4u + tx;
    // @unroll
    for (var j = 0u; j < 8u; j++) {
      if (BKW > j) {
        acc = step(acc, xa + j * (BM + PAD) / 4u, wa + j * (BN + PAD) / 4u);
      }
    }
    b ^= 1u;
  }

  let r0 = m0 + 4u * ty;
  let c0 = n0 + 4u * tx;
  store(r0, c0, acc.s00, split);
  store(r0 + 1u, c0, acc.s10, split);
  store(r0 + 2u, c0, acc.s20, split);
  store(r0 + 3u, c0, acc.s30, split);
  let c1 = c0 + BN / 2u;
  if (TN == 8u) {
    store(r0, c1, acc.s01, split);
    store(r0 + 1u, c1, acc.s11, split);
    store(r0 + 2u, c1, acc.s21, split);
    store(r0 + 3u, c1, acc.s31, split);
  }
  if (TM == 8u) {
    let r1 = r0 + BM / 2u;
    store(r1, c0, acc.s40, split);
    store(r1 + 1u, c0, acc.s50, split);
    store(r1 + 2u, c0, acc.s60, split);
    store(r1 + 3u, c0, acc.s70, split);
    if (TN == 8u) {
      store(r1, c1, acc.s41, split);
      store(r1 + 1u, c1, acc.s51, split);
      store(r1 + 2u, c1, acc.s61, split);
      store(r1 + 3u, c1, acc.s71, split);
    }
  }
}
