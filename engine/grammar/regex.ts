/**
 * A practical regular-expression subset (ECMAScript syntax, as JSON Schema's `pattern` uses):
 * literals, escapes (\d \w \s \D \W \S \n \t \r \f \v \0 \xHH \uHHHH \u{H…} and escaped
 * punctuation), classes `[a-z]` / `[^…]`, `.`, alternation, groups `(…)` `(?:…)` `(?<name>…)`,
 * quantifiers `? * + {m} {m,} {m,n}` (lazy `?` suffixes accepted: same language), and `^` / `$`
 * at the very start and end. Matching is over code points, compiled to UTF-8 bytes.
 * Backreferences, lookaround, word boundaries, `\p{…}` and flags are refused by name.
 */
import { GrammarError } from "./errors.ts";
import { alt, codePoints, empty, type Frag, repeat, seq } from "./nfa.ts";
import { complement, normalize, type Ranges } from "./utf8.ts";

/** A parsed pattern. */
export type RegexNode =
  | { kind: "class"; ranges: Ranges }
  | { kind: "seq"; items: RegexNode[] }
  | { kind: "alt"; items: RegexNode[] }
  | { kind: "repeat"; item: RegexNode; min: number; max?: number };

/** A parsed pattern and whether it was anchored at each end. */
export interface ParsedRegex {
  node: RegexNode;
  anchoredStart: boolean;
  anchoredEnd: boolean;
}

/** The most a `{m,n}` bound may say (bounded repetition is unrolled). */
export const MAX_REPEAT = 1000;

const DIGIT: Ranges = [[0x30, 0x39]];
const WORD: Ranges = [[0x30, 0x39], [0x41, 0x5a], [0x5f, 0x5f], [0x61, 0x7a]];
const SPACE: Ranges = normalize([
  [0x09, 0x0d],
  [0x20, 0x20],
  [0xa0, 0xa0],
  [0x1680, 0x1680],
  [0x2000, 0x200a],
  [0x2028, 0x2029],
  [0x202f, 0x202f],
  [0x205f, 0x205f],
  [0x3000, 0x3000],
  [0xfeff, 0xfeff],
]);
/** `.`: anything but line terminators (ECMAScript). */
const DOT: Ranges = complement([[0x0a, 0x0a], [0x0d, 0x0d], [0x2028, 0x2029]]);
/** Every code point (what an unanchored pattern allows around its match). */
export const ANY_CHAR: Ranges = [[0, 0x10ffff]];

const SIMPLE_ESCAPES: Record<string, number> = {
  n: 0x0a,
  r: 0x0d,
  t: 0x09,
  f: 0x0c,
  v: 0x0b,
  0: 0x00,
};
const SYNTAX = "^$\\.*+?()[]{}|/-";

/**
 * Parses `pattern`.
 *
 * @param path where errors point (e.g. `response_format.json_schema.schema.pattern`)
 * @throws GrammarError naming the unsupported construct and its offset
 * @example parseRegex("^[a-z]+(-[a-z]+)*$", "pattern").anchoredStart // true
 */
export function parseRegex(pattern: string, path: string): ParsedRegex {
  return new Parser(pattern, path).parse();
}

class Parser {
  readonly #cps: number[];
  #i = 0;
  /** Where the construct being parsed starts (errors point there). */
  #at = 0;
  readonly #path: string;
  readonly #src: string;

  constructor(src: string, path: string) {
    this.#src = src;
    this.#cps = Array.from(src, (c) => c.codePointAt(0)!);
    this.#path = path;
  }

