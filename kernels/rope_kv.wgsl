// RoPE + KV-cache write. Input: the fused projection qkv[T, (Hq + 2 Hkv) * D] (q heads, then k
// heads, then v heads). Hugging Face rotate-half RoPE on q and k (`rope_pair`, rope_common.wgsl,
// prepended by the wrapper).
// Rotated q goes to q[T, Hq, D]; rotated k and plain v go into the paged pools at
// (tok_seq[t], pos[t]): block block_table[slot * max_blocks + pos / 16], row pos % 16.
// One thread per (token, head, pair of adjacent elements 2i, 2i + 1): a pool word of an f16
// cache holds such a pair, so no two threads write one word. Each element of k is rotated with
// its partner D / 2 away (the pair's partners may be split across words); v heads just copy.

override WG: u32 = 64u;
override KV16: bool = false; // the pools hold f16, two per word (else f32 bits)

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
@group(0) @binding(7) var<storage, read_write> k_pool: array<u32>;
@group(0) @binding(8) var<storage, read_write> v_pool: array<u32>;

// Element e of the head at `src` in qkv: rotated at `position` (q and k heads) or as is (v).
fn element(src: u32, e: u32, position: u32, rotate: bool) -> f32 {
  if (!rotate) {
    return qkv[src + e];
  }
  let half = p.head_dim / 2u;
  let partner = qkv[src + rope_partner(e, half)];
  return rope_elem(e, half, qkv[src + e], partner, position, inv_freq[e % half]);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let pairs = p.head_dim / 2u;
  let heads = p.n_heads + 2u * p.n_kv_heads;
  let idx = (wid.y * p.groups_x + wid.x) * WG + lid;
  if (idx >= p.tokens * heads * pairs) {
    return;
  }
  let e = (idx % pairs) * 2u;
  let hh = (idx / pairs) % heads;
  let t = idx / (pairs * heads);
  let src = (t * heads + hh) * p.head_dim;
  let position = pos[t];
  let is_v = hh >= p.n_heads + p.n_kv_heads;
  let x0 = element(src, e, position, !is_v);
  let x1 = element(src, e + 1u, position, !is_v);

  if (hh < p.n_heads) {
    let o = (t * p.n_heads + hh) * p.head_dim + e;
    q[o] = x0;
    q[o + 1u] = x1;
    return;
  }
  let kvh = (hh - p.n_heads) % p.n_kv_heads;
  let logical = position / BLOCK;
  if (logical >= p.max_blocks) {
    return; // no such block: drop the write rather than scribble over another slot's row
  }
  let b = block_table[tok_seq[t] * p.max_blocks + logical];
  let o = (((b * p.n_layers + p.layer) * p.n_kv_heads + kvh) * BLOCK + position % BLOCK) *
      p.head_dim + e;
  if (KV16) {
    let word = pack2x16float(vec2<f32>(x0, x1));
    if (is_v) {
      v_pool[o / 2u] = word;
    } else {
      k_pool[o / 2u] = word;
    }
  } else if (is_v) {
    v_pool[o] = bitcast<u32>(x0);
    v_pool[o + 1u] = bitcast<u32>(x1);
  } else {
    k_pool[o] = bitcast<u32>(x0);
    k_pool[o + 1u] = bitcast<u32>(x1);
  }
}
