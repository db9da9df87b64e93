// quant_common.wgsl (prepended): is_quant, q_bits, q_group, group_scale, decode8, decode4.
// The input of a projection, one workgroup per row of x [M, K]:
// - NORM: x' = x / rms(x) * nw (the RMSNorm the matmul would fold in), else x' = x;
// - WRITE_Q: x' quantized to int8 per row for matmul_q8.wgsl: scale = absmax / 127,
//   code = round(x' / scale), four codes per word in k order, scale into xscale[row];
// - STATS: what the precision monitor needs (kernels/quant_x.ts `StatsField`), folded into
//   slot `slot` of `stats` with atomics, so every row of every launch of a pass lands in one
//   small buffer the host reads back with the tokens: the smallest and largest x', the smallest
//   and largest per-row standard deviation, the largest relative int8 error of the row
//   (|x' - scale * code| / |x'|), rows seen, rows with a value that is not finite;
// - SAMPLE: on every `every`-th row, the relative error of the projection itself over SAMPLES
//   sampled rows of W: the quantized rows (WDTYPE, decoded as the matmuls decode them) times what
//   the quantized path multiplies (int8 x per row with WRITE_Q, per unit of 16 k with UNIT_CODES
//   as matmul_small.wgsl's XQ rounds it, x' otherwise) against the 16-bit rows (as f32 in s16)
//   times x'. The sampled rows are a constant count, so the unrolled loop has no branch and a
//   thread's loads of all of them are in flight together; a per-row format's row scales multiply
//   the finished sums once.
// Values are reduced in workgroup memory; min / max fold across rows as atomicMax of ordered
// keys (key(-v) for a minimum), so a zeroed buffer (the `clear` entry point) is the identity.
// Rows that hold no token (a finished slot of a decode step, a padding row of a prefill chunk:
// live_kind) are quantized but not counted: their inputs are stale or zeros, not the model's.

override WG: u32 = 256u; // threads per row, a power of two
override NORM: bool = false;
override WRITE_Q: bool = true;
override STATS: bool = false;
override SAMPLE: bool = false;
override WDTYPE: u32 = 3u; // the sampled W's format (quant_common.wgsl)
override SAMPLES: u32 = 0u; // rows of W sampled (SAMPLE): 1 to 8
override UNIT_CODES: bool = false; // the sampled product multiplies x rounded per unit of 16 k

struct QxParams {
  m: u32, // rows of x (clear: words of stats to zero)
  k: u32, // columns of x, a multiple of 4
  eps: f32, // RMSNorm epsilon (NORM)
  slot: u32, // stats slot (8 words)
  every: u32, // SAMPLE rows: row % every == 0
  wrows: u32, // rows of the sampled W
  samples: u32, // sampled rows of W (SAMPLES, for the record)
  live_kind: u32, // which rows STATS counts: 0 all; 1 live[4 row] == 0 (a slot not done); 2 row < live[2] (a prefill chunk's tokens)
  srows0: vec4<u32>, // the sampled rows of W
  srows1: vec4<u32>,
}

@group(0) @binding(0) var<uniform> qp: QxParams;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>; // [M, K]
@group(0) @binding(2) var<storage, read_write> xq: array<u32>; // [M, K / 4] (WRITE_Q)
@group(0) @binding(3) var<storage, read_write> xscale: array<f32>; // [M] (WRITE_Q)
@group(0) @binding(4) var<storage, read> nw: array<vec4<f32>>; // [K] (NORM)
@group(0) @binding(5) var<storage, read_write> stats: array<atomic<u32>>; // [slots, 8] (STATS)
@group(0) @binding(6) var<storage, read> s16: array<vec4<f32>>; // [samples, K] (SAMPLE)
@group(0) @binding(8) var<storage, read> wq: array<u32>; // codes of the sampled W (SAMPLE)
@group(0) @binding(9) var<storage, read> live: array<u32>; // slot states or a chunk's words

var<workgroup> red: array<vec4<f32>, 2u * WG>; // two reductions at once: [0, WG), [WG, 2 WG)

fn q_k() -> u32 {
  return qp.k;
}

fn q_rows() -> u32 {
  return qp.wrows;
}

struct Pair {
  a: vec4<f32>,
  b: vec4<f32>,
}

