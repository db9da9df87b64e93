/**
 * Loop unrolling for WGSL at pipeline build: every `for` loop on the line after a lone
 * `// @unroll` comment is replaced by one `{ … }` block per trip, the loop variable written as
 * its value (`3u`). The source stays real WGSL (the marked loops compile as they stand, see
 * {@linkcode PipelineOptions.unroll} in kernels/pipeline.ts); expanded, naga sees the straight
 * line a hand-written ladder would give it.
 *
 * Why: naga gives every loop a termination guard, so a driver may not unroll it; an array indexed
 * by a loop counter then lives in local memory, and each trip costs about 30 ns on an H200
 * whatever its body (docs/kernels.md, "Straight-line code").
 *
 * Form: `for (var i = A; i < B; i++)` (or `i <= B`, `i += S`), where A, B and S are integer
 * expressions of literals and module-scope `const`s (`+ - * / % << >>`, parentheses). Bodies may
 * use `i` anywhere (an index, arithmetic, an inner marked loop's bounds) but not assign it, and may
 * not `break` or `continue` the marked loop. Marked loops may nest: the outer one is expanded
 * first, so an inner bound may depend on the outer variable.
 */

/** Options for {@linkcode unrollLoops}. */
export interface UnrollOptions {
  /** Named in error messages (e.g. the .wgsl file). */
  label?: string;
  /** Most blocks one marked loop may expand to (default 256). */
  maxTrips?: number;
}

const MARKER = /^[ \t]*\/\/[ \t]*@unroll[ \t]*$/m;
const IDENT = /^[A-Za-z_][A-Za-z0-9_]*$/;

/**
 * Returns `source` with every loop marked `// @unroll` expanded.
 *
 * @throws Error naming the line when a marked loop has another form, a bound that is not
 *   constant, a body that assigns the loop variable or breaks out of it, or too many trips.
 * @example
 * unrollLoops("const N = 2u;\n// @unroll\nfor (var i = 0u; i < N; i++) { a[i] = f(i); }");
 * // "const N = 2u;\n// unrolled: i = 0u .. 1u\n{ a[0u] = f(0u); }\n{ a[1u] = f(1u); }"
 */
export function unrollLoops(source: string, opts: UnrollOptions = {}): string {
  const consts = moduleConsts(source);
  let out = source;
  for (let m = MARKER.exec(out); m; m = MARKER.exec(out)) {
    const start = m.index;
    const at = `${opts.label ?? "wgsl"}:${lineOf(out, start)}`;
    out = out.slice(0, start) + expand(out, start + m[0].length, start, consts, at, opts);
  }
  return out;
}

