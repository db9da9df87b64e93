// What a request constrains besides the sampler's own settings, on the GPU:
//
// apply_bias (a workgroup per logits row): logit_bias, added to the raw logits in place before
//   sampling (so the logprob and top_logprobs include it). Row r belongs to sequence
//   r / rows_per_seq, whose SampleParams.n_bias entries (token, f32 bias) are row
//   seq of `bias` ([seqs, max_bias]); a sequence's ids are distinct, so no two threads add to one
//   logit.
// grammar_advance (a thread per slot): after the step kernel recorded this step's tokens in the
//   ring, a constrained slot (SampleParams.grammar, docs/grammar.md) walks its state through each
//   new token's bytes (the token-bytes image, vocab.ts tokenBytesImage) and the tables' byte
//   classes and transitions. An EOS token has no bytes: the state stays (the slot is done).

struct Params {
  slot_begin: u32, // grammar_advance: slots [slot_begin, slot_end); apply_bias: rows
  slot_end: u32,
  ring_offset: u32, // entry of this step's row in the ring
  ring_stride: u32, // ring entries per slot
  tokens: u32, // entries of a slot that hold tokens (1, or a verification pass's R)
  rows_per_seq: u32, // apply_bias: logits rows per sequence
  vocab: u32,
  max_bias: u32, // apply_bias: entries per sequence in `bias`
}

@group(0) @binding(0) var<uniform> p: Params;
// SampleParams [seqs] as words (kernels/sample.ts SAMPLE_PARAMS_BYTES): grammar @9, n_bias @10
@group(0) @binding(1) var<storage, read> params: array<u32>;
@group(0) @binding(2) var<storage, read> ring: array<vec2<u32>>; // (token, logprob)
@group(0) @binding(3) var<storage, read> grammar: array<u32>; // packed table images
@group(0) @binding(4) var<storage, read> tok_bytes: array<u32>; // the token-bytes image
@group(0) @binding(5) var<storage, read_write> gram_state: array<u32>; // [slots]
@group(0) @binding(6) var<storage, read_write> logits: array<f32>; // [rows, vocab]
@group(0) @binding(7) var<storage, read> bias: array<vec2<u32>>; // [seqs, max_bias]

const PARAM_WORDS: u32 = 12u;
const NO_GRAMMAR: u32 = 0xffffffffu;
const DEAD: u32 = 0xffffffffu;
override NO_TOKEN: u32;
override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn apply_bias(@builtin(workgroup_id) wid: vec3u, @builtin(local_invocation_index) lid: u32) {
  let row = p.slot_begin + wid.x;
  if (row >= p.slot_end) {
    return;
  }
  let seq = row / p.rows_per_seq;
  let n = min(params[seq * PARAM_WORDS + 10u], p.max_bias);
  for (var e = lid; e < n; e += WG) {
    let b = bias[seq * p.max_bias + e];
    if (b.x < p.vocab) {
      logits[row * p.vocab + b.x] += bitcast<f32>(b.y);
    }
  }
}

@compute @workgroup_size(WG)
fn grammar_advance(@builtin(global_invocation_id) gid: vec3u) {
  let s = p.slot_begin + gid.x;
  if (s >= p.slot_end) {
    return;
  }
  let g = params[s * PARAM_WORDS + 9u];
  if (g == NO_GRAMMAR) {
    return;
  }
  let C = grammar[g + 3u];
  let cls = g + grammar[g + 8u];
  let trans = g + grammar[g + 9u];
  let V = tok_bytes[0];
  var st = gram_state[s];
  for (var j = 0u; j < p.tokens; j++) {
    let tok = ring[p.ring_offset + s * p.ring_stride + j].x;
    if (tok == NO_TOKEN || tok >= V) {
      break;
    }
    for (var b = tok_bytes[1u + tok]; b < tok_bytes[2u + tok] && st != DEAD; b++) {
      let byte = (tok_bytes[V + 2u + (b >> 2u)] >> (8u * (b & 3u))) & 0xffu;
      let c = (grammar[cls + (byte >> 2u)] >> (8u * (byte & 3u))) & 0xffu;
      st = grammar[trans + st * C + c];
    }
  }
  gram_state[s] = st;
}
