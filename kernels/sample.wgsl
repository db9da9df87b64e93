// GPU sampling: one workgroup per row of logits[rows, V]; the token never leaves the GPU.
//
// Order of operations (kernels/reference.ts `sampleRef` is the same in float64):
//   1. penalties on the raw logits: repetition (HF: if seen, l > 0 ? l / rp : l * rp), then
//      presence (l -= pp if n > 0), then frequency (l -= fp * n); n = times generated so far.
//   2. temperature == 0: argmax of the penalised logits, ties to the lowest id. Otherwise tokens
//      are ordered by (penalised logit desc, id asc) and weighted w = exp((l - l_max) / T).
//   3. top-k keeps the first k of that order; 4. top-p the shortest prefix of what is left whose
//      mass is >= top_p of its mass; 5. min-p then keeps w >= min_p (p >= min_p * p_max).
//   6. u = Philox4x32-10(counter (position, 0, 0, 0), key (seed_lo, seed_hi)).x >> 8, * 2^-24;
//      the token is the first kept id, scanning ids upward, whose cumulative weight exceeds u * S.
//   logprob = logit[tok] - logsumexp(raw logits) (unpenalised, untempered).
//   0. Before all of it, a constrained row (SampleParams.grammar) sets the tokens its grammar does
//      not allow to the NEG sentinel (weight 0 at every temperature); the prelude (grammar_mask.wgsl
//      or grammar_nomask.wgsl) supplies mask_setup / mask_allows. logit_bias is already in the
//      logits (kernels/constraint.wgsl apply_bias), so the logprob includes it.
//
// Every filter keeps a prefix of one total order, so the kept set is "a cut" (key, id): tokens
// whose order key is above `key`, plus those equal to `key` with id <= `id`. A cut is found
// without sorting: a radix-16 search on the order key (8 passes, each a 16-bin histogram of count
// or mass per thread, reduced in workgroup memory; radix 4 on CPU adapters) finds the key level,
// then one ordered scan over ids picks how many of the tokens tied at that level are kept. Ties
// are therefore exact: the lowest ids win, as in the reference.

struct SampleParams {
  temperature: f32,
  top_k: u32, // 0 = off
  top_p: f32, // >= 1 = off
  min_p: f32, // 0 = off
  repetition_penalty: f32, // 1 = off
  presence_penalty: f32,
  frequency_penalty: f32,
  seed_lo: u32,
  seed_hi: u32,
  grammar: u32, // first word of the row's grammar tables (grammar_mask.wgsl), or NO_GRAMMAR
  n_bias: u32, // logit_bias entries (kernels/constraint.wgsl)
  _pad2: u32,
}

struct Dims { rows: u32, vocab: u32, _pad0: u32, _pad1: u32 } // rows: or Philox vectors

@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read> logits: array<f32>; // [rows, V]
@group(0) @binding(2) var<storage, read> params: array<SampleParams>; // [rows]
@group(0) @binding(3) var<storage, read> position: array<u32>; // [rows]
// bits 0..29: times generated; bit 31: seen in prompt or output
@group(0) @binding(4) var<storage, read_write> counts: array<u32>; // [rows, V]
@group(0) @binding(5) var<storage, read_write> out: array<u32>; // (token, f32 logprob) [rows]
@group(0) @binding(6) var<storage, read> philox_in: array<u32>; // philox_test: (c0..c3, k0, k1)
// verify_main: each row's input token [rows]; a sequence's rows 1..j are its drafts before row j
@group(0) @binding(7) var<storage, read> row_tok: array<u32>;

// verify_main: rows per sequence (a verification pass of speculative decoding, R = drafts + 1).
override SEQ_ROWS: u32 = 1u;
const MAX_EXTRA: u32 = 16u;

override WG: u32 = 256u; // power of two, <= MAX_WG
const MAX_WG: u32 = 256u;
const MAX_NBIN: u32 = 16u;

// Bits per pass of the cut search: 4 (16 bins, 8 passes) on GPUs; 2 (4 bins, 16 passes) on CPU
// adapters, where llvmpipe's LLVM takes minutes over the larger workgroup array.
override DIGIT_BITS: u32 = 4u; // 2 or 4 (reduce_bins unrolls up to MAX_NBIN bins)
override NBIN: u32 = 1u << DIGIT_BITS;
override DIGIT_PASSES: u32 = 32u / DIGIT_BITS;
const COUNT_MASK: u32 = 0x3fffffffu;
const SEEN_BIT: u32 = 0x80000000u;
const NONE: u32 = 0xffffffffu;
const NEG: f32 = -3.402823e38;

