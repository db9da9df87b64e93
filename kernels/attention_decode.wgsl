// Decode attention with the new token's RoPE and KV-cache write folded in: one new token per
// batch slot, its q, k, v straight from the fused projection qkv[S, (Hq + 2 Hkv) * HD]. Its k
// (rotated) and v go into the paged pools at position pos[s] (rope_kv's addressing: block
// block_table[s * max_blocks + pos / 16], row pos % 16; none past the table), and its q (rotated
// at pos[s] on load) attends keys 0 .. seq_len[s] - 1 of that slot through its block table.
// Slots are ragged. For a running slot pos = seq_len - 1, so the new key is the last one
// attended; a finished or empty slot's pos is the trash position (step_begin), a key no slot
// attends. RoPE arithmetic: rope_common.wgsl, prepended by the wrapper.
//
// The write, and who sees it: the workgroups of the one split whose chunks hold key pos[s]
// (every row group of it: each kv head's q heads may need several workgroups) each write the
// k and v of their kv head, then storageBarrier() before any pool load, so each workgroup's own
// writes are visible to its own later loads. No other workgroup reads that key (other splits
// never load it, other kv heads read other rows, other slots other blocks), so there is no
// cross-workgroup ordering to need; the row groups' writes are identical values. A key nobody
// attends (pos >= seq_len) is written once, by row group 0 of split 0.
//
// Why this shape: the previous kernel (16-key tiles, a 64-long serial dot product per thread from
// workgroup memory, a softmax in ROWS threads, 32-key splits, then a `combine` dispatch with
// serial loops over the splits) took 31.5 + 17 us per layer on an H200 at batch 1, context 640
// (TinyLlama heads), for a KV read of ~1.3 MB (~0.3 us): it was bound by its serial steps. Here
// every step is wide and shallow, and a large enough batch needs no second dispatch.
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
// block-table lookup stays off the critical path. At the end the KG key groups' accumulators are
// summed through workgroup memory, RPR rows per round. The per-thread state (K and V registers,
// running maxima and sums, accumulators) is only ever indexed by constants under `if (N > n)`
// guards, because naga's loop guards can keep a driver from unrolling loops, and an array
// indexed by a loop counter then lives in local memory (on an H200 that made every chunk ~10x
// slower). For the same reason the short loops over rows, keys, partial maxima and key groups
// are written out as straight-line code under such guards: on the H200 a loop trip costs about
// 30 ns whatever its body (scripts/probe_dispatch.ts: 512 dependent FMAs take 15 us as a loop,
// 1 us unrolled). With those loops, `main` + `combine` took 23.2 us per layer at batch 1 and
// context 640 (TinyLlama heads); without, 11.1 us (scripts/sweep_kernels.ts).
//
// A slot's chunks are spread evenly over the n_split splits by its own length: split c takes
// chunks [c * per, (c + 1) * per), per = ceil(chunks / n_split); splits past the end return at
// once (after their share of the KV write). n_split == 1 (the host's choice when the batch alone
// fills the GPU, or the context is short) is a single pass that writes `out` directly: one
// dispatch per layer. Otherwise `main` writes unnormalised partials (m, l, acc) to a scratch
// buffer, and `combine`, a workgroup per (q head, slot), loads every split's partial at once (one
// or a few loads per thread, no serial chain) and merges them:
// out = sum_c acc_c 2^(m_c - M) / sum_c l_c 2^(m_c - M).
// A slot with seq_len 0 gets zeros.
//
// Keys at or past seq_len (possibly stale or NaN in the cache) are never loaded: their scores are
// masked before the max and exp, and their V rows are zeros. Scores are in base 2 (q pre-scaled
// by scale * log2(e)). No subgroups or `enable f16` (an f16 cache is packed in u32 words), so it
// also runs on llvmpipe through GL. Eight storage buffers per entry point at most (the WebGPU
// default): `main` writes its result to `dst`, which is `out` in a single pass and the partials
// when split.

override WG: u32 = 256u; // threads of `main`: 64, 128 or 256
override HD: u32 = 64u; // head_dim, a multiple of 4
override ROWS: u32 = 8u; // q heads per workgroup, <= RMAX
override RPR: u32 = 2u; // rows per round of the final reduction
const CWG: u32 = 64u; // threads of `combine`, >= HD / 4 and >= the split count