  parse(): ParsedRegex {
    const anchoredStart = this.#peek() === "^";
    if (anchoredStart) this.#i++;
    let anchoredEnd = false;
    const node = this.#alternation(() => {
      if (this.#peek() === "$" && this.#i === this.#cps.length - 1) {
        anchoredEnd = true;
        this.#i++;
        return true;
      }
      return false;
    });
    if (this.#i < this.#cps.length) this.#fail(`unexpected '${this.#peek()}'`, undefined, this.#i);
    return { node, anchoredStart, anchoredEnd };
  }

  #fail(what: string, keyword?: string, at = this.#at): never {
    throw new GrammarError(
      this.#path,
      `pattern ${JSON.stringify(this.#src)} at offset ${at}: ${what}`,
      keyword,
    );
  }

  #peek(k = 0): string | undefined {
    const c = this.#cps[this.#i + k];
    return c === undefined ? undefined : String.fromCodePoint(c);
  }

  #alternation(atEnd: () => boolean): RegexNode {
    const items = [this.#sequence(atEnd)];
    while (this.#peek() === "|") {
      this.#i++;
      items.push(this.#sequence(atEnd));
    }
    return items.length === 1 ? items[0] : { kind: "alt", items };
  }

  #sequence(atEnd: () => boolean): RegexNode {
    const items: RegexNode[] = [];
    for (;;) {
      const c = this.#peek();
      if (c === undefined || c === "|" || c === ")") break;
      if (atEnd()) break;
      this.#at = this.#i;
      if (c === "^" || c === "$") {
        this.#fail(
          `'${c}' is supported only at the start and end of the whole pattern; ` +
            "wrap alternatives in a group, e.g. ^(a|b)$",
          "anchor",
        );
      }
      items.push(this.#quantified(this.#atom()));
    }
    return items.length === 1 ? items[0] : { kind: "seq", items };
  }

  #quantified(atom: RegexNode): RegexNode {
    let node = atom;
    for (;;) {
      const c = this.#peek();
      let min: number, max: number | undefined;
      this.#at = this.#i;
      if (c === "?") [min, max] = [0, 1];
      else if (c === "*") [min, max] = [0, undefined];
      else if (c === "+") [min, max] = [1, undefined];
      else if (c === "{") [min, max] = this.#braces();
      else return node;
      if (c !== "{") this.#i++;
      if (this.#peek() === "?") this.#i++; // lazy: the same language
      if (this.#peek() === "+") {
        this.#fail("possessive quantifiers are not supported", "possessive");
      }
      node = { kind: "repeat", item: node, min, max };
    }
  }

  #braces(): [number, number | undefined] {
    const m = /^\{(\d+)(,(\d*))?\}/.exec(this.#src.slice(this.#offset()));
    if (m === null) {
      this.#fail("'{' must start a quantifier {m}, {m,} or {m,n}; write \\{ for a brace");
    }
    this.#i += m[0].length;
    const min = Number(m[1]);
    const max = m[2] === undefined ? min : m[3] === "" ? undefined : Number(m[3]);
    if (max !== undefined && max < min) this.#fail(`quantifier {${min},${max}} has max < min`);
    if ((max ?? min) > MAX_REPEAT) {
      this.#fail(`repetition bounds above ${MAX_REPEAT} are not supported; use * or +`, "repeat");
    }
    return [min, max];
  }

  /** The UTF-16 offset of the cursor (for slicing the source). */
  #offset(): number {
    return String.fromCodePoint(...this.#cps.slice(0, this.#i)).length;
  }

  #atom(): RegexNode {
    const c = this.#peek()!;
    this.#i++;
    if (c === "(") return this.#group();
    if (c === "[") return { kind: "class", ranges: this.#bracket() };
    if (c === ".") return { kind: "class", ranges: DOT };
    if (c === "\\") return { kind: "class", ranges: this.#escape(false) };
    if ("*+?{".includes(c)) this.#fail(`nothing to repeat before '${c}'`);
    if (c === "]" || c === "}") this.#fail(`unescaped '${c}'; write \\${c}`);
    const cp = c.codePointAt(0)!;
    return { kind: "class", ranges: [[cp, cp]] };
  }

  #group(): RegexNode {
    if (this.#peek() === "?") {
      const next = this.#peek(1);
      if (next === ":") this.#i += 2;
      else if (next === "<" && this.#peek(2) !== "=" && this.#peek(2) !== "!") {
        const close = this.#cps.indexOf(0x3e, this.#i);
        if (close < 0) this.#fail("unterminated group name");
        this.#i = close + 1;
      } else if (next === "=" || next === "!" || next === "<") {
        this.#fail("lookahead and lookbehind are not supported", "lookaround");
      } else this.#fail("inline flags and other (?…) groups are not supported", "flags");
    }
    const inner = this.#alternation(() => false);
    if (this.#peek() !== ")") this.#fail("missing ')'", undefined, this.#i);
    this.#i++;
    return inner;
  }

  /** After `\`: a class (one code point or a shorthand). */
  #escape(inClass: boolean): Ranges {
    const c = this.#peek();
    if (c === undefined) this.#fail("pattern ends with '\\'");
    this.#i++;
    switch (c) {
      case "d":
        return DIGIT;
      case "D":
        return complement(DIGIT);
      case "w":
        return WORD;
      case "W":
        return complement(WORD);
      case "s":
        return SPACE;
      case "S":
        return complement(SPACE);
      case "x":
        return this.#hex(2);
      case "u":
        if (this.#peek() === "{") {
          const close = this.#cps.indexOf(0x7d, this.#i);
          const digits = close < 0
            ? ""
            : String.fromCodePoint(...this.#cps.slice(this.#i + 1, close));
          if (!/^[0-9a-fA-F]{1,6}$/.test(digits) || parseInt(digits, 16) > 0x10ffff) {
            this.#fail("bad \\u{…} escape");
          }
          this.#i = close + 1;
          const cp = parseInt(digits, 16);
          return [[cp, cp]];
        }
        return this.#hex(4);
      case "b":
        if (inClass) return [[0x08, 0x08]];
        return this.#fail("word boundaries (\\b) are not supported", "\\b");
      case "B":
        return this.#fail("word boundaries (\\B) are not supported", "\\B");
      case "p":
      case "P":
        return this.#fail("Unicode property escapes (\\p{…}) are not supported", "\\p");
      case "c":
        return this.#fail("control escapes (\\cX) are not supported; write \\xHH", "\\c");
    }
    if (c in SIMPLE_ESCAPES && !(c === "0" && /[0-9]/.test(this.#peek() ?? ""))) {
      return [[SIMPLE_ESCAPES[c], SIMPLE_ESCAPES[c]]];
    }
    if (/[1-9]/.test(c)) this.#fail("backreferences are not supported", "backreference");
    if (SYNTAX.includes(c)) {
      const cp = c.codePointAt(0)!;
      return [[cp, cp]];
    }
    return this.#fail(`unknown escape '\\${c}'`);
  }

  #hex(n: number): Ranges {
    const digits = String.fromCodePoint(...this.#cps.slice(this.#i, this.#i + n));
    if (!new RegExp(`^[0-9a-fA-F]{${n}}$`).test(digits)) {
      this.#fail(`bad \\${n === 2 ? "x" : "u"} escape`);
    }
    this.#i += n;
    const cp = parseInt(digits, 16);
    return [[cp, cp]];
  }

  /** After `[`: the class up to `]`. */
  #bracket(): Ranges {
    const negate = this.#peek() === "^";
    if (negate) this.#i++;
    if (negate && this.#peek() === "]") { // [^]: any character (ECMAScript)
      this.#i++;
      return ANY_CHAR;
    }
    const out: Ranges = [];
    let first = true;
    for (;;) {
      const c = this.#peek();
      if (c === undefined) this.#fail("missing ']'", undefined, this.#i);
      if (c === "]" && !first) break;
      if (c === "]") this.#fail("an empty class [] matches nothing; remove it");
      first = false;
      const lo = this.#classAtom();
      if (this.#peek() === "-" && this.#peek(1) !== "]" && this.#peek(1) !== undefined) {
        this.#i++;
        const hi = this.#classAtom();
        if (lo.length !== 1 || hi.length !== 1 || lo[0][0] !== lo[0][1] || hi[0][0] !== hi[0][1]) {
          this.#fail("a range in a class must join two single characters");
        }
        if (hi[0][0] < lo[0][0]) this.#fail("class range out of order");
        out.push([lo[0][0], hi[0][0]]);
      } else out.push(...lo);
    }
    this.#i++;
    const set = normalize(out);
    return negate ? complement(set) : set;
  }

  #classAtom(): Ranges {
    const c = this.#peek()!;
    this.#i++;
    if (c === "\\") return this.#escape(true);
    const cp = c.codePointAt(0)!;
    return [[cp, cp]];
  }
}

/** How one class becomes bytes: plain UTF-8, or its JSON-string encoding. */
export type CharEncoder = (ranges: Ranges) => Frag;

/**
 * The automaton piece of a parsed node; `encode` turns each class into bytes (default: UTF-8).
 */
export function regexFrag(node: RegexNode, encode: CharEncoder = codePoints): Frag {
  switch (node.kind) {
    case "class":
      return encode(node.ranges);
    case "seq":
      return node.items.length === 0 ? empty : seq(...node.items.map((n) => regexFrag(n, encode)));
    case "alt":
      return alt(...node.items.map((n) => regexFrag(n, encode)));
    case "repeat":
      return repeat(regexFrag(node.item, encode), node.min, node.max);
  }
}

/**
 * The piece for the whole of `pattern` as a standalone grammar: the output must match it
 * entirely (anchors are implicit; `^` and `$` at the ends are accepted and change nothing).
 */
export function regexGrammar(pattern: string, path: string): Frag {
  return regexFrag(parseRegex(pattern, path).node);
}
