/**
 * The lexical pieces of JSON as byte automata: bounded whitespace, strings (any, counted, or
 * with a pattern's characters), numbers, literals. Everything here produces text that
 * `JSON.parse` accepts.
 */
import { alt, byteRange, codePoints, type Frag, literal, opt, repeat, seq, star } from "./nfa.ts";
import { contains, type Ranges, subtract } from "./utf8.ts";

/**
 * Indentation characters (space, tab) allowed after a newline in one whitespace run. A run is
 * `""`, `" "`, or `"\n"` followed by up to this many spaces or tabs: compact and pretty-printed
 * JSON both fit, and a model cannot spin in whitespace.
 */
export const MAX_INDENT = 20;

/** A bounded whitespace run (see {@linkcode MAX_INDENT}). */
export function ws(maxIndent = MAX_INDENT): Frag {
  return opt(
    alt(literal(" "), seq(literal("\n"), repeat(alt(literal(" "), literal("\t")), 0, maxIndent))),
  );
}

/** After a colon: nothing or one space. */
export const colonSpace: Frag = opt(literal(" "));

/** Code points a JSON string may hold unescaped: all but controls, `"` and `\`. */
export const PLAIN: Ranges = subtract([[0, 0x10ffff]], [[0, 0x1f], [0x22, 0x22], [0x5c, 0x5c]]);

const hex = alt(byteRange(0x30, 0x39), byteRange(0x41, 0x46), byteRange(0x61, 0x66));
/** A hex digit that is not d/D: a \u escape outside the surrogates starts with one. */
const hexNotD = alt(
  byteRange(0x30, 0x39),
  byteRange(0x41, 0x43),
  byteRange(0x45, 0x46),
  byteRange(0x61, 0x63),
  byteRange(0x65, 0x66),
);

/**
 * One escape sequence: `\" \\ \/ \b \f \n \r \t` or `\uXXXX` outside the surrogates (so every
 * escape is one code point and lengths count right; a non-BMP character is written as UTF-8).
 */
export const escape: Frag = seq(
  literal("\\"),
  alt(
    byteRange(0x22, 0x22),
    byteRange(0x5c, 0x5c),
    byteRange(0x2f, 0x2f),
    byteRange(0x62, 0x62),
    byteRange(0x66, 0x66),
    byteRange(0x6e, 0x6e),
    byteRange(0x72, 0x72),
    byteRange(0x74, 0x74),
    seq(
      literal("u"),
      alt(
        seq(hexNotD, hex, hex, hex),
        seq(alt(literal("d"), literal("D")), byteRange(0x30, 0x37), hex, hex),
      ),
    ),
  ),
);

/** One code point inside a JSON string, written any way JSON allows (but see {@linkcode escape}). */
export const jsonChar: Frag = alt(codePoints(PLAIN), escape);

/** A JSON string of `min` to `max` code points (`max` undefined: any length). */
export function jsonString(min = 0, max?: number): Frag {
  return seq(literal('"'), repeat(jsonChar, min, max), literal('"'));
}

const SHORT: Record<number, string> = { 8: "b", 9: "t", 10: "n", 12: "f", 13: "r" };

/**
 * One code point of `ranges` as it appears inside a JSON string: plain UTF-8 where allowed, and
 * the escapes JSON requires for `"`, `\` and control characters (short forms and `\u00XX`).
 * Used for patterns and formats, whose classes are about the decoded value.
 */
export function jsonClass(ranges: Ranges): Frag {
  const parts: Frag[] = [];
  const plain = subtract(ranges, [[0, 0x1f], [0x22, 0x22], [0x5c, 0x5c]]);
  if (plain.length > 0) parts.push(codePoints(plain));
  if (contains(ranges, 0x22)) parts.push(literal('\\"'));
  if (contains(ranges, 0x5c)) parts.push(literal("\\\\"));
  for (let c = 0; c < 0x20; c++) {
    if (!contains(ranges, c)) continue;
    if (SHORT[c] !== undefined) parts.push(literal(`\\${SHORT[c]}`));
    parts.push(literal(`\\u00${c.toString(16).padStart(2, "0")}`));
  }
  return parts.length === 0 ? (n) => n.state() : alt(...parts);
}

const digit = byteRange(0x30, 0x39);
const digits = seq(digit, star(digit));
const intPart = seq(opt(literal("-")), alt(literal("0"), seq(byteRange(0x31, 0x39), star(digit))));

/** A JSON integer: `-?(0|[1-9][0-9]*)`. */
export const jsonInteger: Frag = intPart;

/** A JSON number: integer part, optional fraction, optional exponent. */
export const jsonNumber: Frag = seq(
  intPart,
  opt(seq(literal("."), digits)),
  opt(seq(alt(literal("e"), literal("E")), opt(alt(literal("+"), literal("-"))), digits)),
);

/** `true` or `false`. */
export const jsonBoolean: Frag = alt(literal("true"), literal("false"));

/** `null`. */
export const jsonNull: Frag = literal("null");
