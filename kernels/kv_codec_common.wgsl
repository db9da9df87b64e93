// The read side of the KV codecs (kernels/kv_codec.ts draws the formats; docs/kv_codecs.md says
// why they look this way). Prepended to kv_codec.wgsl and to the attention kernels, which supply
// `HD` (the head dim, an override) and `pool_word(is_v, w)`: word w (u32) of the K or V pool.
// With KV_CODEC 0 (no codec, the default) every test of it below is a constant false and the
// compiler drops the branch: the attention kernels read their pools as they always did.
//
// A codec block is [layer, kv head] head blocks of CHW words each, in both pools at the same
// place: codec block b (b >= KV_HOT) starts at word KV_BASE + (b - KV_HOT) * heads * CHW. A head
// block holds 16 rows (tokens) x HD channels and carries its own scales. Element (t, c) has the
// flat index i = t * HD + c; c is a multiple of 4 wherever a vec4 is read (HD % 4 == 0), so the
// 4 elements of a read never straddle a word of codes.
//   1 f16    halves, two per word (pack2x16float's order): words [0, 8 HD)
//   2 int8   codes q in [-127, 127], four per word (byte 0 lowest): words [0, 4 HD); then one
//            f32 scale per row, words [4 HD, 4 HD + 16): x = q * scale[t]
//   3 bfp4   4-bit two's complement mantissas m in [-7, 7], eight per word: words [0, 2 HD);
//            then exponent bytes E from word 2 HD: K one per channel (the group is the block's
//            16 rows of that channel), V one per row and 16 channels (byte t * G + c / 16,
//            G = ceil(HD / 16)): x = m * 2^(E - 127)
//   4 sign1  f16 channel means mu[c] over the 16 rows: words [0, HD / 2); sign bits of
//            x - mu (1: >= 0), bit i % 32 of word HD / 2 + i / 32; f16 row magnitudes a[t]
//            (the mean |x - mu| of the row): words [HD, HD + 8): x = mu[c] +- a[t]

override KV_CODEC: u32 = 0u;
override KV_HOT: u32 = 4294967295u; // first codec block id: blocks [0, KV_HOT) are hot
override KV_BASE: u32 = 0u; // word of codec block KV_HOT in each pool
override CHW: u32 = 4u; // words of one codec head block

// A codec row in decode attention's row addresses (vec4 offsets of hot rows stay below 2^31):
// the tag, the head block's word / 4 (head blocks are 16-byte aligned) in bits 4..30, the row
// in bits 0..3.
const CODEC_ROW: u32 = 0x80000000u;

// Word of the head block `head` (of `heads` per block) of codec block b.
fn codec_head(b: u32, head: u32, heads: u32) -> u32 {
  return KV_BASE + ((b - KV_HOT) * heads + head) * CHW;
}

// The tagged row address of row t of a codec head block (see CODEC_ROW).
fn codec_row(b: u32, head: u32, heads: u32, t: u32) -> u32 {
  return CODEC_ROW | ((codec_head(b, head, heads) / 4u) << 4u) | t;
}

// Elements c .. c + 3 of the row at tagged address `row` (codec_row).
fn codec_load(is_v: bool, row: u32, c: u32) -> vec4<f32> {
  return codec_vec4(is_v, ((row & ~CODEC_ROW) >> 4u) * 4u, row & 15u, c);
}

// Signed 8-bit lanes of w (byte 0 first).
fn lanes8(w: u32) -> vec4<f32> {
  return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(w) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u));
}

// Elements c .. c + 3 (c % 4 == 0) of row t of the head block at word hb, decoded.
fn codec_vec4(is_v: bool, hb: u32, t: u32, c: u32) -> vec4<f32> {
  let i = t * HD + c;
  if (KV_CODEC == 1u) {
    return vec4<f32>(unpack2x16float(pool_word(is_v, hb + i / 2u)),
      unpack2x16float(pool_word(is_v, hb + i / 2u + 1u)));
  }
  if (KV_CODEC == 2u) {
    return lanes8(pool_word(is_v, hb + i / 4u)) * bitcast<f32>(pool_word(is_v, hb + 4u * HD + t));
  }
  if (KV_CODEC == 3u) {
    let sh = vec4<u32>((i % 8u) * 4u) + vec4<u32>(0u, 4u, 8u, 12u);
    let m = bitcast<vec4<i32>>(vec4<u32>(pool_word(is_v, hb + i / 8u)) << (vec4<u32>(28u) - sh)) >>
      vec4<u32>(28u);
    var e: vec4<u32>;
    if (is_v) {
      let bi = t * ((HD + 15u) / 16u) + c / 16u;
      e = vec4<u32>((pool_word(is_v, hb + 2u * HD + bi / 4u) >> (8u * (bi % 4u))) & 255u);
    } else {
      e = (vec4<u32>(pool_word(is_v, hb + 2u * HD + c / 4u)) >> vec4<u32>(0u, 8u, 16u, 24u)) &
        vec4<u32>(255u);
    }
    return ldexp(vec4<f32>(m), bitcast<vec4<i32>>(e) - vec4<i32>(127));
  }
  // sign1
  let mu = vec4<f32>(unpack2x16float(pool_word(is_v, hb + c / 2u)),
    unpack2x16float(pool_word(is_v, hb + c / 2u + 1u)));
  let bits = (vec4<u32>(pool_word(is_v, hb + HD / 2u + i / 32u)) >>
    (vec4<u32>(i % 32u) + vec4<u32>(0u, 1u, 2u, 3u))) & vec4<u32>(1u);
  let a = unpack2x16float(pool_word(is_v, hb + HD + t / 2u))[t % 2u];
  return mu + select(vec4<f32>(-a), vec4<f32>(a), bits == vec4<u32>(1u));
}
