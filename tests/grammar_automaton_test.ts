/**
 * The byte automata under the grammars: UTF-8 classes encode exactly their code points, the
 * regex compiler agrees with JavaScript's RegExp (`u` mode) on seeded random patterns and
 * strings, DFAs come out minimal, and the JSON lexical pieces accept what JSON.parse accepts.
 */
import assert from "node:assert/strict";
import { determinize, type Dfa, matches, walk } from "../engine/grammar/dfa.ts";
import { codePoints, type Frag, Nfa } from "../engine/grammar/nfa.ts";
import { escape, jsonNumber, jsonString, MAX_INDENT, ws } from "../engine/grammar/json_lex.ts";
import { regexGrammar } from "../engine/grammar/regex.ts";
import { encodeUtf8, normalize, type Ranges } from "../engine/grammar/utf8.ts";
import { type Rng, rng } from "../scripts/rng.ts";

const enc = new TextEncoder();

function dfaOf(frag: Frag): Dfa {
  const n = new Nfa();
  const start = n.state();
  return determinize(n, { start, accept: frag(n, start) });
}

const accepts = (d: Dfa, text: string | number[]) =>
  matches(d, typeof text === "string" ? enc.encode(text) : text);

Deno.test("UTF-8 classes: exactly the code points of the ranges, never invalid UTF-8", () => {
  const r = rng(11);
  const sets: Ranges[] = [
    [[0, 0x10ffff]],
    [[0x41, 0x5a], [0xe9, 0xe9], [0x7ff, 0x800], [0xd7ff, 0xe000], [0x10000, 0x10001]],
  ];
  for (let k = 0; k < 4; k++) {
    const ranges: Ranges = [];
    for (let j = 0; j < 1 + r.int(5); j++) {
      const lo = r.int(0x110000), len = r.next() < 0.5 ? r.int(200) : r.int(0x20000);
      ranges.push([lo, Math.min(0x10ffff, lo + len)]);
    }
    sets.push(normalize(ranges));
  }
  for (const set of sets) {
    const d = dfaOf(codePoints(set));
    const probes = new Set<number>();
    for (const [a, b] of set) {
      for (const x of [a - 2, a - 1, a, a + 1, b - 1, b, b + 1, b + 2]) probes.add(x);
    }
    for (const x of [0x7f, 0x80, 0x7ff, 0x800, 0xd7ff, 0xe000, 0xffff, 0x10000, 0x10ffff]) {
      probes.add(x);
    }
    for (let j = 0; j < 5000; j++) probes.add(r.int(0x110000));
    for (const c of probes) {
      if (c < 0 || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) continue;
      const inside = set.some(([a, b]) => a <= c && c <= b);
      assert.equal(
        accepts(d, encodeUtf8(c)),
        inside,
        `U+${c.toString(16)} in ${JSON.stringify(set)}`,
      );
    }
  }
  const all = dfaOf(codePoints([[0, 0x10ffff]]));
  const invalid = [
    [0x80],
    [0xc0, 0x80],
    [0xc1, 0xbf],
    [0xe0, 0x80, 0x80],
    [0xed, 0xa0, 0x80],
    [0xf0, 0x80, 0x80, 0x80],
    [0xf4, 0x90, 0x80, 0x80],
    [0xf5, 0x80, 0x80, 0x80],
    [0xe4, 0xb8],
    [0xff],
  ];
  for (const bytes of invalid) {
    assert.ok(
      !accepts(all, bytes),
      `rejects ${bytes.map((b) => b.toString(16))}`,
    );
  }
});

const ALPHABET = ["a", "b", "c", "0", "7", "-", " ", "\n", "é", "世", "🙂", ".", "\\"];

