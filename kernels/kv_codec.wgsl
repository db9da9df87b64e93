// KV codecs on the GPU: `encode` turns hot blocks of the pools (f32 or f16, [layer, kv head,
// 16 rows, HD]) into codec blocks of the same pools; `decode` turns codec blocks back into the
// hot form, into `out` laid out as KvPool.copyOut lays blocks out (item i's K, then its V, each
// a whole hot block). The formats and the read side: kv_codec_common.wgsl (prepended by the
// wrapper, kernels/kv_codec.ts).
//
// One workgroup per (head block, item, K or V). `encode` works in three steps, each a loop of
// the threads over what it makes, so any head dim fits one shape of workgroup:
//   A  per channel c (over the block's 16 rows): bfp4 K's exponent, sign1's f16 mean -> chan[c]
//   B  per row t, or per (row, 16 channels) for bfp4 V: int8's scale, bfp4 V's exponent,
//      sign1's f16 mean magnitude of x - mu -> grp[g]
//   C  every word of the codec head block, from the hot values and those statistics
// Exponents are exact: frexp, no log2 (the reference reproduces them bit for bit); int8's scale
// is max |x| / 127 in f32. Rounding is round-half-to-even (WGSL `round`). f16 values are clamped
// to +-65504 first (pack2x16float of a larger value is undefined).

override WG: u32 = 64u;
override HD: u32 = 64u; // head dim, a multiple of 4
override KV16: bool = false; // the hot blocks hold f16, two per word (else f32)

const ROWS: u32 = 16u; // tokens per block
const F16_MAX: f32 = 65504.0;
override G: u32 = (HD + 15u) / 16u; // bfp4 V: exponent groups per row

