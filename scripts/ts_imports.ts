/**
 * The module specifiers a TypeScript file names, found by a small tokenizer (so the word
 * `import` inside a comment, a string, a template or a regular expression is never taken for
 * an import). scripts/check_layout.ts judges them against the layer table.
 *
 * Found, each with the line of its specifier:
 * - `import … from "x"`, `import "x"`, `import type … from "x"`, `import x = require("x")`
 * - `export … from "x"`, `export * from "x"`, `export type { … } from "x"`
 * - `import("x")` with a string literal (a computed specifier cannot be checked and is skipped)
 * - `new URL("x", import.meta.url)` (how workers are started) and `import.meta.resolve("x")`
 *
 * @example
 * ```ts
 * findImports('import { a } from "./a.ts"; // import "./b.ts"');
 * // [{ specifier: "./a.ts", line: 1, kind: "import" }]
 * ```
 */

/** How a file names another module. */
export type ImportKind = "import" | "export" | "dynamic" | "url" | "resolve";

/** One specifier named by a file. */
export interface ImportRef {
  /** The specifier as written: `"../gpu/device.ts"`, `"hono"`, `"npm:fflate"`. */
  specifier: string;
  /** 1-based line of the specifier's string literal. */
  line: number;
  kind: ImportKind;
}

/**
 * A token: names (identifiers and keywords), string literals (and templates without
 * substitutions: their text is known), single-character punctuation; numbers, regular
 * expressions and templates with substitutions are `other`.
 */
interface Token {
  kind: "name" | "string" | "punct" | "other";
  value: string;
  line: number;
}

/** After these keywords a `/` starts a regular expression, not a division. */
const BEFORE_REGEX = new Set([
  "return",
  "typeof",
  "instanceof",
  "in",
  "of",
  "new",
  "delete",
  "void",
  "throw",
  "case",
  "do",
  "else",
  "yield",
  "await",
]);

const NAME_START = /[\p{ID_Start}$_]/u;
const NAME_PART = /[\p{ID_Continue}$\u200c\u200d]/u;

/**
 * Splits TypeScript source into tokens, dropping comments and whitespace.
 *
 * @param text the file's source
 * @returns its tokens in order
 */
export function tokenize(text: string): Token[] {
  const out: Token[] = [];
  let i = 0;
  let line = 1;
  // Open `${` substitutions of templates, innermost last: how many `{` are open inside each.
  const substitutions: number[] = [];

  /** Counts the newlines in text[from, to) into `line`. */
  const lines = (from: number, to: number) => {
    for (let k = from; k < to; k++) if (text.charCodeAt(k) === 10) line++;
  };
  /**
   * Scans template text from `i` (just after "`" or the `}` closing a substitution) to its end
   * or its next `${`; returns whether the template ended, with `i` past the "`" or the `${`.
   */
  const templateText = (): boolean => {
    const from = i;
    while (i < text.length) {
      const c = text[i];
      if (c === "\\") i += 2;
      else if (c === "`") {
        lines(from, i);
        i++;
        return true;
      } else if (c === "$" && text[i + 1] === "{") {
        lines(from, i);
        i += 2;
        substitutions.push(0);
        return false;
      } else i++;
    }
    lines(from, i);
    return true;
  };
  const regexAllowed = () => {
    const prev = out.at(-1);
    if (prev === undefined) return true;
    if (prev.kind === "punct") return !")]}".includes(prev.value);
    return prev.kind === "name" && BEFORE_REGEX.has(prev.value);
  };

  if (text.startsWith("#!")) i = text.indexOf("\n") < 0 ? text.length : text.indexOf("\n");
  while (i < text.length) {
    const c = text[i];
    const start = i;
    const at = line;
    if (c === "\n") {
      line++;
      i++;
    } else if (
      c === " " || c === "\t" || c === "\r" || c === "\f" || c === "\v" || c === "\uFEFF"
    ) {
      i++;
    } else if (c === "/" && text[i + 1] === "/") {
      const end = text.indexOf("\n", i);
      i = end < 0 ? text.length : end;
    } else if (c === "/" && text[i + 1] === "*") {
      const end = text.indexOf("*/", i + 2);
      i = end < 0 ? text.length : end + 2;
      lines(start, i);
    } else if (c === '"' || c === "'") {
      let value = "";
      i++;
      while (i < text.length && text[i] !== c && text[i] !== "\n") {
        if (text[i] === "\\") {
          if (text[i + 1] === "\n") line++;
          value += text[i + 1] ?? "";
          i += 2;
        } else value += text[i++];
      }
      i++;
      out.push({ kind: "string", value, line: at });
    } else if (c === "`") {
      i++;
      const ended = templateText();
      const body = text.slice(start + 1, i - 1);
      if (ended && !body.includes("\\")) out.push({ kind: "string", value: body, line: at });
      else out.push({ kind: "other", value: "`", line: at });
    } else if (c === "}" && substitutions.length > 0 && substitutions.at(-1) === 0) {
      substitutions.pop();
      i++;
      templateText();
      out.push({ kind: "other", value: "`", line: at });
    } else if (c === "/" && regexAllowed()) {
      i++;
      let inClass = false;
      while (i < text.length && text[i] !== "\n") {
        const r = text[i];
        if (r === "\\") i++;
        else if (r === "[") inClass = true;
        else if (r === "]") inClass = false;
        else if (r === "/" && !inClass) break;
        i++;
      }
      i++;
      while (i < text.length && NAME_PART.test(text[i])) i++;
      out.push({ kind: "other", value: text.slice(start, i), line: at });
    } else if (NAME_START.test(c)) {
      while (i < text.length && NAME_PART.test(text[i])) i++;
      out.push({ kind: "name", value: text.slice(start, i), line: at });
    } else if (c >= "0" && c <= "9") {
      while (i < text.length && /[0-9A-Za-z_.]/.test(text[i])) i++;
      out.push({ kind: "other", value: text.slice(start, i), line: at });
    } else {
      if (substitutions.length > 0) {
        if (c === "{") substitutions[substitutions.length - 1]++;
        else if (c === "}") substitutions[substitutions.length - 1]--;
      }
      i++;
      out.push({ kind: "punct", value: c, line: at });
    }
  }
  return out;
}