/** A seeded random pattern over {@linkcode ALPHABET}, `depth` levels of nesting. */
function randomPattern(r: Rng, depth: number): string {
  const lit = () => {
    const c = ALPHABET[r.int(ALPHABET.length)];
    return c === "." || c === "\\" ? `\\${c}` : c === "\n" ? "\\n" : c;
  };
  const atom = (): string => {
    const k = r.int(depth > 0 ? 9 : 6);
    if (k === 0) return "[a-c0-9]";
    if (k === 1) return "[^a\\n]";
    if (k === 2) return ["\\d", "\\w", "\\s", "\\D", "."][r.int(5)];
    if (k === 3) return r.next() < 0.8 ? "[é-世]" : "[^]";
    if (k <= 5) return lit();
    if (k <= 7) return `(${randomPattern(r, depth - 1)})`;
    return `(?:${randomPattern(r, depth - 1)}|${randomPattern(r, depth - 1)})`;
  };
  let out = "";
  for (let n = 1 + r.int(3); n > 0; n--) {
    out += atom();
    const q = r.int(9);
    if (q === 0) out += "?";
    else if (q === 1) out += "*";
    else if (q === 2) out += "+";
    else if (q === 3) out += `{${r.int(3)}}`;
    else if (q === 4) {
      const m = r.int(3);
      out += r.next() < 0.5 ? `{${m},}` : `{${m},${m + r.int(3)}}`;
    }
  }
  return out;
}

/** Text the DFA accepts, from a seeded walk over bytes that keep it alive. */
function acceptedText(d: Dfa, r: Rng, maxBytes: number): number[] | undefined {
  let s = 0;
  const out: number[] = [];
  for (let i = 0; i < maxBytes; i++) {
    if (d.accepting[s] && r.next() < 0.3) return out;
    const live: number[] = [];
    for (let b = 0; b < 256; b++) if (d.trans[s * d.classes + d.classOf[b]] >= 0) live.push(b);
    if (live.length === 0) return d.accepting[s] ? out : undefined;
    const b = live[r.int(live.length)];
    out.push(b);
    s = d.trans[s * d.classes + d.classOf[b]];
  }
  return d.accepting[s] ? out : undefined;
}

Deno.test("regex compiler agrees with RegExp (u mode) on seeded random patterns", () => {
  const r = rng(21);
  const dec = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
  for (let k = 0; k < 150; k++) {
    const pattern = randomPattern(r, 2);
    const d = dfaOf(regexGrammar(pattern, "pattern"));
    const re = new RegExp(`^(?:${pattern})$`, "u");
    for (let j = 0; j < 60; j++) {
      const text = Array.from({ length: r.int(7) }, () => ALPHABET[r.int(ALPHABET.length)]).join(
        "",
      );
      assert.equal(accepts(d, text), re.test(text), `${pattern} on ${JSON.stringify(text)}`);
    }
    for (let j = 0; j < 20; j++) {
      const bytes = acceptedText(d, r, 40);
      if (bytes === undefined) continue;
      const text = dec.decode(Uint8Array.from(bytes)); // throws on invalid UTF-8
      assert.ok(re.test(text), `${pattern} accepted ${JSON.stringify(text)}, RegExp does not`);
    }
  }
});

/** Whether some two states of `d` accept the same language (Moore refinement, written plainly). */
function hasEquivalentStates(d: Dfa): boolean {
  let block = Array.from(d.accepting, (a) => a);
  for (;;) {
    const sig = new Map<string, number>();
    const next = block.map((b, s) => {
      const row = [b];
      for (let c = 0; c < d.classes; c++) {
        const t = d.trans[s * d.classes + c];
        row.push(t < 0 ? -1 : block[t]);
      }
      const key = row.join(",");
      if (!sig.has(key)) sig.set(key, sig.size);
      return sig.get(key)!;
    });
    if (sig.size === new Set(block).size) return sig.size < d.states;
    block = next;
  }
}

