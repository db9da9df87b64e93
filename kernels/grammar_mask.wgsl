// Grammar masks for kernels/sample.wgsl, prepended to it in batches with a constrained row
// (kernels/sample.ts `mask`; grammar_nomask.wgsl otherwise). The table image layout is
// docs/grammar.md's: offsets are in words from the image's first word `g`, which the row's
// SampleParams.grammar holds (NO_GRAMMAR: unconstrained).
//
// A row in state s with r tokens still allowed (this one included) samples from the state's
// allowed row, or from its finish row when some allowed token could lead further from acceptance
// than the budget reaches (maxNext >= r): then every output is complete when the budget runs out.

@group(0) @binding(8) var<storage, read> grammar: array<u32>; // packed table images
@group(0) @binding(9) var<storage, read> gram_state: array<u32>; // [seqs] each one's state
// [seqs] y: tokens still allowed (kernels/step.wgsl); a verification row j has j fewer
@group(0) @binding(10) var<storage, read> slot_state: array<vec4<u32>>;

const NO_GRAMMAR: u32 = 0xffffffffu;

var<private> m_on: bool;
var<private> m_rows: u32; // word of the mask row's block ids
var<private> m_blocks: u32; // word of block 0

fn mask_setup(g: u32, seq: u32, j: u32) {
  m_on = g != NO_GRAMMAR;
  if (!m_on) {
    return;
  }
  let y = slot_state[seq].y;
  let r = select(0u, y - j, y > j);
  let rec = g + grammar[g + 10u] + 4u * gram_state[seq];
  let tight = grammar[rec + 3u] >= r;
  let row = grammar[rec + select(0u, 1u, tight)];
  m_rows = g + grammar[g + 11u] + row * grammar[g + 5u];
  m_blocks = g + grammar[g + 12u];
}

fn mask_allows(t: u32) -> bool {
  if (!m_on) {
    return true;
  }
  let block = grammar[m_rows + (t >> 10u)];
  return ((grammar[m_blocks + block * 32u + ((t >> 5u) & 31u)] >> (t & 31u)) & 1u) != 0u;
}
