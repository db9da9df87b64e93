/**
 * The layer rule and the size limits, checked over the repository (part of `deno task check`).
 *
 * A file imports only from its own folder or a lower layer ({@linkcode LAYERS}, lowest first;
 * DESIGN.md "Layout"). Every relative specifier counts: static imports and `export … from`
 * (type-only ones too: the rule is about structure), `import("…")` with a literal,
 * `import.meta.resolve("…")` and `new URL("….ts", import.meta.url)` (how workers start).
 * Package specifiers (bare, `npm:`, `jsr:`, `node:`, `https:`) are always allowed. A file in a
 * folder the table does not list is an error, so a new folder gets its layer deliberately.
 *
 * Size: product `.ts` files stay within {@linkcode MAX_TS_LINES} lines (tests/, scripts/ and
 * kernels/reference.ts aside), `.wgsl` files within {@linkcode MAX_WGSL_LINES}.
 *
 *   deno run --allow-read scripts/check_layout.ts [--root DIR]
 *
 * Prints one line per violation and exits 1, or prints a one-line summary and exits 0.
 */
import { parseArgs } from "node:util";
import { fileURLToPath } from "node:url";
import { findImports } from "./ts_imports.ts";

/** One layer: the folders (ending in `/`) and files in it. */
export interface Layer {
  /** Lowest first; a file may import a file of equal or lower rank. */
  rank: number;
  /** How messages name the layer. */
  name: string;
  /** Folders (`"gpu/"`: the files directly in it, not its subfolders) and files (`"main.ts"`). */
  paths: string[];
  /** When set, the only folders or files this layer may import, whatever their rank. */
  only?: string[];
}

/** The layer table, lowest first. A new folder goes here, at the layer it belongs to. */
export const LAYERS: Layer[] = [
  { rank: 1, name: "api/", paths: ["api/"] },
  { rank: 2, name: "gpu/", paths: ["gpu/"] },
  { rank: 3, name: "kernels/", paths: ["kernels/"] },
  { rank: 4, name: "engine/model/", paths: ["engine/model/"] },
  // Constrained decoding's host half: grammars → token tables (needs the tokenizer; no GPU).
  { rank: 5, name: "engine/grammar/", paths: ["engine/grammar/"] },
  { rank: 6, name: "engine/kv/", paths: ["engine/kv/"] },
  { rank: 7, name: "engine/runner/", paths: ["engine/runner/"] },
  { rank: 8, name: "engine/sessions/", paths: ["engine/sessions/"] },
  { rank: 9, name: "engine/sched/", paths: ["engine/sched/"] },
  { rank: 10, name: "engine/*.ts", paths: ["engine/"] },
  { rank: 11, name: "engine/worker/", paths: ["engine/worker/"] },
  // The HTTP edge sees the engine only through api/'s types (EngineLike), never engine code.
  { rank: 12, name: "routes/", paths: ["routes/"], only: ["api/", "routes/"] },
  { rank: 13, name: "main.ts, scripts/", paths: ["main.ts", "scripts/"] },
  { rank: 14, name: "tests/", paths: ["tests/"] },
];

/** Folders outside the rule: browser JS, served as files, never imported by the server. */
export const OUT_OF_SCOPE = ["static/"];

/** Folders the walk over the repository skips: packages, model files, build and test output. */
export const SKIPPED = ["node_modules/", "models/", "out/", "tmp/", "corpus/", "test-artifacts/"];

/** The most lines a product `.ts` file may have. */
export const MAX_TS_LINES = 500;
/** The most lines a `.wgsl` file may have. */
export const MAX_WGSL_LINES = 600;
/** `.ts` files and folders the size limit leaves aside. */
export const SIZE_EXEMPT = ["tests/", "scripts/", "kernels/reference.ts"];

/** Files whose imports are checked. */
const CODE = [".ts", ".tsx", ".mts"];
/** A `new URL(…)` or `import.meta.resolve(…)` target with one of these is a module, not data. */
const MODULE = [...CODE, ".js", ".mjs"];

/** A file handed to {@linkcode checkLayout}: its path from the repository root, `/`-separated. */
export interface SourceFile {
  path: string;
  text: string;
}

/** One broken rule: where, and what to do about it. */
export interface Violation {
  file: string;
  /** 1-based; absent for a rule about the whole file. */
  line?: number;
  message: string;
}

