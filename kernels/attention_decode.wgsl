// Decode attention (flash-decoding): one query per batch slot, at position seq_len[s] - 1,
// attending keys 0 .. seq_len[s] - 1 of that slot through its block table. Slots are ragged.
//
// `main`: a workgroup per (split c, kv head x row group, slot s) takes keys
// [c * split, (c + 1) * split) (the last split also takes everything past the end, so no key
// is ever dropped) for ROWS of the G q heads that share the kv head, with the same tile loop as
// attention.wgsl (registers prefetch the next tile), and writes the unnormalised partial
// (m, l, acc[D]) to scratch[s, h, c, 0 .. D + 2] (m in base 2). Splits that start past seq_len
// do nothing: the combine reads only the splits that hold keys.
// `combine`: one thread per output element merges the valid splits of its (slot, head):
// out = sum_c acc_c 2^(m_c - M) / sum_c l_c 2^(m_c - M). A slot with seq_len 0 gets zeros.

override WG: u32 = 128u; // threads, >= ROWS
override HD: u32 = 64u; // head_dim
override ROWS: u32 = 8u; // q heads per workgroup
override KEYS: u32 = 16u; // keys per tile: 16, 8, 4, 2 or 1 (a tile never straddles blocks)
override PARTS: u32 = 1u; // threads per score, divides HD, <= WG / (ROWS * KEYS)
override NSPLIT: u32 = 1u; // splits per (slot, head): fixed at build time from maxContext
override CWG: u32 = 64u; // threads of `combine`

const BLOCK: u32 = 16u;
const NEG: f32 = -1e30;
const NT_MAX: u32 = 32u;

override QS: u32 = HD + 1u;
override KS: u32 = KEYS + 1u;
override SPAN: u32 = HD / PARTS;
override NQ: u32 = (ROWS * HD + WG - 1u) / WG;
override NS: u32 = (ROWS * KEYS * PARTS + WG - 1u) / WG;
override NT: u32 = (KEYS * HD + WG - 1u) / WG;

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

var<workgroup> qs: array<f32, ROWS * QS>; // [r][d], pre-scaled
var<workgroup> kv: array<f32, HD * KS>; // K tile [d][j], then V tile [j][d]
var<workgroup> sp: array<f32, ROWS * KEYS * PARTS>; // score partials [part][r][j], then P [r][j]
var<workgroup> acc: array<f32, ROWS * HD>; // unnormalised output [r][d]
var<workgroup> alpha: array<f32, ROWS>;
var<workgroup> len_shared: u32;

var<private> k_reg: array<f32, NT_MAX>;
var<private> v_reg: array<f32, NT_MAX>;

// Element offset of the partial of (slot s, q head h, split c) in scratch.
fn partial_offset(s: u32, h: u32, c: u32) -> u32 {
  return ((s * p.n_heads + h) * NSPLIT + c) * (HD + 2u);
}

