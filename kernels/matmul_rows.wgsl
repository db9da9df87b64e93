// matmul_common.wgsl (prepended): WDTYPE, NORM, SWIGLU, Params, p, bias, y, cols, col_row,
// unpack2.
// Matmul for decode batches against wide matrices (by default M = 12..32 rows of x and W with at
// least 4 times more rows than columns: gate/up, the LM head; any M when forced):
// y[m, n] (+)= sum_k x[m, k] * W[n, k] (+ bias[n]), 16-bit W, K % 8 == 0.
//
// A thread owns CW = 4 or 8 product columns and all R rows of a row tile. Per 8-wide unit of W
// (one 16-byte load per column, widened once) it reads x[m0 .. m0 + R)[k] from workgroup
// memory, where every thread of a column group reads the same address (a broadcast), and does
// CW R multiply-adds per k: R / 4 vec4 reads per CW R multiply-adds, where the `tiled` kernel's
// 4 x 4 blocks do 2 per 16, and W never passes through workgroup memory. Each vec4 read still
// moves 16 bytes to every thread (512 per warp), which made those reads about a sixth of the
// kernel's time with 4 columns (docs/kernels.md, "rows"); 8 columns halve them per multiply-add,
// at twice the accumulators (kernels/matmul_rows.ts `rowsTuning` says where that pays). KL
// adjacent threads take adjacent units of a row of W (one 64- or 128-byte run per row per
// load); CG column groups share a workgroup. K advances in stages of KL units: each stage's x
// tile (R rows x 8 KL k, f32, transposed to [k][m] and scaled by the norm weights
// with NORM) is staged through two buffers, one barrier per stage, with the next stage's x and W
// loads in flight in registers during this stage's multiply-adds. Each lane's block of 8 k-rows
// is padded by one vec4, so the KL lanes of a warp read distinct banks.
//
// Every launch splits K over p.splits workgroups per tile (possibly 1) and writes raw partial
// sums to `part` in the layout of matmul.wgsl's SPLIT ([splits][M][cols], then the rows' sums
// of x^2 [splits][M] with NORM); matmul_reduce.wgsl adds the splits and applies the epilogue
// (1 / rms, bias, SiLU * up, residual add). After the K loop the KL lanes' sums of each column
// group are added through workgroup memory, four rows per round.
//
// As in matmul.wgsl, accumulators and staged loads are named fields and the k steps of a unit
// are written out (a loop trip costs ~30 ns on an H200, and an array indexed by a loop counter
// would live in local memory). Launch shapes: kernels/matmul_rows.ts (`rowsTuning`); what they
// measured against the kernels this one replaced: docs/kernels.md.

override KL: u32 = 4u; // threads along K per column group, each one 8-wide unit per stage: 4 or 8
override CG: u32 = 16u; // column groups of CW product columns per workgroup, >= R / 2
override R: u32 = 16u; // rows of x per tile: 8, 16, 24 or 32
override CW: u32 = 4u; // product columns per thread: 4, or 8 (each x read serves twice the work)

override XS: u32 = R / 4u + 1u; // vec4 per staged k-row (R / 4, padded by one)
override LS: u32 = 8u * XS + 1u; // vec4 per lane block of 8 k-rows (padded by one)
override KC: u32 = KL * 8u; // k per stage
override BUF: u32 = KL * LS; // vec4 per stage buffer

// The epilogue's fields of p (y_stride, y_offset, flags, eps) and bias, y are the reduce's; p.kspan
// is a multiple of KC.
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>; // [M, K], flat
@group(0) @binding(2) var<storage, read> w: array<vec4<u32>>; // [rows, K] packed, flat
@group(0) @binding(4) var<storage, read> nw: array<vec4<f32>>; // RMSNorm weights [K] (NORM)
@group(0) @binding(6) var<storage, read_write> part: array<f32>;

// Two stage buffers of [lane][8 k-rows][R / 4 vec4 of rows]; after the K loop, scratch for
// the sums of x^2 and a round of the lanes' partial sums ([4 CG][KL]).
var<workgroup> xs: array<vec4<f32>, max(2u * BUF, 4u * CG * KL)>;