const BLOCK: u32 = 16u;
const NEG: f32 = -1e30;
const RMAX: u32 = 8u; // rows a thread can hold
const MP: u32 = 8u; // partial maxima (and sums) per row: needs KEYS >= 16, ROWS * MP <= 64 <= WG
const TPK: u32 = 4u; // threads per key (scoring: one vec4 component of partial sums each)
const KMAX: u32 = 16u; // vec4 of a K row a thread holds: HD <= 4 * TPK * KMAX = 256
const VMAX: u32 = 16u; // V rows per thread and chunk
const CMAX: u32 = 16u; // partials per `combine` thread

override D4: u32 = HD / 4u;
override HALF: u32 = HD / 2u; // RoPE pairs (i, i + HALF)
override KEYS: u32 = WG / TPK; // keys per chunk, a multiple of 16
override KSPAN: u32 = (D4 + TPK - 1u) / TPK; // vec4 of the K row per scoring thread, <= KMAX
override ERT: u32 = (ROWS + TPK - 1u) / TPK; // rows per softmax thread, <= 2 (RMAX / TPK)
override KG: u32 = WG / D4; // key groups of the P.V product
override VPT: u32 = (KEYS + KG - 1u) / KG; // keys per P.V thread and chunk, <= VMAX
override BPC: u32 = KEYS / BLOCK; // cache blocks per chunk
override CG: u32 = CWG / D4; // split groups of `combine`