Deno.test("DFAs are minimal, trimmed, and their byte classes are all distinct", () => {
  const r = rng(31);
  const patterns = ["(ab|ac)*a?", "a{2,5}|b{1,3}", "(a|b)*abb", "[a-c]+(-[a-c]+)*", "x|y|z|xy"];
  for (let k = 0; k < 40; k++) patterns.push(randomPattern(r, 2));
  for (const p of patterns) {
    const d = dfaOf(regexGrammar(p, "pattern"));
    assert.ok(!hasEquivalentStates(d), `${p}: equivalent states left`);
    for (let s = 0; s < d.states; s++) {
      // every state can still reach acceptance
      const seen = new Set([s]), stack = [s];
      let live = false;
      while (stack.length > 0 && !live) {
        const q = stack.pop()!;
        if (d.accepting[q]) live = true;
        for (let c = 0; c < d.classes; c++) {
          const t = d.trans[q * d.classes + c];
          if (t >= 0 && !seen.has(t)) seen.add(t), stack.push(t);
        }
      }
      assert.ok(live, `${p}: state ${s} is dead`);
    }
    const columns = new Set<string>();
    for (let c = 0; c < d.classes; c++) {
      columns.add(Array.from({ length: d.states }, (_, s) => d.trans[s * d.classes + c]).join(","));
    }
    assert.equal(columns.size, d.classes, `${p}: two classes behave alike`);
  }
});

Deno.test("JSON strings and numbers: what JSON.stringify writes, and only what JSON.parse reads", () => {
  const str = dfaOf(jsonString()), num = dfaOf(jsonNumber);
  const r = rng(41);
  const chars = [
    '"',
    "\\",
    "/",
    "\n",
    "\t",
    "\u0000",
    "\u001f",
    "a",
    "é",
    "世",
    "🙂",
    "\u2028",
    " ",
  ];
  for (let k = 0; k < 300; k++) {
    const s = Array.from({ length: r.int(8) }, () => chars[r.int(chars.length)]).join("");
    assert.ok(accepts(str, JSON.stringify(s)), JSON.stringify(s));
    const x = (r.next() - 0.5) * 10 ** (r.int(40) - 20);
    assert.ok(accepts(num, JSON.stringify(x)), String(x));
    assert.ok(accepts(num, JSON.stringify(Math.round(x))), String(Math.round(x)));
  }
  for (const ok of ['"\\u00e9"', '"\\uD7FF"', '"\\uE000"', '"\\/"', '"\\b\\f\\n\\r\\t"']) {
    assert.ok(accepts(str, ok), ok);
  }
  // lone surrogate escapes are refused so each escape is one code point
  for (const bad of ['"\\ud800"', '"\\uDFFF"', '"\\x41"', '"\n"', '"a', 'a"', '"\\u12"']) {
    assert.ok(!accepts(str, bad), bad);
  }
  for (const ok of ["0", "-0", "12", "1.5e-7", "3E+10", "-0.0"]) assert.ok(accepts(num, ok), ok);
  for (const bad of ["01", "+1", "1.", ".5", "1e", "--1", "0x10", "1.5e+"]) {
    assert.ok(!accepts(num, bad), bad);
  }
  for (let k = 0; k < 200; k++) {
    for (const [d, type] of [[str, "string"], [num, "number"]] as const) {
      const bytes = acceptedText(d, r, 30);
      if (bytes === undefined) continue;
      const text = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(
        Uint8Array.from(bytes),
      );
      assert.equal(typeof JSON.parse(text), type, text);
    }
  }
  assert.ok(accepts(dfaOf(escape), "\\u0041"));
});

Deno.test("whitespace runs are bounded: '', ' ', or a newline and up to MAX_INDENT spaces/tabs", () => {
  const d = dfaOf(ws());
  for (const ok of ["", " ", "\n", "\n\t  ", "\n" + " ".repeat(MAX_INDENT)]) {
    assert.ok(accepts(d, ok), JSON.stringify(ok));
  }
  for (const bad of ["  ", "\t", "\n\n", " \n", "\n" + " ".repeat(MAX_INDENT + 1), "\r\n"]) {
    assert.ok(!accepts(d, bad), JSON.stringify(bad));
  }
  assert.equal(walk(d, 0, enc.encode("x")), -1);
});
