// RoPE + KV-cache write. Input: the fused projection qkv[T, (Hq + 2 Hkv) * D] (q heads, then k
// heads, then v heads). Hugging Face rotate-half RoPE on q and k: for i < D/2 with
// angle = pos * inv_freq[i] (f32, as HF computes it),
//   x'[i] = x[i] cos - x[i + D/2] sin,   x'[i + D/2] = x[i + D/2] cos + x[i] sin.
// Rotated q goes to q[T, Hq, D]; rotated k and plain v go into the paged pools at
// (tok_seq[t], pos[t]): block block_table[slot * max_blocks + pos / 16], row pos % 16.
// One thread per (token, head, rotation pair i); v heads just copy their pair.

override WG: u32 = 64u;

const BLOCK: u32 = 16u; // tokens per KV block (docs/internals.md)

struct Params {
  tokens: u32,
  n_heads: u32,
  n_kv_heads: u32,
  head_dim: u32,
  layer: u32,
  n_layers: u32,
  max_blocks: u32,
  groups_x: u32, // workgroups along x (the grid may be split over x and y)
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read> pos: array<u32>;
@group(0) @binding(3) var<storage, read> tok_seq: array<u32>;
@group(0) @binding(4) var<storage, read> block_table: array<u32>;
@group(0) @binding(5) var<storage, read> inv_freq: array<f32>;
@group(0) @binding(6) var<storage, read_write> q: array<f32>;
@group(0) @binding(7) var<storage, read_write> k_pool: array<f32>;
@group(0) @binding(8) var<storage, read_write> v_pool: array<f32>;

// pi/2 in 6-bit pieces: k * PIO2_1..4 is exact for |k| < 2^18, so the reduction below loses
// nothing for |a| < 4e5 (positions up to ~400k). The built-in cos/sin are only specified to
// ~2^-11 on [-pi, pi] and get worse with larger arguments on real GPUs.
const PIO2_1: f32 = 1.5625;
const PIO2_2: f32 = 0.00830078125;
const PIO2_3: f32 = -0.000004410743713378906;
const PIO2_4: f32 = -4.377216100692749e-8;
const PIO2_5: f32 = 6.077094383272197e-11;

// (sin a, cos a) to ~1e-7 absolute: Cody-Waite reduction to r in [-pi/4, pi/4] and quadrant,
// then the Cephes single-precision polynomials.
fn sin_cos(a: f32) -> vec2<f32> {
  let k = round(a * 0.63661977236);
  var r = a - k * PIO2_1;
  r = r - k * PIO2_2;
  r = r - k * PIO2_3;
  r = r - k * PIO2_4;
  r = r - k * PIO2_5;
  let z = r * r;
  let s = r + r * z * (-1.6666654611e-1 + z * (8.3321608736e-3 + z * -1.9515295891e-4));
  let c = 1.0 - 0.5 * z +
    z * z * (4.166664568298827e-2 + z * (-1.388731625493765e-3 + z * 2.443315711809948e-5));
  switch (u32(i32(k)) & 3u) {
    case 0u: { return vec2<f32>(s, c); }
    case 1u: { return vec2<f32>(c, -s); }
    case 2u: { return vec2<f32>(-s, -c); }
    default: { return vec2<f32>(-c, s); }
  }
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let half = p.head_dim / 2u;
  let heads = p.n_heads + 2u * p.n_kv_heads;
  let idx = (wid.y * p.groups_x + wid.x) * WG + lid;
  if (idx >= p.tokens * heads * half) {
    return;
  }
  let i = idx % half;
  let hh = (idx / half) % heads;
  let t = idx / (half * heads);
  let src = (t * heads + hh) * p.head_dim + i;
  let x0 = qkv[src];
  let x1 = qkv[src + half];
  let position = pos[t];
  let sc = sin_cos(f32(position) * inv_freq[i]);
  let r0 = x0 * sc.y - x1 * sc.x;
  let r1 = x1 * sc.y + x0 * sc.x;

  if (hh < p.n_heads) {
    let o = (t * p.n_heads + hh) * p.head_dim + i;
    q[o] = r0;
    q[o + half] = r1;
    return;
  }
  let is_v = hh >= p.n_heads + p.n_kv_heads;
  let kvh = (hh - p.n_heads) % p.n_kv_heads;
  let logical = position / BLOCK;
  if (logical >= p.max_blocks) {
    return; // no such block: drop the write rather than scribble over another slot's row
  }
  let b = block_table[tok_seq[t] * p.max_blocks + logical];
  let o = (((b * p.n_layers + p.layer) * p.n_kv_heads + kvh) * BLOCK + position % BLOCK) *
      p.head_dim + i;
  if (is_v) {
    v_pool[o] = x0;
    v_pool[o + half] = x1;
  } else {
    k_pool[o] = r0;
    k_pool[o + half] = r1;
  }
}