struct Params {
  seqs: u32,
  n_heads: u32,
  n_kv_heads: u32,
  group: u32, // n_heads / n_kv_heads
  row_groups: u32, // workgroups per kv head along y: ceil(group / ROWS)
  layer: u32,
  n_layers: u32,
  max_blocks: u32,
  scale_log2e: f32,
  n_split: u32, // splits per (slot, kv head), <= CWG and <= CG * CMAX; 1 = single pass
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> qkv: array<f32>; // [S, Hq + 2 Hkv, HD]: q, k, v heads
@group(0) @binding(2) var<storage, read> pos: array<u32>; // [S] the new token's position
@group(0) @binding(3) var<storage, read> inv_freq: array<f32>; // [HALF]
@group(0) @binding(4) var<storage, read> block_table: array<u32>; // [S, max_blocks]
@group(0) @binding(5) var<storage, read> seq_len: array<u32>; // [S]
// KV (a vec4 of the cache: vec4<f32>, or 4 halves in a vec2<u32>), kv_get and kv_put come from
// the wrapper's prelude (kernels/attention_decode.ts), by the cache's dtype.
@group(0) @binding(6) var<storage, read_write> k_pool: array<KV>; // [blocks, L, Hkv, 16, D4]
@group(0) @binding(7) var<storage, read_write> v_pool: array<KV>;
// out [S, Hq, D4]; for `main` with splits, the partials: acc [S, Hq, n_split, D4], then
// (m, l, 0, 0) [S, Hq, n_split]
@group(0) @binding(8) var<storage, read_write> dst: array<vec4<f32>>;
@group(0) @binding(9) var<storage, read> partials: array<vec4<f32>>; // `combine`'s input

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

var<workgroup> cm: array<vec4<f32>, CWG / 4u>; // `combine`: m per split (-inf past n)
var<workgroup> cw: array<f32, CWG>; // `combine`: w per split
var<workgroup> cl: array<vec4<f32>, CWG / 4u>; // `combine`: w l per split
var<workgroup> cred: array<vec4<f32>, CWG>; // `combine`: [cg][d4] partial sums

// Vec4 offset of q head h of slot s in `out`.
fn head_row(s: u32, h: u32) -> u32 {
  return (s * p.n_heads + h) * D4;
}

// Float offset of head hh (q heads, then k, then v) of slot s in `qkv`.
fn qkv_head(s: u32, hh: u32) -> u32 {
  return (s * (p.n_heads + 2u * p.n_kv_heads) + hh) * HD;
}

// Element e of the k head at `ks` in `qkv`, rotated at `position`.
fn k_elem(ks: u32, e: u32, position: u32) -> f32 {
  let partner = qkv[ks + rope_partner(e, HALF)];
  return rope_elem(e, HALF, qkv[ks + e], partner, position, inv_freq[e % HALF]);
}

// Vec4 offset of key `j` of chunk `ch` of kv head `kvh`; the chunk's blocks are staged in
// `blocks` by chunk parity.
fn key_row(ch: u32, j: u32, kvh: u32) -> u32 {
  let b = blocks[(ch & 1u) * BPC + j / BLOCK];
  return (((b * p.n_layers + p.layer) * p.n_kv_heads + kvh) * BLOCK + j % BLOCK) * D4;
}

// V[j][d4] of key j of chunk ch; zeros past len (and for idle threads), so a stale NaN can
// never meet its zero probability.
fn v_at(ch: u32, j: u32, d4: u32, len: u32, kvh: u32) -> vec4<f32> {
  if (j >= KEYS || d4 >= D4 || ch * KEYS + j >= len) {
    return vec4<f32>(0.0);
  }
  return kv_get(v_pool[key_row(ch, j, kvh) + d4]);
}

// Physical block of 16-key block b of chunk ch of slot s; 0 past the slot's keys (its table row
// may end there).
fn block_of(s: u32, ch: u32, b: u32, len: u32) -> u32 {
  if ((ch * BPC + b) * BLOCK >= len) {
    return 0u;
  }
  return block_table[s * p.max_blocks + ch * BPC + b];
}

// The private state of `main` (K and V registers, the softmax running values, the accumulators)
// is only ever indexed by constants, under `if (N > n)` guards on the override constants: naga
// adds a termination guard to every loop, so a driver may not unroll them, and an array indexed
// by a loop counter would then live in local memory (see matmul_small's `mac_rows` and `pick`).

// Vec4 y of this thread's part kpart of the K row at `base`: zero past D4.
fn k_at(base: u32, y: u32, kpart: u32) -> vec4<f32> {
  if (y * TPK + kpart >= D4) {
    return vec4<f32>(0.0);
  }
  return kv_get(k_pool[base + y * TPK + kpart]);
}

// This thread's KSPAN vec4s of the K row at `base`.
fn load_k(kr: ptr<function, array<vec4<f32>, KMAX>>, base: u32, kpart: u32) {
  (*kr)[0] = k_at(base, 0u, kpart);
  if (KSPAN > 1u) {
    (*kr)[1] = k_at(base, 1u, kpart);
  }
  if (KSPAN > 2u) {
    (*kr)[2] = k_at(base, 2u, kpart);
  }
  if (KSPAN > 3u) {
    (*kr)[3] = k_at(base, 3u, kpart);
  }
  if (KSPAN > 4u) {
    (*kr)[4] = k_at(base, 4u, kpart);
  }
  if (KSPAN > 5u) {
    (*kr)[5] = k_at(base, 5u, kpart);
  }
  if (KSPAN > 6u) {
    (*kr)[6] = k_at(base, 6u, kpart);
  }
  if (KSPAN > 7u) {
    (*kr)[7] = k_at(base, 7u, kpart);
  }
  if (KSPAN > 8u) {
    (*kr)[8] = k_at(base, 8u, kpart);
  }
  if (KSPAN > 9u) {
    (*kr)[9] = k_at(base, 9u, kpart);
  }
  if (KSPAN > 10u) {
    (*kr)[10] = k_at(base, 10u, kpart);
  }
  if (KSPAN > 11u) {
    (*kr)[11] = k_at(base, 11u, kpart);
  }
  if (KSPAN > 12u) {
    (*kr)[12] = k_at(base, 12u, kpart);
  }
  if (KSPAN > 13u) {
    (*kr)[13] = k_at(base, 13u, kpart);
  }
  if (KSPAN > 14u) {
    (*kr)[14] = k_at(base, 14u, kpart);
  }
  if (KSPAN > 15u) {
    (*kr)[15] = k_at(base, 15u, kpart);
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
  if (KSPAN > 1u) {
    d += q_dot((*kr)[1], r, 1u, kpart);
  }
  if (KSPAN > 2u) {
    d += q_dot((*kr)[2], r, 2u, kpart);
  }
  if (KSPAN > 3u) {
    d += q_dot((*kr)[3], r, 3u, kpart);
  }
  if (KSPAN > 4u) {
    d += q_dot((*kr)[4], r, 4u, kpart);
  }
  if (KSPAN > 5u) {
    d += q_dot((*kr)[5], r, 5u, kpart);
  }
  if (KSPAN > 6u) {
    d += q_dot((*kr)[6], r, 6u, kpart);
  }
  if (KSPAN > 7u) {
    d += q_dot((*kr)[7], r, 7u, kpart);
  }
  if (KSPAN > 8u) {
    d += q_dot((*kr)[8], r, 8u, kpart);
  }
  if (KSPAN > 9u) {
    d += q_dot((*kr)[9], r, 9u, kpart);
  }
  if (KSPAN > 10u) {
    d += q_dot((*kr)[10], r, 10u, kpart);
  }
  if (KSPAN > 11u) {
    d += q_dot((*kr)[11], r, 11u, kpart);
  }
  if (KSPAN > 12u) {
    d += q_dot((*kr)[12], r, 12u, kpart);
  }
  if (KSPAN > 13u) {
    d += q_dot((*kr)[13], r, 13u, kpart);
  }
  if (KSPAN > 14u) {
    d += q_dot((*kr)[14], r, 14u, kpart);
  }
  if (KSPAN > 15u) {
    d += q_dot((*kr)[15], r, 15u, kpart);
  }
  return d;
}

// V[j][d4] of keys kg, kg + KG, ... (VPT of them) of chunk ch.
fn load_v(
  vr: ptr<function, array<vec4<f32>, VMAX>>,
  ch: u32,
  kg: u32,
  d4: u32,
  len: u32,
  kvh: u32,
) {
  (*vr)[0] = v_at(ch, kg, d4, len, kvh);
  if (VPT > 1u) {
    (*vr)[1] = v_at(ch, kg + 1u * KG, d4, len, kvh);
  }
  if (VPT > 2u) {
    (*vr)[2] = v_at(ch, kg + 2u * KG, d4, len, kvh);
  }
  if (VPT > 3u) {
    (*vr)[3] = v_at(ch, kg + 3u * KG, d4, len, kvh);
  }
  if (VPT > 4u) {
    (*vr)[4] = v_at(ch, kg + 4u * KG, d4, len, kvh);
  }
  if (VPT > 5u) {
    (*vr)[5] = v_at(ch, kg + 5u * KG, d4, len, kvh);
  }
  if (VPT > 6u) {
    (*vr)[6] = v_at(ch, kg + 6u * KG, d4, len, kvh);
  }
  if (VPT > 7u) {
    (*vr)[7] = v_at(ch, kg + 7u * KG, d4, len, kvh);
  }
  if (VPT > 8u) {
    (*vr)[8] = v_at(ch, kg + 8u * KG, d4, len, kvh);
  }
  if (VPT > 9u) {
    (*vr)[9] = v_at(ch, kg + 9u * KG, d4, len, kvh);
  }
  if (VPT > 10u) {
    (*vr)[10] = v_at(ch, kg + 10u * KG, d4, len, kvh);
  }
  if (VPT > 11u) {
    (*vr)[11] = v_at(ch, kg + 11u * KG, d4, len, kvh);
  }
  if (VPT > 12u) {
    (*vr)[12] = v_at(ch, kg + 12u * KG, d4, len, kvh);
  }
  if (VPT > 13u) {
    (*vr)[13] = v_at(ch, kg + 13u * KG, d4, len, kvh);
  }
  if (VPT > 14u) {
    (*vr)[14] = v_at(ch, kg + 14u * KG, d4, len, kvh);
  }
  if (VPT > 15u) {
    (*vr)[15] = v_at(ch, kg + 15u * KG, d4, len, kvh);
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
  if (VPT > 1u) {
    o += pv_term(r, kg + 1u * KG, (*vr)[1]);
  }
  if (VPT > 2u) {
    o += pv_term(r, kg + 2u * KG, (*vr)[2]);
  }
  if (VPT > 3u) {
    o += pv_term(r, kg + 3u * KG, (*vr)[3]);
  }
  if (VPT > 4u) {
    o += pv_term(r, kg + 4u * KG, (*vr)[4]);
  }
  if (VPT > 5u) {
    o += pv_term(r, kg + 5u * KG, (*vr)[5]);
  }
  if (VPT > 6u) {
    o += pv_term(r, kg + 6u * KG, (*vr)[6]);
  }
  if (VPT > 7u) {
    o += pv_term(r, kg + 7u * KG, (*vr)[7]);
  }
  if (VPT > 8u) {
    o += pv_term(r, kg + 8u * KG, (*vr)[8]);
  }
  if (VPT > 9u) {
    o += pv_term(r, kg + 9u * KG, (*vr)[9]);
  }
  if (VPT > 10u) {
    o += pv_term(r, kg + 10u * KG, (*vr)[10]);
  }
  if (VPT > 11u) {
    o += pv_term(r, kg + 11u * KG, (*vr)[11]);
  }
  if (VPT > 12u) {
    o += pv_term(r, kg + 12u * KG, (*vr)[12]);
  }
  if (VPT > 13u) {
    o += pv_term(r, kg + 13u * KG, (*vr)[13]);
  }
  if (VPT > 14u) {
    o += pv_term(r, kg + 14u * KG, (*vr)[14]);
  }
  if (VPT > 15u) {
    o += pv_term(r, kg + 15u * KG, (*vr)[15]);
  }
  return o;
}

// Accumulator r (< ROWS) of a0 .. a7, by a select chain.
fn pick(
  a0: vec4<f32>,
  a1: vec4<f32>,
  a2: vec4<f32>,
  a3: vec4<f32>,
  a4: vec4<f32>,
  a5: vec4<f32>,
  a6: vec4<f32>,
  a7: vec4<f32>,
  r: u32,
) -> vec4<f32> {
  var v = a0;
  if (ROWS > 1u) {
    v = select(v, a1, r == 1u);
  }
  if (ROWS > 2u) {
    v = select(v, a2, r == 2u);
  }
  if (ROWS > 3u) {
    v = select(v, a3, r == 3u);
  }
  if (ROWS > 4u) {
    v = select(v, a4, r == 4u);
  }
  if (ROWS > 5u) {
    v = select(v, a5, r == 5u);
  }
  if (ROWS > 6u) {
    v = select(v, a6, r == 6u);
  }
  if (ROWS > 7u) {
    v = select(v, a7, r == 7u);
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
// added) into sc, masked past len; returns it.
fn whole_score(r: u32, i: u32, base: u32, len: u32) -> f32 {
  let v = select(NEG, dot(buf[r * KEYS + i], vec4<f32>(1.0)), base + i < len);
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
// loads: a loop here would cost ~30 ns per trip on an H200) and write the rows of real q heads.
fn final_round(
  r0: u32,
  kg: u32,
  d4: u32,
  lid: u32,
  s: u32,
  kvh: u32,
  g0: u32,
  split: u32,
  a0: vec4<f32>,
  a1: vec4<f32>,
  a2: vec4<f32>,
  a3: vec4<f32>,
  a4: vec4<f32>,
  a5: vec4<f32>,
  a6: vec4<f32>,
  a7: vec4<f32>,
) {
  if (kg < KG) {
    buf[kg * D4 + d4] = pick(a0, a1, a2, a3, a4, a5, a6, a7, r0);
    if (RPR > 1u && r0 + 1u < ROWS) {
      buf[(KG + kg) * D4 + d4] = pick(a0, a1, a2, a3, a4, a5, a6, a7, r0 + 1u);
    }
  }
  workgroupBarrier();
  let rr = lid / D4;
  let r = r0 + rr;
  if (lid < RPR * D4 && r < ROWS && g0 + r < p.group) {
    var o = group_acc(rr, 0u, d4) + group_acc(rr, 1u, d4) + group_acc(rr, 2u, d4) +
      group_acc(rr, 3u, d4);
    if (KG > 4u) {
      o += group_acc(rr, 4u, d4) + group_acc(rr, 5u, d4) + group_acc(rr, 6u, d4) +
        group_acc(rr, 7u, d4);
    }
    if (KG > 8u) {
      o += group_acc(rr, 8u, d4) + group_acc(rr, 9u, d4) + group_acc(rr, 10u, d4) +
        group_acc(rr, 11u, d4);
    }
    if (KG > 12u) {
      o += group_acc(rr, 12u, d4) + group_acc(rr, 13u, d4) + group_acc(rr, 14u, d4) +
        group_acc(rr, 15u, d4);
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
  let chunks = (len + KEYS - 1u) / KEYS;
  let per = (chunks + p.n_split - 1u) / p.n_split;
  let c0 = split * per;
  let c1 = min(c0 + per, chunks);

  // The new token's k (rotated) and v into the pools, by the split that reads that key (see the
  // top); storageBarrier before the first pool load makes them visible to this workgroup.
  let position = pos[s];
  var writes = split == 0u && g0 == 0u;
  if (position < len) {
    writes = split == position / KEYS / per;
  }
  if (writes && position / BLOCK < p.max_blocks) {
    let b = block_table[s * p.max_blocks + position / BLOCK];
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
  if (lid < 2u * BPC && c0 + lid / BPC < c1) {
    blocks[((c0 + lid / BPC) & 1u) * BPC + lid % BPC] = block_of(s, c0 + lid / BPC, lid % BPC, len);
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
  // loaded (its score is masked); vec4s past D4 stay zero.
  // Indexed by constants only (see the helpers above).
  var kr: array<vec4<f32>, KMAX>;
  var vr: array<vec4<f32>, VMAX>;
  let vd4 = select(D4, d4, kg < KG); // D4 (zeros) for idle P.V threads
  if (c0 * KEYS + kj < len) {
    load_k(&kr, key_row(c0, kj, kvh), kpart);
  }
  load_v(&vr, c0, kg, vd4, len, kvh);
  // Rows er and er + TPK (ERT <= 2): (row max, equal in every thread; this thread's share of
  // the row sum).
  var ml0 = vec2<f32>(NEG, 0.0);
  var ml1 = vec2<f32>(NEG, 0.0);
  // acc<r>: row r's share of the output from this key group, element d4 (named registers).
  var acc0 = vec4<f32>(0.0);
  var acc1 = vec4<f32>(0.0);
  var acc2 = vec4<f32>(0.0);
  var acc3 = vec4<f32>(0.0);
  var acc4 = vec4<f32>(0.0);
  var acc5 = vec4<f32>(0.0);
  var acc6 = vec4<f32>(0.0);
  var acc7 = vec4<f32>(0.0);

  for (var ch = c0; ch < c1; ch++) {
    // The blocks of chunk ch + 2, stored at the end of this chunk (read long before then).
    var next_block = 0u;
    if (lid < BPC && ch + 2u < c1) {
      next_block = block_of(s, ch + 2u, lid, len);
    }

    // S: this thread's share of the scores of key kj, for every row.
    buf[kj][kpart] = score(&kr, 0u, kpart);
    if (ROWS > 1u) {
      buf[1u * KEYS + kj][kpart] = score(&kr, 1u, kpart);
    }
    if (ROWS > 2u) {
      buf[2u * KEYS + kj][kpart] = score(&kr, 2u, kpart);
    }
    if (ROWS > 3u) {
      buf[3u * KEYS + kj][kpart] = score(&kr, 3u, kpart);
    }
    if (ROWS > 4u) {
      buf[4u * KEYS + kj][kpart] = score(&kr, 4u, kpart);
    }
    if (ROWS > 5u) {
      buf[5u * KEYS + kj][kpart] = score(&kr, 5u, kpart);
    }
    if (ROWS > 6u) {
      buf[6u * KEYS + kj][kpart] = score(&kr, 6u, kpart);
    }
    if (ROWS > 7u) {
      buf[7u * KEYS + kj][kpart] = score(&kr, 7u, kpart);
    }
    if ((ch + 1u) * KEYS + kj < len && ch + 1u < c1) {
      load_k(&kr, key_row(ch + 1u, kj, kvh), kpart);
    }
    workgroupBarrier();

    // M: whole, masked scores and partial row maxima over keys i, i + MP, ... (consecutive
    // threads, consecutive vec4s). Constant trip counts, so the loads go out together.
    if (lid < ROWS * MP) {
      let r = lid / MP;
      let i = lid % MP;
      let base = ch * KEYS;
      var mx = whole_score(r, i, base, len);
      if (KEYS / MP > 1u) {
        mx = max(mx, whole_score(r, i + 1u * MP, base, len));
      }
      if (KEYS / MP > 2u) {
        mx = max(mx, whole_score(r, i + 2u * MP, base, len));
      }
      if (KEYS / MP > 3u) {
        mx = max(mx, whole_score(r, i + 3u * MP, base, len));
      }
      if (KEYS / MP > 4u) {
        mx = max(mx, whole_score(r, i + 4u * MP, base, len));
      }
      if (KEYS / MP > 5u) {
        mx = max(mx, whole_score(r, i + 5u * MP, base, len));
      }
      if (KEYS / MP > 6u) {
        mx = max(mx, whole_score(r, i + 6u * MP, base, len));
      }
      if (KEYS / MP > 7u) {
        mx = max(mx, whole_score(r, i + 7u * MP, base, len));
      }
      part[lid / 4u][lid % 4u] = mx;
    }
    workgroupBarrier();

    // E: probabilities against the new row max; rescale the running sums.
    let live = ch * KEYS + j < len;
    ml0 = softmax_row(er, j, live, ml0);
    if (ERT > 1u) {
      ml1 = softmax_row(er + TPK, j, live, ml1);
    }
    workgroupBarrier();

    // PV: acc<r> = acc<r> alpha[r] + sum over this thread's keys of p[r][j] V[j][d4].
    if (kg < KG) {
      acc0 = pv_row(acc0, 0u, kg, &vr);
      if (ROWS > 1u) {
        acc1 = pv_row(acc1, 1u, kg, &vr);
      }
      if (ROWS > 2u) {
        acc2 = pv_row(acc2, 2u, kg, &vr);
      }
      if (ROWS > 3u) {
        acc3 = pv_row(acc3, 3u, kg, &vr);
      }
      if (ROWS > 4u) {
        acc4 = pv_row(acc4, 4u, kg, &vr);
      }
      if (ROWS > 5u) {
        acc5 = pv_row(acc5, 5u, kg, &vr);
      }
      if (ROWS > 6u) {
        acc6 = pv_row(acc6, 6u, kg, &vr);
      }
      if (ROWS > 7u) {
        acc7 = pv_row(acc7, 7u, kg, &vr);
      }
    }
    if (ch + 1u < c1) {
      load_v(&vr, ch + 1u, kg, vd4, len, kvh);
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
    if (KEYS / MP > 1u) {
      l += sc[at + 1u * MP];
    }
    if (KEYS / MP > 2u) {
      l += sc[at + 2u * MP];
    }
    if (KEYS / MP > 3u) {
      l += sc[at + 3u * MP];
    }
    if (KEYS / MP > 4u) {
      l += sc[at + 4u * MP];
    }
    if (KEYS / MP > 5u) {
      l += sc[at + 5u * MP];
    }
    if (KEYS / MP > 6u) {
      l += sc[at + 6u * MP];
    }
    if (KEYS / MP > 7u) {
      l += sc[at + 7u * MP];
    }
    part[lid / 4u][lid % 4u] = l;
  }

  // Sum the key groups' accumulators, RPR rows per round, and write the rows of real q heads.
  final_round(0u, kg, d4, lid, s, kvh, g0, split, acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7);
  if (ROWS > 1u * RPR) {
    final_round(1u * RPR, kg, d4, lid, s, kvh, g0, split, acc0, acc1, acc2, acc3, acc4, acc5,
      acc6, acc7);
  }
  if (ROWS > 2u * RPR) {
    final_round(2u * RPR, kg, d4, lid, s, kvh, g0, split, acc0, acc1, acc2, acc3, acc4, acc5,
      acc6, acc7);
  }
  if (ROWS > 3u * RPR) {
    final_round(3u * RPR, kg, d4, lid, s, kvh, g0, split, acc0, acc1, acc2, acc3, acc4, acc5,
      acc6, acc7);
  }
  if (ROWS > 4u * RPR) {
    final_round(4u * RPR, kg, d4, lid, s, kvh, g0, split, acc0, acc1, acc2, acc3, acc4, acc5,
      acc6, acc7);
  }
  if (ROWS > 5u * RPR) {
    final_round(5u * RPR, kg, d4, lid, s, kvh, g0, split, acc0, acc1, acc2, acc3, acc4, acc5,
      acc6, acc7);
  }
  if (ROWS > 6u * RPR) {
    final_round(6u * RPR, kg, d4, lid, s, kvh, g0, split, acc0, acc1, acc2, acc3, acc4, acc5,
      acc6, acc7);
  }
  if (ROWS > 7u * RPR) {
    final_round(7u * RPR, kg, d4, lid, s, kvh, g0, split, acc0, acc1, acc2, acc3, acc4, acc5,
      acc6, acc7);
  }
}

// Split c's accumulator at element d4, or zero when c holds no keys (c >= n).
fn part_acc(base: u32, c: u32, d4: u32, n: u32) -> vec4<f32> {
  if (c >= n) {
    return vec4<f32>(0.0);
  }
  return partials[(base + c) * D4 + d4];
}

// Split c's weighted accumulator a w_c; zero when c holds no keys (its `a` may be stale).
fn weighted(a: vec4<f32>, c: u32, n: u32) -> vec4<f32> {
  if (c >= n) {
    return vec4<f32>(0.0);
  }
  return a * cw[c];
}

// Group g's share of the output at element d4 (zero past CG).
fn group_sum(g: u32, d4: u32) -> vec4<f32> {
  if (g >= CG) {
    return vec4<f32>(0.0);
  }
  return cred[g * D4 + d4];
}

// Straight-line code throughout (no loops: on an H200 every loop trip costs ~30 ns, which made
// the looped version of this kernel ~9 us).
@compute @workgroup_size(CWG)
fn combine(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let h = wid.x;
  let s = wid.y;
  let base = (s * p.n_heads + h) * p.n_split;
  let cg = lid / D4;
  let d4 = lid % D4;

  // Every load up front, not waiting for seq_len: (m, l) of split lid, and acc of splits cg,
  // cg + CG, ... at element d4 (guarded by n_split here; splits at or past n are zeroed below).
  var ml = vec2<f32>(NEG, 0.0);
  if (lid < p.n_split) {
    ml = partials[p.seqs * p.n_heads * p.n_split * D4 + base + lid].xy;
  }
  let ok = cg < CG;
  let a0 = part_acc(base, cg, d4, select(0u, p.n_split, ok));
  let a1 = part_acc(base, cg + CG, d4, select(0u, p.n_split, ok));
  let a2 = part_acc(base, cg + 2u * CG, d4, select(0u, p.n_split, ok));
  let a3 = part_acc(base, cg + 3u * CG, d4, select(0u, p.n_split, ok));
  let a4 = part_acc(base, cg + 4u * CG, d4, select(0u, p.n_split, ok));
  let a5 = part_acc(base, cg + 5u * CG, d4, select(0u, p.n_split, ok));
  let a6 = part_acc(base, cg + 6u * CG, d4, select(0u, p.n_split, ok));
  let a7 = part_acc(base, cg + 7u * CG, d4, select(0u, p.n_split, ok));
  let a8 = part_acc(base, cg + 8u * CG, d4, select(0u, p.n_split, ok));
  let a9 = part_acc(base, cg + 9u * CG, d4, select(0u, p.n_split, ok));
  let a10 = part_acc(base, cg + 10u * CG, d4, select(0u, p.n_split, ok));
  let a11 = part_acc(base, cg + 11u * CG, d4, select(0u, p.n_split, ok));
  let a12 = part_acc(base, cg + 12u * CG, d4, select(0u, p.n_split, ok));
  let a13 = part_acc(base, cg + 13u * CG, d4, select(0u, p.n_split, ok));
  let a14 = part_acc(base, cg + 14u * CG, d4, select(0u, p.n_split, ok));
  let a15 = part_acc(base, cg + 15u * CG, d4, select(0u, p.n_split, ok));

  let len = seq_len[s];
  let chunks = (len + KEYS - 1u) / KEYS;
  let per = max(1u, (chunks + p.n_split - 1u) / p.n_split);
  let n = (chunks + per - 1u) / per; // splits that hold keys, as `main` divided them
  cm[lid / 4u][lid % 4u] = select(NEG, ml.x, lid < n);
  workgroupBarrier();

  // Weights 2^(m_c - M), 0 past n: the max over all CWG = 64 entries, 16 vec4 reads.
  var m4 = max(max(max(cm[0], cm[1]), max(cm[2], cm[3])),
    max(max(cm[4], cm[5]), max(cm[6], cm[7])));
  m4 = max(m4, max(max(max(cm[8], cm[9]), max(cm[10], cm[11])),
    max(max(cm[12], cm[13]), max(cm[14], cm[15]))));
  let mx = max(max(m4.x, m4.y), max(m4.z, m4.w));
  let w = select(0.0, exp2(ml.x - mx), lid < n);
  cw[lid] = w;
  cl[lid / 4u][lid % 4u] = select(0.0, w * ml.y, lid < n);
  workgroupBarrier();

  let o = weighted(a0, cg, n) + weighted(a1, cg + CG, n) + weighted(a2, cg + 2u * CG, n) +
    weighted(a3, cg + 3u * CG, n) + weighted(a4, cg + 4u * CG, n) + weighted(a5, cg + 5u * CG, n) +
    weighted(a6, cg + 6u * CG, n) + weighted(a7, cg + 7u * CG, n) + weighted(a8, cg + 8u * CG, n) +
    weighted(a9, cg + 9u * CG, n) + weighted(a10, cg + 10u * CG, n) +
    weighted(a11, cg + 11u * CG, n) + weighted(a12, cg + 12u * CG, n) +
    weighted(a13, cg + 13u * CG, n) + weighted(a14, cg + 14u * CG, n) +
    weighted(a15, cg + 15u * CG, n);
  if (ok) {
    cred[lid] = o;
  }
  workgroupBarrier();

  if (lid < D4) {
    var t = group_sum(0u, lid) + group_sum(1u, lid) + group_sum(2u, lid) + group_sum(3u, lid);
    if (CG > 4u) {
      t += group_sum(4u, lid) + group_sum(5u, lid) + group_sum(6u, lid) + group_sum(7u, lid);
    }
    if (CG > 8u) {
      t += group_sum(8u, lid) + group_sum(9u, lid) + group_sum(10u, lid) + group_sum(11u, lid);
      t += group_sum(12u, lid) + group_sum(13u, lid) + group_sum(14u, lid) + group_sum(15u, lid);
    }
    for (var g = 16u; g < CG; g++) { // tiny head dims only (HD < 64)
      t += cred[g * D4 + lid];
    }
    // l = sum over the splits of w l: 16 vec4 reads.
    var l4 = (cl[0] + cl[1] + cl[2] + cl[3]) + (cl[4] + cl[5] + cl[6] + cl[7]);
    l4 += (cl[8] + cl[9] + cl[10] + cl[11]) + (cl[12] + cl[13] + cl[14] + cl[15]);
    let l = l4.x + l4.y + l4.z + l4.w;
    dst[head_row(s, h) + lid] = select(vec4<f32>(0.0), t / l, n > 0u);
  }
}