// Sums of a and of b (with `most`, the maximum of b) over the workgroup, in one tree: a barrier
// per level for both. Call in uniform control flow.
fn reduce2(lid: u32, a: vec4<f32>, b: vec4<f32>, most: bool) -> Pair {
  workgroupBarrier();
  red[lid] = a;
  red[WG + lid] = b;
  for (var s = WG / 2u; s > 0u; s >>= 1u) {
    workgroupBarrier();
    if (lid < s) {
      red[lid] += red[lid + s];
      let o = red[WG + lid + s];
      red[WG + lid] = select(red[WG + lid] + o, max(red[WG + lid], o), most);
    }
  }
  workgroupBarrier();
  return Pair(red[0], red[WG]);
}

// An order-preserving key of v: unsigned order of keys = float order of values.
fn key(v: f32) -> u32 {
  let b = bitcast<u32>(v);
  return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

fn fold(field: u32, v: f32) {
  atomicMax(&stats[qp.slot * 8u + field], key(v));
}

// Weights k .. k + 3 of row `row` of the sampled W, decoded as the matmuls decode them; for a
// per-row format (int8, e4m3) without the row scale.
fn w4(row: u32, k: u32) -> vec4<f32> {
  let e = row * qp.k + k;
  var c: vec4<f32>;
  if (q_bits() == 8u) {
    c = decode8(wq[e / 4u]);
  } else {
    let n = decode4(wq[e / 8u]);
    c = select(n.lo, n.hi, (e & 4u) != 0u);
  }
  if (q_group() == 0u) {
    return c;
  }
  let sm = group_scale(row, k / q_group());
  return sm.x * c - sm.y;
}

fn srow(i: u32) -> u32 {
  return select(qp.srows0[i & 3u], qp.srows1[i & 3u], i >= 4u);
}

// The row scales of sampled rows 4 h .. 4 h + 3 (per-row formats; 1 otherwise).
fn row_scales(h: u32) -> vec4<f32> {
  if (q_group() != 0u) {
    return vec4<f32>(1.0);
  }
  var v = vec4<f32>(1.0);
  // @unroll
  for (var j = 0u; j < 4u; j++) {
    if (4u * h + j < SAMPLES) {
      v[j] = group_scale(srow(4u * h + j), 0u).x;
    }
  }
  return v;
}

// Pass 2's running sums (one row per workgroup).
var<private> err: f32; // squared error of x' quantized per row
var<private> y16a: vec4<f32>; // sampled rows 0..3 of W times x'
var<private> y16b: vec4<f32>; // 4..7
var<private> yqa: vec4<f32>; // the same rows, quantized, times the quantized path's input
var<private> yqb: vec4<f32>;

// Pass 2 on vec4 i of the row whose first is `base`: n = x' there; `scale`, `inv` the row's
// int8 scale and its inverse; `xin` what the quantized path multiplies when it is not the row's
// int8 x.
fn pass2(base: u32, i: u32, n: vec4<f32>, scale: f32, inv: f32, xin: vec4<f32>, sampled: bool) {
  let c = clamp(round(n * inv), vec4<f32>(-127.0), vec4<f32>(127.0));
  if (WRITE_Q) {
    xq[base + i] = pack4xI8(vec4<i32>(c));
  }
  let d = n - scale * c;
  err += dot(d, d);
  if (!sampled) {
    return;
  }
  let xv = select(xin, scale * c, WRITE_Q);
  let k4 = qp.k / 4u;
  // @unroll
  for (var s = 0u; s < 8u; s++) {
    if (s < SAMPLES) {
      let a = dot(n, s16[s * k4 + i]);
      let b = dot(xv, w4(srow(s), 4u * i));
      if (s < 4u) {
        y16a[s & 3u] += a; // s & 3: both arms must index in bounds once unrolled
        yqa[s & 3u] += b;
      } else {
        y16b[s & 3u] += a;
        yqb[s & 3u] += b;
      }
    }
  }
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
  @builtin(local_invocation_index) lid: u32) {
  let row = wid.y * nwg.x + wid.x;
  if (row >= qp.m) {
    return; // uniform: the workgroup's row
  }
  let k4 = qp.k / 4u;
  let base = row * k4;
  // Pass 1: sum of x^2 (the norm), and of x * nw: absmax, max, -min, sum, sum of squares.
  var sums = vec4<f32>(0.0); // x^2, x*nw, (x*nw)^2, values not finite
  var most = vec4<f32>(0.0, -3.4e38, -3.4e38, 0.0); // |x*nw|, x*nw, -(x*nw)
  for (var i = lid; i < k4; i += WG) {
    let v = x[base + i];
    var n = v;
    if (NORM) {
      n = v * nw[i];
    }
    let bad = select(vec4<f32>(0.0), vec4<f32>(1.0), !(abs(v) <= vec4<f32>(3.4e38)));
    sums += vec4<f32>(dot(v, v), n.x + n.y + n.z + n.w, dot(n, n), bad.x + bad.y + bad.z + bad.w);
    let a = abs(n);
    most = max(most, vec4<f32>(max(max(a.x, a.y), max(a.z, a.w)),
      max(max(n.x, n.y), max(n.z, n.w)), -min(min(n.x, n.y), min(n.z, n.w)), 0.0));
  }
  let pass1 = reduce2(lid, sums, most, true);
  let tot = pass1.a;
  let top = pass1.b;
  var r = 1.0;
  if (NORM) {
    r = inverseSqrt(tot.x / f32(qp.k) + qp.eps);
  }
  let scale = r * top.x * (1.0 / 127.0);
  let inv = select(0.0, 1.0 / scale, scale > 0.0);
  if (WRITE_Q && lid == 0u) {
    xscale[row] = scale;
  }

  // Pass 2: the codes, their squared error, and the sampled products.
  let sampled = SAMPLE && row % qp.every == 0u;
  if (UNIT_CODES) {
    // A unit of 16 k per thread and trip: its scale, then its four vec4.
    for (var u = lid; u < k4 / 4u; u += WG) {
      var n: array<vec4<f32>, 4>;
      var a = vec4<f32>(0.0);
      // @unroll
      for (var j = 0u; j < 4u; j++) {
        n[j] = x[base + 4u * u + j] * r;
        if (NORM) {
          n[j] *= nw[4u * u + j];
        }
        a = max(a, abs(n[j]));
      }
      let amax = max(max(a.x, a.y), max(a.z, a.w));
      let us = amax * (1.0 / 127.0);
      let uinv = select(0.0, 127.0 / amax, amax > 0.0);
      // @unroll
      for (var j = 0u; j < 4u; j++) {
        pass2(base, 4u * u + j, n[j], scale, inv, us * round(n[j] * uinv), sampled);
      }
    }
  } else {
    for (var i = lid; i < k4; i += WG) {
      var n = x[base + i] * r;
      if (NORM) {
        n *= nw[i];
      }
      pass2(base, i, n, scale, inv, n, sampled);
    }
  }
  var counted = true;
  if (qp.live_kind == 1u) {
    counted = live[4u * row] == 0u;
  } else if (qp.live_kind == 2u) {
    counted = row < live[2u];
  }
  if (!STATS || !counted) {
    return; // uniform: an override, the workgroup's row
  }
  var sample_err = 0.0;
  if (sampled) {
    let y = reduce2(lid, y16a, y16b, false);
    let q = reduce2(lid, yqa, yqb, false);
    let qa = q.a * row_scales(0u) - y.a;
    let qb = q.b * row_scales(1u) - y.b;
    sample_err = sqrt((dot(qa, qa) + dot(qb, qb)) / max(dot(y.a, y.a) + dot(y.b, y.b), 1e-30));
  }
  let e2 = reduce2(lid, vec4<f32>(err), vec4<f32>(0.0), false).a.x;
  if (lid != 0u) {
    return;
  }
  let kf = f32(qp.k);
  let mean = r * tot.y / kf;
  let sd = sqrt(max(r * r * tot.z / kf - mean * mean, 0.0));
  fold(0u, r * top.z); // -min
  fold(1u, r * top.y); // max
  fold(2u, -sd); // -(smallest std)
  fold(3u, sd);
  fold(4u, sqrt(e2 / max(r * r * tot.z, 1e-30)));
  if (sampled) {
    fold(5u, sample_err);
  }
  atomicAdd(&stats[qp.slot * 8u + 6u], 1u);
  if (tot.w > 0.0) {
    atomicAdd(&stats[qp.slot * 8u + 7u], 1u);
  }
}

// Zeroes the first qp.m words of stats (the identity of every field).
@compute @workgroup_size(64)
fn clear(@builtin(global_invocation_id) id: vec3<u32>) {
  if (id.x < qp.m) {
    atomicStore(&stats[id.x], 0u);
  }
}
