// The attention mask, compiled into the attention kernels (prepended to attention.wgsl and to
// decode attention's two entry points; kernels/attention_mask.ts sets the constants). No mask
// tensor and no per-step mask work: the kind and its sizes are pipeline constants, so a causal
// pipeline carries none of the window's tests, and a window kernel visits only the keys its
// queries can see (`mask_span`: a window never reads the blocks that fell out of it).
//
// Query position i, key position j (j <= i always):
//   0 causal        j <= i
//   1 window        i - j < MASK_WINDOW                      (Mistral's sliding_window)
//   2 sinks+window  j < MASK_SINKS, or i - j < MASK_WINDOW   (streaming; positions absolute)
//   3 chunked       j / MASK_CHUNK == i / MASK_CHUNK         (chunked local attention)
// Every kind sees key i itself, so no query row is ever left without a key.

override MASK_KIND: u32 = 0u;
override MASK_WINDOW: u32 = 1u;
override MASK_SINKS: u32 = 0u;
override MASK_CHUNK: u32 = 1u;

// The first key visible from position p, the sinks aside: every key of [mask_lo(p), p] is, and
// mask_lo never decreases with p.
fn mask_lo(p: u32) -> u32 {
  if (MASK_KIND == 1u || MASK_KIND == 2u) {
    return select(0u, p + 1u - MASK_WINDOW, p >= MASK_WINDOW);
  }
  if (MASK_KIND == 3u) {
    return p - p % MASK_CHUNK;
  }
  return 0u;
}

// Keys [0, mask_sinks()) are visible from every position at or after them.
fn mask_sinks() -> u32 {
  return select(0u, MASK_SINKS, MASK_KIND == 2u);
}

// Whether key `key` of a query at position p is visible (causality included).
fn mask_visible(p: u32, key: u32) -> bool {
  return key <= p && (key >= mask_lo(p) || key < mask_sinks());
}

// The same for four keys: causal `key <= p`, and the window's lower edge unless MASK_KIND is 0.
fn mask_visible4(p: u32, key: vec4<u32>) -> vec4<bool> {
  var ok = key <= vec4<u32>(p);
  if (MASK_KIND != 0u) {
    ok = ok & ((key >= vec4<u32>(mask_lo(p))) | (key < vec4<u32>(mask_sinks())));
  }
  return ok;
}

// Whether key `key` can be seen by some query at a position >= p_lo (no causal test): keys below
// are never loaded, so a block that fell out of every window may hold anything.
fn mask_live(p_lo: u32, key: u32) -> bool {
  return key >= mask_lo(p_lo) || key < mask_sinks();
}

// The units of `unit` keys (tiles, chunks) that queries at positions [p_lo, p_hi] visit, in
// visiting order: the sink units [0, x), then the window's units [y, y + z - x). Returns
// (x = sink units, y = first window unit, z = units in all). Causal: (0, 0, ceil((p_hi+1)/unit)).
fn mask_span(p_lo: u32, p_hi: u32, unit: u32) -> vec3<u32> {
  let end = p_hi / unit + 1u;
  let lo = mask_lo(p_lo);
  let sinks = (min(mask_sinks(), lo) + unit - 1u) / unit;
  let first = max(sinks, lo / unit);
  return vec3<u32>(sinks, first, sinks + end - first);
}

// The unit of visit t (t < span.z).
fn mask_unit(span: vec3<u32>, t: u32) -> u32 {
  return select(span.y + t - span.x, t, t < span.x);
}

// The visit that reads unit u (one that `mask_span` visits).
fn mask_visit(span: vec3<u32>, u: u32) -> u32 {
  return select(span.x + u - span.y, u, u < span.x);
}
