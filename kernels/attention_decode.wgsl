// Decode attention with the new token's RoPE and KV-cache write folded in: one new token per
// batch slot, its q, k, v straight from the fused projection qkv[S, (Hq + 2 Hkv) * HD]. Its k
// (rotated) and v go into the paged pools at position pos[s] (rope_kv's addressing: block
// block_table[s * max_blocks + pos / 16], row pos % 16; none past the table), and its q (rotated
// at pos[s] on load) attends the keys of 0 .. seq_len[s] - 1 of that slot that the mask lets
// position seq_len[s] - 1 see (attention_mask.wgsl), through its block table. Slots are ragged. For a running slot pos = seq_len - 1, so the new key is the last one
// attended; a finished or empty slot's pos is the trash position (step_begin), a key no slot
// attends. RoPE arithmetic: rope_common.wgsl, prepended by the wrapper.
//
// Verification passes (speculative decoding) run SEQ_ROWS query rows per sequence as rows of
// their own: row s reads sequence s / SEQ_ROWS's block table, is rotated at its own pos and
// attends its own seq_len (row j of a sequence at L keys: L + j, L + j + 1), and with WRITE_KV
// off writes nothing: rope_kv wrote every row's key before, so each row sees the drafts before it.
//
// The write, and who sees it: the workgroups of the one split whose chunks hold key pos[s]
// (every row group of it: each kv head's q heads may need several workgroups) each write the
// k and v of their kv head, then storageBarrier() before any pool load, so each workgroup's own
// writes are visible to its own later loads. No other workgroup reads that key (other splits
// never load it, other kv heads read other rows, other slots other blocks), so there is no
// cross-workgroup ordering to need; the row groups' writes are identical values. A key nobody
// attends (pos >= seq_len) is written once, by row group 0 of split 0.
//
// Why this shape: every step is wide and shallow (serial steps, not bytes, bound this kernel),
// and a large enough batch needs no second dispatch (docs/kernels.md, "Decode attention").
//
// `main`: a workgroup per (split, kv head x row group, slot) holds ROWS of the q heads that share
// the kv head, and walks chunks of KEYS = WG / 4 keys with an online softmax. Per chunk:
//   S   4 threads per key each dot a quarter of its K row (vec4s kpart, kpart + 4, ...: a load
//       instruction reads 64 contiguous bytes of 8 rows) with every row of q (workgroup memory)
//       -> one component each of the partial scores buf[r][j];
//   M   ROWS x MP threads add the components, mask keys past seq_len, and take partial row
//       maxima (KEYS / MP keys each);
//   E   WG threads turn the scores into p = 2^(s - m) against the new row max, keep running row
//       sums (a share per thread, added up once at the end) and publish the rescale alpha;
//   PV  thread (key group kg, d4) updates all ROWS rows of acc[r][d4] += p[r][j] V[j][d4] over
//       keys kg, kg + KG, ... (V loads coalesced across d4, each used ROWS times).
// Four barriers per chunk, and no loops inside a chunk. The next chunk's K is loaded as soon as
// S is done with the registers, its V after PV, and the physical blocks two chunks ahead, so the
// block-table load stays off the critical path. At the end the KG key groups' accumulators are
// summed through workgroup memory, RPR rows per round.
//
// Straight-line code: the per-thread state (K and V registers, running maxima and sums,
// accumulators) is only ever indexed by constants: the short loops over rows, keys and key
// groups are marked `// @unroll` (kernels/unroll.ts writes out one block per trip, under
// `if (N > i)` guards on the override constants). As loops, an array indexed by the counter lives
// in local memory (~10x slower on an H200) and each trip costs ~30 ns (docs/kernels.md).
//
// A slot visits only the chunks its mask lets it see (`decode_span`: causal, every chunk up to
// its length; a window, O(window) chunks after the sink chunks, whatever its length), spread
// evenly over the n_split splits: split c takes visits [c * per, (c + 1) * per), per =
// ceil(visits / n_split); splits past the end return at once (after their share of the KV
// write). `blocks` holds the physical blocks by visit parity. n_split == 1 (the host's choice when the batch alone
// fills the GPU, or the context is short) is a single pass that writes `out` directly: one
// dispatch per layer. Otherwise `main` writes unnormalised partials (m, l, acc) to a scratch
// buffer, and `combine` (attention_combine.wgsl) merges them.
//
// Keys at or past seq_len, and keys below the window (possibly stale or NaN in the cache: their
// blocks may have been freed), are never loaded: their scores are masked before the max and exp,
// their V rows are zeros. Every visited chunk holds a key the query sees. Scores are in base 2 (q pre-scaled by
// scale * log2(e)). No subgroups or `enable f16` (an f16 cache is packed in u32 words): it runs on
// llvmpipe through GL. At most eight storage buffers per entry point (the WebGPU default): `main`
// writes `dst`, which is `out` in a single pass and the partials when split.