struct Params {
  items: u32,
  heads: u32, // layers x kv heads
  hot_words: u32, // words of one hot block (in each pool)
  _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
// encode: (hot block, codec block); decode: (codec block, item of `out`)
@group(0) @binding(1) var<storage, read> pairs: array<vec2<u32>>;
@group(0) @binding(2) var<storage, read_write> k_pool: array<u32>;
@group(0) @binding(3) var<storage, read_write> v_pool: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<u32>; // decode only

var<workgroup> chan: array<f32, HD>;
var<workgroup> grp: array<f32, ROWS * G>;

fn pool_word(is_v: bool, w: u32) -> u32 {
  if (is_v) {
    return v_pool[w];
  }
  return k_pool[w];
}

fn pool_put(is_v: bool, w: u32, x: u32) {
  if (is_v) {
    v_pool[w] = x;
  } else {
    k_pool[w] = x;
  }
}

// Hot element i (flat index t * HD + c) of the head block whose first element is `src`.
fn hot_at(is_v: bool, src: u32, i: u32) -> f32 {
  let e = src + i;
  if (KV16) {
    return unpack2x16float(pool_word(is_v, e / 2u))[e % 2u];
  }
  return bitcast<f32>(pool_word(is_v, e));
}

fn f16_round(x: f32) -> f32 {
  return unpack2x16float(pack2x16float(vec2<f32>(clamp(x, -F16_MAX, F16_MAX), 0.0))).x;
}

fn pack_f16(a: f32, b: f32) -> u32 {
  return pack2x16float(clamp(vec2<f32>(a, b), vec2<f32>(-F16_MAX), vec2<f32>(F16_MAX)));
}

// bfp4's exponent k (x = m 2^k, |m| <= 7) of a group whose largest magnitude is mx: the least k
// with mx <= 7 2^k, from mx = f 2^e (f in [0.5, 1)); at least -126 (zero groups included).
fn bfp_exponent(mx: f32) -> i32 {
  if (mx == 0.0) {
    return -126;
  }
  let fr = frexp(mx);
  return max(select(fr.exp - 2, fr.exp - 3, fr.fract <= 0.875), -126);
}

// Step A for channel c.
fn channel_stat(is_v: bool, src: u32, c: u32) -> f32 {
  if (KV_CODEC == 3u && !is_v) {
    var mx = 0.0;
    for (var t = 0u; t < ROWS; t++) {
      mx = max(mx, abs(hot_at(is_v, src, t * HD + c)));
    }
    return f32(bfp_exponent(mx));
  }
  if (KV_CODEC == 4u) {
    var s = 0.0;
    for (var t = 0u; t < ROWS; t++) {
      s += hot_at(is_v, src, t * HD + c);
    }
    return f16_round(s / f32(ROWS));
  }
  return 0.0;
}

// Entries of step B: per row, or per (row, group) for bfp4 V.
fn group_count(is_v: bool) -> u32 {
  if (KV_CODEC == 3u) {
    return select(0u, ROWS * G, is_v);
  }
  return select(0u, ROWS, KV_CODEC == 2u || KV_CODEC == 4u);
}

// Step B for entry g.
fn group_stat(is_v: bool, src: u32, g: u32) -> f32 {
  if (KV_CODEC == 3u) {
    let t = g / G;
    let c0 = (g % G) * 16u;
    var mx = 0.0;
    for (var c = c0; c < min(c0 + 16u, HD); c++) {
      mx = max(mx, abs(hot_at(is_v, src, t * HD + c)));
    }
    return f32(bfp_exponent(mx));
  }
  var acc = 0.0;
  for (var c = 0u; c < HD; c++) {
    let x = hot_at(is_v, src, g * HD + c);
    if (KV_CODEC == 2u) {
      acc = max(acc, abs(x));
    } else {
      acc += abs(x - chan[c]);
    }
  }
  if (KV_CODEC == 2u) {
    return acc / 127.0;
  }
  return f16_round(acc / f32(HD));
}

// int8 code of element i (row scale s), as its byte.
fn int8_byte(is_v: bool, src: u32, i: u32) -> u32 {
  let s = grp[i / HD];
  var q = 0.0;
  if (s > 0.0) {
    q = clamp(round(hot_at(is_v, src, i) / s), -127.0, 127.0);
  }
  return bitcast<u32>(i32(q)) & 255u;
}

// bfp4 mantissa of element i, as its nibble.
fn bfp4_nibble(is_v: bool, src: u32, i: u32) -> u32 {
  let t = i / HD;
  let c = i % HD;
  var k: f32;
  if (is_v) {
    k = grp[t * G + c / 16u];
  } else {
    k = chan[c];
  }
  let m = clamp(round(ldexp(hot_at(is_v, src, i), -i32(k))), -7.0, 7.0);
  return bitcast<u32>(i32(m)) & 15u;
}

// Exponent byte b of bfp4's exponent area (0 past the groups).
fn bfp4_exp_byte(is_v: bool, b: u32) -> u32 {
  var k: f32;
  if (is_v) {
    if (b >= ROWS * G) {
      return 0u;
    }
    k = grp[b];
  } else {
    if (b >= HD) {
      return 0u;
    }
    k = chan[b];
  }
  return u32(i32(k) + 127);
}

// Step C: word w of the codec head block.
fn codec_word(is_v: bool, src: u32, w: u32) -> u32 {
  if (KV_CODEC == 1u) {
    return pack_f16(hot_at(is_v, src, 2u * w), hot_at(is_v, src, 2u * w + 1u));
  }
  if (KV_CODEC == 2u) {
    if (w < 4u * HD) {
      var x = 0u;
      for (var j = 0u; j < 4u; j++) {
        x |= int8_byte(is_v, src, 4u * w + j) << (8u * j);
      }
      return x;
    }
    if (w < 4u * HD + ROWS) {
      return bitcast<u32>(grp[w - 4u * HD]);
    }
    return 0u;
  }
  if (KV_CODEC == 3u) {
    var x = 0u;
    if (w < 2u * HD) {
      for (var j = 0u; j < 8u; j++) {
        x |= bfp4_nibble(is_v, src, 8u * w + j) << (4u * j);
      }
    } else {
      for (var j = 0u; j < 4u; j++) {
        x |= bfp4_exp_byte(is_v, 4u * (w - 2u * HD) + j) << (8u * j);
      }
    }
    return x;
  }
  // sign1
  if (w < HD / 2u) {
    return pack_f16(chan[2u * w], chan[2u * w + 1u]);
  }
  if (w < HD) {
    var x = 0u;
    for (var j = 0u; j < 32u; j++) {
      let i = 32u * (w - HD / 2u) + j;
      if (hot_at(is_v, src, i) - chan[i % HD] >= 0.0) {
        x |= 1u << j;
      }
    }
    return x;
  }
  if (w < HD + ROWS / 2u) {
    return pack_f16(grp[2u * (w - HD)], grp[2u * (w - HD) + 1u]);
  }
  return 0u;
}

@compute @workgroup_size(WG)
fn encode(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let head = wid.x;
  let pr = pairs[wid.y];
  let is_v = wid.z == 1u;
  let src = (pr.x * p.heads + head) * ROWS * HD; // element index of the hot head block
  let hb = codec_head(pr.y, head, p.heads);
  for (var c = lid; c < HD; c += WG) {
    chan[c] = channel_stat(is_v, src, c);
  }
  workgroupBarrier();
  for (var g = lid; g < group_count(is_v); g += WG) {
    grp[g] = group_stat(is_v, src, g);
  }
  workgroupBarrier();
  for (var w = lid; w < CHW; w += WG) {
    pool_put(is_v, hb + w, codec_word(is_v, src, w));
  }
}

@compute @workgroup_size(WG)
fn decode(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let head = wid.x;
  let pr = pairs[wid.y];
  let is_v = wid.z == 1u;
  let hb = codec_head(pr.x, head, p.heads);
  // Word of this head block in `out`: item pr.y's K block, then its V block.
  let dst = (2u * pr.y + wid.z) * p.hot_words + head * ROWS * select(HD, HD / 2u, KV16);
  let d4 = HD / 4u;
  for (var e = lid; e < ROWS * d4; e += WG) {
    let x = codec_vec4(is_v, hb, e / d4, (e % d4) * 4u);
    if (KV16) {
      out[dst + 2u * e] = pack_f16(x.x, x.y);
      out[dst + 2u * e + 1u] = pack_f16(x.z, x.w);
    } else {
      out[dst + 4u * e] = bitcast<u32>(x.x);
      out[dst + 4u * e + 1u] = bitcast<u32>(x.y);
      out[dst + 4u * e + 2u] = bitcast<u32>(x.z);
      out[dst + 4u * e + 3u] = bitcast<u32>(x.w);
    }
  }
}
