// matmul_common.wgsl and quant_common.wgsl (prepended): WDTYPE, NORM, SWIGLU, Params, p, bias,
// y, cols, w_row, unpack2, store_out, store4; is_quant, q_bits, q_group, group_scale, decode8,
// decode4.
// Register-blocked matmul for decode batches and short prompts (M = 1..64 rows of x):
//   y[m, n] (+)= sum_k x[m, k] * W[n, k] (+ bias[n])
// W is read in 16-byte units (8 halves or 4 f32, vec4<u32> loads); each unit is widened once
// and applied to RM rows of x held in registers, and each vec4 of x read is applied to the 4
// columns (rows of W) a thread owns. So a thread keeps 4 x RM accumulators (vec4 over its 4
// columns, one per row of x), and per unit does 4 loads of W, RM (f32 W) or 2 RM (16-bit W)
// loads of x and 16 RM or 32 RM multiply-adds.
//
// A workgroup owns a tile of RM * TM rows of x by 4 * TN product columns and walks all of K
// (no cross-workgroup reduction): TK threads split K unit by unit, TN column groups and TM row
// groups share the tile. Lanes: KL (8 or 16, at most TK) consecutive threads take KL adjacent
// units of a row of W (one or two 128-byte lines per row), then come the column groups (they
// read the same x: broadcast), then the rest of K, then the row groups (they read the same W,
// from L1). Workgroups are laid out [column tile][row tile]: neighbours read the same W tile,
// which then comes from L2.
// x is read from global memory (small next to W; L1/L2-resident); workgroup memory holds only the
// reduction, one vec4 per thread (llvmpipe's GL compile time grows steeply with workgroup
// arrays: naga zero-fills them with one constructor term per element).
//
// After the K loop the TK partial sums of each accumulator are added in workgroup memory:
// RM passes in which lane r of each block of RM lanes adds the block's sums of row r (so the
// RM rows are summed in parallel), then one tree over the blocks, four entries per step.
//
// Optional fusions (override constants):
// - NORM: y = (x / rms(x) * nw) . W^T. nw scales the widened W units (shared by the RM rows)
//   and 1 / rms the finished sums. After the K loop all threads of the workgroup share
//   sum(x^2) over the tile's rows (one pass over x, one reduction).
// - SWIGLU: W is gate/up interleaved in blocks of p.block rows (see w_row). The product has
//   2F columns, gate and up of output c / 2 at c even and odd, so a thread's 4 columns are two
//   whole outputs and y[m, n] = silu(gate) * up needs no exchange.
//
// Quantized W (WDTYPE >= 3): a unit is still 16 bytes, 16 8-bit or 32 4-bit codes, loaded raw
// and decoded a word at a time inside mac_rows_q (a whole decoded unit of 4-bit codes would be
// 128 floats), each decoded word applied to the RM rows of x. A unit lies in one scale group
// (groups are 16 or 32 codes): its partial sums are scaled by the 4 columns' group scales
// (and, for q4_k, less the group minimum times the sum of x over the unit); formats with one
// scale per row (int8, e4m3) scale the finished sums instead.
//
// XQ (W of signed 8-bit codes: int8, q8_0, q6_k; the adapter has dot4I8Packed): x is quantized
// too, per unit of 16 k (a scale each: absmax / 127 of x, times nw with NORM), into workgroup
// memory, by all the workgroup's threads, XU units of each of the tile's rows at a time (a chunk:
// whole loop trips where the workgroup memory allows). The loop then reads a unit of x as one
// vec4<u32> of codes and its scale, and per column does 4 dot4I8Packed (16 multiply-adds, exact
// i32), one conversion to f32 (through 1.5 * 2^23: |sum| <= 16 * 128 * 127 < 2^22) and one
// multiply-add by the unit's x scale (times the column's group scale for q8_0 and q6_k): about a
// quarter of an operation per weight and row of x, where the decode above costs about 4 per
// weight and 1 per weight and row. The staging costs about 7 operations per element of x, once
// per workgroup: 7 / (4 TN) per weight and row. The first trip's loads of W are issued before it.
//
// Requires K % 8 == 0 (16-bit W), K % 4 == 0 (f32 W), K % 16 (8-bit codes) or K % 32 (4-bit),
// RM in {1, 2, 4, 8}, TK a power of two >= RM, TN and TM powers of two; the wrapper checks and
// falls back otherwise.

