// Speculative decoding inside the GPU-resident loop: drafts from each sequence's own history
// (prompt-lookup decoding) and from a pool of the model's own guesses (lookahead / Jacobi
// n-grams), verified by one forward pass of R = k + 1 rows per slot, accepted as the longest
// prefix the model samples itself. No token travels to the host in between.
//
// spec_begin (a workgroup per slot): the slot's rows for this step. Row 0 is the token the last
// step sampled (next_tok, at position L = seq_len); rows 1..d are drafts, at most
// D = min(the host's cap spec_cap, R - 1, tokens allowed - 1):
//   1. lookup: the latest earlier occurrence of the history's longest suffix (up to NGRAM tokens,
//      at least NGRAM_MIN) in hist[0..L]; the drafts are the tokens that followed it, copied on
//      past L as an overlapping copy (draft j after occurrence e is the token at e + j, a draft
//      itself once e + j > L), so a phrase that repeats drafts at full depth;
//   2. pool (POOL): the rows lookup left, or all of them when it found nothing, continue from the
//      last token so far with the guesses the slot's n-gram pool holds under it, chained while
//      entries follow.
// Live row j gets the KV write position L + j and attends L + j + 1 keys; rows past d and every
// row of a done slot are dead: they write KV at the trash position and attend nothing. The
// plain path's cross-check (engine/runner/verify.ts) reads check_pos / check_len: row 0's.
//
// spec_end (a thread per slot): row j sampled the token for position L + j + 1 exactly as plain
// decoding would (the sampler's counter is that position and its penalties count rows 1..j as
// already generated). Row j's sample is valid when drafts 1..j were what the model sampled before
// them: accept rows 0..m, m = the leading drafts that match, cut by the token budget and at the
// first EOS. Accepted tokens go to the ring (entries 0..a-1 of the slot's, the rest NO_TOKEN;
// entry R holds (drafted d | pool drafts << 8 | drafts allowed << 16, drafts accepted)), the
// history and the penalty counts; seq_len advances by a, so the KV of rejected rows is simply
// written again later. How deep a slot drafts is the host's choice (engine/sched/speculation.ts:
// per sequence and length group, by acceptance and the cost of the pass): drafts within a pass's
// rows cost next to nothing, so each step drafts as deep as the cap lets it.
//
// The pool (lookahead decoding's n-gram pool, grown from the verification rows themselves): when
// draft m + 1 is rejected, rows m + 1..d still sampled what the model expects at positions
// L + m + 2.., conditioned on a draft that was wrong by one token. They are stored under the token
// accepted at the mismatch (sampled[m]), which is the next step's row 0: a Jacobi iteration's next
// guess, and an n-gram the model proposed for whenever that token comes again. Direct-mapped,
// POOL_ENTRIES per slot, keyed by a hash of the token; the newest guess replaces.

