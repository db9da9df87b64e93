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
// Four barriers per chunk; no serial loop longer than HD / 16 vec4s or KEYS / MP. The next
// chunk's K is loaded as soon as S is done with the registers, its V after PV, and the physical
// blocks two chunks ahead, so the block-table lookup stays off the critical path. At the end the
// KG key groups' accumulators are summed through workgroup memory, RPR rows per round.
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
// by scale * log2(e)). No subgroups or f16, so it also runs on llvmpipe through GL. Eight
// storage buffers per entry point at most (the WebGPU default): `main` writes its result to
// `dst`, which is `out` in a single pass and the partials when split.

override WG: u32 = 256u; // threads of `main`: 64, 128 or 256
override HD: u32 = 64u; // head_dim, a multiple of 4
override ROWS: u32 = 8u; // q heads per workgroup, <= RMAX
override RPR: u32 = 2u; // rows per round of the final reduction
override CWG: u32 = 64u; // threads of `combine`, >= HD / 4 and >= the split count

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
override ERT: u32 = (ROWS + TPK - 1u) / TPK; // rows per softmax thread
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
@group(0) @binding(6) var<storage, read_write> k_pool: array<vec4<f32>>; // [blocks, L, Hkv, 16, D4]
@group(0) @binding(7) var<storage, read_write> v_pool: array<vec4<f32>>;
// out [S, Hq, D4]; for `main` with splits, the partials: acc [S, Hq, n_split, D4], then
// (m, l, 0, 0) [S, Hq, n_split]
@group(0) @binding(8) var<storage, read_write> dst: array<vec4<f32>>;
@group(0) @binding(9) var<storage, read> partials: array<vec4<f32>>; // `combine`'s input

var<workgroup> qs: array<vec4<f32>, ROWS * D4>; // [r][d4], pre-scaled
// [r][j] partial scores, one component per scoring thread of key j; after the chunk loop, one
// round [rr][kg][d4] of the final sum of the P.V accumulators.
var<workgroup> buf: array<vec4<f32>, max(ROWS * KEYS, RPR * KG * D4)>;
var<workgroup> sc: array<f32, ROWS * KEYS>; // [r][j] masked scores, then p; at the end l shares
var<workgroup> part: array<f32, ROWS * MP>; // [r][i] partial row maxima, at the end row sums
var<workgroup> alpha: array<f32, ROWS>; // per-chunk rescale of acc; at the end the row max
var<workgroup> blocks: array<u32, 2u * BPC>; // physical blocks of the next two chunks, by parity
var<workgroup> len_shared: u32;

var<workgroup> cml: array<vec2<f32>, CWG>; // `combine`: (m, l) per split
var<workgroup> cw: array<vec2<f32>, CWG>; // `combine`: (w, l w) per split
var<workgroup> cred: array<vec4<f32>, CWG>; // `combine`: [cg][d4] partial sums

// Vec4 offset of q head h of slot s in `out`.
fn head_row(s: u32, h: u32) -> u32 {
  return (s * p.n_heads + h) * D4;
}

// Float offset of head hh (q heads, then k, then v) of slot s in `qkv`.
fn qkv_head(s: u32, hh: u32) -> u32 {
  return (s * (p.n_heads + 2u * p.n_kv_heads) + hh) * HD;
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
  return v_pool[key_row(ch, j, kvh) + d4];
}

