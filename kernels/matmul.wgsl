// matmul_common.wgsl, quant_common.wgsl and matmul_tiled_quant.wgsl (prepended): WDTYPE, NORM,
// SWIGLU, Params, p, bias, y, cols, col_row, unpack2, store_out, store4; is_quant, QROW,
// fetch_wq, fetch_wrow, decode_wq, scale_cols (quantized W, decoded as it is staged).
// Tiled matmul for prefill (M > 64 rows): y[m, n] (+)= sum_k x[m, k] * W[n, k] (+ bias[n]).
//
// Classic SGEMM register blocking. A workgroup of (BM / TM) x (BN / TN) threads owns a BM x BN
// tile of y; each thread a TM x TN block of it (TM, TN = 4 or 8), as one or two 4-row groups
// (rows 4 ty .. and BM / 2 + 4 ty ..) by one or two 4-column groups (columns 4 tx .. and
// BN / 2 + 4 tx ..). Per k a thread reads TM / 4 + TN / 4 vec4 from workgroup memory and does
// TM * TN multiply-adds: 8 x 8 gives 64 per 4 loads, where 4 x 4 gives 16 per 2 and is bound by
// workgroup-memory bandwidth. Splitting each dimension in two halves keeps the reads of a warp
// on adjacent vec4 (no bank conflicts) and each thread's product columns in whole SWIGLU pairs.
//
// K advances in steps of BK. Each step's x tile (BM x BK f32) and W tile (BN x BK) are fetched
// as 16-byte slots (4 elements of x: a vec4; 8 halves or 4 f32 of W: a vec4<u32>) into
// registers one step ahead: the loads for step s + 1 are issued before the multiply-adds of
// step s and only stored (W widened to f32, both transposed to k-major [k][m], [k][n], rows
// padded by 4 floats) at the start of step s + 1, so global latency hides behind a whole step
// of arithmetic. With BUFS = 2 the tiles alternate between two buffers and a step needs one
// barrier; with BUFS = 1, two. Slots are assigned so that BK / 4 (x) or BK / 8 (16-bit W)
// adjacent threads read one row's contiguous run; their transposed stores have at most 2-way
// bank conflicts at BK <= 16 (4-way at 32), the vec4 reads of the inner loop none.
//
// ALIGNED (K a multiple of BK): one vector load per slot, no k bounds. Otherwise every element
// is loaded on its own and bounds-checked (odd K: W rows not word-aligned). Rows past M and
// columns past N are clamped to the last one in both paths (in-bounds loads, nothing stored).
//
// Every loop in WebGPU carries a termination guard (naga), which may keep a driver from
// unrolling it, and an array indexed by a loop counter would live in local memory. So the
// accumulators are sixteen named vec4 fields of a struct, the staged slots named fields too,
// and a step's BK k are written out (a loop trip costs ~30 ns on an H200 whatever its body):
// the only loop left in the hot path is the one over K.
//
// SPLIT (split-K, for few-row products whose tiles alone leave the GPU idle): workgroup g takes
// tile g % tiles and the K range [split * p.kspan, + p.kspan) of split g / tiles; it writes its
// raw sums (and with NORM its rows' partial sums of x^2) to `part`, and matmul_reduce.wgsl, one
// thread per output, adds the splits in order and applies the epilogue.
//
// Optional fusions (override constants):
// - NORM: y = (x / rms(x) * nw) . W^T. nw is fetched with x and scales it as it is staged;
//   the stagers sum x^2 of their slots (each element of the x tile is staged by one thread);
//   after the K loop the partial sums of each row meet in workgroup memory and 1 / rms scales
//   the accumulators.
// - SWIGLU: W is gate/up interleaved in blocks of p.block rows (see w_row). The tile's columns
//   alternate gate, up of consecutive outputs (the stagers map them to rows of W), so each
//   thread's 4-column groups are two whole pairs and y[m, n] = silu(gate) * up needs no exchange.
//
// llvmpipe through GL: naga's GL backend zero-fills workgroup arrays with one constructor term
// per element, and compile time grows steeply with their length and with the 8 x 8 arithmetic
// (seconds to minutes per pipeline; docs/kernels.md), so CPU adapters get a small configuration
// (kernels/matmul_tiled.ts).