override K: u32 = 64u; // columns of W and x
override RM: u32 = 1u; // rows of x per thread: 1, 2, 4 or 8
override TM: u32 = 1u; // row groups: a tile has RM * TM rows of x
override TN: u32 = 1u; // column groups of 4: a tile has 4 * TN product columns
override TK: u32 = 8u; // threads splitting K, a power of two >= RM
override UNROLL: u32 = 1u; // units per column per loop iteration (loads in flight): 1, 2 or 4
override KL: u32 = 8u; // adjacent threads along a row of W: 8 or 16 (at most TK take effect)
override XQ: bool = false; // x quantized per unit in workgroup memory, dot4I8Packed (see above)
override XU: u32 = 1u; // XQ: units of x per row and chunk

@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> nw: array<vec4<f32>>; // RMSNorm weights [K] (NORM)

var<workgroup> red: array<vec4<f32>, TK * TN * TM>; // one entry per thread
var<workgroup> inv_rms: array<f32, RM * TM>; // 1 / rms of the tile's rows of x (NORM)
var<workgroup> xw: array<vec4<u32>, RM * TM * XU>; // XQ: codes of a chunk, [row][unit]
var<workgroup> xsc: array<f32, RM * TM * XU>; // XQ: their scales

// A unit of the thread's 4 columns, widened and transposed: lo[k] holds element k of each
// column (k = 0..3), hi[k] element 4 + k (16-bit W only); quantized W: the raw words of each
// column (q0: column 0's 4 words, ...).
struct Unit {
  lo: mat4x4<f32>,
  hi: mat4x4<f32>,
  q0: vec4<u32>,
  q1: vec4<u32>,
  q2: vec4<u32>,
  q3: vec4<u32>,
}

// vec4s of x per unit: 1 for f32 W, 2 for 16-bit (8 elements), 4 for 8-bit codes, 8 for 4-bit.
fn x_vecs() -> u32 {
  if (is_quant()) {
    return select(4u, 8u, q_bits() == 4u);
  }
  return select(1u, 2u, WDTYPE != 0u);
}

// Units per row of W.
fn units() -> u32 {
  return K / (4u * x_vecs());
}

// First unit of the row of W behind product column c. Columns past the edge re-read the last
// one (in bounds, no branch) and store nothing.
fn row_base(c: u32) -> u32 {
  let cc = min(c, cols() - 1u);
  return select(cc, w_row(cc / 2u, cc % 2u), SWIGLU) * units();
}

// First vec4 of row m of x; rows past M re-read the last row and store nothing.
fn x_base(m: u32) -> u32 {
  return min(m, p.m - 1u) * (K / 4u);
}

fn lo4(q: vec4<u32>) -> vec4<f32> {
  if (WDTYPE == 0u) {
    return bitcast<vec4<f32>>(q);
  }
  return vec4<f32>(unpack2(q.x), unpack2(q.y));
}

fn hi4(q: vec4<u32>) -> vec4<f32> {
  return vec4<f32>(unpack2(q.z), unpack2(q.w));
}

// Scales k-row k of t by s[k] (the norm weights of those columns of W).
fn scale(t: mat4x4<f32>, s: vec4<f32>) -> mat4x4<f32> {
  return mat4x4<f32>(t[0] * s.x, t[1] * s.y, t[2] * s.z, t[3] * s.w);
}

