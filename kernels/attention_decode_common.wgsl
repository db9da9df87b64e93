// Shared by decode attention's two entry points (kernels/attention_decode.ts prepends it to
// attention_decode.wgsl, `main`, and to attention_combine.wgsl, `combine`, after
// attention_mask.wgsl): the launch's sizes, its Params, the bindings both use and the chunks a
// slot visits.

override WG: u32 = 256u; // threads of `main`: 64, 128 or 256
override HD: u32 = 64u; // head_dim, a multiple of 4
const CWG: u32 = 64u; // threads of `combine`, >= HD / 4 and >= the split count
const CMAX: u32 = 16u; // partials per `combine` thread
const NEG: f32 = -1e30;
const TPK: u32 = 4u; // threads per key (scoring: one vec4 component of partial sums each)

override D4: u32 = HD / 4u;
override KEYS: u32 = WG / TPK; // keys per chunk, a multiple of 16
override CG: u32 = CWG / D4; // split groups of `combine`

struct Params {
  seqs: u32,
  n_heads: u32,
  n_kv_heads: u32,
  group: u32, // n_heads / n_kv_heads
  row_groups: u32, // workgroups per kv head along y: ceil(group / ROWS)
  layer: u32,
  n_layers: u32,
  max_blocks: u32,
  scale_log2e: f32,
  n_split: u32, // splits per (slot, kv head), <= CWG and <= CG * CMAX; 1 = single pass
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(5) var<storage, read> seq_len: array<u32>; // [S]
// out [S, Hq, D4]; for `main` with splits, the partials: acc [S, Hq, n_split, D4], then
// (m, l, 0, 0) [S, Hq, n_split]
@group(0) @binding(8) var<storage, read_write> dst: array<vec4<f32>>;

// Vec4 offset of q head h of slot s in `out`.
fn head_row(s: u32, h: u32) -> u32 {
  return (s * p.n_heads + h) * D4;
}

// The chunks of KEYS keys that a query attending seq_len `len` visits, as mask_span gives them
// for its position len - 1 (`main` divides them over the splits, `combine` counts them); none
// for an empty slot.
fn decode_span(len: u32) -> vec3<u32> {
  if (len == 0u) {
    return vec3<u32>(0u);
  }
  return mask_span(len - 1u, len - 1u, KEYS);
}

// Whether the query of a slot attending seq_len `len` sees key `key`.
fn key_seen(key: u32, len: u32) -> bool {
  return key < len && mask_live(len - 1u, key);
}