// attention_decode_common.wgsl (prepended, after attention_mask.wgsl): WG, HD, D4, KEYS, NEG,
// TPK, Params, p, seq_len, dst, head_row, decode_span, key_seen. kv_codec_common.wgsl: KV_CODEC,
// KV_HOT, CODEC_ROW, codec_row, codec_load (KV_CODEC 0, no codec, compiles them out). The new
// token's K and V always go to a hot block: only blocks behind the hot window are re-encoded.

// Query rows per sequence (verification passes): row s reads sequence s / SEQ_ROWS's table.
override SEQ_ROWS: u32 = 1u;
// Write the new token's K and V (off in verification passes: rope_kv wrote them already).
override WRITE_KV: bool = true;
override ROWS: u32 = 8u; // q heads per workgroup, <= RMAX
override RPR: u32 = 2u; // rows per round of the final reduction

const BLOCK: u32 = 16u;
const RMAX: u32 = 8u; // rows a thread can hold
const MP: u32 = 8u; // partial maxima (and sums) per row: needs KEYS >= 16, ROWS * MP <= 64 <= WG
const KMAX: u32 = 16u; // vec4 of a K row a thread holds: HD <= 4 * TPK * KMAX = 256
const MAX_KEYS: u32 = 64u; // keys per chunk at most (256 threads / TPK)
const VMAX: u32 = 16u; // V rows per thread and chunk

override HALF: u32 = HD / 2u; // RoPE pairs (i, i + HALF)
override KSPAN: u32 = (D4 + TPK - 1u) / TPK; // vec4 of the K row per scoring thread, <= KMAX
override ERT: u32 = (ROWS + TPK - 1u) / TPK; // rows per softmax thread, <= 2 (RMAX / TPK)
override KG: u32 = WG / D4; // key groups of the P.V product
override VPT: u32 = (KEYS + KG - 1u) / KG; // keys per P.V thread and chunk, <= VMAX
override BPC: u32 = KEYS / BLOCK; // cache blocks per chunk

@group(0) @binding(1) var<storage, read> qkv: array<f32>; // [S, Hq + 2 Hkv, HD]: q, k, v heads
@group(0) @binding(2) var<storage, read> pos: array<u32>; // [S] the new token's position
@group(0) @binding(3) var<storage, read> inv_freq: array<f32>; // [HALF]
@group(0) @binding(4) var<storage, read> block_table: array<u32>; // [S, max_blocks]
// KV (a vec4 of the cache: vec4<f32>, or 4 halves in a vec2<u32>), kv_get and kv_put come from
// the wrapper's prelude (kernels/attention_decode.ts), by the cache's dtype.
@group(0) @binding(6) var<storage, read_write> k_pool: array<KV>; // [blocks, L, Hkv, 16, D4]
@group(0) @binding(7) var<storage, read_write> v_pool: array<KV>;

