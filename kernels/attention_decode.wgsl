// Decode attention (flash-decoding): one query per batch slot, at position seq_len[s] - 1,
// attending keys 0 .. seq_len[s] - 1 of that slot through its block table. Slots are ragged.
//
// `main`: a workgroup per (split c, kv head x row group, slot s) takes keys
// [c * split, (c + 1) * split) (the last split also takes everything past the end, so no key
// is ever dropped) for ROWS of the G q heads that share the kv head, with the same tile loop as
// attention.wgsl, and writes the unnormalised partial (m, l, acc[D]) to
// scratch[s, h, c, 0 .. D + 2] (m in base 2). Splits that start past seq_len do nothing: the
// combine reads only the splits that hold keys.
// `combine`: one thread per output element merges the valid splits of its (slot, head):
// out = sum_c acc_c 2^(m_c - M) / sum_c l_c 2^(m_c - M). A slot with seq_len 0 gets zeros.

override WG: u32 = 128u; // threads; a multiple of HD
override HD: u32 = 64u; // head_dim
override ROWS: u32 = 8u; // q heads per workgroup, <= WG and <= ACC_MAX * RPP
override PARTS: u32 = 1u; // threads per score (max(1, WG / (ROWS * 16)))
override CWG: u32 = 64u; // threads of `combine`

const BLOCK: u32 = 16u;
const ACC_MAX: u32 = 32u;
const NEG: f32 = -1e30;

override RPP: u32 = WG / HD;
override NACC: u32 = (ROWS + RPP - 1u) / RPP;

struct Params {
  seqs: u32,
  n_heads: u32,
  n_kv_heads: u32,
  group: u32, // n_heads / n_kv_heads
  row_groups: u32, // workgroups per kv head along y: ceil(group / ROWS)
  layer: u32,
  n_layers: u32,
  max_blocks: u32,
  split: u32, // keys per split, a multiple of 16
  n_splits: u32,
  scale_log2e: f32,
  combine_groups_x: u32, // `combine` workgroups along x (its grid may be split over x and y)
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k_pool: array<f32>;
@group(0) @binding(3) var<storage, read> v_pool: array<f32>;
@group(0) @binding(4) var<storage, read> block_table: array<u32>;
@group(0) @binding(5) var<storage, read> seq_len: array<u32>;
@group(0) @binding(6) var<storage, read_write> scratch: array<f32>;
@group(0) @binding(7) var<storage, read_write> out: array<f32>;

var<workgroup> qs: array<f32, ROWS * HD>;
var<workgroup> kt: array<f32, HD * BLOCK>;
var<workgroup> vs: array<f32, BLOCK * HD>;
var<workgroup> sp: array<f32, ROWS * BLOCK * PARTS>;
var<workgroup> alpha: array<f32, ROWS>;
var<workgroup> len_shared: u32;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let c = wid.x;
  let kvh = wid.y / p.row_groups;
  let g0 = (wid.y % p.row_groups) * ROWS; // first head of the group handled here
  let s = wid.z;
  if (lid == 0u) {
    len_shared = seq_len[s];
  }
  let len = workgroupUniformLoad(&len_shared); // uniform, so the loop below may hold barriers
  let k0 = c * p.split;
  if (k0 >= len) {
    return;
  }
  let k_end = select(min(len, k0 + p.split), len, c + 1u == p.n_splits);

  for (var e = lid; e < ROWS * HD; e += WG) {
    let g = g0 + e / HD;
    var v = 0.0;
    if (g < p.group) {
      v = q[(s * p.n_heads + kvh * p.group + g) * HD + e % HD] * p.scale_log2e;
    }
    qs[e] = v;
  }

  var m = NEG;
  var l = 0.0;
  let d = lid % HD;
  let r0 = lid / HD;
  var acc: array<f32, ACC_MAX>;