// Unit u of the four rows of W that start at units `rows`.
fn load_unit(rows: vec4<u32>, u: u32) -> Unit {
  let q0 = w[rows.x + u];
  let q1 = w[rows.y + u];
  let q2 = w[rows.z + u];
  let q3 = w[rows.w + u];
  var t: Unit;
  if (is_quant()) {
    t.q0 = q0;
    t.q1 = q1;
    t.q2 = q2;
    t.q3 = q3;
    return t;
  }
  t.lo = transpose(mat4x4<f32>(lo4(q0), lo4(q1), lo4(q2), lo4(q3)));
  if (WDTYPE != 0u) {
    t.hi = transpose(mat4x4<f32>(hi4(q0), hi4(q1), hi4(q2), hi4(q3)));
  }
  if (NORM) {
    t.lo = scale(t.lo, nw[x_vecs() * u]);
    if (WDTYPE != 0u) {
      t.hi = scale(t.hi, nw[x_vecs() * u + 1u]);
    }
  }
  return t;
}

// a + unit t times the elements of x from vec4 i on: a chain of multiply-adds, one per element.
fn mac(a: vec4<f32>, t: Unit, i: u32) -> vec4<f32> {
  let v = x[i];
  var s = a + t.lo[0] * v.x + t.lo[1] * v.y + t.lo[2] * v.z + t.lo[3] * v.w;
  if (WDTYPE != 0u) {
    let v2 = x[i + 1u];
    s = s + t.hi[0] * v2.x + t.hi[1] * v2.y + t.hi[2] * v2.z + t.hi[3] * v2.w;
  }
  return s;
}

// Applies unit u to rows m0 .. m0 + RM - 1 of x. Constant indices only (the loop is unrolled):
// the accumulators stay in registers (an array indexed by a loop counter would live in local
// memory).
fn mac_rows(acc: ptr<function, array<vec4<f32>, 8>>, t: Unit, u: u32, m0: u32) {
  let i = x_vecs() * u;
  (*acc)[0] = mac((*acc)[0], t, x_base(m0) + i);
  // @unroll
  for (var r = 1u; r < 8u; r++) {
    if (RM > r) {
      (*acc)[r] = mac((*acc)[r], t, x_base(m0 + r) + i);
    }
  }
}

// mac_rows for quantized W: unit u of the 4 columns whose rows of W are `wrow` (their scales),
// applied to rows m0 .. m0 + RM - 1 of x, a word at a time (see the header).
fn mac_rows_q(acc: ptr<function, array<vec4<f32>, 8>>, t: Unit, u: u32, m0: u32, wrow: vec4<u32>) {
  let i = x_vecs() * u;
  var part: array<vec4<f32>, 8>; // this unit's sums per row of x
  var sx: array<f32, 8>; // q4_k: the sum of (normed) x over the unit per row
  // @unroll
  for (var j = 0u; j < 4u; j++) {
    let wd = vec4<u32>(t.q0[j], t.q1[j], t.q2[j], t.q3[j]); // word j of each column
    var lo: mat4x4<f32>;
    var hi: mat4x4<f32>;
    var v = i + j; // the vec4 of x of lo (8-bit: 4 k per word)
    if (q_bits() == 8u) {
      lo = transpose(mat4x4<f32>(decode8(wd.x), decode8(wd.y), decode8(wd.z), decode8(wd.w)));
    } else {
      v = i + 2u * j;
      let a = decode4(wd.x);
      let b = decode4(wd.y);
      let c = decode4(wd.z);
      let d = decode4(wd.w);
      lo = transpose(mat4x4<f32>(a.lo, b.lo, c.lo, d.lo));
      hi = transpose(mat4x4<f32>(a.hi, b.hi, c.hi, d.hi));
    }
    var n0 = vec4<f32>(1.0);
    var n1 = vec4<f32>(1.0);
    if (NORM) {
      n0 = nw[v];
      lo = scale(lo, n0);
      if (q_bits() == 4u) {
        n1 = nw[v + 1u];
        hi = scale(hi, n1);
      }
    }
    // @unroll
    for (var r = 0u; r < 8u; r++) {
      if (RM > r) {
        let xb = x_base(m0 + r) + v;
        let a = x[xb];
        var s = part[r] + lo[0] * a.x + lo[1] * a.y + lo[2] * a.z + lo[3] * a.w;
        if (q_bits() == 4u) {
          let b = x[xb + 1u];
          s = s + hi[0] * b.x + hi[1] * b.y + hi[2] * b.z + hi[3] * b.w;
          if (WDTYPE == 7u) {
            sx[r] += dot(a, n0) + dot(b, n1);
          }
        }
        part[r] = s;
      }
    }
  }
  if (q_group() == 0u) {
    // @unroll
    for (var r = 0u; r < 8u; r++) {
      if (RM > r) {
        (*acc)[r] += part[r];
      }
    }
    return;
  }
  let g = (u * 4u * x_vecs()) / q_group();
  let s0 = group_scale(wrow.x, g);
  let s1 = group_scale(wrow.y, g);
  let s2 = group_scale(wrow.z, g);
  let s3 = group_scale(wrow.w, g);
  let sc = vec4<f32>(s0.x, s1.x, s2.x, s3.x);
  let mn = vec4<f32>(s0.y, s1.y, s2.y, s3.y);
  // @unroll
  for (var r = 0u; r < 8u; r++) {
    if (RM > r) {
      (*acc)[r] += sc * part[r] - mn * sx[r];
    }
  }
}