var<workgroup> qs: array<vec4<f32>, ROWS * D4>; // [r][d4], pre-scaled
// [r][j] partial scores, one component per scoring thread of key j; after the chunk loop, one
// round [rr][kg][d4] of the final sum of the P.V accumulators.
var<workgroup> buf: array<vec4<f32>, max(ROWS * KEYS, RPR * KG * D4)>;
var<workgroup> sc: array<f32, ROWS * KEYS>; // [r][j] masked scores, then p; at the end l shares
// [r][i] partial row maxima (two vec4 per row), at the end row sums
var<workgroup> part: array<vec4<f32>, ROWS * MP / 4u>;
var<workgroup> alpha: array<f32, ROWS>; // per-chunk rescale of acc; at the end the row max
var<workgroup> blocks: array<u32, 2u * BPC>; // physical blocks of the next two chunks, by parity
var<workgroup> len_shared: u32;

// Float offset of head hh (q heads, then k, then v) of slot s in `qkv`.
fn qkv_head(s: u32, hh: u32) -> u32 {
  return (s * (p.n_heads + 2u * p.n_kv_heads) + hh) * HD;
}

// Element e of the k head at `ks` in `qkv`, rotated at `position`.
fn k_elem(ks: u32, e: u32, position: u32) -> f32 {
  let partner = qkv[ks + rope_partner(e, HALF)];
  return rope_elem(e, HALF, qkv[ks + e], partner, position, inv_freq[e % HALF]);
}

// Vec4 offset of key `j` of the chunk of visit t of kv head `kvh`; the chunk's blocks are staged
// in `blocks` by visit parity. A codec block's row is a tagged address instead (codec_row), and
// k_at / v_at decode it on load (kv_codec_common.wgsl, prepended by the wrapper).
fn key_row(t: u32, j: u32, kvh: u32) -> u32 {
  let b = blocks[(t & 1u) * BPC + j / BLOCK];
  if (KV_CODEC != 0u && b >= KV_HOT) {
    return codec_row(b, p.layer * p.n_kv_heads + kvh, p.n_layers * p.n_kv_heads, j % BLOCK);
  }
  return (((b * p.n_layers + p.layer) * p.n_kv_heads + kvh) * BLOCK + j % BLOCK) * D4;
}

// V[j][d4] of key j of the chunk of visit t (its first key key0); zeros for keys the query does
// not see (and for idle threads), so a stale NaN can never meet its zero probability.
fn v_at(t: u32, key0: u32, j: u32, d4: u32, len: u32, kvh: u32) -> vec4<f32> {
  if (j >= KEYS || d4 >= D4 || !key_seen(key0 + j, len)) {
    return vec4<f32>(0.0);
  }
  let row = key_row(t, j, kvh);
  if (KV_CODEC != 0u && row >= CODEC_ROW) {
    return codec_load(true, row, d4 * 4u);
  }
  return kv_get(v_pool[row + d4]);
}

// Physical block of 16-key block b of chunk ch (absolute) of slot s; 0 past the slot's keys
// (its table row may end there).
fn block_of(s: u32, ch: u32, b: u32, len: u32) -> u32 {
  if ((ch * BPC + b) * BLOCK >= len) {
    return 0u;
  }
  return block_table[(s / SEQ_ROWS) * p.max_blocks + ch * BPC + b];
}

// Vec4 y of this thread's part kpart of the K row at `base`: zero past D4.
fn k_at(base: u32, y: u32, kpart: u32) -> vec4<f32> {
  if (y * TPK + kpart >= D4) {
    return vec4<f32>(0.0);
  }
  if (KV_CODEC != 0u && base >= CODEC_ROW) {
    return codec_load(false, base, (y * TPK + kpart) * 4u);
  }
  return kv_get(k_pool[base + y * TPK + kpart]);
}

// This thread's KSPAN vec4s of the K row at `base`.
fn load_k(kr: ptr<function, array<vec4<f32>, KMAX>>, base: u32, kpart: u32) {
  (*kr)[0] = k_at(base, 0u, kpart);
  // @unroll
  for (var y = 1u; y < KMAX; y++) {
    if (KSPAN > y) {
      (*kr)[y] = k_at(base, y, kpart);
    }
  }
}

