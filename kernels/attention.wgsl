// Causal prefill attention of one sequence over the paged KV cache: FlashAttention-2's loop
// (a workgroup owns a tile of query rows and streams key tiles through an online softmax), with
// register-blocked products in place of tensor cores, since our targets have no subgroups and
// f16 is optional.
//
// Why this shape: every step is a wide 4x4 register block or a short reduction, since a kernel
// bound by serial steps (one thread per row running the softmax, a long dot product per thread)
// is slow however few FLOPs it has. The loops over the head dim and the keys take four steps per
// trip and the reductions over key groups are unrolled: a loop trip costs ~30 ns on the H200
// whatever its body. Measurements: docs/kernels.md, "Prefill attention".
//
// Rows: the T queries of the sequence times the G = n_heads / n_kv_heads q heads that share a kv
// head (GQA), row = t * G + g. A workgroup takes BR consecutive rows of one kv head (grid:
// x = row tile, the last rows, which see the most keys, first; y = kv head), so every K/V tile
// it loads serves all of them. Query t sits at position pos0 + t and sees the keys of
// 0 ..= pos0 + t that the mask allows (attention_mask.wgsl, prepended by the wrapper; keys
// before pos0 are cached from earlier steps). The workgroup visits only the tiles of BC keys
// that some row of it can see (`mask_span`: causal, tiles 0 up to its last row's position; a
// window, the tiles from its first row's window on, after the sink tiles): tiles wholly above
// the diagonal or below every row's window are never read, and only tiles that cross the
// diagonal or a row's window edge are masked.
//
// Threads: BR / 4 = TR row groups; row group rg owns rows rg, rg + TR, rg + 2 TR, rg + 3 TR (so
// the rows a warp reads together fall in different banks). Per key tile:
//   K tile (already in registers) -> kv [j][d4] in workgroup memory                   barrier
//   S   TR x TC threads (TC = BC / 4), one per (row group, key group tc): the 4x4 block of
//       S = Q K^T for its rows and keys tc, tc + TC, tc + 2 TC, tc + 3 TC, from vec4 reads of qs
//       and kv (8 vec4 loads per 64 multiply-adds), held in registers; masked on diagonal
//       tiles; partial row maxima -> red. Meanwhile the next K tile loads into registers.  barrier
//   softmax: the S threads take their rows' maxima from red, rescale (alpha; base 2, q is
//       pre-scaled by scale * log2 e), write P [rg][j] (a vec4 over the 4 rows) and alpha;
//       each keeps its share of the running row sums (the shares are added once at the end).
//       All threads put the V tile (registers) over K in kv, and load the next V tile.    barrier
//   PV  thread (rg, dg) owns rows rg + i TR and dim groups dg + n DGT (n < NDG): O += P V as
//       4x4 outer products, keys in fours (1 + NDG vec4 loads per key, 16 NDG multiply-adds).
//                                                                                      barrier
// Per-thread state is only ever indexed by constants: the S block and the softmax state are vec4s
// and 4x4 matrices, the O accumulators and the K/V prefetch arrays of NT_MAX vec4 and NDG_MAX
// matrices, filled and read in loops marked `// @unroll` (kernels/unroll.ts writes out one block
// per trip under `if (NT > n)` guards). As loops, an array indexed by the counter would live in
// local memory (~10x slower on an H200; see attention_decode.wgsl). Helpers take and return
// values, never pointers (Mesa GL once gave NaNs for pointer arguments). The physical blocks of
// a tile are looked up two tiles ahead into workgroup memory, so the block-table load is off the
// critical path of the K/V loads.
//
// Keys at or past the sequence end, and keys below every row's window (stale or NaN in the
// cache: their blocks may have been freed), are never loaded: their K and V are zeros. Masked
// scores are MASKED, below the running max's start NEG, so exp2 gives exact zeros for them even
// in a row that has seen no key yet (a window's first tile may hold none of a later row's keys).
// Every row sees its own position, so l >= 1 at the end. Q, K, V and out are read and written as scalars
// (f32, or f16 halves of an f16 cache: any head dim; a key row of the pools need not be 16-byte
// aligned), assembled into vec4 in workgroup memory, zero-padded past HD. The wrapper picks small
// tiles, and more threads per tile, on Mesa llvmpipe through GL, where compile time grows steeply
// with workgroup memory and code size; it is the same code.
//
// Codec blocks (ids from KV_HOT on, kv_codec_common.wgsl; only with a head dim that is a
// multiple of 4) are decoded as their items load; with KV_CODEC 0 that branch compiles out.

