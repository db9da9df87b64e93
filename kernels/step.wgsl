// The decode loop's bookkeeping on the GPU, so no token travels to the host between steps.
// step_begin: each running slot takes the next position; finished or empty slots point at the
//   trash position, whose block-table entry is the trash block, so their writes harm nobody.
// step_end: each running slot takes its sampled token as the next input, records it in the ring
//   (read back once per submission) and, when a history is kept, at its position in `hist`
//   (speculation drafts from it), updates penalty counts and sets `done` on EOS / max tokens.

struct Params {
  slot_begin: u32,
  slot_end: u32,
  vocab: u32,
  ring_offset: u32, // element offset (in vec2 units) of this step's row in the ring
  trash_pos: u32,
  n_eos: u32,
  ring_stride: u32, // ring entries per slot (speculation's rows + 1; else 1)
  hist_len: u32, // positions per history row (0: none kept)
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> seq_len: array<u32>;
@group(0) @binding(2) var<storage, read_write> pos: array<u32>;
// x = done (0 running, 1 finished), y = tokens still allowed, z = stop at EOS (1/0), w unused
@group(0) @binding(3) var<storage, read_write> slot_state: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read_write> next_tok: array<u32>;
@group(0) @binding(5) var<storage, read_write> sampled: array<vec2<u32>>; // (token, f32 logprob)
@group(0) @binding(6) var<storage, read_write> ring: array<vec2<u32>>;
@group(0) @binding(7) var<storage, read_write> counts: array<u32>; // [slots, vocab]
@group(0) @binding(8) var<storage, read_write> eos: array<u32>;
@group(0) @binding(9) var<storage, read_write> hist: array<u32>; // [slots, hist_len]

override WG: u32 = 64;
// The ring's token for a slot that was already finished (kernels/step.ts NO_TOKEN).
override NO_TOKEN: u32;

@compute @workgroup_size(WG)
fn step_begin(@builtin(global_invocation_id) g: vec3u) {
  let s = p.slot_begin + g.x;
  if (s >= p.slot_end) { return; }
  if (slot_state[s].x == 0u) {
    let n = seq_len[s];
    pos[s] = n;
    seq_len[s] = n + 1u;
  } else {
    pos[s] = p.trash_pos;
  }
}

@compute @workgroup_size(WG)
fn step_end(@builtin(global_invocation_id) g: vec3u) {
  let s = p.slot_begin + g.x;
  if (s >= p.slot_end) { return; }
  var st = slot_state[s];
  let out = p.ring_offset + s * p.ring_stride;
  if (st.x != 0u) {
    ring[out] = vec2<u32>(NO_TOKEN, 0u);
    return;
  }
  let tok = sampled[s].x;
  ring[out] = sampled[s];
  next_tok[s] = tok;
  // The sampled token's position: seq_len after step_begin (or after a prefill).
  let at = seq_len[s];
  if (at < p.hist_len) {
    hist[s * p.hist_len + at] = tok;
  }
  let ci = s * p.vocab + tok;
  counts[ci] = ((counts[ci] & 0x3fffffffu) + 1u) | 0x80000000u;
  st.y = st.y - 1u;
  var stop = st.y == 0u;
  if (st.z != 0u) {
    for (var i = 0u; i < p.n_eos; i++) {
      if (eos[i] == tok) { stop = true; }
    }
  }
  if (stop) { st.x = 1u; }
  slot_state[s] = st;
}
