// RoPE + KV-cache write. Input: the fused projection qkv[T, (Hq + 2 Hkv) * D] (q heads, then k
// heads, then v heads). Hugging Face rotate-half RoPE on q and k (`rope_pair`, rope_common.wgsl,
// prepended by the wrapper).
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
  let rot = rope_pair(x0, x1, position, inv_freq[i]);
  let r0 = rot.x;
  let r1 = rot.y;

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