// Eight rows of a thread's accumulators, each a vec4 over its 4 columns.
struct A8 {
  a: vec4<f32>, b: vec4<f32>, c: vec4<f32>, d: vec4<f32>,
  e: vec4<f32>, f: vec4<f32>, g: vec4<f32>, h: vec4<f32>,
}

// Rows 8 i .. 8 i + 7 in qi; fields past R are never touched.
struct Acc {
  q0: A8, q1: A8, q2: A8, q3: A8,
}

// A thread's accumulators: columns 0..3 (a) and, with CW = 8, 4..7 (b).
struct Acc2 {
  a: Acc, b: Acc,
}

// A stage's global loads of a thread: x slots j = 0..3 (xj) with their norm weights (nj), and
// the unit of each of its columns (uj; u4..u7 with CW = 8).
struct Staged {
  x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>,
  n0: vec4<f32>, n1: vec4<f32>, n2: vec4<f32>, n3: vec4<f32>,
  u0: vec4<u32>, u1: vec4<u32>, u2: vec4<u32>, u3: vec4<u32>,
  u4: vec4<u32>, u5: vec4<u32>, u6: vec4<u32>, u7: vec4<u32>,
}

fn threads() -> u32 {
  return KL * CG;
}

// x slots of a stage: R rows x KC / 4 vec4 (slot s: row s / (KC / 4), k 4 (s % (KC / 4)) ..).
fn x_slots() -> u32 {
  return R * KC / 4u;
}

fn has_x(s: u32) -> bool {
  return s < x_slots();
}

fn fetch_x(s: u32, m0: u32, k0: u32, ke: u32) -> vec4<f32> {
  let r = m0 + s / (KC / 4u);
  let k = k0 + 4u * (s % (KC / 4u));
  if (!has_x(s) || r >= p.m || k >= ke) {
    return vec4<f32>(0.0);
  }
  return x[(r * p.k + k) / 4u];
}

fn fetch_nw(s: u32, k0: u32, ke: u32) -> vec4<f32> {
  let k = k0 + 4u * (s % (KC / 4u));
  if (!has_x(s) || k >= ke) {
    return vec4<f32>(0.0);
  }
  return nw[k / 4u];
}

// The unit at k of the row of W whose first unit is wo (zeros past this split's K).
fn fetch_u(wo: u32, k: u32, ke: u32) -> vec4<u32> {
  if (k >= ke) {
    return vec4<u32>(0u);
  }
  return w[wo + k / 8u];
}

fn fetch(lid: u32, m0: u32, wo: vec4<u32>, wo2: vec4<u32>, lane: u32, k0: u32, ke: u32) -> Staged {
  let t = threads();
  var g: Staged;
  g.x0 = fetch_x(lid, m0, k0, ke);
  g.x1 = fetch_x(lid + t, m0, k0, ke);
  g.x2 = fetch_x(lid + 2u * t, m0, k0, ke);
  g.x3 = fetch_x(lid + 3u * t, m0, k0, ke);
  if (NORM) {
    g.n0 = fetch_nw(lid, k0, ke);
    g.n1 = fetch_nw(lid + t, k0, ke);
    g.n2 = fetch_nw(lid + 2u * t, k0, ke);
    g.n3 = fetch_nw(lid + 3u * t, k0, ke);
  }
  let k = k0 + 8u * lane;
  g.u0 = fetch_u(wo.x, k, ke);
  g.u1 = fetch_u(wo.y, k, ke);
  g.u2 = fetch_u(wo.z, k, ke);
  g.u3 = fetch_u(wo.w, k, ke);
  if (CW == 8u) {
    g.u4 = fetch_u(wo2.x, k, ke);
    g.u5 = fetch_u(wo2.y, k, ke);
    g.u6 = fetch_u(wo2.z, k, ke);
    g.u7 = fetch_u(wo2.w, k, ke);
  }
  return g;
}