override HD: u32 = 64u; // head_dim
override BR: u32 = 32u; // rows per workgroup, a multiple of 4
override BC: u32 = 64u; // keys per tile: 4, 8, 16, 32 or 64 (divides or is made of 16-key blocks)
override WG: u32 = 128u; // threads: TR * DGT, >= TR * TC, with NT <= NT_MAX and NDG <= NDG_MAX
override KV16: bool = false; // the pools hold f16 (else f32)

const BLOCK: u32 = 16u; // tokens per KV block
const NEG: f32 = -1e30; // "no key yet": finite, so exp2(NEG - m) is 0 and never NaN
const MASKED: f32 = -2e30; // a masked score: exp2(MASKED - m) is 0 even while m is NEG
const NT_MAX: u32 = 8u; // K (and V) vec4 a thread prefetches per tile, at most (Share)
const NDG_MAX: u32 = 4u; // dim groups (4x4 accumulator blocks) per thread, at most

override D4: u32 = (HD + 3u) / 4u; // vec4 per row
override KS: u32 = D4 + 1u; // row stride of qs and kv (vec4): rows read together in other banks
override TR: u32 = BR / 4u; // row groups
override TC: u32 = BC / 4u; // key groups of the S phase
override DGT: u32 = WG / TR; // threads per row group in the PV phase
override NDG: u32 = (D4 + DGT - 1u) / DGT; // dim groups per PV thread
override NT: u32 = (BC * D4 + WG - 1u) / WG; // K (and V) items per thread and tile
override PS: u32 = BC + 1u; // row-group stride of pt
override RS: u32 = TC + 1u; // row-group stride of red
override BPC: u32 = max(1u, BC / BLOCK); // cache blocks per tile