// XQ: four elements of x (already divided by their unit's scale) as int8 codes in one word, k
// order. Adding 1.5 * 2^23 rounds to the nearest integer, ties to even, and leaves it in the low
// bits (|v| <= 127 < 2^22): the low byte is the code in two's complement.
fn code4(v: vec4<f32>) -> u32 {
  let b = bitcast<vec4<u32>>(v + vec4<f32>(12582912.0)) & vec4<u32>(0xffu);
  return b.x | (b.y << 8u) | (b.z << 16u) | (b.w << 24u);
}

// XQ: units c0 .. c0 + XU - 1 of the tile's rows t0 .. of x into xw / xsc, one unit and row per
// thread and pass (rows past M re-read the last row; units past K are left as they are, never
// read). With NORM the unit is x * nw: 1 / rms is a factor of the whole row, applied to the
// finished sums, and does not change the codes.
fn stage_x(lid: u32, t0: u32, c0: u32) {
  for (var i = lid; i < RM * TM * XU; i += TK * TN * TM) {
    let u = c0 + i % XU;
    if (u < units()) {
      let b = x_base(t0 + i / XU) + 4u * u;
      var v0 = x[b];
      var v1 = x[b + 1u];
      var v2 = x[b + 2u];
      var v3 = x[b + 3u];
      if (NORM) {
        v0 *= nw[4u * u];
        v1 *= nw[4u * u + 1u];
        v2 *= nw[4u * u + 2u];
        v3 *= nw[4u * u + 3u];
      }
      let a = max(max(abs(v0), abs(v1)), max(abs(v2), abs(v3)));
      let amax = max(max(a.x, a.y), max(a.z, a.w));
      let inv = select(0.0, 127.0 / amax, amax > 0.0);
      xw[i] = vec4<u32>(code4(v0 * inv), code4(v1 * inv), code4(v2 * inv), code4(v3 * inv));
      xsc[i] = amax * (1.0 / 127.0);
    }
  }
}

// The exact sum of the 16 products of a unit of W codes and a unit of x codes.
fn dot16(w4: vec4<u32>, x4: vec4<u32>) -> i32 {
  return dot4I8Packed(w4.x, x4.x) + dot4I8Packed(w4.y, x4.y) + dot4I8Packed(w4.z, x4.z) +
    dot4I8Packed(w4.w, x4.w);
}

// i32 sums below 2^22 in magnitude as f32, exactly, without a conversion instruction (a quarter
// of the FMA rate on NVIDIA): 1.5 * 2^23 + d has d in its low bits.
fn i2f(d: vec4<i32>) -> vec4<f32> {
  return bitcast<vec4<f32>>(bitcast<vec4<u32>>(d) + vec4<u32>(0x4b400000u)) -
    vec4<f32>(12582912.0);
}

