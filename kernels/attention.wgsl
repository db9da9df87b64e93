// Causal prefill attention of one sequence over the paged KV cache, FlashAttention-style.
//
// Rows: the T queries of the sequence times the G = n_heads / n_kv_heads q heads that share a kv
// head (GQA), row = t * G + g. A workgroup takes ROWS consecutive rows of one kv head (grid:
// x = row tile, y = kv head), so every K/V tile it loads serves all of them. Query t sits at
// position pos0 + t and sees keys 0 ..= pos0 + t (keys before pos0 are cached from earlier steps).
//
// Per KV tile of KEYS keys (16 = one cache block on GPUs; part of a block where workgroup
// memory is kept small), found through the block table:
//   K (already in registers) -> workgroup memory, transposed          (keys past the end: zeros)
//   scores S[r, j] = q_r . k_j, split over PARTS threads when ROWS * KEYS < WG
//   V (registers) -> workgroup memory, and the next tile's K and V are fetched into registers,
//     so their latency hides behind the softmax and P V of this tile
//   one thread per row: online softmax in f32 (base 2: q is pre-scaled by scale * log2 e)
//   acc[r, :] = acc[r, :] * alpha[r] + P[r, :] V
// No subgroups on our targets, so sharing goes through workgroup memory and barriers. Loops that
// load have constant trip counts so the compiler can unroll them and keep loads in flight.

override WG: u32 = 128u; // threads, >= ROWS
override HD: u32 = 64u; // head_dim
override ROWS: u32 = 16u; // rows per workgroup
override KEYS: u32 = 16u; // keys per tile: 16, 8, 4, 2 or 1 (a tile never straddles blocks)
override PARTS: u32 = 1u; // threads per score, divides HD, <= WG / (ROWS * KEYS)

const BLOCK: u32 = 16u; // tokens per KV block
const NEG: f32 = -1e30; // "no key yet": finite, so exp2(NEG - m) is 0 and never NaN
const NT_MAX: u32 = 32u; // tile elements per thread, at most (KEYS * HD <= 32 * WG)

override QS: u32 = HD + 1u; // q row stride: rows read together fall in different banks
override KS: u32 = KEYS + 1u; // transposed K row stride, likewise
override SPAN: u32 = HD / PARTS; // dims per score thread
override NQ: u32 = (ROWS * HD + WG - 1u) / WG; // q / acc elements per thread
override NS: u32 = (ROWS * KEYS * PARTS + WG - 1u) / WG; // score items per thread
override NT: u32 = (KEYS * HD + WG - 1u) / WG; // K (and V) tile elements per thread

struct Params {
  tokens: u32,
  n_heads: u32,
  n_kv_heads: u32,
  group: u32, // n_heads / n_kv_heads
  slot: u32,
  pos0: u32,
  layer: u32,
  n_layers: u32,
  max_blocks: u32,
  row0: u32, // index of this sequence's first token in q and out
  scale_log2e: f32, // softmax scale times log2(e)
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k_pool: array<f32>;
@group(0) @binding(3) var<storage, read> v_pool: array<f32>;
@group(0) @binding(4) var<storage, read> block_table: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

var<workgroup> qs: array<f32, ROWS * QS>; // [r][d], pre-scaled
// The K tile transposed [d][j] (score threads read consecutive j), then the V tile [j][d].
var<workgroup> kv: array<f32, HD * KS>;
var<workgroup> sp: array<f32, ROWS * KEYS * PARTS>; // score partials [part][r][j], then P [r][j]
var<workgroup> acc: array<f32, ROWS * HD>; // unnormalised output [r][d]
var<workgroup> alpha: array<f32, ROWS>; // per-row rescale of acc for this tile, then 1 / l

// This thread's share of the K and V tile in flight: element lid + i * WG of [j][d].
var<private> k_reg: array<f32, NT_MAX>;
var<private> v_reg: array<f32, NT_MAX>;

// Element offset of q / out for row `row` (of all T * G) under kv head `kvh`.
fn row_offset(row: u32, kvh: u32) -> u32 {
  let t = row / p.group;
  let h = kvh * p.group + row % p.group;
  return ((p.row0 + t) * p.n_heads + h) * HD;
}

// Fetches keys [key0, key0 + KEYS) of kv head `kvh` into k_reg / v_reg; keys at or past `limit`
// (possibly unwritten: stale or NaN) become zeros, so 0 * V stays 0.
fn fetch(key0: u32, limit: u32, kvh: u32, lid: u32) {
  var valid = 0u;
  var base = 0u;
  if (key0 < limit) {
    valid = min(KEYS, limit - key0);
    let b = block_table[p.slot * p.max_blocks + key0 / BLOCK];
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
  let rows_total = p.tokens * p.group;
  let first = wid.x * ROWS;
  let kvh = wid.y;
  let last = min(rows_total, first + ROWS) - 1u;
  let limit = p.pos0 + last / p.group + 1u; // keys [0, limit) serve some row here
  let n_tiles = (limit + KEYS - 1u) / KEYS;

  fetch(0u, limit, kvh, lid);
  for (var i = 0u; i < NQ; i++) {
    let e = lid + i * WG;
    if (e < ROWS * HD) {
      let row = first + e / HD;
      var v = 0.0;
      if (row < rows_total) {
        v = q[row_offset(row, kvh) + e % HD] * p.scale_log2e;
      }
      qs[(e / HD) * QS + e % HD] = v;
      acc[e] = 0.0;
    }
  }

  // Softmax state of row `lid` (threads lid < ROWS). Padding rows take the last real position.
  let my_pos = p.pos0 + min(first + lid, last) / p.group;
  var m = NEG;
  var l = 0.0;

  for (var tile = 0u; tile < n_tiles; tile++) {
    let key0 = tile * KEYS;
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
        var s = 0.0;
        for (var x = 0u; x < SPAN; x++) {
          s += qs[qo + x] * kv[ko + x * KS];
        }
        sp[item] = s;
      }
    }
    workgroupBarrier();

    for (var i = 0u; i < NT; i++) {
      let e = lid + i * WG;
      if (e < KEYS * HD) {
        kv[e] = v_reg[i]; // the scores are done with K
      }
    }
    fetch(key0 + KEYS, limit, kvh, lid);

    // Online softmax, one thread per row; it only touches row `lid` of part 0 of sp.
    if (lid < ROWS) {
      var mx = m;
      for (var j = 0u; j < KEYS; j++) {
        var v = sp[lid * KEYS + j];
        for (var part = 1u; part < PARTS; part++) {
          v += sp[(part * ROWS + lid) * KEYS + j];
        }
        v = select(NEG, v, key0 + j <= my_pos); // causal mask
        sp[lid * KEYS + j] = v;
        mx = max(mx, v);
      }
      let a = exp2(m - mx);
      l *= a;
      for (var j = 0u; j < KEYS; j++) {
        let v = sp[lid * KEYS + j];
        let pj = select(0.0, exp2(v - mx), v > NEG);
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
    workgroupBarrier(); // the next tile overwrites kv, sp and alpha
  }

  if (lid < ROWS) {
    alpha[lid] = 1.0 / l; // every real row saw key 0, so l >= 1
  }
  workgroupBarrier();
  for (var i = 0u; i < NQ; i++) {
    let e = lid + i * WG;
    let row = first + e / HD;
    if (e < ROWS * HD && row < rows_total) {
      out[row_offset(row, kvh) + e % HD] = acc[e] * alpha[e / HD];
    }
  }
}