struct Params {
  n_heads: u32,
  n_kv_heads: u32,
  group: u32, // n_heads / n_kv_heads
  layer: u32,
  n_layers: u32,
  max_blocks: u32,
  row0: u32, // index of this sequence's first token in q and out
  scale_log2e: f32, // softmax scale times log2(e)
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>; // [row0 + T, Hq, HD]
// [blocks, L, Hkv, 16, HD] as bits: f32 (KV16 false), or two halves per word (`pack2x16float`'s
// order, the even element low).
@group(0) @binding(2) var<storage, read> k_pool: array<u32>;
@group(0) @binding(3) var<storage, read> v_pool: array<u32>;
@group(0) @binding(4) var<storage, read> block_table: array<u32>; // [S, max_blocks]
@group(0) @binding(5) var<storage, read_write> out: array<f32>; // [row0 + T, Hq, HD]
// [slot, pos0, tokens] of this chunk: in a buffer rather than the uniform, so one built launch
// serves every chunk of up to its capacity of rows (workgroups past `tokens` return at once).
@group(0) @binding(6) var<storage, read> chunk: array<u32>;

var<workgroup> qs: array<vec4<f32>, BR * KS>; // [r][d4] q, pre-scaled; zeros past the rows
var<workgroup> kv: array<vec4<f32>, BC * KS>; // [j][d4] the K tile, then the V tile
var<workgroup> pt: array<vec4<f32>, TR * PS>; // [rg][j] P of rows rg + i TR (component i)
var<workgroup> red: array<vec4<f32>, TR * RS>; // [rg][tc] partial row maxima; at the end sums
var<workgroup> alpha: array<vec4<f32>, TR>; // [rg] this tile's rescale of the accumulators
var<workgroup> blocks: array<u32, 2u * BPC>; // physical blocks of two tiles, by visit parity
var<workgroup> chunk_wg: vec3<u32>; // chunk[0], chunk[1], chunk[2], read once: uniform values

// A thread's share of a K or V tile: items lid + i * WG (i < NT) of [j][d4], indexed by constants
// only (see the header).
alias Share = array<vec4<f32>, NT_MAX>;

// Element offset of q / out for row `row` (of all T * G) under kv head `kvh`.
fn row_offset(row: u32, kvh: u32) -> u32 {
  let t = row / p.group;
  let h = kvh * p.group + row % p.group;
  return ((p.row0 + t) * p.n_heads + h) * HD;
}

// Looks up the blocks of the tile of visit t (see mask_span) into blocks[t & 1] (threads
// lid < BPC); 0 past `limit`, where the table row may end.
fn stage(t: u32, span: vec3<u32>, limit: u32, slot: u32, lid: u32) {
  if (lid < BPC) {
    let key = mask_unit(span, t) * BC + lid * BLOCK;
    var b = 0u;
    if (key < limit) {
      b = block_table[slot * p.max_blocks + key / BLOCK];
    }
    blocks[(t & 1u) * BPC + lid] = b;
  }
}

// Word w of the K (or V) pool (codec blocks: kv_codec_common.wgsl, prepended by the wrapper).
fn pool_word(is_v: bool, w: u32) -> u32 {
  if (is_v) {
    return v_pool[w];
  }
  return k_pool[w];
}

// One element of the K (or V) pool, or 0 when `ok` is false.
fn pool_at(is_v: bool, i: u32, ok: bool) -> f32 {
  if (!ok) {
    return 0.0;
  }
  var w: u32;
  if (is_v) {
    w = v_pool[select(i, i / 2u, KV16)];
  } else {
    w = k_pool[select(i, i / 2u, KV16)];
  }
  if (KV16) {
    return unpack2x16float(w)[i % 2u];
  }
  return bitcast<f32>(w);
}

// Where a tile lies: its first key, the parity of its visit (its blocks' half of `blocks`), the
// keys [0, limit) that serve some row, and the first row's position (keys no row at or after it
// sees are not loaded).
struct TileAt {
  key0: u32,
  par: u32,
  limit: u32,
  pos_lo: u32,
}

// Item e (key e / D4, dims 4 (e % D4) ..) of the K or V tile `at` of kv head kvh: zeros past the
// tile, at or past the limit, for keys no row sees, and past HD.
fn pool_item(is_v: bool, e: u32, at: TileAt, kvh: u32) -> vec4<f32> {
  let j = e / D4;
  let d = (e % D4) * 4u;
  let key0 = at.key0;
  if (j >= BC || key0 + j >= at.limit || !mask_live(at.pos_lo, key0 + j)) {
    return vec4<f32>(0.0);
  }
  let b = blocks[at.par * BPC + (key0 % BLOCK + j) / BLOCK];
  if (KV_CODEC != 0u && b >= KV_HOT) {
    let hb = codec_head(b, p.layer * p.n_kv_heads + kvh, p.n_layers * p.n_kv_heads);
    return codec_vec4(is_v, hb, (key0 + j) % BLOCK, d);
  }
  let head = (b * p.n_layers + p.layer) * p.n_kv_heads + kvh;
  let i = (head * BLOCK + (key0 + j) % BLOCK) * HD + d;
  let full = HD % 4u == 0u; // a constant once HD is: no per-element test
  return vec4<f32>(
    pool_at(is_v, i, true),
    pool_at(is_v, i + 1u, full || d + 1u < HD),
    pool_at(is_v, i + 2u, full || d + 2u < HD),
    pool_at(is_v, i + 3u, full || d + 3u < HD),
  );
}

// This thread's share of the K (or V) tile `at`.
fn fetch(is_v: bool, at: TileAt, kvh: u32, lid: u32) -> Share {
  var r: Share;
  r[0] = pool_item(is_v, lid, at, kvh);
  // @unroll
  for (var i = 1u; i < NT_MAX; i++) {
    if (NT > i) {
      r[i] = pool_item(is_v, lid + i * WG, at, kvh);
    }
  }
  return r;
}

// Writes item e of a tile into kv.
fn put(e: u32, x: vec4<f32>) {
  if (e < BC * D4) {
    kv[(e / D4) * KS + e % D4] = x;
  }
}

// Writes this thread's share of a tile into kv.
fn put_share(r: Share, lid: u32) {
  put(lid, r[0]);
  // @unroll
  for (var i = 1u; i < NT_MAX; i++) {
    if (NT > i) {
      put(lid + i * WG, r[i]);
    }
  }
}

// s + (q . k_c for the 4 keys c): kt holds the keys' 4 dims transposed (column i = dim i of
// each key), so each step is a vec4 multiply-add.
fn score4(s: vec4<f32>, kt: mat4x4<f32>, q4: vec4<f32>) -> vec4<f32> {
  return s + kt[0] * q4.x + kt[1] * q4.y + kt[2] * q4.z + kt[3] * q4.w;
}

fn max4(v: vec4<f32>) -> f32 {
  return max(max(v.x, v.y), max(v.z, v.w));
}

fn sum4(v: vec4<f32>) -> f32 {
  return (v.x + v.y) + (v.z + v.w);
}

// Columns of o (one output row each) times a.
fn rescale(o: mat4x4<f32>, a: vec4<f32>) -> mat4x4<f32> {
  return mat4x4<f32>(o[0] * a.x, o[1] * a.y, o[2] * a.z, o[3] * a.w);
}

// o + v p^T: column i (row rg + i TR) gains p_i v.
fn outer_add(o: mat4x4<f32>, v: vec4<f32>, pr: vec4<f32>) -> mat4x4<f32> {
  return mat4x4<f32>(o[0] + v * pr.x, o[1] + v * pr.y, o[2] + v * pr.z, o[3] + v * pr.w);
}

// o plus the terms of keys j .. j + 3 (P columns pr[0..3]) for dim group c of V.
fn pv4(o: mat4x4<f32>, j: u32, c: u32, pr: mat4x4<f32>) -> mat4x4<f32> {
  var r = outer_add(o, kv[j * KS + c], pr[0]);
  r = outer_add(r, kv[(j + 1u) * KS + c], pr[1]);
  r = outer_add(r, kv[(j + 2u) * KS + c], pr[2]);
  return outer_add(r, kv[(j + 3u) * KS + c], pr[3]);
}

// The S block of a thread: rows srg + i TR (s<i>), keys tc + c TC (component c).
struct Scores {
  s0: vec4<f32>,
  s1: vec4<f32>,
  s2: vec4<f32>,
  s3: vec4<f32>,
}

// The S block plus the products of dims 4 d4 .. 4 d4 + 3.
fn score_step(st: Scores, tc: u32, srg: u32, d4: u32) -> Scores {
  let kt = transpose(mat4x4<f32>(
    kv[tc * KS + d4],
    kv[(tc + TC) * KS + d4],
    kv[(tc + 2u * TC) * KS + d4],
    kv[(tc + 3u * TC) * KS + d4],
  ));
  return Scores(
    score4(st.s0, kt, qs[srg * KS + d4]),
    score4(st.s1, kt, qs[(srg + TR) * KS + d4]),
    score4(st.s2, kt, qs[(srg + 2u * TR) * KS + d4]),
    score4(st.s3, kt, qs[(srg + 3u * TR) * KS + d4]),
  );
}

// red[rg][t], or `fill` past the TC key groups.
fn red_or(rg: u32, t: u32, fill: vec4<f32>) -> vec4<f32> {
  if (t >= TC) {
    return fill;
  }
  return red[rg * RS + t];
}

// Max over the TC entries of row group rg in red (TC <= 16, a power of two), four per block.
fn red_max(rg: u32, m: vec4<f32>) -> vec4<f32> {
  let n = vec4<f32>(NEG);
  var x = m;
  // @unroll
  for (var t = 0u; t < 16u; t += 4u) {
    if (TC > t) {
      x = max(max(max(x, red_or(rg, t, n)), red_or(rg, t + 1u, n)),
        max(red_or(rg, t + 2u, n), red_or(rg, t + 3u, n)));
    }
  }
  return x;
}

// Sum over the TC entries of row group rg in red, likewise.
fn red_sum(rg: u32) -> vec4<f32> {
  let z = vec4<f32>(0.0);
  var x = (red_or(rg, 0u, z) + red_or(rg, 1u, z)) + (red_or(rg, 2u, z) + red_or(rg, 3u, z));
  // @unroll
  for (var t = 4u; t < 16u; t += 4u) {
    if (TC > t) {
      x += (red_or(rg, t, z) + red_or(rg, t + 1u, z)) + (red_or(rg, t + 2u, z) +
        red_or(rg, t + 3u, z));
    }
  }
  return x;
}

// The O accumulators of a PV thread: dim groups dg + n DGT (element n < NDG).
alias Acc = array<mat4x4<f32>, NDG_MAX>;

// acc plus the terms of keys j .. j + 3 for row group prg, dim groups c (per accumulator).
fn pv_step(acc: Acc, j: u32, prg: u32, c: vec4<u32>) -> Acc {
  let pr = mat4x4<f32>(
    pt[prg * PS + j],
    pt[prg * PS + j + 1u],
    pt[prg * PS + j + 2u],
    pt[prg * PS + j + 3u],
  );
  var r = acc;
  r[0] = pv4(r[0], j, c.x, pr);
  // @unroll
  for (var n = 1u; n < NDG_MAX; n++) {
    if (NDG > n) {
      r[n] = pv4(r[n], j, c[n], pr);
    }
  }
  return r;
}

// Writes dims 4 d4 .. of output row `row` (skipped past the rows or HD).
fn store(row: u32, d4: u32, x: vec4<f32>, rows_total: u32, kvh: u32) {
  if (row >= rows_total || d4 >= D4) {
    return;
  }
  let i = row_offset(row, kvh) + d4 * 4u;
  out[i] = x.x;
  if (d4 * 4u + 1u < HD) {
    out[i + 1u] = x.y;
  }
  if (d4 * 4u + 2u < HD) {
    out[i + 2u] = x.z;
  }
  if (d4 * 4u + 3u < HD) {
    out[i + 3u] = x.w;
  }
}

// Stores accumulator block o (rows rg + i TR of the tile, dim group d4) divided by the row sums.
fn store4(o: mat4x4<f32>, inv: vec4<f32>, first: u32, rg: u32, d4: u32, rows_total: u32, kvh: u32) {
  store(first + rg, d4, o[0] * inv.x, rows_total, kvh);
  store(first + rg + TR, d4, o[1] * inv.y, rows_total, kvh);
  store(first + rg + 2u * TR, d4, o[2] * inv.z, rows_total, kvh);
  store(first + rg + 3u * TR, d4, o[3] * inv.w, rows_total, kvh);
}

@compute @workgroup_size(WG)
fn main(
  @builtin(workgroup_id) wid: vec3<u32>,
  @builtin(num_workgroups) nwg: vec3<u32>,
  @builtin(local_invocation_index) lid: u32,
) {
  if (lid == 0u) {
    chunk_wg = vec3<u32>(chunk[0], chunk[1], chunk[2]);
  }
  let c = workgroupUniformLoad(&chunk_wg);
  let slot = c.x;
  let pos0 = c.y;
  let rows_total = c.z * p.group;
  // The last rows see the most keys: start them first, so no long tile ends the dispatch alone.
  let first = (nwg.x - 1u - wid.x) * BR;
  if (first >= rows_total) {
    return; // past this chunk's rows (the launch was built for more)
  }
  let kvh = wid.y;
  let last = min(rows_total, first + BR) - 1u;
  let pos_lo = pos0 + first / p.group; // position of the first row
  let limit = pos0 + last / p.group + 1u; // keys [0, limit) serve some row here
  // The tiles some row sees, in visiting order (sink tiles, then the window's); causal: all
  // tiles up to the last row's position.
  let span = mask_span(pos_lo, limit - 1u, BC);
  let n_tiles = span.z;
  // The window's lower edge of the last row: a tile from it on is seen whole by every row that
  // is past the tile (the edge only grows with the position).
  let lo_hi = mask_lo(limit - 1u);

  stage(0u, span, limit, slot, lid);
  stage(1u, span, limit, slot, lid);
  for (var i = lid; i < BR * D4; i += WG) {
    let r = i / D4;
    let d = (i % D4) * 4u;
    var x = vec4<f32>(0.0);
    if (first + r < rows_total) {
      let o = row_offset(first + r, kvh) + d;
      x.x = q[o];
      if (d + 1u < HD) {
        x.y = q[o + 1u];
      }
      if (d + 2u < HD) {
        x.z = q[o + 2u];
      }
      if (d + 3u < HD) {
        x.w = q[o + 3u];
      }
    }
    qs[r * KS + i % D4] = x * p.scale_log2e;
  }
  workgroupBarrier();
  let at0 = TileAt(mask_unit(span, 0u) * BC, 0u, limit, pos_lo);
  var kr = fetch(false, at0, kvh, lid); // this tile's K, then the next one's
  var vr = fetch(true, at0, kvh, lid);

  // S-phase role: row group srg, key group tc (threads lid < TR * TC).
  let is_s = lid < TR * TC;
  let srg = min(lid / TC, TR - 1u);
  let tc = lid % TC;
  // Positions of the S thread's rows (padding rows take the last real row's).
  let pos = vec4<u32>(
    pos0 + min(first + srg, last) / p.group,
    pos0 + min(first + srg + TR, last) / p.group,
    pos0 + min(first + srg + 2u * TR, last) / p.group,
    pos0 + min(first + srg + 3u * TR, last) / p.group,
  );
  var m = vec4<f32>(NEG); // running row maxima
  var l = vec4<f32>(0.0); // this thread's share of the running row sums
  // PV-phase role: row group prg, dim groups dg + n DGT (past D4: clamped, computed, not stored).
  let prg = lid / DGT;
  let dg = lid % DGT;
  let cs = min(vec4<u32>(dg) + vec4<u32>(0u, DGT, 2u * DGT, 3u * DGT), vec4<u32>(D4 - 1u));
  var acc: Acc;

  for (var t = 0u; t < n_tiles; t++) {
    let key0 = mask_unit(span, t) * BC;
    let next = TileAt(mask_unit(span, t + 1u) * BC, (t + 1u) & 1u, limit, pos_lo);
    put_share(kr, lid);
    workgroupBarrier();
    stage(t + 2u, span, limit, slot, lid); // blocks[t & 1] was last read by this tile's prefetch
    kr = fetch(false, next, kvh, lid);

    var s0 = vec4<f32>(0.0);
    var s1 = vec4<f32>(0.0);
    var s2 = vec4<f32>(0.0);
    var s3 = vec4<f32>(0.0);
    if (is_s) {
      // Four vec4 of the head dim per loop trip (a trip costs ~30 ns on an H200).
      var st = Scores(s0, s1, s2, s3);
      var d4 = 0u;
      for (; d4 + 4u <= D4; d4 += 4u) {
        st = score_step(st, tc, srg, d4);
        // @unroll
        for (var e = 1u; e < 4u; e++) {
          st = score_step(st, tc, srg, d4 + e);
        }
      }
      for (; d4 < D4; d4++) {
        st = score_step(st, tc, srg, d4);
      }
      s0 = st.s0;
      s1 = st.s1;
      s2 = st.s2;
      s3 = st.s3;
      // Masked where the tile crosses the diagonal (or the end), or lies below some row's
      // window edge and is not all sinks; a causal pipeline has only the first test.
      var edge = key0 + BC - 1u > pos_lo;
      if (MASK_KIND != 0u) {
        edge = edge || (key0 < lo_hi && key0 + BC > mask_sinks());
      }
      if (edge) {
        let key = vec4<u32>(key0 + tc) + vec4<u32>(0u, TC, 2u * TC, 3u * TC);
        let neg = vec4<f32>(MASKED);
        s0 = select(neg, s0, mask_visible4(pos.x, key));
        s1 = select(neg, s1, mask_visible4(pos.y, key));
        s2 = select(neg, s2, mask_visible4(pos.z, key));
        s3 = select(neg, s3, mask_visible4(pos.w, key));
      }
      red[srg * RS + tc] = vec4<f32>(max4(s0), max4(s1), max4(s2), max4(s3));
    }
    workgroupBarrier();

    put_share(vr, lid); // the scores are done with K
    vr = fetch(true, next, kvh, lid);
    if (is_s) {
      let mx = red_max(srg, m);
      let a = exp2(m - mx);
      m = mx;
      let pm = mat4x4<f32>(exp2(s0 - mx.x), exp2(s1 - mx.y), exp2(s2 - mx.z), exp2(s3 - mx.w));
      l = l * a + vec4<f32>(sum4(pm[0]), sum4(pm[1]), sum4(pm[2]), sum4(pm[3]));
      let pk = transpose(pm); // column c: key tc + c TC for the 4 rows
      pt[srg * PS + tc] = pk[0];
      pt[srg * PS + tc + TC] = pk[1];
      pt[srg * PS + tc + 2u * TC] = pk[2];
      pt[srg * PS + tc + 3u * TC] = pk[3];
      if (tc == 0u) {
        alpha[srg] = a;
      }
    }
    workgroupBarrier();

    let a = alpha[prg];
    acc[0] = rescale(acc[0], a);
    // @unroll
    for (var n = 1u; n < NDG_MAX; n++) {
      if (NDG > n) {
        acc[n] = rescale(acc[n], a);
      }
    }
    // Keys in fours (BC is a multiple of 4), sixteen per loop trip; past limit - key0, p and V
    // are zeros.
    let keys = min(BC, (limit - key0 + 3u) & ~3u);
    for (var j = 0u; j < keys; j += 16u) {
      acc = pv_step(acc, j, prg, cs);
      // @unroll
      for (var q = 4u; q < 16u; q += 4u) {
        if (j + q < keys) {
          acc = pv_step(acc, j + q, prg, cs);
        }
      }
    }
    workgroupBarrier(); // the next tile overwrites kv, red, pt and alpha
  }

  if (is_s) {
    red[srg * RS + tc] = l;
  }
  workgroupBarrier();
  let inv = 1.0 / red_sum(prg);
  store4(acc[0], inv, first, prg, dg, rows_total, kvh);
  // @unroll
  for (var n = 1u; n < NDG_MAX; n++) {
    if (NDG > n) {
      store4(acc[n], inv, first, prg, dg + n * DGT, rows_total, kvh);
    }
  }
}
