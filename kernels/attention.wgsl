// Causal prefill attention of one sequence over the paged KV cache, FlashAttention-style.
//
// Rows: the T queries of the sequence times the G = n_heads / n_kv_heads q heads that share a kv
// head (GQA), row = t * G + g. A workgroup takes ROWS consecutive rows of one kv head (grid:
// x = row tile, y = kv head), so every K/V tile it loads serves all of them. Query t sits at
// position pos0 + t and sees keys 0 ..= pos0 + t (keys before pos0 are cached from earlier steps).
//
// Per KV tile of 16 keys (exactly one cache block, read through the block table):
//   load K (transposed) into workgroup memory                (keys past the last needed: zeros)
//   scores S[r, j] = q_r . k_j, split over PARTS threads when ROWS * 16 < WG
//   one thread per row: online softmax in f32 (base 2: q is pre-scaled by scale * log2 e);
//     meanwhile all threads load V over K
//   acc[r, :] = acc[r, :] * alpha[r] + P[r, :] V
// No subgroups on our targets, so sharing goes through workgroup memory and barriers. The
// accumulator lives in workgroup memory too: per-thread register arrays with dynamic indices
// made Mesa's compiler (our CI) take minutes per pipeline, and cost little to avoid.

override WG: u32 = 128u; // threads, >= ROWS
override HD: u32 = 64u; // head_dim
override ROWS: u32 = 16u; // rows per workgroup
override PARTS: u32 = 1u; // threads per score: max(1, WG / (ROWS * 16))

const BLOCK: u32 = 16u; // keys per tile = tokens per KV block
const NEG: f32 = -1e30; // "no key yet": finite, so exp2(NEG - m) is 0 and never NaN

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

var<workgroup> qs: array<f32, ROWS * HD + 1u>; // [r][d], pre-scaled
// The K tile transposed [d][j] (score threads read consecutive j), then the V tile [j][d].
var<workgroup> kv: array<f32, BLOCK * HD + 1u>;
var<workgroup> sp: array<f32, ROWS * BLOCK * PARTS + 1u>; // score partials [part][r][j], then P [r][j]
var<workgroup> acc: array<f32, ROWS * HD + 1u>; // unnormalised output [r][d]
var<workgroup> alpha: array<f32, ROWS + 1u>; // per-row rescale of acc for this tile, then 1 / l

// Element offset of q / out for row `row` (of all T * G) under kv head `kvh`.
fn row_offset(row: u32, kvh: u32) -> u32 {
  let t = row / p.group;
  let h = kvh * p.group + row % p.group;
  return ((p.row0 + t) * p.n_heads + h) * HD;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let rows_total = p.tokens * p.group;
  let first = wid.x * ROWS;
  let kvh = wid.y;
  let last = min(rows_total, first + ROWS) - 1u;
  let limit = p.pos0 + last / p.group + 1u; // keys [0, limit) serve some row here
  let n_tiles = (limit + BLOCK - 1u) / BLOCK;

  for (var e = lid; e < ROWS * HD; e += WG) {
    let row = first + e / HD;
    var v = 0.0;
    if (row < rows_total) {
      v = q[row_offset(row, kvh) + e % HD] * p.scale_log2e;
    }
    qs[e] = v;
    acc[e] = 0.0;
  }

  // Softmax state of row `lid` (threads lid < ROWS). Padding rows take the last real position.
  let my_pos = p.pos0 + min(first + lid, last) / p.group;
  var m = NEG;
  var l = 0.0;

  let head_base = p.layer * p.n_kv_heads + kvh;
  for (var tile = 0u; tile < n_tiles; tile++) {
    let b = block_table[p.slot * p.max_blocks + tile];
    let base = (b * p.n_layers * p.n_kv_heads + head_base) * BLOCK * HD;
    // Keys at or past `limit` may be unwritten (stale or NaN): load zeros so 0 * V stays 0.
    let valid = min(BLOCK, limit - tile * BLOCK);
    for (var e = lid; e < BLOCK * HD; e += WG) {
      let j = e / HD;
      kv[(e % HD) * BLOCK + j] = select(0.0, k_pool[base + e], j < valid);
    }
    workgroupBarrier();

    for (var item = lid; item < ROWS * BLOCK * PARTS; item += WG) {
      let pair = item % (ROWS * BLOCK);
      let part = item / (ROWS * BLOCK);
      let qo = (pair / BLOCK) * HD;
      let j = pair % BLOCK;
      var s = 0.0;
      for (var dd = part; dd < HD; dd += PARTS) {
        s += qs[qo + dd] * kv[dd * BLOCK + j];
      }
      sp[item] = s;
    }
    workgroupBarrier();

    // Online softmax, one thread per row; it only touches row `lid` of part 0 of sp.
    if (lid < ROWS) {
      var mx = m;
      for (var j = 0u; j < BLOCK; j++) {
        var v = sp[lid * BLOCK + j];
        for (var part = 1u; part < PARTS; part++) {
          v += sp[(part * ROWS + lid) * BLOCK + j];
        }
        v = select(NEG, v, tile * BLOCK + j <= my_pos); // causal mask
        sp[lid * BLOCK + j] = v;
        mx = max(mx, v);
      }
      let a = exp2(m - mx);
      l *= a;
      for (var j = 0u; j < BLOCK; j++) {
        let v = sp[lid * BLOCK + j];
        let pj = select(0.0, exp2(v - mx), v > NEG);
        l += pj;
        sp[lid * BLOCK + j] = pj;
      }
      alpha[lid] = a;
      m = mx;
    }
    // Meanwhile everyone loads V over K (the scores are done with K).
    for (var e = lid; e < BLOCK * HD; e += WG) {
      kv[e] = select(0.0, v_pool[base + e], e / HD < valid);
    }
    workgroupBarrier();

    for (var e = lid; e < ROWS * HD; e += WG) {
      let r = e / HD;
      let d = e % HD;
      var o = acc[e] * alpha[r];
      for (var j = 0u; j < BLOCK; j++) {
        o += sp[r * BLOCK + j] * kv[j * HD + d];
      }
      acc[e] = o;
    }
    workgroupBarrier(); // the next tile overwrites kv, sp and alpha
  }

  if (lid < ROWS) {
    alpha[lid] = 1.0 / l; // every real row saw key 0, so l >= 1
  }
  workgroupBarrier();
  for (var e = lid; e < ROWS * HD; e += WG) {
    let row = first + e / HD;
    if (row < rows_total) {
      out[row_offset(row, kvh) + e % HD] = acc[e] * alpha[e / HD];
    }
  }
}