/** The marked loop after `from` expanded, followed by the rest of `src`. */
function expand(
  src: string,
  from: number,
  markerStart: number,
  consts: Map<string, string>,
  at: string,
  opts: UnrollOptions,
): string {
  const fail = (what: string): never => {
    throw new Error(`unroll: ${at}: ${what}`);
  };
  const head = /^\s*for\s*\(/.exec(src.slice(from));
  if (!head) fail("`// @unroll` must be followed by a `for` loop");
  const open = from + head![0].length - 1;
  const close = matching(src, open, "(", ")") ?? fail("unclosed `for (`");
  const parts = splitTop(src.slice(open + 1, close), ";");
  if (parts.length !== 3) fail("expected `for (init; condition; update)`");
  const init = /^\s*var\s+([A-Za-z_]\w*)\s*(?::\s*([iu]32)\s*)?=\s*([^]*?)\s*$/.exec(parts[0]);
  if (!init) fail(`the init must be \`var NAME = START\`; got \`${parts[0].trim()}\``);
  const [, name, type, startText] = init!;
  const cond = /^\s*([A-Za-z_]\w*)\s*(<=?)\s*([^]*?)\s*$/.exec(parts[1]);
  if (!cond || cond[1] !== name) {
    fail(
      `the condition must be \`${name} < END\` or \`${name} <= END\`; got \`${parts[1].trim()}\``,
    );
  }
  const upd = parts[2].trim();
  const stepMatch = new RegExp(`^${name}\\s*\\+=\\s*([^]+)$`).exec(upd);
  const stepText = upd === `${name}++` || upd === `++${name}` ? "1" : stepMatch?.[1];
  if (stepText === undefined) fail(`the update must be \`${name}++\` or \`${name} += STEP\``);
  const value = (what: string, text: string) => {
    try {
      return evaluate(text, consts);
    } catch (e) {
      return fail(`${what} \`${text.trim()}\`: ${(e as Error).message}`);
    }
  };
  const first = value("start", startText), end = value("bound", cond![3]);
  const step = value("step", stepText!);
  if (step < 1) fail(`the step must be >= 1; got ${step}`);
  const braceAt = skipSpace(src, close + 1);
  if (src[braceAt] !== "{") fail("the loop body must be a `{ … }` block");
  const bodyEnd = matching(src, braceAt, "{", "}") ?? fail("unclosed loop body");
  const body = src.slice(braceAt + 1, bodyEnd);
  checkBody(body, name, fail);

  const suffix = type ? type[0] : literalSuffix(startText, consts);
  const lit = (v: number) => v < 0 ? `(${v}${suffix})` : `${v}${suffix}`;
  const values: number[] = [];
  for (let v = first; cond![2] === "<=" ? v <= end : v < end; v += step) {
    values.push(v);
    if (values.length > (opts.maxTrips ?? 256)) fail(`over ${opts.maxTrips ?? 256} trips`);
  }
  const uses = new RegExp(`(?<![\\w.])${name}(?!\\w)`, "g");
  const indent = /^[ \t]*/.exec(src.slice(markerStart))![0];
  const range = values.length
    ? `${name} = ${lit(values[0])} .. ${lit(values[values.length - 1])}`
    : `${name}: no trips`;
  const blocks = values.map((v) => `{${body.replace(uses, lit(v))}}`).join(`\n${indent}`);
  return `${indent}// unrolled: ${range}\n${indent}${blocks}` + src.slice(bodyEnd + 1);
}

/** Fails when `body` assigns `name`, declares it again, or breaks or continues its loop. */
function checkBody(body: string, name: string, fail: (what: string) => never): void {
  const code = stripComments(body);
  if (new RegExp(`\\b(var|let|const)\\s+${name}\\b`).test(code)) {
    fail(`the body declares \`${name}\` again`);
  }
  if (new RegExp(`(?<![\\w.])${name}\\s*(=(?!=)|\\+\\+|--|[-+*/%&|^]=|<<=|>>=)`).test(code)) {
    fail(`the body assigns the loop variable \`${name}\``);
  }
  // break / continue outside any loop or switch nested in the body would leave the unrolled one.
  let depth = 0;
  const inner: number[] = []; // brace depths at which nested loops' bodies open
  let pending = false;
  for (const t of code.matchAll(/\b(for|while|loop|switch|break|continue)\b|[{}]/g)) {
    const tok = t[0];
    if (tok === "{") {
      depth++;
      if (pending) inner.push(depth), pending = false;
    } else if (tok === "}") {
      if (inner[inner.length - 1] === depth) inner.pop();
      depth--;
    } else if (tok === "break" || tok === "continue") {
      if (inner.length === 0) fail(`\`${tok}\` in the body of an unrolled loop`);
    } else pending = true;
  }
}

/** Integer values of the source's module-scope `const`s, as their initialiser text. */
function moduleConsts(src: string): Map<string, string> {
  const code = stripComments(src);
  const consts = new Map<string, string>();
  let depth = 0;
  const re = /[{}]|\bconst\s+([A-Za-z_]\w*)\s*(?::\s*[^=]+)?=\s*([^;]+);/g;
  for (const m of code.matchAll(re)) {
    if (m[0] === "{") depth++;
    else if (m[0] === "}") depth--;
    else if (depth === 0) consts.set(m[1], m[2]);
  }
  return consts;
}

/**
 * Evaluates an integer expression of literals (`16`, `16u`, `0x10`) and consts.
 *
 * @throws Error on anything else (an `override`, a runtime value, a float).
 */
export function evaluate(text: string, consts: Map<string, string>, seen: string[] = []): number {
  const tokens = text.match(/0[xX][0-9a-fA-F]+[iu]?|\d+[iu]?|[A-Za-z_]\w*|<<|>>|\S/g) ?? [];
  let i = 0;
  const peek = () => tokens[i];
  const bad = (what: string): never => {
    throw new Error(what);
  };
  const primary = (): number => {
    const t = tokens[i++];
    if (t === undefined) return bad("unexpected end");
    if (t === "(") {
      const v = binary(0);
      if (tokens[i++] !== ")") bad("expected `)`");
      return v;
    }
    if (t === "-") return -primary();
    if (/^(0[xX][0-9a-fA-F]+|\d+)[iu]?$/.test(t)) return Number(t.replace(/[iu]$/, ""));
    if (IDENT.test(t)) {
      const def = consts.get(t);
      if (def === undefined) bad(`\`${t}\` is not an integer literal or a module-scope const`);
      if (seen.includes(t)) bad(`\`${t}\` is defined in terms of itself`);
      return evaluate(def!, consts, [...seen, t]);
    }
    return bad(`unexpected \`${t}\``);
  };
  const PREC: Record<string, number> = { "<<": 1, ">>": 1, "+": 2, "-": 2, "*": 3, "/": 3, "%": 3 };
  const binary = (min: number): number => {
    let left = primary();
    while (peek() !== undefined && (PREC[peek()] ?? 0) > min) {
      const op = tokens[i++];
      const right = binary(PREC[op]);
      left = op === "+"
        ? left + right
        : op === "-"
        ? left - right
        : op === "*"
        ? left * right
        : op === "/"
        ? Math.trunc(left / right)
        : op === "%"
        ? left % right
        : op === "<<"
        ? left * 2 ** right
        : Math.floor(left / 2 ** right);
    }
    return left;
  };
  const v = binary(0);
  if (i !== tokens.length) bad(`unexpected \`${tokens[i]}\``);
  if (!Number.isSafeInteger(v)) bad(`not an integer: ${v}`);
  return v;
}

/**
 * The suffix (`u` or `i`) of the loop variable's type: that of the first suffixed literal of its
 * start, through consts; `i` for an abstract integer (WGSL makes `var i = 0` an i32).
 */
function literalSuffix(text: string, consts: Map<string, string>, depth = 0): string {
  for (const t of text.match(/0[xX][0-9a-fA-F]+[iu]?|\d+[iu]?|[A-Za-z_]\w*/g) ?? []) {
    if (/^\d|^0[xX]/.test(t)) {
      if (/[iu]$/.test(t)) return t[t.length - 1];
    } else if (consts.has(t) && depth < 16) {
      const s = literalSuffix(consts.get(t)!, consts, depth + 1);
      if (s !== "") return s;
    }
  }
  return depth === 0 ? "i" : "";
}

/** Index of the bracket closing the one at `open`, skipping comments; undefined when none. */
function matching(src: string, open: number, o: string, c: string): number | undefined {
  let depth = 0;
  for (let i = open; i < src.length; i++) {
    i = skipComment(src, i);
    if (src[i] === o) depth++;
    else if (src[i] === c && --depth === 0) return i;
  }
  return undefined;
}

/** Splits at `sep` outside brackets. */
function splitTop(s: string, sep: string): string[] {
  const parts: string[] = [];
  let depth = 0, last = 0;
  for (let i = 0; i < s.length; i++) {
    if ("([".includes(s[i])) depth++;
    else if (")]".includes(s[i])) depth--;
    else if (s[i] === sep && depth === 0) parts.push(s.slice(last, i)), last = i + 1;
  }
  return [...parts, s.slice(last)];
}

/** The index past any comment starting at `i` (WGSL's block comments nest). */
function skipComment(src: string, i: number): number {
  if (src.startsWith("//", i)) {
    const nl = src.indexOf("\n", i);
    return nl < 0 ? src.length : nl;
  }
  if (!src.startsWith("/*", i)) return i;
  let depth = 0;
  for (let j = i; j < src.length - 1; j++) {
    if (src.startsWith("/*", j)) depth++, j++;
    else if (src.startsWith("*/", j) && --depth === 0) return j + 2;
  }
  return src.length;
}

function skipSpace(src: string, i: number): number {
  let j = i;
  while (j < src.length) {
    const k = skipComment(src, j);
    if (k > j) j = k;
    else if (/\s/.test(src[j])) j++;
    else return j;
  }
  return j;
}

/** `src` with comments blanked out (same length, so offsets still match). */
function stripComments(src: string): string {
  let out = "";
  for (let i = 0; i < src.length;) {
    const j = skipComment(src, i);
    if (j > i) out += src.slice(i, j).replace(/[^\n]/g, " "), i = j;
    else out += src[i++];
  }
  return out;
}

function lineOf(src: string, offset: number): number {
  return src.slice(0, offset).split("\n").length;
}