// Fetches keys [key0, key0 + KEYS) of slot s, kv head kvh into k_reg / v_reg; keys at or past
// `end` (possibly unwritten: stale or NaN) become zeros.
fn fetch(s: u32, key0: u32, end: u32, kvh: u32, lid: u32) {
  var valid = 0u;
  var base = 0u;
  if (key0 < end) {
    valid = min(KEYS, end - key0);
    let b = block_table[s * p.max_blocks + key0 / BLOCK];
    let head = (b * p.n_layers + p.layer) * p.n_kv_heads + kvh;
    base = (head * BLOCK + key0 % BLOCK) * HD;
  }
  for (var i = 0u; i < NT; i++) {
    let e = lid + i * WG;
    var kx = 0.0;
    var vx = 0.0;
    if (e < KEYS * HD && e / HD < valid) {
      kx = k_pool[base + e];
      vx = v_pool[base + e];
    }
    k_reg[i] = kx;
    v_reg[i] = vx;
  }
}

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
  let k_end = select(min(len, k0 + p.split), len, c + 1u == NSPLIT);

  fetch(s, k0, k_end, kvh, lid);
  for (var i = 0u; i < NQ; i++) {
    let e = lid + i * WG;
    if (e < ROWS * HD) {
      let g = g0 + e / HD;
      var v = 0.0;
      if (g < p.group) {
        v = q[(s * p.n_heads + kvh * p.group + g) * HD + e % HD] * p.scale_log2e;
      }
      qs[(e / HD) * QS + e % HD] = v;
      acc[e] = 0.0;
    }
  }

  var m = NEG;
  var l = 0.0;
  for (var key0 = k0; key0 < k_end; key0 += KEYS) {
    let valid = min(KEYS, k_end - key0);
    for (var i = 0u; i < NT; i++) {
      let e = lid + i * WG;
      if (e < KEYS * HD) {
        kv[(e % HD) * KS + e / HD] = k_reg[i];
      }
    }
    workgroupBarrier();

    for (var i = 0u; i < NS; i++) {
      let item = lid + i * WG;
      if (item < ROWS * KEYS * PARTS) {
        let pair = item % (ROWS * KEYS);
        let part = item / (ROWS * KEYS);
        let qo = (pair / KEYS) * QS + part * SPAN;
        let ko = part * SPAN * KS + pair % KEYS;
        var dot = 0.0;
        for (var x = 0u; x < SPAN; x++) {
          dot += qs[qo + x] * kv[ko + x * KS];
        }
        sp[item] = dot;
      }
    }
    workgroupBarrier();

    for (var i = 0u; i < NT; i++) {
      let e = lid + i * WG;
      if (e < KEYS * HD) {
        kv[e] = v_reg[i];
      }
    }
    fetch(s, key0 + KEYS, k_end, kvh, lid);

    if (lid < ROWS) {
      var mx = m;
      for (var j = 0u; j < KEYS; j++) {
        var v = sp[lid * KEYS + j];
        for (var part = 1u; part < PARTS; part++) {
          v += sp[(part * ROWS + lid) * KEYS + j];
        }
        v = select(NEG, v, j < valid);
        sp[lid * KEYS + j] = v;
        mx = max(mx, v);
      }
      let a = exp2(m - mx);
      l *= a;
      for (var j = 0u; j < KEYS; j++) {
        let pj = select(0.0, exp2(sp[lid * KEYS + j] - mx), j < valid);
        l += pj;
        sp[lid * KEYS + j] = pj;
      }
      alpha[lid] = a;
      m = mx;
    }
    workgroupBarrier();

    for (var i = 0u; i < NQ; i++) {
      let e = lid + i * WG;
      if (e < ROWS * HD) {
        let r = e / HD;
        let d = e % HD;
        var o = acc[e] * alpha[r];
        for (var j = 0u; j < KEYS; j++) {
          o += sp[r * KEYS + j] * kv[j * HD + d];
        }
        acc[e] = o;
      }
    }
    workgroupBarrier();
  }

  if (lid < ROWS && g0 + lid < p.group) {
    let o = partial_offset(s, kvh * p.group + g0 + lid, c);
    scratch[o] = m;
    scratch[o + 1u] = l;
  }
  for (var i = 0u; i < NQ; i++) {
    let e = lid + i * WG;
    let g = g0 + e / HD;
    if (e < ROWS * HD && g < p.group) {
      scratch[partial_offset(s, kvh * p.group + g, c) + 2u + e % HD] = acc[e];
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
  let n = min(NSPLIT, (len + p.split - 1u) / p.split);
  let base = partial_offset(sh / p.n_heads, sh % p.n_heads, 0u);
  // Constant trip counts (NSPLIT) let the compiler keep several splits' loads in flight.
  var mx = NEG;
  for (var c = 0u; c < NSPLIT; c++) {
    if (c < n) {
      mx = max(mx, scratch[base + c * (HD + 2u)]);
    }
  }
  var l = 0.0;
  var o = 0.0;
  for (var c = 0u; c < NSPLIT; c++) {
    if (c < n) {
      let at = base + c * (HD + 2u);
      let w = exp2(scratch[at] - mx);
      l += scratch[at + 1u] * w;
      o += scratch[at + 2u + d] * w;
    }
  }
  out[idx] = select(0.0, o / l, n > 0u);
}