struct Params {
  slot_begin: u32,
  slot_end: u32,
  rows: u32, // R: rows per slot (k + 1), <= RMAX
  hist_len: u32, // H: positions of a slot's history row
  trash_pos: u32,
  vocab: u32,
  ring_offset: u32, // entry offset of this step's row in the ring (spec_end)
  n_eos: u32,
  ring_stride: u32, // ring entries per slot (>= R + 1)
  _pad0: u32,
  _pad1: u32,
  _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> seq_len: array<u32>; // [S]
// x = done, y = tokens still allowed, z = stop at EOS, w unused here
@group(0) @binding(2) var<storage, read_write> slot_state: array<vec4<u32>>; // [S]
@group(0) @binding(3) var<storage, read_write> next_tok: array<u32>; // [S]
@group(0) @binding(4) var<storage, read_write> hist: array<u32>; // [S, H] tokens by position
@group(0) @binding(5) var<storage, read_write> row_tok: array<u32>; // [S, R] input tokens
@group(0) @binding(6) var<storage, read_write> row_pos: array<u32>; // [S, R] KV write position
@group(0) @binding(7) var<storage, read_write> row_len: array<u32>; // [S, R] keys attended
@group(0) @binding(8) var<storage, read_write> sampled: array<vec2<u32>>; // [S, R]
@group(0) @binding(9) var<storage, read_write> ring: array<vec2<u32>>; // [.., S, stride]
@group(0) @binding(10) var<storage, read_write> counts: array<u32>; // [S, V]
@group(0) @binding(11) var<storage, read_write> eos: array<u32>; // [n_eos]
// Most drafts per step a slot may take, set by the host (0: this sequence does not speculate).
@group(0) @binding(12) var<storage, read> spec_cap: array<u32>; // [S]
// [S, POOL_WORDS]: word 0, the current step's pool drafts | the host's cap within the rows << 16
// (spec_begin -> spec_end); then
// POOL_ENTRIES entries of 16 words: key | length << 24 (length 0: empty), 15 guessed tokens.
@group(0) @binding(13) var<storage, read_write> pool: array<u32>;
// [S]: where the plain path's cross-check of row 0 writes KV, and the keys it attends.
@group(0) @binding(14) var<storage, read_write> check_pos: array<u32>;
@group(0) @binding(15) var<storage, read_write> check_len: array<u32>;

override WG: u32 = 64u; // spec_begin threads per slot
override NGRAM: u32 = 3u; // longest suffix matched
override NGRAM_MIN: u32 = 1u; // shortest suffix that drafts (>= 1)
override NO_TOKEN: u32;
override POOL_ENTRIES: u32 = 128u; // a power of two
override POOL: bool = true; // draft from the pool too
const RMAX: u32 = 16u;
const ENTRY: u32 = 16u; // words per pool entry
override POOL_WORDS: u32 = 1u + POOL_ENTRIES * ENTRY;

// Best match so far: (suffix length << 24) | end position, the larger the better (longer
// suffix, then later occurrence).
var<workgroup> best: atomic<u32>;

// How many of the NGRAM tokens before position e (e included) equal the history's suffix (the
// tokens up to L). 0 when h[e] != h[L].
fn match_len(base: u32, e: u32, last: u32) -> u32 {
  var n = 0u;
  for (var q = 0u; q < NGRAM; q++) {
    if (q > e || hist[base + e - q] != hist[base + last - q]) {
      break;
    }
    n = q + 1u;
  }
  return n;
}

// mix: lowbias32, kernels/hash_common.wgsl (prepended by the wrapper).

// Word offset of the pool entry of `key` in slot s's pool.
fn entry_of(s: u32, key: u32) -> u32 {
  return s * POOL_WORDS + 1u + (mix(key) & (POOL_ENTRIES - 1u)) * ENTRY;
}

@compute @workgroup_size(WG)
fn spec_begin(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) lid: u32) {
  let s = p.slot_begin + wg.x;
  if (s >= p.slot_end) {
    return;
  }
  let st = slot_state[s];
  let L = seq_len[s];
  let r0 = s * p.rows;
  let base = s * p.hist_len;
  if (lid == 0u) {
    atomicStore(&best, 0u);
  }
  workgroupBarrier();
  // Every earlier position may end an occurrence of the suffix; the latest longest wins.
  let running = st.x == 0u;
  if (running && L >= 1u && L < p.hist_len) {
    for (var e = lid; e < L; e += WG) {
      let n = match_len(base, e, L);
      if (n >= NGRAM_MIN) {
        atomicMax(&best, (n << 24u) | e);
      }
    }
  }
  workgroupBarrier();
  if (lid != 0u) {
    return;
  }
  let found = atomicLoad(&best);
  // At most D drafts: the cap, the rows, and the budget (row d samples position L + d + 1, and
  // st.y tokens may still be sampled).
  var D = 0u;
  if (running) {
    D = min(spec_cap[s], min(p.rows - 1u, st.y - 1u));
  }
  var drafts: array<u32, RMAX>;
  var d = 0u;
  if (found != 0u) {
    let e = found & 0xffffffu;
    let span = L - e;
    for (; d < D; d++) {
      if (d < span) {
        drafts[d] = hist[base + e + 1u + d];
      } else {
        drafts[d] = drafts[d - span];
      }
    }
  }
  let lookup = d;
  if (POOL) {
    var t = select(next_tok[s], drafts[max(d, 1u) - 1u], d > 0u);
    while (d < D) {
      let at = entry_of(s, t);
      let head = pool[at];
      let n = min(head >> 24u, D - d);
      if ((head & 0xffffffu) != t || n == 0u) {
        break;
      }
      for (var i = 0u; i < n; i++) {
        drafts[d + i] = pool[at + 1u + i];
      }
      d += n;
      t = drafts[d - 1u];
    }
  }
  pool[s * POOL_WORDS] = (d - lookup) | (min(spec_cap[s], p.rows - 1u) << 16u);
  for (var j = 0u; j < p.rows; j++) {
    let r = r0 + j;
    if (running && j <= d) {
      row_tok[r] = select(drafts[max(j, 1u) - 1u], next_tok[s], j == 0u);
      row_pos[r] = L + j;
      row_len[r] = L + j + 1u;
    } else {
      row_tok[r] = 0u;
      row_pos[r] = p.trash_pos;
      row_len[r] = 0u;
    }
  }
  check_pos[s] = select(p.trash_pos, L, running);
  check_len[s] = select(0u, L + 1u, running);
}