// Per-thread partials: NBIN (>= 3) bins x WG threads (part[bin][lid]); reused by every reduction.
// Nested, not flat: llvmpipe takes minutes to compile the zero-init of one flat 4096-float array
// (and an inner array may not be override-sized).
var<workgroup> part: array<array<f32, MAX_WG>, NBIN>;
var<workgroup> part_u: array<u32, WG>;
var<workgroup> picked: u32;

// The row this invocation works on (set once in main).
var<private> lid: u32;
var<private> V: u32;
var<private> base: u32;
var<private> cbase: u32; // the row's sequence's row of `counts`
var<private> sp: SampleParams;
var<private> has_pen: bool;
// Tokens a row counts as generated beyond `counts` (a verification row's drafts before it).
var<private> extra: array<u32, MAX_EXTRA>;
var<private> n_extra: u32;
var<private> pen_max: f32;

// ---- Philox4x32-10 (engine/philox.ts is the same, word for word) ----

fn mulhilo(a: u32, b: u32) -> vec2<u32> {
  let al = a & 0xffffu;
  let ah = a >> 16u;
  let bl = b & 0xffffu;
  let bh = b >> 16u;
  let ll = al * bl;
  let lh = al * bh;
  let hl = ah * bl;
  let mid = (ll >> 16u) + (lh & 0xffffu) + (hl & 0xffffu);
  return vec2<u32>(a * b, ah * bh + (lh >> 16u) + (hl >> 16u) + (mid >> 16u));
}

fn philox4x32(counter: vec4<u32>, key: vec2<u32>) -> vec4<u32> {
  var c = counter;
  var k = key;
  for (var r = 0u; r < 10u; r++) {
    if (r > 0u) { k += vec2<u32>(0x9e3779b9u, 0xbb67ae85u); } // bump the key between rounds
    let p0 = mulhilo(0xd2511f53u, c.x);
    let p1 = mulhilo(0xcd9e8d57u, c.z);
    c = vec4<u32>(p1.y ^ c.y ^ k.x, p1.x, p0.y ^ c.w ^ k.y, p0.x);
  }
  return c;
}

// ---- per-token values (recomputed identically in every pass) ----

fn penalised(i: u32) -> f32 {
  if (!mask_allows(i)) {
    return NEG;
  }
  var x = logits[base + i];
  if (has_pen) {
    let c = counts[cbase + i];
    var n = c & COUNT_MASK;
    for (var t = 0u; t < n_extra; t++) {
      n += select(0u, 1u, extra[t] == i);
    }
    if ((c & SEEN_BIT) != 0u || n > 0u) {
      x = select(x * sp.repetition_penalty, x / sp.repetition_penalty, x > 0.0);
    }
    if (n > 0u) {
      // explicit fma: the same rounding in every pass, whatever the compiler contracts
      x = fma(-sp.frequency_penalty, f32(n), x - sp.presence_penalty);
    }
  }
  return x;
}

