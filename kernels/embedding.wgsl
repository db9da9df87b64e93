// Embedding lookup: out[t, c] = E[tokens[t], c], E in any weight dtype, out f32.
// One invocation per output element; the token ids come from a storage buffer so a built
// dispatch can be re-encoded every decode step (the sampler writes the ids on the GPU).

override WG: u32 = 256u;
// Weight dtype: 0 = f32, 1 = f16, 2 = bf16 (docs/internals.md).
override WDTYPE: u32 = 1u;

struct Params {
  count: u32, // T, tokens in the step
  cols: u32, // width of one table row
  rows: u32, // rows in the table (ids past the end are clamped, never read out of bounds)
  groups_x: u32, // workgroups along x (the grid may be split over x and y)
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> table: array<u32>;
@group(0) @binding(2) var<storage, read> tokens: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

// Element i of the flat weight tensor, widened to f32.
fn weight_at(i: u32) -> f32 {
  if (WDTYPE == 0u) {
    return bitcast<f32>(table[i]);
  }
  let word = table[i >> 1u];
  if (WDTYPE == 1u) {
    return unpack2x16float(word)[i & 1u];
  }
  // bf16: the even element is the low half.
  return bitcast<f32>(select(word << 16u, word & 0xffff0000u, (i & 1u) == 1u));
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let i = (wid.y * p.groups_x + wid.x) * WG + lid;
  if (i >= p.count * p.cols) {
    return;
  }
  let t = i / p.cols;
  let c = i - t * p.cols;
  let row = min(tokens[t], p.rows - 1u);
  out[i] = weight_at(row * p.cols + c);
}