override BM: u32 = 64u; // tile rows (m): 16, 32, 64 or 128
override BN: u32 = 64u; // tile columns (product columns): 16, 32, 64 or 128
override TM: u32 = 8u; // rows per thread: 4 or 8
override TN: u32 = 8u; // columns per thread: 4 or 8
override BK: u32 = 16u; // k per step: 8, 16 or 32
override BUFS: u32 = 2u; // workgroup buffers per tile: 2 = one barrier per step
override ALIGNED: bool = false; // K % BK == 0: vector loads, no k bounds
override SPLIT: bool = false; // split-K: partial sums to `part`, matmul_reduce.wgsl finishes

const PAD: u32 = 4u; // floats after each k-row of a staged tile

@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>; // [M, K], flat
@group(0) @binding(2) var<storage, read> w: array<vec4<u32>>; // [rows, K] packed, flat
@group(0) @binding(4) var<storage, read> nw: array<vec4<f32>>; // RMSNorm weights [K] (NORM)
// SPLIT: [splits][M][cols()] partial products, then [splits][M] partial sums of x^2 (NORM).
@group(0) @binding(6) var<storage, read_write> part: array<f32>;

// Staged tiles, BUFS of each: [k][m] and [k][n] f32, k-rows of BM + PAD and BN + PAD floats.
var<workgroup> xs: array<vec4<f32>, BUFS * BK * (BM + PAD) / 4u>;
var<workgroup> ws: array<vec4<f32>, BUFS * BK * (BN + PAD) / 4u>;

// A thread's TM x TN accumulators: sRH holds row R (0..3: 4 ty + R; 4..7: BM / 2 + 4 ty + R - 4)
// by column group H (0: 4 tx ..; 1: BN / 2 + 4 tx ..). Fields a smaller TM or TN leaves unused
// are never touched.
struct Acc {
  s00: vec4<f32>, s10: vec4<f32>, s20: vec4<f32>, s30: vec4<f32>,
  s40: vec4<f32>, s50: vec4<f32>, s60: vec4<f32>, s70: vec4<f32>,
  s01: vec4<f32>, s11: vec4<f32>, s21: vec4<f32>, s31: vec4<f32>,
  s41: vec4<f32>, s51: vec4<f32>, s61: vec4<f32>, s71: vec4<f32>,
}

// One step's global loads of a thread, in flight across a step of arithmetic: x slots j = 0..3
// (xj), their norm weights (nj, NORM) and W slots (wj). Slot j is thread lid + j * threads().
struct Staged {
  x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>,
  n0: vec4<f32>, n1: vec4<f32>, n2: vec4<f32>, n3: vec4<f32>,
  w0: vec4<u32>, w1: vec4<u32>, w2: vec4<u32>, w3: vec4<u32>,
}

fn threads() -> u32 {
  return (BM / TM) * (BN / TN);
}

// Elements of W per slot: 16 bytes of floats, or one word of codes (8 codes with QROW).
fn wk() -> u32 {
  if (is_quant()) {
    return select(32u / q_bits(), 8u, QROW);
  }
  return select(8u, 4u, WDTYPE == 0u);
}

// Slots of a step's x and W tiles, and per thread (at most 4 each; the wrapper checks).
fn x_slots() -> u32 {
  return BM * BK / 4u;
}

fn w_slots() -> u32 {
  return BN * BK / wk();
}

fn x_per_thread() -> u32 {
  return (x_slots() + threads() - 1u) / threads();
}

fn w_per_thread() -> u32 {
  return (w_slots() + threads() - 1u) / threads();
}

// Floats per k-row of the staged tiles.
fn ldx() -> u32 {
  return BM + PAD;
}

fn ldw() -> u32 {
  return BN + PAD;
}

fn x_at(e: u32) -> f32 {
  return x[e >> 2u][e & 3u];
}