// mac_rows for XQ: unit u (entry j of the staged chunk) of the 4 columns whose rows of W are
// `wrow`, against the thread's RM staged rows of x from row mg * RM of the tile.
fn mac_rows_x(acc: ptr<function, array<vec4<f32>, 8>>, t: Unit, u: u32, j: u32, mg: u32,
  wrow: vec4<u32>) {
  var sc = vec4<f32>(1.0); // per-row formats: the row scales come last
  if (q_group() != 0u) {
    let g = (u * 16u) / q_group();
    sc = vec4<f32>(group_scale(wrow.x, g).x, group_scale(wrow.y, g).x,
      group_scale(wrow.z, g).x, group_scale(wrow.w, g).x);
  }
  // @unroll
  for (var r = 0u; r < 8u; r++) {
    if (RM > r) {
      let i = (mg * RM + r) * XU + j;
      let xv = xw[i];
      let d = vec4<i32>(dot16(t.q0, xv), dot16(t.q1, xv), dot16(t.q2, xv), dot16(t.q3, xv));
      (*acc)[r] += (xsc[i] * sc) * i2f(d);
    }
  }
}

// XQ: the K loop, chunk by chunk (see the header).
fn loop_xq(acc: ptr<function, array<vec4<f32>, 8>>, lid: u32, kj: u32, t0: u32, mg: u32,
  rows: vec4<u32>, wrow: vec4<u32>) {
  for (var c0 = 0u; c0 < units(); c0 += XU) {
    let end = min(c0 + XU, units());
    // The first trip's units, in flight while the chunk of x is staged.
    var ld: array<Unit, 4>;
    var u = c0 + kj;
    // @unroll
    for (var q = 0u; q < 4u; q++) {
      if (UNROLL > q) {
        ld[q] = load_unit(rows, min(u + q * TK, units() - 1u));
      }
    }
    workgroupBarrier(); // the last chunk's codes are no longer read
    stage_x(lid, t0, c0);
    workgroupBarrier();
    while (u < end) {
      // @unroll
      for (var q = 0u; q < 4u; q++) {
        if (UNROLL > q && u + q * TK < end) {
          mac_rows_x(acc, ld[q], u + q * TK, u + q * TK - c0, mg, wrow);
        }
      }
      u += UNROLL * TK;
      if (u < end) {
        // @unroll
        for (var q = 0u; q < 4u; q++) {
          if (UNROLL > q) {
            ld[q] = load_unit(rows, min(u + q * TK, units() - 1u));
          }
        }
      }
    }
  }
}

// Adds red[i + stride * l] over the lanes l = lane .. of a segment of `width` lanes (a power
// of two) into the entry of lane 0, four entries per step, and returns red[i] (the total at
// lane 0). Call in uniform control flow after writing red[i].
fn reduce(i: u32, lane: u32, width: u32, stride: u32) -> vec4<f32> {
  workgroupBarrier();
  for (var s = 1u; s < width; s *= 4u) {
    if ((lane & (4u * s - 1u)) == 0u) {
      var v = red[i] + red[i + stride * s];
      if (lane + 2u * s < width) {
        v += red[i + 2u * stride * s] + red[i + 3u * stride * s];
      }
      red[i] = v;
    }
    workgroupBarrier();
  }
  return red[i];
}

// NORM: 1 / rms of rows t0 .. t0 + RM * TM - 1 of x into inv_rms. Each row gets TK * TN / RM
// threads (all of the workgroup's), one pass over x and one reduction.
fn norm_rows(lid: u32, t0: u32) {
  let span = TK * TN / RM;
  let r = lid / span;
  let j = lid % span;
  var ss = 0.0;
  if (t0 + r < p.m) {
    let base = (t0 + r) * (K / 4u);
    for (var i = j; i < K / 4u; i += span) {
      let v = x[base + i];
      ss += dot(v, v);
    }
  }
  red[lid] = vec4<f32>(ss, 0.0, 0.0, 0.0);
  let total = reduce(lid, j, span, 1u);
  if (j == 0u) {
    inv_rms[r] = inverseSqrt(total.x / f32(K) + p.eps);
  }
  workgroupBarrier(); // red is free again, inv_rms visible
}