// q row r's vec4 y of part kpart, dotted with k: zero past D4.
fn q_dot(k: vec4<f32>, r: u32, y: u32, kpart: u32) -> f32 {
  if (y * TPK + kpart >= D4) {
    return 0.0;
  }
  return dot(qs[r * D4 + y * TPK + kpart], k);
}

// This thread's partial score of q row r against its part of the K row.
fn score(kr: ptr<function, array<vec4<f32>, KMAX>>, r: u32, kpart: u32) -> f32 {
  var d = q_dot((*kr)[0], r, 0u, kpart);
  // @unroll
  for (var y = 1u; y < KMAX; y++) {
    if (KSPAN > y) {
      d += q_dot((*kr)[y], r, y, kpart);
    }
  }
  return d;
}

// V[j][d4] of keys kg, kg + KG, ... (VPT of them) of the chunk of visit t, from key0.
fn load_v(
  vr: ptr<function, array<vec4<f32>, VMAX>>,
  t: u32,
  key0: u32,
  kg: u32,
  d4: u32,
  len: u32,
  kvh: u32,
) {
  (*vr)[0] = v_at(t, key0, kg, d4, len, kvh);
  // @unroll
  for (var i = 1u; i < VMAX; i++) {
    if (VPT > i) {
      (*vr)[i] = v_at(t, key0, kg + i * KG, d4, len, kvh);
    }
  }
}

// p[r][jj] v, or zero past the chunk (key jj >= KEYS).
fn pv_term(r: u32, jj: u32, v: vec4<f32>) -> vec4<f32> {
  if (jj >= KEYS) {
    return vec4<f32>(0.0);
  }
  return sc[r * KEYS + jj] * v;
}

// Row r's accumulator a after PV: a alpha[r] + p[r][jj] V[jj][d4] over this thread's keys
// jj = kg, kg + KG, ... with their V rows vr.
fn pv_row(a: vec4<f32>, r: u32, kg: u32, vr: ptr<function, array<vec4<f32>, VMAX>>) -> vec4<f32> {
  var o = a * alpha[r];
  o += pv_term(r, kg, (*vr)[0]);
  // @unroll
  for (var i = 1u; i < VMAX; i++) {
    if (VPT > i) {
      o += pv_term(r, kg + i * KG, (*vr)[i]);
    }
  }
  return o;
}

// Accumulator r (< ROWS) of acc, by a select chain (a read at index r would move acc to local
// memory).
fn pick(acc: array<vec4<f32>, RMAX>, r: u32) -> vec4<f32> {
  var v = acc[0];
  // @unroll
  for (var i = 1u; i < RMAX; i++) {
    if (ROWS > i) {
      v = select(v, acc[i], r == i);
    }
  }
  return v;
}

// E for row r (none past ROWS) and key j: p = 2^(s - m) against the new row max, alpha published
// by key 0's thread; returns the running (max, sum share) ml updated.
fn softmax_row(r: u32, j: u32, live: bool, ml: vec2<f32>) -> vec2<f32> {
  if (r >= ROWS) {
    return ml;
  }
  let m4 = max(part[2u * r], part[2u * r + 1u]); // MP = 8: two vec4
  let mx = max(ml.x, max(max(m4.x, m4.y), max(m4.z, m4.w)));
  let a = exp2(ml.x - mx);
  let pj = select(0.0, exp2(sc[r * KEYS + j] - mx), live);
  sc[r * KEYS + j] = pj;
  if (j == 0u) {
    alpha[r] = a;
  }
  return vec2<f32>(mx, ml.y * a + pj);
}

// Row r's sum share l and (key 0's thread) max m, for the end of `main`; none past ROWS.
fn publish_row(r: u32, j: u32, ml: vec2<f32>) {
  if (r < ROWS) {
    sc[r * KEYS + j] = ml.y;
    if (j == 0u) {
      alpha[r] = ml.x;
    }
  }
}