// Bits of element e of W: an f32, or a 16-bit weight in the low half.
fn w_bits(e: u32) -> u32 {
  if (WDTYPE == 0u) {
    return w[e >> 2u][e & 3u];
  }
  return (w[e >> 3u][(e >> 1u) & 3u] >> (16u * (e & 1u))) & 0xffffu;
}

// Element index in x of x slot s of the tile at row m0, at k0 = 0: row m0 + s / (BK / 4)
// (clamped), k 4 (s % (BK / 4)) ...
fn x_origin(s: u32, m0: u32) -> u32 {
  return min(m0 + s / (BK / 4u), p.m - 1u) * p.k + 4u * (s % (BK / 4u));
}

// Element index in W of W slot s of the tile at product column n0, at k0 = 0: the row behind
// column n0 + s / (BK / wk()) (clamped), wk() elements from k wk() (s % (BK / wk())).
fn w_origin(s: u32, n0: u32) -> u32 {
  let row = col_row(min(n0 + s / (BK / wk()), cols() - 1u));
  return row * p.k + wk() * (s % (BK / wk()));
}

// x slot s, whose origin is o, at step k0.
fn fetch_x(s: u32, o: u32, k0: u32) -> vec4<f32> {
  let e = o + k0;
  if (ALIGNED) {
    return x[e >> 2u];
  }
  let k = k0 + 4u * (s % (BK / 4u));
  var v = vec4<f32>(0.0);
  if (k < p.k) {
    v.x = x_at(e);
  }
  if (k + 1u < p.k) {
    v.y = x_at(e + 1u);
  }
  if (k + 2u < p.k) {
    v.z = x_at(e + 2u);
  }
  if (k + 3u < p.k) {
    v.w = x_at(e + 3u);
  }
  return v;
}

// The norm weights of x slot s at step k0 (zeros past K).
fn fetch_nw(s: u32, k0: u32) -> vec4<f32> {
  let k = k0 + 4u * (s % (BK / 4u));
  if (ALIGNED) {
    return nw[k >> 2u];
  }
  let q = nw[min(k, p.k - 1u) >> 2u];
  return select(vec4<f32>(0.0), q, k + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(p.k));
}

// W slot s, whose origin is o, at step k0, packed as stored (16-bit: element 2i in the low
// half of word i; zeros past K).
fn fetch_w(s: u32, o: u32, k0: u32) -> vec4<u32> {
  let e = o + k0;
  if (is_quant()) {
    let k = k0 + wk() * (s % (BK / wk()));
    if (QROW) {
      return fetch_wrow(e, k);
    }
    return fetch_wq(e, k);
  }
  if (ALIGNED) {
    return w[e / wk()];
  }
  let k = k0 + wk() * (s % (BK / wk()));
  if (WDTYPE == 0u) {
    return vec4<u32>(w_elem(e, k, 0u), w_elem(e, k, 1u), w_elem(e, k, 2u), w_elem(e, k, 3u));
  }
  return vec4<u32>(w_pair(e, k, 0u), w_pair(e, k, 2u), w_pair(e, k, 4u), w_pair(e, k, 6u));
}

// Bits of element e + i of W, at k + i (zero past K).
fn w_elem(e: u32, k: u32, i: u32) -> u32 {
  return select(0u, w_bits(e + i), k + i < p.k);
}

// 16-bit W: elements e + i, e + i + 1 packed into one word, the first in the low half.
fn w_pair(e: u32, k: u32, i: u32) -> u32 {
  return w_elem(e, k, i) | (w_elem(e, k, i + 1u) << 16u);
}

// Whether thread lid has x (W) slot j: always when the slots divide evenly among the threads.
fn has_x(lid: u32, j: u32) -> bool {
  return j < x_per_thread() && (x_slots() % threads() == 0u || lid + j * threads() < x_slots());
}

fn has_w(lid: u32, j: u32) -> bool {
  return j < w_per_thread() && (w_slots() % threads() == 0u || lid + j * threads() < w_slots());
}