// Reduction pass r: every lane publishes its row-r sums; lane r of each block of RM lanes adds
// up the block's into *part.
fn gather(r: u32, v: vec4<f32>, slot: u32, kj: u32, part: ptr<function, vec4<f32>>) {
  red[slot] = v;
  workgroupBarrier();
  if (kj % RM == r) {
    let b = slot - r; // lane 0 of the block
    var s = red[b];
    for (var i = 1u; i < RM; i++) {
      s += red[b + i];
    }
    *part = s;
  }
  workgroupBarrier();
}

// acc[r] by constant indices: a loop-indexed read would move acc to local memory.
fn pick(acc: array<vec4<f32>, 8>, r: u32) -> vec4<f32> {
  var v = acc[0];
  // @unroll
  for (var i = 1u; i < 8u; i++) {
    if (RM > i) {
      v = select(v, acc[i], r == i);
    }
  }
  return v;
}

@compute @workgroup_size(TK * TN * TM)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let kl = min(TK, KL);
  let kj = lid % kl + kl * ((lid / (kl * TN)) % (TK / kl)); // lane along K
  let ng = (lid / kl) % TN; // column group
  let mg = lid / (TK * TN); // row group
  let slot = (mg * TN + ng) * TK + kj; // red entry: lanes of a group are adjacent
  let g = wid.y * p.groups_x + wid.x;
  let mtiles = (p.m + RM * TM - 1u) / (RM * TM);
  let t0 = (g % mtiles) * RM * TM; // first row of x of the tile
  let m0 = t0 + mg * RM; // this thread's first row
  let c0 = ((g / mtiles) * TN + ng) * 4u; // this thread's first product column

  let rows = vec4<u32>(row_base(c0), row_base(c0 + 1u), row_base(c0 + 2u), row_base(c0 + 3u));
  let wrow = rows / units(); // rows of W behind the 4 columns (their scales)
  var acc: array<vec4<f32>, 8>;
  if (XQ) {
    loop_xq(&acc, lid, kj, t0, mg, rows, wrow);
  }
  for (var u = kj; u < units() && !XQ; u += UNROLL * TK) {
    // All UNROLL units are loaded before any is applied: UNROLL x 4 loads in flight, and one
    // loop trip (~30 ns of overhead on an H200) per UNROLL units.
    var ld: array<Unit, 4>;
    ld[0] = load_unit(rows, u);
    // @unroll
    for (var q = 1u; q < 4u; q++) {
      if (UNROLL > q) {
        ld[q] = load_unit(rows, min(u + q * TK, units() - 1u));
      }
    }
    if (is_quant()) {
      mac_rows_q(&acc, ld[0], u, m0, wrow);
    } else {
      mac_rows(&acc, ld[0], u, m0);
    }
    // @unroll
    for (var q = 1u; q < 4u; q++) {
      if (UNROLL > q && u + q * TK < units()) {
        if (is_quant()) {
          mac_rows_q(&acc, ld[q], u + q * TK, m0, wrow);
        } else {
          mac_rows(&acc, ld[q], u + q * TK, m0);
        }
      }
    }
  }

  // 1 / rms is only needed for the finished sums: computing it here lets the loads of W start
  // at once, and the loop has just brought x into L1.
  if (NORM) {
    norm_rows(lid, t0);
  }

  // Lane r + RM * t ends up with block t's sums of row r, then lane r with the row's total.
  var part = acc[0];
  if (RM > 1u) {
    for (var r = 0u; r < RM; r++) {
      gather(r, pick(acc, r), slot, kj, &part);
    }
  }
  red[slot] = part;
  let total = reduce(slot, kj / RM, TK / RM, RM);
  let m = m0 + kj;
  if (kj < RM && m < p.m) {
    var s = total;
    if (NORM) {
      s *= inv_rms[mg * RM + kj];
    }
    if (is_quant() && q_group() == 0u) {
      s *= vec4<f32>(group_scale(wrow.x, 0u).x, group_scale(wrow.y, 0u).x,
        group_scale(wrow.z, 0u).x, group_scale(wrow.w, 0u).x);
    }
    store4(m, c0, s);
  }
}