// Vec4 index in xs of (buffer b, stage k-row kl, row r of the tile).
fn xs_at(b: u32, kl: u32, r: u32) -> u32 {
  return b * BUF + (kl / 8u) * LS + (kl % 8u) * XS + r / 4u;
}

// Stores x slot s into buffer b, transposed.
fn put_x(s: u32, v: vec4<f32>, b: u32) {
  if (!has_x(s)) {
    return;
  }
  let r = s / (KC / 4u);
  let kl = 4u * (s % (KC / 4u));
  let c = r % 4u;
  xs[xs_at(b, kl, r)][c] = v.x;
  xs[xs_at(b, kl + 1u, r)][c] = v.y;
  xs[xs_at(b, kl + 2u, r)][c] = v.z;
  xs[xs_at(b, kl + 3u, r)][c] = v.w;
}

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
  put_x(lid, x0, b);
  put_x(lid + t, x1, b);
  put_x(lid + 2u * t, x2, b);
  put_x(lid + 3u * t, x3, b);
}

fn fma8(s: A8, x0: vec4<f32>, x1: vec4<f32>, wv: vec4<f32>) -> A8 {
  var r = s;
  r.a += x0.x * wv;
  r.b += x0.y * wv;
  r.c += x0.z * wv;
  r.d += x0.w * wv;
  r.e += x1.x * wv;
  r.f += x1.y * wv;
  r.g += x1.z * wv;
  r.h += x1.w * wv;
  return r;
}

// One k: the tile's rows of x from xs[xa ..] times the thread's weights wv (columns 0..3) and,
// with CW = 8, wv2 (4..7): each x read from workgroup memory serves CW multiply-adds.
fn kstep(a: Acc2, xa: u32, wv: vec4<f32>, wv2: vec4<f32>) -> Acc2 {
  var r = a;
  let x0 = xs[xa];
  let x1 = xs[xa + 1u];
  r.a.q0 = fma8(r.a.q0, x0, x1, wv);
  if (CW == 8u) {
    r.b.q0 = fma8(r.b.q0, x0, x1, wv2);
  }
  if (R >= 16u) {
    let x2 = xs[xa + 2u];
    let x3 = xs[xa + 3u];
    r.a.q1 = fma8(r.a.q1, x2, x3, wv);
    if (CW == 8u) {
      r.b.q1 = fma8(r.b.q1, x2, x3, wv2);
    }
  }
  if (R >= 24u) {
    let x4 = xs[xa + 4u];
    let x5 = xs[xa + 5u];
    r.a.q2 = fma8(r.a.q2, x4, x5, wv);
    if (CW == 8u) {
      r.b.q2 = fma8(r.b.q2, x4, x5, wv2);
    }
  }
  if (R == 32u) {
    let x6 = xs[xa + 6u];
    let x7 = xs[xa + 7u];
    r.a.q3 = fma8(r.a.q3, x6, x7, wv);
    if (CW == 8u) {
      r.b.q3 = fma8(r.b.q3, x6, x7, wv2);
    }
  }
  return r;
}

// Two k of one word of each column's unit (w: columns 0..3, v: 4..7 with CW = 8).
fn word(a: Acc2, xa: u32, w: vec4<u32>, v: vec4<u32>) -> Acc2 {
  let p0 = unpack2(w.x);
  let p1 = unpack2(w.y);
  let p2 = unpack2(w.z);
  let p3 = unpack2(w.w);
  var q0 = vec2<f32>(0.0);
  var q1 = vec2<f32>(0.0);
  var q2 = vec2<f32>(0.0);
  var q3 = vec2<f32>(0.0);
  if (CW == 8u) {
    q0 = unpack2(v.x);
    q1 = unpack2(v.y);
    q2 = unpack2(v.z);
    q3 = unpack2(v.w);
  }
  let r = kstep(a, xa, vec4<f32>(p0.x, p1.x, p2.x, p3.x), vec4<f32>(q0.x, q1.x, q2.x, q3.x));
  return kstep(r, xa + XS, vec4<f32>(p0.y, p1.y, p2.y, p3.y), vec4<f32>(q0.y, q1.y, q2.y, q3.y));
}