// Issues the loads of the step at k0; xo, wo: the origins of the thread's slots.
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
  if (NORM) {
    if (has_x(lid, 0u)) {
      g.n0 = fetch_nw(lid, k0);
    }
    if (has_x(lid, 1u)) {
      g.n1 = fetch_nw(lid + t, k0);
    }
    if (has_x(lid, 2u)) {
      g.n2 = fetch_nw(lid + 2u * t, k0);
    }
    if (has_x(lid, 3u)) {
      g.n3 = fetch_nw(lid + 3u * t, k0);
    }
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

// Stores x slot s (already scaled) into buffer b, transposed: element i at k-row 4 kq + i.
fn put_x(s: u32, v: vec4<f32>, b: u32) {
  let r = s / (BK / 4u);
  let o = b * BK * ldx() + 4u * (s % (BK / 4u)) * ldx() + r; // float index; o % 4 == r % 4
  let c = r % 4u;
  xs[o / 4u][c] = v.x;
  xs[(o + ldx()) / 4u][c] = v.y;
  xs[(o + 2u * ldx()) / 4u][c] = v.z;
  xs[(o + 3u * ldx()) / 4u][c] = v.w;
}

// Widens W slot s and stores it into buffer b, transposed.
fn put_w(s: u32, q: vec4<u32>, b: u32) {
  let n = s / (BK / wk());
  let o = b * BK * ldw() + wk() * (s % (BK / wk())) * ldw() + n;
  let c = n % 4u;
  var lo = bitcast<vec4<f32>>(q);
  var hi = vec4<f32>(unpack2(q.z), unpack2(q.w));
  if (is_quant()) {
    let d = decode_wq(q);
    lo = d.lo;
    hi = d.hi;
  } else if (WDTYPE != 0u) {
    lo = vec4<f32>(unpack2(q.x), unpack2(q.y));
  }
  ws[o / 4u][c] = lo.x;
  ws[(o + ldw()) / 4u][c] = lo.y;
  ws[(o + 2u * ldw()) / 4u][c] = lo.z;
  ws[(o + 3u * ldw()) / 4u][c] = lo.w;
  if (wk() == 8u) {
    ws[(o + 4u * ldw()) / 4u][c] = hi.x;
    ws[(o + 5u * ldw()) / 4u][c] = hi.y;
    ws[(o + 6u * ldw()) / 4u][c] = hi.z;
    ws[(o + 7u * ldw()) / 4u][c] = hi.w;
  }
}

// Stores the staged loads into buffer b (x scaled by the norm weights with NORM).
fn stash(g: Staged, lid: u32, b: u32) {
  let t = threads();
  var x0 = g.x0;
  var x1 = g.x1;
  var x2 = g.x2;
  var x3 = g.x3;
  if (NORM) {
    x0 *= g.n0;
    x1 *= g.n1;
    x2 *= g.n2;
    x3 *= g.n3;
  }
  if (has_x(lid, 0u)) {
    put_x(lid, x0, b);
  }
  if (has_x(lid, 1u)) {
    put_x(lid + t, x1, b);
  }
  if (has_x(lid, 2u)) {
    put_x(lid + 2u * t, x2, b);
  }
  if (has_x(lid, 3u)) {
    put_x(lid + 3u * t, x3, b);
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

// One k: the thread's rows of x from xs[xa] (and xs[xa + BM / 8]), its columns of W from
// ws[wa] (and ws[wa + BN / 8]), TM x TN multiply-adds.
fn step(c: Acc, xa: u32, wa: u32) -> Acc {
  var r = c;
  let a0 = xs[xa];
  let b0 = ws[wa];
  var a1 = vec4<f32>(0.0);
  var b1 = vec4<f32>(0.0);
  if (TM == 8u) {
    a1 = xs[xa + BM / 8u];
  }
  if (TN == 8u) {
    b1 = ws[wa + BN / 8u];
  }
  r.s00 += a0.x * b0;
  r.s10 += a0.y * b0;
  r.s20 += a0.z * b0;
  r.s30 += a0.w * b0;
  if (TN == 8u) {
    r.s01 += a0.x * b1;
    r.s11 += a0.y * b1;
    r.s21 += a0.z * b1;
    r.s31 += a0.w * b1;
  }
  if (TM == 8u) {
    r.s40 += a1.x * b0;
    r.s50 += a1.y * b0;
    r.s60 += a1.z * b0;
    r.s70 += a1.w * b0;
  }
  if (TM == 8u && TN == 8u) {
    r.s41 += a1.x * b1;
    r.s51 += a1.y * b1;
    r.s61 += a1.z * b1;
    r.s71 += a1.w * b1;
  }
  return r;
}

// Eight k from k-rows xa, wa on, written out: a loop trip costs ~30 ns on an H200 whatever
// its body (and may keep the driver from overlapping one trip's reads with the last's math).
fn steps8(c: Acc, xa: u32, wa: u32) -> Acc {
  let dx = ldx() / 4u; // vec4 per k-row
  let dw = ldw() / 4u;
  var r = step(c, xa, wa);
  r = step(r, xa + dx, wa + dw);
  r = step(r, xa + 2u * dx, wa + 2u * dw);
  r = step(r, xa + 3u * dx, wa + 3u * dw);
  r = step(r, xa + 4u * dx, wa + 4u * dw);
  r = step(r, xa + 5u * dx, wa + 5u * dw);
  r = step(r, xa + 6u * dx, wa + 6u * dw);
  return step(r, xa + 7u * dx, wa + 7u * dw);
}

// Float i of xs (the NORM partial sums).
fn xs_f(i: u32) -> f32 {
  return xs[i / 4u][i % 4u];
}

// Sum of x^2 over row r of the tile: the BK / 4 partial sums the stagers left at xs floats
// r * (BK / 4) .., written out (BK / 4 = 2, 4 or 8).
fn row_ss(r: u32) -> f32 {
  let i = r * (BK / 4u);
  var s = xs_f(i) + xs_f(i + 1u);
  if (BK >= 16u) {
    s += xs_f(i + 2u) + xs_f(i + 3u);
  }
  if (BK == 32u) {
    s += xs_f(i + 4u) + xs_f(i + 5u) + xs_f(i + 6u) + xs_f(i + 7u);
  }
  return s;
}

fn inv_rms(r: u32) -> vec4<f32> {
  let s = vec4<f32>(row_ss(r), row_ss(r + 1u), row_ss(r + 2u), row_ss(r + 3u));
  return inverseSqrt(s / f32(p.k) + p.eps);
}

// Writes row m of the thread's 4 product columns c0.. (c0 a multiple of 4); with SPLIT the
// raw partial sums of split `split` into part.
fn store(m: u32, c0: u32, v: vec4<f32>, split: u32) {
  if (m >= p.m) {
    return;
  }
  if (SPLIT) {
    // Written out: a loop trip costs ~30 ns.
    let o = (split * p.m + m) * cols() + c0;
    if (c0 < cols()) {
      part[o] = v.x;
    }
    if (c0 + 1u < cols()) {
      part[o + 1u] = v.y;
    }
    if (c0 + 2u < cols()) {
      part[o + 2u] = v.z;
    }
    if (c0 + 3u < cols()) {
      part[o + 3u] = v.w;
    }
    return;
  }
  store4(m, c0, v);
}

@compute @workgroup_size((BM / TM) * (BN / TN))
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  // Workgroups are laid out [tile_m][tile_n]: neighbours share the x tile and walk W.
  let tiles_n = (cols() + BN - 1u) / BN;
  let tiles = ((p.m + BM - 1u) / BM) * tiles_n;
  let g = wid.y * p.groups_x + wid.x;
  let split = g / tiles; // 0 without SPLIT
  let m0 = ((g % tiles) / tiles_n) * BM;
  let n0 = (g % tiles % tiles_n) * BN;
  let kb = split * p.kspan; // this workgroup's K range: [kb, ke)
  let ke = min(p.k, kb + p.kspan);
  let tx = lid % (BN / TN); // this thread's columns: n0 + 4 tx .. (and n0 + BN / 2 + 4 tx ..)
  let ty = lid / (BN / TN); // this thread's rows: m0 + 4 ty .. (and m0 + BM / 2 + 4 ty ..)

  var acc: Acc;
  var ss = vec4<f32>(0.0); // NORM: sum of x^2 of x slot j, in component j
  // Origins of the thread's slots, computed once (a row of W behind a SWIGLU column costs a
  // division).
  let t = threads();
  let xo = vec4<u32>(x_origin(lid, m0), x_origin(lid + t, m0), x_origin(lid + 2u * t, m0),
    x_origin(lid + 3u * t, m0));
  let wo = vec4<u32>(w_origin(lid, n0), w_origin(lid + t, n0), w_origin(lid + 2u * t, n0),
    w_origin(lid + 3u * t, n0));
  var staged = fetch(lid, xo, wo, kb);
  var b = 0u;
  for (var k0 = kb; k0 < ke; k0 += BK) {
    if (NORM) {
      ss += vec4<f32>(dot(staged.x0, staged.x0), dot(staged.x1, staged.x1),
        dot(staged.x2, staged.x2), dot(staged.x3, staged.x3));
    }
    stash(staged, lid, b);
    workgroupBarrier();
    if (k0 + BK < ke) {
      staged = fetch(lid, xo, wo, k0 + BK); // in flight during this step's arithmetic
    }
    // The step's BK k, 8 at a time (8 k-rows: 2 ldx() vec4), no loop.
    let xa = b * BK * ldx() / 4u + ty;
    let wa = b * BK * ldw() / 4u + tx;
    acc = steps8(acc, xa, wa);
    if (BK >= 16u) {
      acc = steps8(acc, xa + 2u * ldx(), wa + 2u * ldw());
    }
    if (BK == 32u) {
      acc = steps8(acc, xa + 4u * ldx(), wa + 4u * ldw());
      acc = steps8(acc, xa + 6u * ldx(), wa + 6u * ldw());
    }
    if (BUFS == 1u) {
      workgroupBarrier(); // everyone is done with the tiles before they are overwritten
    } else {
      b ^= 1u;
    }
  }

  if (NORM) {
    // x slot s's partial sum goes to float s of xs: row s / (BK / 4) owns floats
    // r * (BK / 4) .. + BK / 4 (xs holds BK * (BM + PAD) >= BM * BK / 4 floats).
    workgroupBarrier();
    if (has_x(lid, 0u)) {
      xs[lid / 4u][lid % 4u] = ss.x;
    }
    if (has_x(lid, 1u)) {
      xs[(lid + t) / 4u][lid % 4u] = ss.y; // t is a multiple of 4
    }
    if (has_x(lid, 2u)) {
      xs[(lid + 2u * t) / 4u][lid % 4u] = ss.z;
    }
    if (has_x(lid, 3u)) {
      xs[(lid + 3u * t) / 4u][lid % 4u] = ss.w;
    }
    workgroupBarrier();
    if (SPLIT) {
      // The rows' partial sums of x^2 over this split's K, once per row tile.
      if (n0 == 0u) {
        for (var r = lid; r < BM && m0 + r < p.m; r += t) {
          part[p.splits * p.m * cols() + split * p.m + m0 + r] = row_ss(r);
        }
      }
    }
  }
  if (NORM && !SPLIT) {
    let lo = inv_rms(4u * ty);
    acc.s00 *= lo.x;
    acc.s10 *= lo.y;
    acc.s20 *= lo.z;
    acc.s30 *= lo.w;
    if (TN == 8u) {
      acc.s01 *= lo.x;
      acc.s11 *= lo.y;
      acc.s21 *= lo.z;
      acc.s31 *= lo.w;
    }
    if (TM == 8u) {
      let hi = inv_rms(BM / 2u + 4u * ty);
      acc.s40 *= hi.x;
      acc.s50 *= hi.y;
      acc.s60 *= hi.z;
      acc.s70 *= hi.w;
      if (TN == 8u) {
        acc.s41 *= hi.x;
        acc.s51 *= hi.y;
        acc.s61 *= hi.z;
        acc.s71 *= hi.w;
      }
    }
  }

  let r0 = m0 + 4u * ty;
  let c0 = n0 + 4u * tx;
  if (QROW) {
    acc = scale_cols(acc, c0, c0 + BN / 2u);
  }
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
