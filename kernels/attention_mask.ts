/**
 * Attention masks as compile-time choices of the attention kernels (kernels/attention_mask.wgsl
 * has the WGSL side and the definitions), and the length buckets that the decode launch plans
 * are specialised for. A mask is a kind and its sizes, fixed when the model loads: each kind ×
 * length bucket is its own pipeline, never a mask tensor.
 */

/**
 * Which keys a query sees. Positions are absolute (keys are stored rotated), for every kind.
 * - `causal`: key j from query i iff j ≤ i.
 * - `window`: iff i − j < window (Mistral's `sliding_window`).
 * - `sinks`: iff j < sinks or i − j < window (attention sinks + window, StreamingLLM's mask;
 *   the KV behind the window and past the sinks is never read, so it can be freed).
 * - `chunked`: iff ⌊j / chunk⌋ = ⌊i / chunk⌋ (chunked local attention).
 */
export type AttentionMask =
  | { kind: "causal" }
  | { kind: "window"; window: number }
  | { kind: "sinks"; sinks: number; window: number }
  | { kind: "chunked"; chunk: number };

/** The plain causal mask. */
export const CAUSAL: AttentionMask = { kind: "causal" };

const KIND_ID = { causal: 0, window: 1, sinks: 2, chunked: 3 } as const;

/**
 * Checks a mask's sizes: window and chunk are integers ≥ 1, sinks an integer ≥ 1.
 *
 * @throws Error naming the field and the value.
 */
export function checkMask(mask: AttentionMask): AttentionMask {
  const int = (name: string, v: number) => {
    if (!(Number.isInteger(v) && v >= 1 && v < 2 ** 31)) {
      throw new Error(`attention mask ${mask.kind}: ${name} must be an integer >= 1; got ${v}`);
    }
  };
  if (mask.kind === "window") int("window", mask.window);
  else if (mask.kind === "sinks") {
    int("sinks", mask.sinks);
    int("window", mask.window);
  } else if (mask.kind === "chunked") int("chunk", mask.chunk);
  else if (mask.kind !== "causal") {
    throw new Error(`unknown attention mask kind '${(mask as { kind: string }).kind}'`);
  }
  return mask;
}

/** The WGSL override constants of `mask` (kernels/attention_mask.wgsl). */
export function maskConstants(mask: AttentionMask = CAUSAL): Record<string, number> {
  checkMask(mask);
  if (mask.kind === "causal") return {}; // the WGSL defaults
  return {
    MASK_KIND: KIND_ID[mask.kind],
    ...(mask.kind === "chunked" ? { MASK_CHUNK: mask.chunk } : { MASK_WINDOW: mask.window }),
    ...(mask.kind === "sinks" ? { MASK_SINKS: mask.sinks } : {}),
  };
}

/** A short name for labels: `causal`, `window 4096`, `sinks 4 + window 1024`, `chunk 8192`. */
export function maskLabel(mask: AttentionMask = CAUSAL): string {
  switch (mask.kind) {
    case "causal":
      return "causal";
    case "window":
      return `window ${mask.window}`;
    case "sinks":
      return `sinks ${mask.sinks} + window ${mask.window}`;
    case "chunked":
      return `chunk ${mask.chunk}`;
  }
}

/**
 * The first key visible from position `p`, the sinks aside (the WGSL's `mask_lo`): every key of
 * `[maskLo(p), p]` is visible, and keys `[0, maskSinks(mask))` are too.
 */
export function maskLo(mask: AttentionMask, p: number): number {
  if (mask.kind === "window" || mask.kind === "sinks") return Math.max(0, p - mask.window + 1);
  if (mask.kind === "chunked") return p - (p % mask.chunk);
  return 0;
}

/** Keys every later position sees: the sinks (0 for the other kinds). */
export function maskSinks(mask: AttentionMask): number {
  return mask.kind === "sinks" ? mask.sinks : 0;
}

/**
 * The most keys one query of a sequence of `len` keys sees (the decode plan's length): `len`
 * causal, at most the window (plus the sinks), at most the chunk.
 */
export function attendedKeys(mask: AttentionMask, len: number): number {
  switch (mask.kind) {
    case "causal":
      return len;
    case "window":
      return Math.min(len, mask.window);
    case "sinks":
      return Math.min(len, mask.sinks + mask.window);
    case "chunked":
      return Math.min(len, mask.chunk);
  }
}

/**
 * Tops of the length buckets, in keys attended: [1, 2k], (2k, 8k], (8k, 32k], (32k, 128k]. Decode
 * attention has one launch plan (threads, splits, row groups; so its own pipelines) per bucket.
 */
export const LENGTH_BUCKETS = [2048, 8192, 32768, 131072];

/**
 * The buckets a model serving contexts of `contextLength` tokens under `mask` needs, ascending:
 * those below the most keys a query attends, then that number itself (the last bucket's plan is
 * made for it, not for a longer top). A window of 4096 needs two at any context length.
 *
 * @example
 * lengthBuckets(131072, CAUSAL); // [2048, 8192, 32768, 131072]
 * lengthBuckets(32768, { kind: "window", window: 4096 }); // [2048, 4096]
 */
export function lengthBuckets(contextLength: number, mask: AttentionMask = CAUSAL): number[] {
  const most = Math.max(1, attendedKeys(mask, contextLength));
  return [...LENGTH_BUCKETS.filter((top) => top < most), most];
}

/** The bucket (its top) for queries attending at most `keys` keys: the first top ≥ keys. */
export function bucketFor(buckets: readonly number[], keys: number): number {
  return buckets.find((top) => top >= keys) ?? buckets[buckets.length - 1];
}
