/**
 * Sets of Unicode scalar values as ranges, and the UTF-8 byte sequences that encode them, so that
 * character classes become byte automata (tokens of byte-level vocabularies may end inside a
 * character).
 */

/** Inclusive code point ranges, sorted, disjoint and not adjacent (after {@linkcode normalize}). */
export type Ranges = [number, number][];

/** The largest code point. */
export const MAX_CODE_POINT = 0x10ffff;

/** `r` sorted and merged (overlapping or adjacent ranges joined). */
export function normalize(r: Ranges): Ranges {
  const sorted = r.filter(([a, b]) => a <= b).sort((x, y) => x[0] - y[0]);
  const out: Ranges = [];
  for (const [a, b] of sorted) {
    const last = out.at(-1);
    if (last !== undefined && a <= last[1] + 1) last[1] = Math.max(last[1], b);
    else out.push([a, b]);
  }
  return out;
}

/** Every code point not in `r` (within 0..U+10FFFF). */
export function complement(r: Ranges): Ranges {
  const out: Ranges = [];
  let next = 0;
  for (const [a, b] of normalize(r)) {
    if (a > next) out.push([next, a - 1]);
    next = b + 1;
  }
  if (next <= MAX_CODE_POINT) out.push([next, MAX_CODE_POINT]);
  return out;
}

/** Code points in `a` and not in `b`. */
export function subtract(a: Ranges, b: Ranges): Ranges {
  return intersect(a, complement(b));
}

/** Code points in both `a` and `b`. */
export function intersect(a: Ranges, b: Ranges): Ranges {
  const x = normalize(a), y = normalize(b);
  const out: Ranges = [];
  let i = 0, j = 0;
  while (i < x.length && j < y.length) {
    const lo = Math.max(x[i][0], y[j][0]), hi = Math.min(x[i][1], y[j][1]);
    if (lo <= hi) out.push([lo, hi]);
    if (x[i][1] < y[j][1]) i++;
    else j++;
  }
  return out;
}

/** Whether code point `c` is in `r`. */
export function contains(r: Ranges, c: number): boolean {
  return r.some(([a, b]) => a <= c && c <= b);
}

/** One UTF-8 sequence shape: a byte range per byte position. */
export type ByteSequence = [number, number][];

/** The UTF-8 bytes of a scalar value. */
export function encodeUtf8(c: number): number[] {
  if (c < 0x80) return [c];
  if (c < 0x800) return [0xc0 | (c >> 6), 0x80 | (c & 63)];
  if (c < 0x10000) return [0xe0 | (c >> 12), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63)];
  return [0xf0 | (c >> 18), 0x80 | ((c >> 12) & 63), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63)];
}

/**
 * Byte-range sequences whose union encodes exactly the scalar values of `r` (surrogates
 * D800–DFFF are never encoded). The split is the one of Rust's regex-syntax `Utf8Sequences`:
 * a range is cut until, within each piece, every byte position varies independently.
 *
 * @example utf8Sequences([[0x41, 0x5a]]) // [[[0x41, 0x5a]]]
 */
export function utf8Sequences(r: Ranges): ByteSequence[] {
  const out: ByteSequence[] = [];
  for (const [a, b] of normalize(r)) split(a, b, out);
  return out;
}

function split(lo: number, hi: number, out: ByteSequence[]): void {
  if (lo <= 0xdfff && hi >= 0xd800) {
    if (lo < 0xd800) split(lo, 0xd7ff, out);
    if (hi > 0xdfff) split(0xe000, hi, out);
    return;
  }
  for (const max of [0x7f, 0x7ff, 0xffff]) {
    if (lo <= max && hi > max) {
      split(lo, max, out);
      split(max + 1, hi, out);
      return;
    }
  }
  if (hi <= 0x7f) {
    out.push([[lo, hi]]);
    return;
  }
  const n = encodeUtf8(hi).length;
  for (let i = 1; i < n; i++) {
    const m = (1 << (6 * i)) - 1;
    if ((lo & ~m) !== (hi & ~m)) {
      if ((lo & m) !== 0) {
        split(lo, lo | m, out);
        split((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) !== m) {
        split(lo, (hi & ~m) - 1, out);
        split(hi & ~m, hi, out);
        return;
      }
    }
  }
  const a = encodeUtf8(lo), b = encodeUtf8(hi);
  out.push(a.map((x, i) => [x, b[i]]));
}