// M for row r, key i of the chunk starting at key `base`: the whole score (its four components
// added) into sc, masked where the query does not see the key; returns it.
fn whole_score(r: u32, i: u32, base: u32, len: u32) -> f32 {
  let v = select(NEG, dot(buf[r * KEYS + i], vec4<f32>(1.0)), key_seen(base + i, len));
  sc[r * KEYS + i] = v;
  return v;
}

// Key group g's accumulator of row rr of the round (buf[rr][g][d4]); zero past KG.
fn group_acc(rr: u32, g: u32, d4: u32) -> vec4<f32> {
  if (g >= KG) {
    return vec4<f32>(0.0);
  }
  return buf[(rr * KG + g) * D4 + d4];
}

// One round of the final reduction of `main`: rows r0 .. r0 + RPR - 1 (< ROWS) of every key
// group's accumulators meet in `buf`, and RPR * D4 threads add them up (a straight line of
// loads) and write the rows of real q heads.
fn final_round(
  r0: u32,
  kg: u32,
  d4: u32,
  lid: u32,
  s: u32,
  kvh: u32,
  g0: u32,
  split: u32,
  acc: array<vec4<f32>, RMAX>,
) {
  if (kg < KG) {
    buf[kg * D4 + d4] = pick(acc, r0);
    if (RPR > 1u && r0 + 1u < ROWS) {
      buf[(KG + kg) * D4 + d4] = pick(acc, r0 + 1u);
    }
  }
  workgroupBarrier();
  let rr = lid / D4;
  let r = r0 + rr;
  if (lid < RPR * D4 && r < ROWS && g0 + r < p.group) {
    var o = group_acc(rr, 0u, d4) + group_acc(rr, 1u, d4) + group_acc(rr, 2u, d4) +
      group_acc(rr, 3u, d4);
    // @unroll
    for (var g = 4u; g < 16u; g += 4u) {
      if (KG > g) {
        o += group_acc(rr, g, d4) + group_acc(rr, g + 1u, d4) + group_acc(rr, g + 2u, d4) +
          group_acc(rr, g + 3u, d4);
      }
    }
    for (var g = 16u; g < KG; g++) { // tiny head dims only (HD < 16)
      o += buf[(rr * KG + g) * D4 + d4];
    }
    let l4 = part[2u * r] + part[2u * r + 1u]; // MP = 8 shares
    let l = l4.x + l4.y + l4.z + l4.w;
    let h = kvh * p.group + g0 + r;
    if (p.n_split == 1u) {
      dst[head_row(s, h) + d4] = o / l;
    } else {
      let at = (s * p.n_heads + h) * p.n_split + split;
      dst[at * D4 + d4] = o;
      if (d4 == 0u) {
        dst[p.seqs * p.n_heads * p.n_split * D4 + at] = vec4<f32>(alpha[r], l, 0.0, 0.0);
      }
    }
  }
  workgroupBarrier();
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let split = wid.x;
  let kvh = wid.y / p.row_groups;
  let g0 = (wid.y % p.row_groups) * ROWS; // first q head of the group handled here
  let s = wid.z;
  if (lid == 0u) {
    len_shared = seq_len[s];
  }
  let len = workgroupUniformLoad(&len_shared); // uniform, so the chunk loop may hold barriers
  let span = decode_span(len); // the chunks this slot visits (see the top)
  let chunks = span.z;
  let per = (chunks + p.n_split - 1u) / p.n_split;
  let c0 = split * per;
  let c1 = min(c0 + per, chunks);

  // The new token's k (rotated) and v into the pools, by the split that reads that key (see the
  // top); storageBarrier before the first pool load makes them visible to this workgroup.
  let position = pos[s];
  var writes = split == 0u && g0 == 0u;
  if (position < len && key_seen(position, len)) {
    writes = split == mask_visit(span, position / KEYS) / per;
  }
  if (WRITE_KV && writes && position / BLOCK < p.max_blocks) {
    let b = block_table[(s / SEQ_ROWS) * p.max_blocks + position / BLOCK];
    let row = (((b * p.n_layers + p.layer) * p.n_kv_heads + kvh) * BLOCK + position % BLOCK) * D4;
    let ks = qkv_head(s, p.n_heads + kvh);
    let vs = qkv_head(s, p.n_heads + p.n_kv_heads + kvh);
    // Whole vec4s (a packed cache has no single-element stores): thread d4 rotates its four
    // elements of k, each with its partner HALF away (pairs may straddle vec4s).
    for (var d4 = lid; d4 < D4; d4 += WG) {
      let e = d4 * 4u;
      let v = vec4<f32>(qkv[vs + e], qkv[vs + e + 1u], qkv[vs + e + 2u], qkv[vs + e + 3u]);
      v_pool[row + d4] = kv_put(v);
      let k = vec4<f32>(k_elem(ks, e, position), k_elem(ks, e + 1u, position),
        k_elem(ks, e + 2u, position), k_elem(ks, e + 3u, position));
      k_pool[row + d4] = kv_put(k);
    }
  }
  storageBarrier();

  if (c0 >= c1) {
    // An empty slot: the single pass writes its zeros (with splits, `combine` does).
    if (p.n_split == 1u && split == 0u) {
      for (var e = lid; e < ROWS * D4; e += WG) {
        if (g0 + e / D4 < p.group) {
          dst[head_row(s, kvh * p.group + g0 + e / D4) + e % D4] = vec4<f32>(0.0);
        }
      }
    }
    return;
  }

  // q rows, rotated at `position` and pre-scaled: thread e takes pair i of row r.
  for (var e = lid; e < ROWS * HALF; e += WG) {
    let r = e / HALF;
    let i = e % HALF;
    var x = vec2<f32>(0.0);
    if (g0 + r < p.group) {
      let o = qkv_head(s, kvh * p.group + g0 + r) + i;
      x = rope_pair(qkv[o], qkv[o + HALF], position, inv_freq[i]) * p.scale_log2e;
    }
    qs[r * D4 + i / 4u][i % 4u] = x.x;
    qs[r * D4 + (i + HALF) / 4u][(i + HALF) % 4u] = x.y;
  }
  let tv = c0 + lid / BPC;
  if (lid < 2u * BPC && tv < c1) {
    blocks[(tv & 1u) * BPC + lid % BPC] = block_of(s, mask_unit(span, tv), lid % BPC, len);
  }
  workgroupBarrier();

  // Scoring: vec4s kpart, kpart + TPK, ... of the K row of key kj, so each load instruction
  // reads 64 contiguous bytes of 8 rows (one row per thread would be 32 rows, 16 bytes each).
  let kj = lid / TPK;
  let kpart = lid % TPK;
  let j = lid % KEYS; // softmax: key j, rows er, er + TPK, ...
  let er = lid / KEYS;
  let kg = lid / D4; // P.V: keys kg, kg + KG, ... of the chunk, element d4 of every row
  let d4 = lid % D4;
  // This thread's vec4s of the K row of key kj, and V[j][d4] of keys kg + KG x: the first
  // chunk's now, then each next chunk's as soon as the registers are free. K past len is never
  // loaded (its score is masked); vec4s past D4 stay zero. Indexed by constants only.
  var kr: array<vec4<f32>, KMAX>;
  var vr: array<vec4<f32>, VMAX>;
  let vd4 = select(D4, d4, kg < KG); // D4 (zeros) for idle P.V threads
  let first_key = mask_unit(span, c0) * KEYS;
  if (key_seen(first_key + kj, len)) {
    load_k(&kr, key_row(c0, kj, kvh), kpart);
  }
  load_v(&vr, c0, first_key, kg, vd4, len, kvh);
  // Rows er and er + TPK (ERT <= 2): (row max, equal in every thread; this thread's share of
  // the row sum).
  var ml0 = vec2<f32>(NEG, 0.0);
  var ml1 = vec2<f32>(NEG, 0.0);
  // acc[r]: row r's share of the output from this key group, element d4.
  var acc: array<vec4<f32>, RMAX>;

  for (var ch = c0; ch < c1; ch++) { // ch: the visit; its chunk starts at key0
    let key0 = mask_unit(span, ch) * KEYS;
    let key1 = mask_unit(span, ch + 1u) * KEYS; // the next visit's
    // The blocks of visit ch + 2, stored at the end of this chunk (read long before then).
    var next_block = 0u;
    if (lid < BPC && ch + 2u < c1) {
      next_block = block_of(s, mask_unit(span, ch + 2u), lid, len);
    }

    // S: this thread's share of the scores of key kj, for every row.
    buf[kj][kpart] = score(&kr, 0u, kpart);
    // @unroll
    for (var r = 1u; r < RMAX; r++) {
      if (ROWS > r) {
        buf[r * KEYS + kj][kpart] = score(&kr, r, kpart);
      }
    }
    if (ch + 1u < c1 && key_seen(key1 + kj, len)) {
      load_k(&kr, key_row(ch + 1u, kj, kvh), kpart);
    }
    workgroupBarrier();

    // M: whole, masked scores and partial row maxima over keys i, i + MP, ... (consecutive
    // threads, consecutive vec4s). Constant trip counts, so the loads go out together.
    if (lid < ROWS * MP) {
      let r = lid / MP;
      let i = lid % MP;
      let base = key0;
      var mx = whole_score(r, i, base, len);
      // @unroll
      for (var t = 1u; t < MAX_KEYS / MP; t++) {
        if (KEYS / MP > t) {
          mx = max(mx, whole_score(r, i + t * MP, base, len));
        }
      }
      part[lid / 4u][lid % 4u] = mx;
    }
    workgroupBarrier();

    // E: probabilities against the new row max; rescale the running sums.
    let live = key_seen(key0 + j, len);
    ml0 = softmax_row(er, j, live, ml0);
    if (ERT > 1u) {
      ml1 = softmax_row(er + TPK, j, live, ml1);
    }
    workgroupBarrier();

    // PV: acc[r] = acc[r] alpha[r] + sum over this thread's keys of p[r][j] V[j][d4].
    if (kg < KG) {
      acc[0] = pv_row(acc[0], 0u, kg, &vr);
      // @unroll
      for (var r = 1u; r < RMAX; r++) {
        if (ROWS > r) {
          acc[r] = pv_row(acc[r], r, kg, &vr);
        }
      }
    }
    if (ch + 1u < c1) {
      load_v(&vr, ch + 1u, key1, kg, vd4, len, kvh);
    }
    if (lid < BPC && ch + 2u < c1) {
      blocks[(ch & 1u) * BPC + lid] = next_block;
    }
    workgroupBarrier();
  }

  // Row sums: each softmax thread's share, summed like the maxima. Row maxima to `alpha`.
  publish_row(er, j, ml0);
  if (ERT > 1u) {
    publish_row(er + TPK, j, ml1);
  }
  workgroupBarrier();
  if (lid < ROWS * MP) {
    let at = (lid / MP) * KEYS + lid % MP;
    var l = sc[at];
    // @unroll
    for (var t = 1u; t < MAX_KEYS / MP; t++) {
      if (KEYS / MP > t) {
        l += sc[at + t * MP];
      }
    }
    part[lid / 4u][lid % 4u] = l;
  }

  // Sum the key groups' accumulators, RPR rows per round, and write the rows of real q heads.
  final_round(0u, kg, d4, lid, s, kvh, g0, split, acc);
  // @unroll
  for (var t = 1u; t < RMAX; t++) {
    if (ROWS > t * RPR) {
      final_round(t * RPR, kg, d4, lid, s, kvh, g0, split, acc);
    }
  }
}