/** `file:line: message`, or `file: message`. */
export function formatViolation(v: Violation): string {
  return v.line === undefined ? `${v.file}: ${v.message}` : `${v.file}:${v.line}: ${v.message}`;
}

/** `a/b/c.ts` → `a/b/`; `c.ts` → `""`. */
function folderOf(path: string): string {
  return path.slice(0, path.lastIndexOf("/") + 1);
}

/** The layer of `path` and the table entry (folder or file) that placed it there. */
function layerOf(path: string): { layer: Layer; entry: string } | undefined {
  const folder = folderOf(path);
  for (const layer of LAYERS) {
    for (const entry of layer.paths) {
      if (entry === path || (entry.endsWith("/") && entry === folder)) return { layer, entry };
    }
  }
  return undefined;
}

const under = (path: string, list: string[]) =>
  list.some((p) => p.endsWith("/") ? path.startsWith(p) : path === p);

/** `specifier` resolved against the file `from`; undefined when it climbs out of the root. */
function resolve(from: string, specifier: string): string | undefined {
  const parts = folderOf(from).split("/").filter((p) => p !== "");
  for (const p of specifier.replace(/[?#].*$/, "").split("/")) {
    if (p === "..") {
      if (parts.length === 0) return undefined;
      parts.pop();
    } else if (p !== "." && p !== "") parts.push(p);
  }
  return parts.join("/");
}

/** Lines as `wc -l` and an editor count them (a final newline ends the last line). */
function lineCount(text: string): number {
  if (text === "") return 0;
  return text.split("\n").length - (text.endsWith("\n") ? 1 : 0);
}

function sizeViolation(file: SourceFile): Violation | undefined {
  const lines = lineCount(file.text);
  if (file.path.endsWith(".wgsl") && lines > MAX_WGSL_LINES) {
    return {
      file: file.path,
      message: `${lines} lines; .wgsl files stay under ${MAX_WGSL_LINES} (split it)`,
    };
  }
  if (CODE.some((e) => file.path.endsWith(e)) && !under(file.path, SIZE_EXEMPT)) {
    if (lines > MAX_TS_LINES) {
      return {
        file: file.path,
        message: `${lines} lines; product .ts files stay under ${MAX_TS_LINES} (split it)`,
      };
    }
  }
  return undefined;
}

const NOT_IN_TABLE = "is not in the layer table: add it to LAYERS in scripts/check_layout.ts, " +
  "at the layer it belongs to (DESIGN.md, Layout)";

/** The layer-rule violations of one code file. */
function importViolations(file: SourceFile): Violation[] {
  const out: Violation[] = [];
  const self = layerOf(file.path);
  if (self === undefined) {
    const where = folderOf(file.path) === "" ? `top-level file ${file.path}` : folderOf(file.path);
    return [{ file: file.path, message: `${where} ${NOT_IN_TABLE}` }];
  }
  const { layer } = self;
  for (const ref of findImports(file.text)) {
    const spec = ref.specifier;
    const at = { file: file.path, line: ref.line };
    if (spec.startsWith("/") || spec.startsWith("file:")) {
      out.push({
        ...at,
        message: `imports ${spec} by an absolute path; use a relative specifier (./, ../) ` +
          "so the layer rule can check it",
      });
      continue;
    }
    if (!spec.startsWith("./") && !spec.startsWith("../")) continue; // a package
    const target = resolve(file.path, spec);
    if (target === undefined) {
      out.push({ ...at, message: `imports ${spec}, outside the repository` });
      continue;
    }
    if ((ref.kind === "url" || ref.kind === "resolve") && !MODULE.some((e) => target.endsWith(e))) {
      continue; // a data file or folder (WGSL source, static/, a model), read, not imported
    }
    if (under(target, OUT_OF_SCOPE)) continue;
    const other = layerOf(target);
    if (other === undefined) {
      const folder = folderOf(target) === "" ? `top-level file ${target}` : folderOf(target);
      out.push({ ...at, message: `imports ${target}, but ${folder} ${NOT_IN_TABLE}` });
      continue;
    }
    const what = `imports ${target} (layer ${other.layer.rank}, ${other.layer.name}) ` +
      `from layer ${layer.rank} (${layer.name})`;
    if (layer.only !== undefined) {
      if (!layer.only.includes(other.entry)) {
        const list = layer.only.join(" and ");
        out.push({
          ...at,
          message: `${what}; ${layer.name} may import only ${list} (and packages)`,
        });
      }
    } else if (other.layer.rank > layer.rank) {
      out.push({
        ...at,
        message: `${what}; a file may import only its own folder or a lower layer`,
      });
    }
  }
  return out;
}

/**
 * Checks files against the layer rule and the size limits. Files in {@linkcode OUT_OF_SCOPE}
 * folders and files that are neither code nor `.wgsl` are passed over.
 *
 * @param files paths from the repository root (`/`-separated) with their text
 * @returns the violations, by file then line; empty when everything follows the rules
 * @example
 * ```ts
 * checkLayout([{ path: "gpu/a.ts", text: 'import "../engine/kv/blocks.ts";' }]).map(formatViolation);
 * // ["gpu/a.ts:1: imports engine/kv/blocks.ts (layer 6, engine/kv/) from layer 2 (gpu/); …"]
 * ```
 */
export function checkLayout(files: SourceFile[]): Violation[] {
  const out: Violation[] = [];
  for (const file of files) {
    if (under(file.path, OUT_OF_SCOPE)) continue;
    const code = CODE.some((e) => file.path.endsWith(e));
    if (!code && !file.path.endsWith(".wgsl")) continue;
    const size = sizeViolation(file);
    if (size !== undefined) out.push(size);
    if (code) out.push(...importViolations(file));
  }
  return out.sort((a, b) =>
    a.file < b.file ? -1 : a.file > b.file ? 1 : (a.line ?? 0) - (b.line ?? 0)
  );
}

/**
 * Reads every code and `.wgsl` file under `root`, skipping hidden folders, {@linkcode SKIPPED}
 * and {@linkcode OUT_OF_SCOPE}; paths come back relative to `root`, sorted.
 */
export async function readTree(root: string): Promise<SourceFile[]> {
  const out: SourceFile[] = [];
  const walk = async (dir: string) => {
    const entries = [];
    for await (const e of Deno.readDir(`${root}/${dir}`)) entries.push(e);
    entries.sort((a, b) => (a.name < b.name ? -1 : 1));
    for (const e of entries) {
      const path = dir + e.name;
      if (e.isDirectory) {
        const folder = `${path}/`;
        if (e.name.startsWith(".") || under(folder, [...SKIPPED, ...OUT_OF_SCOPE])) continue;
        await walk(folder);
      } else if (e.isFile && [...CODE, ".wgsl"].some((x) => e.name.endsWith(x))) {
        out.push({ path, text: await Deno.readTextFile(`${root}/${path}`) });
      }
    }
  };
  await walk("");
  return out;
}

const HELP = `Usage: deno run --allow-read scripts/check_layout.ts [--root DIR]

Checks the layer rule and the size limits over the repository (DIR: default, the folder above
scripts/). A file imports only from its own folder or a lower layer, lowest first:
${
  LAYERS.map((l) =>
    `  ${String(l.rank).padStart(2)}. ${l.name}${l.only ? ` (only ${l.only.join(", ")})` : ""}`
  )
    .join("\n")
}
static/ (browser JS) is outside the rule; package specifiers (bare, npm:, jsr:, node:) are
always allowed; a folder not in the table is an error (add it to LAYERS in this file).
Product .ts files stay within ${MAX_TS_LINES} lines (${SIZE_EXEMPT.join(", ")} aside), .wgsl
within ${MAX_WGSL_LINES}.

Prints each violation as file:line: message and exits 1; exits 0 with a summary otherwise.`;

if (import.meta.main) {
  const { values } = parseArgs({
    options: { root: { type: "string" }, help: { type: "boolean", short: "h" } },
  });
  if (values.help) {
    console.log(HELP);
    Deno.exit(0);
  }
  const root = values.root ?? fileURLToPath(new URL("..", import.meta.url));
  const files = await readTree(root.replace(/\/$/, ""));
  const violations = checkLayout(files);
  for (const v of violations) console.log(formatViolation(v));
  if (violations.length > 0) {
    const count = (n: number, what: string) => `${n} ${what}${n === 1 ? "" : "s"}`;
    const files = count(new Set(violations.map((v) => v.file)).size, "file");
    console.error(
      `check_layout: ${count(violations.length, "violation")} in ${files} (see --help)`,
    );
    Deno.exit(1);
  }
  console.log(`check_layout: ${files.length} files follow the layer rule and the size limits`);
}