// Physical block of 16-key block b of chunk ch of slot s; 0 past the slot's keys (its table row
// may end there).
fn block_of(s: u32, ch: u32, b: u32, len: u32) -> u32 {
  if ((ch * BPC + b) * BLOCK >= len) {
    return 0u;
  }
  return block_table[s * p.max_blocks + ch * BPC + b];
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
    for (var e = lid; e < HD; e += WG) {
      v_pool[row + e / 4u][e % 4u] = qkv[vs + e];
      if (e < HALF) {
        let k = rope_pair(qkv[ks + e], qkv[ks + e + HALF], position, inv_freq[e]);
        k_pool[row + e / 4u][e % 4u] = k.x;
        k_pool[row + (e + HALF) / 4u][(e + HALF) % 4u] = k.y;
      }
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
  var kr: array<vec4<f32>, KMAX>;
  var vr: array<vec4<f32>, VMAX>;
  if (c0 * KEYS + kj < len) {
    let base = key_row(c0, kj, kvh);
    for (var y = 0u; y < KSPAN; y++) {
      if (y * TPK + kpart < D4) {
        kr[y] = k_pool[base + y * TPK + kpart];
      }
    }
  }
  for (var x = 0u; x < VPT; x++) {
    vr[x] = v_at(c0, kg + x * KG, select(D4, d4, kg < KG), len, kvh);
  }
  var m_run: array<f32, RMAX>; // row maxima of the softmax thread's rows (equal in every thread)
  var l_run: array<f32, RMAX>; // this thread's share of the row sums
  for (var x = 0u; x < RMAX; x++) {
    m_run[x] = NEG;
    l_run[x] = 0.0;
  }
  var acc: array<vec4<f32>, RMAX>; // [r] this key group's share of the output, element d4

  for (var ch = c0; ch < c1; ch++) {
    // The blocks of chunk ch + 2, stored at the end of this chunk (read long before then).
    var next_block = 0u;
    if (lid < BPC && ch + 2u < c1) {
      next_block = block_of(s, ch + 2u, lid, len);
    }

    // S: this thread's share of the scores of key kj, for every row.
    for (var r = 0u; r < ROWS; r++) {
      var d = 0.0;
      for (var y = 0u; y < KSPAN; y++) {
        if (y * TPK + kpart < D4) {
          d += dot(qs[r * D4 + y * TPK + kpart], kr[y]);
        }
      }
      buf[r * KEYS + kj][kpart] = d;
    }
    if ((ch + 1u) * KEYS + kj < len && ch + 1u < c1) {
      let base = key_row(ch + 1u, kj, kvh);
      for (var y = 0u; y < KSPAN; y++) {
        if (y * TPK + kpart < D4) {
          kr[y] = k_pool[base + y * TPK + kpart];
        }
      }
    }
    workgroupBarrier();

    // M: whole, masked scores and partial row maxima over keys i, i + MP, ... (consecutive
    // threads, consecutive vec4s). Constant trip counts, so the loads go out together.
    if (lid < ROWS * MP) {
      let r = lid / MP;
      var mx = NEG;
      for (var x = 0u; x < KEYS / MP; x++) {
        let i = lid % MP + x * MP;
        let v = select(NEG, dot(buf[r * KEYS + i], vec4<f32>(1.0)), ch * KEYS + i < len);
        sc[r * KEYS + i] = v;
        mx = max(mx, v);
      }
      part[lid] = mx;
    }
    workgroupBarrier();

    // E: probabilities against the new row max; rescale the running sums.
    for (var x = 0u; x < ERT; x++) {
      let r = er + x * TPK;
      if (r < ROWS) {
        var mx = m_run[x];
        for (var i = 0u; i < MP; i++) {
          mx = max(mx, part[r * MP + i]);
        }
        let a = exp2(m_run[x] - mx);
        let pj = select(0.0, exp2(sc[r * KEYS + j] - mx), ch * KEYS + j < len);
        sc[r * KEYS + j] = pj;
        l_run[x] = l_run[x] * a + pj;
        m_run[x] = mx;
        if (j == 0u) {
          alpha[r] = a;
        }
      }
    }
    workgroupBarrier();

    // PV: acc[r] = acc[r] * alpha[r] + sum over this thread's keys of p[r][j] V[j][d4].
    if (kg < KG) {
      for (var r = 0u; r < ROWS; r++) {
        acc[r] *= alpha[r];
      }
      for (var x = 0u; x < VPT; x++) {
        let jj = kg + x * KG;
        if (jj < KEYS) {
          for (var r = 0u; r < ROWS; r++) {
            acc[r] += sc[r * KEYS + jj] * vr[x];
          }
        }
      }
    }
    if (ch + 1u < c1) {
      for (var x = 0u; x < VPT; x++) {
        vr[x] = v_at(ch + 1u, kg + x * KG, select(D4, d4, kg < KG), len, kvh);
      }
    }
    if (lid < BPC && ch + 2u < c1) {
      blocks[(ch & 1u) * BPC + lid] = next_block;
    }
    workgroupBarrier();
  }

  // Row sums: each softmax thread's share, summed like the maxima. Row maxima to `alpha`.
  for (var x = 0u; x < ERT; x++) {
    let r = er + x * TPK;
    if (r < ROWS) {
      sc[r * KEYS + j] = l_run[x];
      if (j == 0u) {
        alpha[r] = m_run[x];
      }
    }
  }
  workgroupBarrier();
  if (lid < ROWS * MP) {
    let r = lid / MP;
    var l = 0.0;
    for (var x = 0u; x < KEYS / MP; x++) {
      l += sc[r * KEYS + lid % MP + x * MP];
    }
    part[lid] = l;
  }

  // Sum the key groups' accumulators, RPR rows per round, and write the rows of real q heads.
  for (var r0 = 0u; r0 < ROWS; r0 += RPR) {
    if (kg < KG) {
      for (var rr = 0u; rr < RPR; rr++) {
        if (r0 + rr < ROWS) {
          buf[(rr * KG + kg) * D4 + d4] = acc[r0 + rr];
        }
      }
    }
    workgroupBarrier();
    let r = r0 + lid / D4;
    if (lid < RPR * D4 && r < ROWS && g0 + r < p.group) {
      var o = vec4<f32>(0.0);
      for (var g = 0u; g < KG; g++) {
        o += buf[((lid / D4) * KG + g) * D4 + d4];
      }
      var l = 0.0;
      for (var i = 0u; i < MP; i++) {
        l += part[r * MP + i];
      }
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
}

@compute @workgroup_size(CWG)
fn combine(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let h = wid.x;
  let s = wid.y;
  let len = seq_len[s];
  let chunks = (len + KEYS - 1u) / KEYS;
  let per = max(1u, (chunks + p.n_split - 1u) / p.n_split);
  let n = (chunks + per - 1u) / per; // splits that hold keys, as `main` divided them
  let base = (s * p.n_heads + h) * p.n_split;

  // Every load up front, not waiting for seq_len: (m, l) of split lid, and acc of splits cg,
  // cg + CG, ... at element d4. Splits at or past n hold stale values: never used.
  var ml = vec2<f32>(0.0);
  if (lid < p.n_split) {
    ml = partials[p.seqs * p.n_heads * p.n_split * D4 + base + lid].xy;
  }
  cml[lid] = select(vec2<f32>(NEG, 0.0), ml, lid < n);
  let cg = lid / D4;
  let d4 = lid % D4;
  var a: array<vec4<f32>, CMAX>;
  for (var x = 0u; x < CMAX; x++) {
    let c = cg + x * CG;
    if (cg < CG && c < p.n_split) {
      a[x] = partials[(base + c) * D4 + d4];
    }
  }
  workgroupBarrier();

  // Weights 2^(m_c - M), 0 past n. Loops over all CWG entries (constant trip counts), so their
  // reads go out together instead of one after another.
  var mx = NEG;
  for (var c = 0u; c < CWG; c++) {
    mx = max(mx, cml[c].x);
  }
  let w = select(0.0, exp2(cml[lid].x - mx), lid < n);
  cw[lid] = vec2<f32>(w, w * cml[lid].y);
  workgroupBarrier();

  if (cg < CG) {
    var o = vec4<f32>(0.0);
    for (var x = 0u; x < CMAX; x++) {
      let c = cg + x * CG;
      if (c < n) {
        o += a[x] * cw[c].x;
      }
    }
    cred[lid] = o;
  }
  workgroupBarrier();

  if (lid < D4) {
    var o = vec4<f32>(0.0);
    for (var g = 0u; g < CG; g++) {
      o += cred[g * D4 + lid];
    }
    var l = 0.0;
    for (var c = 0u; c < CWG; c++) {
      l += cw[c].y;
    }
    dst[head_row(s, h) + lid] = select(vec4<f32>(0.0), o / l, n > 0u);
  }
}
