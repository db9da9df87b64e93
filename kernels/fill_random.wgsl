// Random weights written straight into a GPU buffer (the bench's synthetic models): element i is
// center + scale * u(seed, i) with u uniform in [-1, 1), stored as f32, f16 or bf16 per
// docs/internals.md (16-bit: two halves per u32, the even element in the low half). The value is
// a hash of (seed, i), so every word is computed independently and the result does not depend on
// the launch shape. |center| + |scale| stays far below 65504, so f16 never overflows to Inf.

override WG: u32 = 256u;
// Weight dtype: 0 = f32, 1 = f16, 2 = bf16 (docs/internals.md).
override WDTYPE: u32 = 1u;

struct Params {
  words: u32, // u32 words to write
  count: u32, // elements in the tensor (a 16-bit tensor's padding half is written as 0)
  seed: u32,
  groups_x: u32, // workgroups along x (the grid may be split over x and y)
  scale: f32,
  center: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;

// PCG output permutation (Jarzynski & Olano, "Hash Functions for GPU Rendering", 2020).
fn pcg(x: u32) -> u32 {
  let s = x * 747796405u + 2891336453u;
  let w = ((s >> ((s >> 28u) + 4u)) ^ s) * 277803737u;
  return (w >> 22u) ^ w;
}

// Element i's value: 24 random bits → uniform in [-1, 1), then scaled.
fn value(i: u32) -> f32 {
  let h = pcg(pcg(i) ^ pcg(p.seed ^ 0x9e3779b9u));
  let u = f32(h >> 8u) * (2.0 / 16777216.0) - 1.0;
  return p.center + p.scale * u;
}

// Round-to-nearest-even bf16 bits of a finite f32 (in the low 16 bits).
fn bf16_bits(x: f32) -> u32 {
  let u = bitcast<u32>(x);
  return (u + 0x7fffu + ((u >> 16u) & 1u)) >> 16u;
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) g: vec3u) {
  let w = g.x + g.y * p.groups_x * WG;
  if (w >= p.words) { return; }
  if (WDTYPE == 0u) {
    out[w] = bitcast<u32>(value(w));
    return;
  }
  let i = 2u * w;
  let a = value(i);
  var b = 0.0;
  if (i + 1u < p.count) { b = value(i + 1u); }
  if (WDTYPE == 1u) {
    out[w] = pack2x16float(vec2<f32>(a, b));
  } else {
    var hi = 0u;
    if (i + 1u < p.count) { hi = bf16_bits(b); }
    out[w] = bf16_bits(a) | (hi << 16u);
  }
}