/**
 * Every module specifier `text` names (see the module doc for the forms), in source order.
 *
 * @param text a TypeScript or JavaScript file's source
 * @returns the specifiers with their lines and how each is named
 */
export function findImports(text: string): ImportRef[] {
  const t = tokenize(text);
  const out: ImportRef[] = [];
  const is = (k: number, kind: Token["kind"], value?: string) =>
    t[k]?.kind === kind && (value === undefined || t[k].value === value);
  const add = (k: number, kind: ImportKind) =>
    out.push({ specifier: t[k].value, line: t[k].line, kind });
  /**
   * From j (the token after `import` or `export`, past any `type`), skips a `{ … }` list or a
   * `* as name` and returns the index after it; undefined when neither is there.
   */
  const bindings = (j: number): number | undefined => {
    if (is(j, "punct", "*")) return is(j + 1, "name", "as") ? j + 3 : j + 1;
    if (!is(j, "punct", "{")) return undefined;
    for (j++; j < t.length && !is(j, "punct", "}"); j++) {
      if (!is(j, "name") && !is(j, "string") && !is(j, "punct", ",")) return undefined;
    }
    return j + 1;
  };
  /** The index of the string in `from "x"` at j, if it is there. */
  const from = (j: number | undefined) =>
    j !== undefined && is(j, "name", "from") && is(j + 1, "string") ? j + 1 : undefined;
  /** `type` at j is a modifier (`import type X from`), not a default binding named type. */
  const typeModifier = (j: number) =>
    is(j, "name", "type") &&
    ((is(j + 1, "name") && !is(j + 1, "name", "from")) || is(j + 1, "punct", "{") ||
      is(j + 1, "punct", "*"));

  for (let k = 0; k < t.length; k++) {
    if (t[k].kind !== "name" || is(k - 1, "punct", ".")) continue;
    const word = t[k].value;
    if (word === "import") {
      if (is(k + 1, "punct", "(")) {
        if (is(k + 2, "string") && (is(k + 3, "punct", ")") || is(k + 3, "punct", ","))) {
          add(k + 2, "dynamic");
        }
      } else if (is(k + 1, "punct", ".")) {
        if (
          is(k + 2, "name", "meta") && is(k + 3, "punct", ".") && is(k + 4, "name", "resolve") &&
          is(k + 5, "punct", "(") && is(k + 6, "string")
        ) add(k + 6, "resolve");
      } else if (is(k + 1, "string")) {
        add(k + 1, "import");
      } else {
        let j = typeModifier(k + 1) ? k + 2 : k + 1;
        let end: number | undefined;
        if (is(j, "name") && !is(j, "name", "from")) {
          j++;
          if (is(j, "punct", "=") && is(j + 1, "name", "require") && is(j + 2, "punct", "(")) {
            if (is(j + 3, "string")) add(j + 3, "import");
            continue;
          }
          end = is(j, "punct", ",") ? bindings(j + 1) : j;
        } else end = bindings(j);
        const s = from(end);
        if (s !== undefined) add(s, "import");
      }
    } else if (word === "export") {
      const s = from(bindings(typeModifier(k + 1) ? k + 2 : k + 1));
      if (s !== undefined) add(s, "export");
    } else if (word === "new" && is(k + 1, "name", "URL") && is(k + 2, "punct", "(")) {
      if (
        is(k + 3, "string") && is(k + 4, "punct", ",") && is(k + 5, "name", "import") &&
        is(k + 6, "punct", ".") && is(k + 7, "name", "meta") && is(k + 8, "punct", ".") &&
        is(k + 9, "name", "url")
      ) add(k + 3, "url");
    }
  }
  return out;
}
