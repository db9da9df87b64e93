// Speculative decoding inside the GPU-resident loop: drafts from each sequence's own history
// (prompt-lookup decoding), verified by one forward pass of R = k + 1 rows per slot, accepted as
// the longest prefix the model samples itself. No token travels to the host in between.
//
// spec_begin (a workgroup per slot): the slot's rows for this step. Row 0 is the token the last
// step sampled (next_tok, at position L = seq_len); rows 1..d are drafts: the d tokens that
// followed the most recent earlier occurrence of the history's longest suffix (up to NGRAM
// tokens, at least NGRAM_MIN) in hist[0..L]. d is at most the slot's adaptive depth
// (slot_state.w), the host's cap (spec_cap) and R - 1, and leaves row d's sample within the token
// budget. Live row j gets the KV write position L + j and attends L + j + 1 keys; rows past d
// and every row of a done slot are dead: they write KV at the trash position and attend nothing.
//
// spec_end (a thread per slot): row j sampled the token for position L + j + 1 exactly as plain
// decoding would (the sampler's counter is that position and its penalties count rows 1..j as
// already generated). Row j's sample is valid when drafts 1..j were what the model sampled before
// them: accept rows 0..m, m = the leading drafts that match, cut by the token budget and at the
// first EOS. Accepted tokens go to the ring (entries 0..a-1 of the slot's R + 1, the rest
// NO_TOKEN; entry R holds (drafted d, drafts accepted)), the history and the penalty counts;
// seq_len advances by a, so the KV of rejected rows is simply written again later. The depth
// grows after a step that took every draft and falls to what was taken otherwise.

struct Params {
  slot_begin: u32,
  slot_end: u32,
  rows: u32, // R: rows per slot (k + 1), <= RMAX
  hist_len: u32, // H: positions of a slot's history row
  trash_pos: u32,
  vocab: u32,
  ring_offset: u32, // entry offset of this step's row in the ring (spec_end)
  n_eos: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> seq_len: array<u32>; // [S]
// x = done, y = tokens still allowed, z = stop at EOS, w = draft depth
@group(0) @binding(2) var<storage, read_write> slot_state: array<vec4<u32>>; // [S]
@group(0) @binding(3) var<storage, read_write> next_tok: array<u32>; // [S]
@group(0) @binding(4) var<storage, read_write> hist: array<u32>; // [S, H] tokens by position
@group(0) @binding(5) var<storage, read_write> row_tok: array<u32>; // [S, R] input tokens
@group(0) @binding(6) var<storage, read_write> row_pos: array<u32>; // [S, R] KV write position
@group(0) @binding(7) var<storage, read_write> row_len: array<u32>; // [S, R] keys attended
@group(0) @binding(8) var<storage, read_write> sampled: array<vec2<u32>>; // [S, R]
@group(0) @binding(9) var<storage, read_write> ring: array<vec2<u32>>; // [.., S, R + 1]
@group(0) @binding(10) var<storage, read_write> counts: array<u32>; // [S, V]
@group(0) @binding(11) var<storage, read_write> eos: array<u32>; // [n_eos]
// Most drafts per step a slot may take, set by the host (0: this sequence does not speculate).
@group(0) @binding(12) var<storage, read> spec_cap: array<u32>; // [S]

override WG: u32 = 64u; // spec_begin threads per slot
override NGRAM: u32 = 3u; // longest suffix matched
override NGRAM_MIN: u32 = 1u; // shortest suffix that drafts (>= 1)
override NO_TOKEN: u32;
const RMAX: u32 = 16u;
const NONE: u32 = 0xffffffffu;

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
  // Drafts: what followed the occurrence, up to the depth, the budget (row d samples position
  // L + d + 1, and st.y tokens may still be sampled) and the history written so far.
  var d = 0u;
  if (running && found != 0u) {
    let e = found & 0xffffffu;
    d = min(min(st.w, spec_cap[s]), min(p.rows - 1u, min(L - e, st.y - 1u)));
  }
  for (var j = 0u; j < p.rows; j++) {
    let r = r0 + j;
    if (running && j <= d) {
      row_tok[r] = select(hist[base + (found & 0xffffffu) + j], next_tok[s], j == 0u);
      row_pos[r] = L + j;
      row_len[r] = L + j + 1u;
    } else {
      row_tok[r] = 0u;
      row_pos[r] = p.trash_pos;
      row_len[r] = 0u;
    }
  }
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
  let E = p.rows + 1u;
  let out = p.ring_offset + s * E;
  var st = slot_state[s];
  if (st.x != 0u) {
    for (var j = 0u; j < E; j++) {
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
  ring[out + p.rows] = vec2<u32>(d, min(m, a - 1u));
  seq_len[s] = L + a;
  next_tok[s] = sampled[r0 + a - 1u].x;
  st.y -= a;
  // Depth: one more after a step that took every draft, else what this one took (at least 1).
  if (d > 0u && m == d) {
    st.w = min(st.w + 1u, p.rows - 1u);
  } else if (d > 0u) {
    st.w = max(m, 1u);
  }
  if (stop) {
    st.x = 1u;
  }
  slot_state[s] = st;
}