// Order-preserving map of f32 to u32 (-0 folded onto +0, so they tie as in the reference).
fn order_key(x: f32) -> u32 {
  let b = select(bitcast<u32>(x), 0u, bitcast<u32>(x) == 0x80000000u);
  return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

fn key_value(k: u32) -> f32 {
  return bitcast<f32>(select(~k, k & 0x7fffffffu, (k & 0x80000000u) != 0u));
}

fn weight(x: f32) -> f32 {
  return exp((x - pen_max) / sp.temperature);
}

fn in_cut(k: u32, i: u32, cut: vec2<u32>) -> bool {
  return k > cut.x || (k == cut.x && i <= cut.y);
}

// ---- workgroup reductions ----

// part[b][lid] += part[b][lid + s], for a bin that exists.
fn add_bin(b: u32, s: u32) {
  if (b < NBIN) {
    part[b][lid] += part[b][lid + s];
  }
}

// Sums part[b][t] over t for all bins; the result is in part[b][0]. The loop over bins is
// unrolled (`// @unroll`, kernels/unroll.ts): a loop trip costs ~30 ns on an H200, and this runs
// 8 levels x 8 passes.
fn reduce_bins() {
  for (var s = WG / 2u; s > 0u; s >>= 1u) {
    workgroupBarrier();
    if (lid < s) {
      // @unroll
      for (var b = 0u; b < MAX_NBIN; b++) {
        add_bin(b, s);
      }
    }
  }
  workgroupBarrier();
}

// Radix-NBIN search for the cut level: the largest key t with F(key >= t) >= aim, where F sums
// 1 (count mode) or the weight (mass mode) over tokens inside `cut`. In mass mode the aim is
// `goal` times the total mass inside the cut. Returns (t, bits of F(key > t), bits of aim).
fn find_level(use_mass: bool, goal: f32, cut: vec2<u32>) -> vec3<u32> {
  var prefix = 0u;
  var above = 0.0;
  var aim = goal;
  for (var digit = 0u; digit < DIGIT_PASSES; digit++) {
    let shift = 32u - DIGIT_BITS * (digit + 1u);
    workgroupBarrier(); // everyone has read the previous bins
    for (var b = 0u; b < NBIN; b++) { part[b][lid] = 0.0; }
    for (var i = lid; i < V; i += WG) {
      let x = penalised(i);
      let k = order_key(x);
      if (!in_cut(k, i, cut) || (digit > 0u && (k >> (shift + DIGIT_BITS)) != prefix)) {
        continue;
      }
      let d = (k >> shift) & (NBIN - 1u);
      part[d][lid] += select(1.0, weight(x), use_mass);
    }
    reduce_bins();
    if (use_mass && digit == 0u) {
      var total = 0.0;
      for (var b = 0u; b < NBIN; b++) { total += part[b][0]; }
      aim = goal * total;
    }
    // Highest digit whose bin brings the running sum to the aim; if rounding leaves none,
    // the lowest non-empty digit (take everything that is left).
    var acc = above;
    var chosen = NBIN;
    var acc_chosen = above;
    var lowest = 0u;
    var acc_lowest = above;
    for (var j = 0u; j < NBIN; j++) {
      let b = NBIN - 1u - j;
      let v = part[b][0];
      if (v > 0.0) {
        if (chosen == NBIN && acc + v >= aim) {
          chosen = b;
          acc_chosen = acc;
        }
        lowest = b;
        acc_lowest = acc;
      }
      acc += v;
    }
    if (chosen == NBIN) {
      chosen = lowest;
      acc_chosen = acc_lowest;
    }
    prefix = (prefix << DIGIT_BITS) | chosen;
    above = acc_chosen;
  }
  return vec3<u32>(prefix, bitcast<u32>(above), bitcast<u32>(aim));
}

const MODE_TIES: u32 = 0u; // 1 for tokens in the cut at key level t
const MODE_KEPT: u32 = 1u; // weight of tokens in the cut with w >= min_p

fn contrib(mode: u32, i: u32, t: u32, cut: vec2<u32>) -> f32 {
  let x = penalised(i);
  let k = order_key(x);
  if (!in_cut(k, i, cut)) { return 0.0; }
  if (mode == MODE_TIES) { return select(0.0, 1.0, k == t); }
  let w = weight(x);
  return select(0.0, w, w >= min(sp.min_p, 1.0));
}

// Scans ids upward and returns the first whose cumulative contribution exceeds `goal` (times the
// total when `scaled`), or the last contributing id if rounding leaves none. Each thread owns a
// contiguous chunk of ids; chunk sums are scanned across the workgroup.
fn ordered_pick(mode: u32, t: u32, cut: vec2<u32>, goal: f32, scaled: bool) -> u32 {
  let chunk = (V + WG - 1u) / WG;
  let lo = min(lid * chunk, V);
  let hi = min(lo + chunk, V);
  var s = 0.0;
  for (var i = lo; i < hi; i++) {
    s += contrib(mode, i, t, cut);
  }
  workgroupBarrier(); // part is free
  part[0][lid] = s;
  if (lid == 0u) { picked = NONE; }
  var src = 0u;
  for (var off = 1u; off < WG; off <<= 1u) {
    workgroupBarrier();
    var v = part[src][lid];
    if (lid >= off) { v += part[src][lid - off]; }
    part[1u - src][lid] = v;
    src = 1u - src;
  }
  workgroupBarrier();
  let incl = part[src][lid];
  let excl = select(0.0, part[src][max(lid, 1u) - 1u], lid > 0u);
  let total = part[src][WG - 1u];
  var aim = select(goal, goal * total, scaled);
  if (total > 0.0) {
    aim = min(aim, bitcast<f32>(bitcast<u32>(total) - 1u)); // below total: one owner
  }
  if (excl <= aim && aim < incl) {
    var acc = 0.0;
    let local_target = aim - excl;
    var found = NONE;
    var last = NONE;
    for (var i = lo; i < hi; i++) {
      let f = contrib(mode, i, t, cut);
      if (f > 0.0) {
        acc += f;
        last = i;
        if (acc > local_target) {
          found = i;
          break;
        }
      }
    }
    picked = select(found, last, found == NONE);
  }
  return workgroupUniformLoad(&picked);
}

// The cut that keeps the prefix found by find_level: all above level t, plus the lowest-id
// `r` of the tokens tied at t.
fn cut_at(level: vec3<u32>, r: f32, cut: vec2<u32>) -> vec2<u32> {
  let id = ordered_pick(MODE_TIES, level.x, cut, max(r, 1.0) - 1.0, false);
  return vec2<u32>(level.x, id);
}

fn cut_count(k: f32, cut: vec2<u32>) -> vec2<u32> {
  let level = find_level(false, k, cut);
  return cut_at(level, k - bitcast<f32>(level.y), cut);
}

fn cut_mass(top_p: f32, cut: vec2<u32>) -> vec2<u32> {
  let level = find_level(true, top_p, cut);
  let w_t = weight(key_value(level.x));
  let need = bitcast<f32>(level.z) - bitcast<f32>(level.y);
  return cut_at(level, ceil(need / w_t), cut);
}

// Raw max / sum (for the logprob) and penalised max / argmax of the row, in one pass.
struct RowStats {
  raw_lse: f32,
  pen_max: f32,
  pen_arg: u32,
}

// A running penalised max and its id (NONE before the first).
struct Best {
  p: f32,
  id: u32,
}

// `best` updated with id i (when `ok`): ids come in ascending order per thread, so the first of
// equal values wins, as in the reference.
fn arg_step(best: Best, i: u32, ok: bool) -> Best {
  if (!ok) {
    return best;
  }
  let p = penalised(i);
  if (p > best.p || best.id == NONE) {
    return Best(p, i);
  }
  return best;
}

// Four ids per loop trip (i, i + WG, i + 2 WG, i + 3 WG): a trip costs ~30 ns on an H200 whatever
// its body, and one workgroup walks the whole vocabulary.
fn row_stats() -> RowStats {
  var m = NEG;
  var s = 0.0;
  var best = Best(NEG, NONE);
  for (var i = lid; i < V; i += 4u * WG) {
    let ids = vec4<u32>(i, i + WG, i + 2u * WG, i + 3u * WG);
    let ok = ids < vec4<u32>(V);
    let at = vec4<u32>(base) + min(ids, vec4<u32>(V - 1u));
    let x = select(vec4<f32>(NEG), vec4<f32>(logits[at.x], logits[at.y], logits[at.z],
      logits[at.w]), ok);
    // Online log-sum-exp over the valid ids: rescale once to the new max, then add.
    let mx = max(max(x.x, x.y), max(x.z, x.w));
    if (mx > m) {
      s = s * exp(m - mx);
      m = mx;
    }
    s += dot(select(vec4<f32>(0.0), exp(x - vec4<f32>(m)), ok), vec4<f32>(1.0));
    // @unroll
    for (var c = 0u; c < 4u; c++) {
      best = arg_step(best, ids[c], ok[c]);
    }
  }
  var pm = best.p;
  var pa = best.id;
  part[0][lid] = m;
  part[1][lid] = s;
  part[2][lid] = pm;
  part_u[lid] = pa;
  for (var st = WG / 2u; st > 0u; st >>= 1u) {
    workgroupBarrier();
    if (lid < st) {
      let m2 = part[0][lid + st];
      let mm = max(m, m2);
      s = s * exp(m - mm) + part[1][lid + st] * exp(m2 - mm);
      m = mm;
      part[0][lid] = m;
      part[1][lid] = s;
      let p2 = part[2][lid + st];
      let a2 = part_u[lid + st];
      if (a2 != NONE && (pa == NONE || p2 > pm || (p2 == pm && a2 < pa))) {
        pm = p2;
        pa = a2;
        part[2][lid] = pm;
        part_u[lid] = pa;
      }
    }
  }
  workgroupBarrier();
  let r = RowStats(part[0][0] + log(part[1][0]), part[2][0], part_u[0]);
  workgroupBarrier(); // part is free again
  return r;
}

// Samples logits row `row` with sequence `seq`'s parameters and penalty counts (plus `extra`); the
// row is the sequence's `j`-th of a verification pass (0 otherwise).
fn sample_row(row: u32, seq: u32, j: u32) {
  V = dims.vocab;
  base = row * V;
  cbase = seq * V;
  sp = params[seq];
  mask_setup(sp.grammar, seq, j);
  has_pen = sp.repetition_penalty != 1.0 || sp.presence_penalty != 0.0 ||
    sp.frequency_penalty != 0.0;
  let st = row_stats();
  pen_max = st.pen_max;
  var tok = st.pen_arg;
  if (sp.temperature > 0.0) {
    var cut = vec2<u32>(0u, NONE); // everything
    if (sp.top_k > 0u && sp.top_k < V) { cut = cut_count(f32(sp.top_k), cut); }
    if (sp.top_p <= 0.0) {
      cut = cut_count(1.0, cut);
    } else if (sp.top_p < 1.0) {
      cut = cut_mass(sp.top_p, cut);
    }
    let w0 = philox4x32(vec4<u32>(position[row], 0u, 0u, 0u), vec2<u32>(sp.seed_lo, sp.seed_hi)).x;
    let u = f32(w0 >> 8u) * (1.0 / 16777216.0);
    let pick = ordered_pick(MODE_KEPT, 0u, cut, u, true);
    tok = select(pick, tok, pick == NONE);
  }
  if (lid == 0u) {
    out[2u * row] = tok;
    out[2u * row + 1u] = bitcast<u32>(logits[base + tok] - st.raw_lse);
  }
}

@compute @workgroup_size(WG)
fn main(
  @builtin(workgroup_id) wid: vec3<u32>,
  @builtin(num_workgroups) nwg: vec3<u32>,
  @builtin(local_invocation_index) li: u32,
) {
  let row = wid.y * nwg.x + wid.x;
  if (row >= dims.rows) { return; }
  lid = li;
  n_extra = 0u;
  sample_row(row, row, 0u);
}

// A verification pass: row j of a sequence samples the token after its drafts 1..j exactly as
// plain decoding would after generating them: the sequence's parameters and counts, the drafts
// counted as generated, Philox at the row's own position.
@compute @workgroup_size(WG)
fn verify_main(
  @builtin(workgroup_id) wid: vec3<u32>,
  @builtin(num_workgroups) nwg: vec3<u32>,
  @builtin(local_invocation_index) li: u32,
) {
  let row = wid.y * nwg.x + wid.x;
  if (row >= dims.rows) { return; }
  lid = li;
  let seq = row / SEQ_ROWS;
  let j = row % SEQ_ROWS;
  n_extra = min(j, MAX_EXTRA);
  for (var t = 0u; t < n_extra; t++) {
    extra[t] = row_tok[seq * SEQ_ROWS + 1u + t];
  }
  sample_row(row, seq, j);
}

// counts[row, token] += 1 and mark seen, for the token main() wrote to `out`.
@compute @workgroup_size(64)
fn update_counts(@builtin(global_invocation_id) gid: vec3<u32>) {
  let row = gid.x;
  if (row >= dims.rows) { return; }
  let tok = out[2u * row];
  if (tok >= dims.vocab) { return; }
  let i = row * dims.vocab + tok;
  let c = counts[i];
  counts[i] = (c & ~COUNT_MASK) | SEEN_BIT | min((c & COUNT_MASK) + 1u, COUNT_MASK);
}

// Test entry: raw Philox words for dims.rows (counter, key) vectors.
@compute @workgroup_size(64)
fn philox_test(@builtin(global_invocation_id) gid: vec3<u32>) {
  let n = gid.x;
  if (n >= dims.rows) { return; }
  let a = 6u * n;
  let c = vec4<u32>(philox_in[a], philox_in[a + 1u], philox_in[a + 2u], philox_in[a + 3u]);
  let w = philox4x32(c, vec2<u32>(philox_in[a + 4u], philox_in[a + 5u]));
  for (var j = 0u; j < 4u; j++) { out[4u * n + j] = w[j]; }
}