fn is_eos(t: u32) -> bool {
  for (var i = 0u; i < p.n_eos; i++) {
    if (eos[i] == t) {
      return true;
    }
  }
  return false;
}

@compute @workgroup_size(64)
fn spec_end(@builtin(global_invocation_id) g: vec3u) {
  let s = p.slot_begin + g.x;
  if (s >= p.slot_end) {
    return;
  }
  let out = p.ring_offset + s * p.ring_stride;
  var st = slot_state[s];
  if (st.x != 0u) {
    for (var j = 0u; j <= p.rows; j++) {
      ring[out + j] = vec2<u32>(NO_TOKEN, 0u);
    }
    return;
  }
  let r0 = s * p.rows;
  let L = seq_len[s];
  // Drafted: the live rows past row 0.
  var d = 0u;
  for (var j = 1u; j < p.rows; j++) {
    if (row_len[r0 + j] != 0u) {
      d = j;
    }
  }
  var m = 0u;
  while (m < d && sampled[r0 + m].x == row_tok[r0 + m + 1u]) {
    m += 1u;
  }
  var a = min(m + 1u, st.y);
  var stop = a == st.y;
  for (var j = 0u; j < a; j++) {
    if (st.z != 0u && is_eos(sampled[r0 + j].x)) {
      a = j + 1u;
      stop = true;
      break;
    }
  }
  for (var j = 0u; j < p.rows; j++) {
    if (j < a) {
      let tok = sampled[r0 + j].x;
      ring[out + j] = sampled[r0 + j];
      let ci = s * p.vocab + tok;
      counts[ci] = ((counts[ci] & 0x3fffffffu) + 1u) | 0x80000000u;
      if (L + 1u + j < p.hist_len) {
        hist[s * p.hist_len + L + 1u + j] = tok;
      }
    } else {
      ring[out + j] = vec2<u32>(NO_TOKEN, 0u);
    }
  }
  // (drafted | pool drafts << 8 | drafts the host allowed << 16, accepted)
  let hdr = pool[s * POOL_WORDS];
  ring[out + p.rows] = vec2<u32>(d | ((hdr & 0xffu) << 8u) | (hdr & 0xff0000u), min(m, a - 1u));
  // The rows after the first rejected draft: the model's guesses past the token it chose there.
  if (m < d) {
    let key = sampled[r0 + m].x;
    let n = d - m;
    let at = entry_of(s, key);
    pool[at] = key | (n << 24u);
    for (var i = 0u; i < n; i++) {
      pool[at + 1u + i] = sampled[r0 + m + 1u + i].x;
    }
  }
  seq_len[s] = L + a;
  next_tok[s] = sampled[r0 + a - 1u].x;
  st.y -= a;
  if (stop) {
    st.x = 1u;
  }
  slot_state[s] = st;
}