// The 8 k of a stage's units, from k-row block xa on.
fn unit(a: Acc2, xa: u32, g: Staged) -> Acc2 {
  var r = word(a, xa, vec4<u32>(g.u0.x, g.u1.x, g.u2.x, g.u3.x),
    vec4<u32>(g.u4.x, g.u5.x, g.u6.x, g.u7.x));
  r = word(r, xa + 2u * XS, vec4<u32>(g.u0.y, g.u1.y, g.u2.y, g.u3.y),
    vec4<u32>(g.u4.y, g.u5.y, g.u6.y, g.u7.y));
  r = word(r, xa + 4u * XS, vec4<u32>(g.u0.z, g.u1.z, g.u2.z, g.u3.z),
    vec4<u32>(g.u4.z, g.u5.z, g.u6.z, g.u7.z));
  return word(r, xa + 6u * XS, vec4<u32>(g.u0.w, g.u1.w, g.u2.w, g.u3.w),
    vec4<u32>(g.u4.w, g.u5.w, g.u6.w, g.u7.w));
}

// One round of the lanes' reduction: rows 4 rho .. 4 rho + 3 of the tile, v0..v3 this thread's
// sums for them in its columns off .. off + 3. Thread o < 4 CG adds the KL lanes of column group
// o / 4, row o % 4, and writes split `split`'s partial sums of those 4 columns.
fn round(lid: u32, lane: u32, cg: u32, m0: u32, n0: u32, split: u32, rho: u32, off: u32,
  v0: vec4<f32>, v1: vec4<f32>, v2: vec4<f32>, v3: vec4<f32>) {
  workgroupBarrier();
  xs[(cg * 4u) * KL + lane] = v0;
  xs[(cg * 4u + 1u) * KL + lane] = v1;
  xs[(cg * 4u + 2u) * KL + lane] = v2;
  xs[(cg * 4u + 3u) * KL + lane] = v3;
  workgroupBarrier();
  if (lid >= 4u * CG) {
    return;
  }
  let i = lid * KL;
  var s = xs[i] + xs[i + 1u] + xs[i + 2u] + xs[i + 3u];
  if (KL == 8u) {
    s += xs[i + 4u] + xs[i + 5u] + xs[i + 6u] + xs[i + 7u];
  }
  let m = m0 + 4u * rho + lid % 4u;
  let c = n0 + (lid / 4u) * CW + off;
  let n = cols();
  if (m >= p.m) {
    return;
  }
  let o = (split * p.m + m) * n + c;
  if (c < n) {
    part[o] = s.x;
  }
  if (c + 1u < n) {
    part[o + 1u] = s.y;
  }
  if (c + 2u < n) {
    part[o + 2u] = s.z;
  }
  if (c + 3u < n) {
    part[o + 3u] = s.w;
  }
}

