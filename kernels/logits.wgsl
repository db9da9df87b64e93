// Per-row statistics of logits[rows, V], one workgroup per row.
// stats: max, log-sum-exp and argmax (ties: lowest id), written as four u32 per row
//   (f32 bits of max, f32 bits of lse, argmax, 0).
// top_k: the k (<= 20) largest logits per row, sorted descending, ties by lower id, as
//   (id, f32 bits of logit - lse) pairs; entries past V are (0xffffffff, -inf). Each thread keeps
//   its own sorted top-k of the ids it strides over (one read of the row), then k rounds of a
//   workgroup max pick the winners.

struct Dims {
  rows: u32,
  vocab: u32,
  k: u32,
  _pad: u32,
}

@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read> logits: array<f32>; // [rows, V]
@group(0) @binding(2) var<storage, read_write> stats: array<u32>; // [rows, 4]
@group(0) @binding(3) var<storage, read_write> out: array<u32>; // [rows, k, 2]

override WG: u32 = 256u; // power of two

const MAX_K: u32 = 20u;
const NONE: u32 = 0xffffffffu;
const NEG: f32 = -3.402823e38;
const NEG_INF_BITS: u32 = 0xff800000u;

var<workgroup> wv: array<f32, WG>;
var<workgroup> ws: array<f32, WG>;
var<workgroup> wi: array<u32, WG>;
var<workgroup> wo: array<u32, WG>;

// (a_v, a_i) comes before (b_v, b_i): larger value, then lower id; NONE ids come last.
fn before(a_v: f32, a_i: u32, b_v: f32, b_i: u32) -> bool {
  if (a_i == NONE || b_i == NONE) {
    return b_i == NONE && a_i != NONE;
  }
  return a_v > b_v || (a_v == b_v && a_i < b_i);
}

fn row_of(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
  return wid.y * nwg.x + wid.x;
}

@compute @workgroup_size(WG)
fn stats_main(
  @builtin(workgroup_id) wid: vec3<u32>,
  @builtin(num_workgroups) nwg: vec3<u32>,
  @builtin(local_invocation_index) lid: u32,
) {
  let row = row_of(wid, nwg);
  if (row >= dims.rows) {
    return;
  }
  let V = dims.vocab;
  let base = row * V;
  // online max / sum of exp / argmax over this thread's ids
  var m = NEG;
  var s = 0.0;
  var a = NONE;
  for (var i = lid; i < V; i += WG) {
    let x = logits[base + i];
    if (x > m || a == NONE) {
      s = s * exp(m - x) + 1.0;
      m = x;
      a = i;
    } else {
      s += exp(x - m);
    }
  }
  wv[lid] = m;
  ws[lid] = s;
  wi[lid] = a;
  for (var st = WG / 2u; st > 0u; st >>= 1u) {
    workgroupBarrier();
    if (lid < st) {
      let m2 = wv[lid + st];
      let a2 = wi[lid + st];
      let mm = max(m, m2);
      s = s * exp(m - mm) + ws[lid + st] * exp(m2 - mm);
      if (before(m2, a2, m, a)) {
        a = a2;
      }
      m = mm;
      wv[lid] = m;
      ws[lid] = s;
      wi[lid] = a;
    }
  }
  if (lid == 0u) {
    stats[4u * row] = bitcast<u32>(m);
    stats[4u * row + 1u] = bitcast<u32>(m + log(s));
    stats[4u * row + 2u] = a;
    stats[4u * row + 3u] = 0u;
  }
}

@compute @workgroup_size(WG)
fn top_k(
  @builtin(workgroup_id) wid: vec3<u32>,
  @builtin(num_workgroups) nwg: vec3<u32>,
  @builtin(local_invocation_index) lid: u32,
) {
  let row = row_of(wid, nwg);
  if (row >= dims.rows) {
    return;
  }
  let V = dims.vocab;
  let K = min(dims.k, MAX_K);
  if (K == 0u) {
    return;
  }
  let base = row * V;
  // this thread's top-K, sorted; ids ascend within a thread, so equal values keep their place
  var tv: array<f32, MAX_K>;
  var ti: array<u32, MAX_K>;
  var n = 0u;
  for (var i = lid; i < V; i += WG) {
    let x = logits[base + i];
    if (n < K || x > tv[K - 1u]) {
      var j = min(n, K - 1u);
      n = min(n + 1u, K);
      while (j > 0u && x > tv[j - 1u]) {
        tv[j] = tv[j - 1u];
        ti[j] = ti[j - 1u];
        j--;
      }
      tv[j] = x;
      ti[j] = i;
    }
  }
  let lse = bitcast<f32>(stats[4u * row + 1u]);
  var head = 0u;
  for (var r = 0u; r < K; r++) {
    var v = NEG;
    var id = NONE;
    if (head < n) {
      v = tv[head];
      id = ti[head];
    }
    var owner = lid;
    workgroupBarrier(); // the previous round's winner has been read
    wv[lid] = v;
    wi[lid] = id;
    wo[lid] = owner;
    for (var st = WG / 2u; st > 0u; st >>= 1u) {
      workgroupBarrier();
      if (lid < st) {
        let v2 = wv[lid + st];
        let i2 = wi[lid + st];
        if (before(v2, i2, v, id)) {
          v = v2;
          id = i2;
          owner = wo[lid + st];
          wv[lid] = v;
          wi[lid] = id;
          wo[lid] = owner;
        }
      }
    }
    workgroupBarrier();
    let win = wi[0];
    if (wo[0] == lid && win != NONE) {
      head++;
    }
    if (lid == 0u) {
      let o = 2u * (row * dims.k + r);
      out[o] = win;
      out[o + 1u] = select(bitcast<u32>(wv[0] - lse), NEG_INF_BITS, win == NONE);
    }
  }
}