  let head_base = p.layer * p.n_kv_heads + kvh;
  for (var tile = k0 / BLOCK; tile * BLOCK < k_end; tile++) {
    let b = block_table[s * p.max_blocks + tile];
    let base = (b * p.n_layers * p.n_kv_heads + head_base) * BLOCK * HD;
    let valid = min(BLOCK, k_end - tile * BLOCK);
    for (var e = lid; e < BLOCK * HD; e += WG) {
      let j = e / HD;
      // Rows past the sequence may be unwritten (stale or NaN): zeros keep 0 * V finite.
      var kv = 0.0;
      var vv = 0.0;
      if (j < valid) {
        kv = k_pool[base + e];
        vv = v_pool[base + e];
      }
      kt[(e % HD) * BLOCK + j] = kv;
      vs[e] = vv;
    }
    workgroupBarrier();

    for (var item = lid; item < ROWS * BLOCK * PARTS; item += WG) {
      let pair = item % (ROWS * BLOCK);
      let part = item / (ROWS * BLOCK);
      let qo = (pair / BLOCK) * HD;
      let j = pair % BLOCK;
      var acc_s = 0.0;
      for (var dd = part; dd < HD; dd += PARTS) {
        acc_s += qs[qo + dd] * kt[dd * BLOCK + j];
      }
      sp[item] = acc_s;
    }
    workgroupBarrier();

    if (lid < ROWS) {
      var sc: array<f32, BLOCK>;
      var mx = m;
      for (var j = 0u; j < BLOCK; j++) {
        var v = 0.0;
        for (var part = 0u; part < PARTS; part++) {
          v += sp[(part * ROWS + lid) * BLOCK + j];
        }
        sc[j] = select(NEG, v, j < valid);
        mx = max(mx, sc[j]);
      }
      let a = exp2(m - mx);
      l *= a;
      for (var j = 0u; j < BLOCK; j++) {
        let pj = select(0.0, exp2(sc[j] - mx), j < valid);
        l += pj;
        sp[lid * BLOCK + j] = pj;
      }
      alpha[lid] = a;
      m = mx;
    }
    workgroupBarrier();

    for (var i = 0u; i < NACC; i++) {
      let r = r0 + i * RPP;
      if (r < ROWS) {
        acc[i] *= alpha[r];
      }
    }
    for (var j = 0u; j < BLOCK; j++) {
      let v = vs[j * HD + d];
      for (var i = 0u; i < NACC; i++) {
        let r = r0 + i * RPP;
        if (r < ROWS) {
          acc[i] += sp[r * BLOCK + j] * v;
        }
      }
    }
    workgroupBarrier();
  }

  let stride = HD + 2u;
  if (lid < ROWS && g0 + lid < p.group) {
    let o = ((s * p.n_heads + kvh * p.group + g0 + lid) * p.n_splits + c) * stride;
    scratch[o] = m;
    scratch[o + 1u] = l;
  }
  for (var i = 0u; i < NACC; i++) {
    let r = r0 + i * RPP;
    if (r < ROWS && g0 + r < p.group) {
      let o = ((s * p.n_heads + kvh * p.group + g0 + r) * p.n_splits + c) * stride;
      scratch[o + 2u + d] = acc[i];
    }
  }
}

@compute @workgroup_size(CWG)
fn combine(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let idx = (wid.y * p.combine_groups_x + wid.x) * CWG + lid;
  if (idx >= p.seqs * p.n_heads * HD) {
    return;
  }
  let d = idx % HD;
  let sh = idx / HD; // s * n_heads + h
  let len = seq_len[sh / p.n_heads];
  let n = min(p.n_splits, (len + p.split - 1u) / p.split);
  let stride = HD + 2u;
  let base = sh * p.n_splits * stride;
  var mx = NEG;
  for (var c = 0u; c < n; c++) {
    mx = max(mx, scratch[base + c * stride]);
  }
  var l = 0.0;
  var o = 0.0;
  for (var c = 0u; c < n; c++) {
    let w = exp2(scratch[base + c * stride] - mx);
    l += scratch[base + c * stride + 1u] * w;
    o += scratch[base + c * stride + 2u + d] * w;
  }
  out[idx] = select(0.0, o / l, n > 0u);
}