@compute @workgroup_size(KL * CG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  // Workgroups are laid out [split][column tile][row tile]: row tiles of a column tile are
  // neighbours and read the same W.
  let rtiles = (p.m + R - 1u) / R;
  let tiles = rtiles * ((cols() + CW * CG - 1u) / (CW * CG));
  let g = wid.y * p.groups_x + wid.x;
  let split = g / tiles;
  let m0 = (g % tiles % rtiles) * R;
  let n0 = (g % tiles / rtiles) * CW * CG;
  let lane = lid % KL;
  let cg = lid / KL;
  let c0 = n0 + CW * cg;
  let kb = split * p.kspan;
  let ke = min(p.k, kb + p.kspan);
  let t = threads();
  // First unit of the row of W behind each of the thread's columns (clamped to the last).
  let last = cols() - 1u;
  let wo = vec4<u32>(col_row(min(c0, last)), col_row(min(c0 + 1u, last)),
    col_row(min(c0 + 2u, last)), col_row(min(c0 + 3u, last))) * (p.k / 8u);
  var wo2 = vec4<u32>(0u);
  if (CW == 8u) {
    wo2 = vec4<u32>(col_row(min(c0 + 4u, last)), col_row(min(c0 + 5u, last)),
      col_row(min(c0 + 6u, last)), col_row(min(c0 + 7u, last))) * (p.k / 8u);
  }

  var acc: Acc2;
  var ss = vec4<f32>(0.0); // NORM: sum of x^2 of x slot j, in component j
  var staged = fetch(lid, m0, wo, wo2, lane, kb, ke);
  var b = 0u;
  for (var k0 = kb; k0 < ke; k0 += KC) {
    if (NORM) {
      ss += vec4<f32>(dot(staged.x0, staged.x0), dot(staged.x1, staged.x1),
        dot(staged.x2, staged.x2), dot(staged.x3, staged.x3));
    }
    stash(staged, lid, b);
    let units = staged;
    workgroupBarrier();
    if (k0 + KC < ke) {
      staged = fetch(lid, m0, wo, wo2, lane, k0 + KC, ke); // in flight during this stage's math
    }
    acc = unit(acc, b * BUF + lane * LS, units);
    b ^= 1u;
  }

  if (NORM) {
    // x slot s's sum of x^2 goes to float s of xs; row r of the tile owns floats
    // r * KC / 4 .. + KC / 4. The first column tile writes the rows' sums for this split.
    workgroupBarrier();
    if (has_x(lid)) {
      xs[lid / 4u][lid % 4u] = ss.x;
    }
    if (has_x(lid + t)) {
      xs[(lid + t) / 4u][lid % 4u] = ss.y; // t is a multiple of 4
    }
    if (has_x(lid + 2u * t)) {
      xs[(lid + 2u * t) / 4u][lid % 4u] = ss.z;
    }
    if (has_x(lid + 3u * t)) {
      xs[(lid + 3u * t) / 4u][lid % 4u] = ss.w;
    }
    workgroupBarrier();
    if (n0 == 0u && lid < R && m0 + lid < p.m) {
      var sum = 0.0;
      for (var i = lid * (KC / 4u); i < (lid + 1u) * (KC / 4u); i++) {
        sum += xs[i / 4u][i % 4u];
      }
      part[p.splits * p.m * cols() + split * p.m + m0 + lid] = sum;
    }
  }

  rounds(lid, lane, cg, m0, n0, split, 0u, acc.a);
  if (CW == 8u) {
    rounds(lid, lane, cg, m0, n0, split, 4u, acc.b);
  }
}

// The lanes' reduction of one set of 4 columns (at `off`), every row of the tile.
fn rounds(lid: u32, lane: u32, cg: u32, m0: u32, n0: u32, split: u32, off: u32, a: Acc) {
  round(lid, lane, cg, m0, n0, split, 0u, off, a.q0.a, a.q0.b, a.q0.c, a.q0.d);
  round(lid, lane, cg, m0, n0, split, 1u, off, a.q0.e, a.q0.f, a.q0.g, a.q0.h);
  if (R >= 16u) {
    round(lid, lane, cg, m0, n0, split, 2u, off, a.q1.a, a.q1.b, a.q1.c, a.q1.d);
    round(lid, lane, cg, m0, n0, split, 3u, off, a.q1.e, a.q1.f, a.q1.g, a.q1.h);
  }
  if (R >= 24u) {
    round(lid, lane, cg, m0, n0, split, 4u, off, a.q2.a, a.q2.b, a.q2.c, a.q2.d);
    round(lid, lane, cg, m0, n0, split, 5u, off, a.q2.e, a.q2.f, a.q2.g, a.q2.h);
  }
  if (R == 32u) {
    round(lid, lane, cg, m0, n0, split, 6u, off, a.q3.a, a.q3.b, a.q3.c, a.q3.d);
    round(lid, lane, cg, m0, n0, split, 7u, off, a.q3.e, a.q3.f, a.q3.g, a.q3.h);
  }
}
