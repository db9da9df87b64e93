/**
 * `deno task bench --resume`: how fast a session evicted from the GPU comes back, against
 * recomputing it, in one run (docs/kv_tiers.md). For each length L, a session takes a turn of L
 * prompt tokens on an engine whose pool holds one context; a long request then takes every block
 * (the session is evicted and its GPU blocks overwritten); the session's next turn (16 new
 * tokens) is timed to its first token, with its KV coming back
 *
 * - from host memory (`--kv-host-mb`),
 * - from spill files (`--kv-spill`, host memory 0: every block is read from its file),
 * - from the snapshot store (Deno KV, `--kv`: read and unpacked chunk by chunk),
 * - or recomputed (no tier: the whole prompt is prefilled again).
 *
 * Restores use their tier whatever the start-up profile says ("always"); the table shows the
 * profile's verdict beside the measurement. Also: spill GB/s (GPU → host memory, host memory →
 * files) and restore GB/s per tier from the engine's counters, and how many sessions of
 * `--resident-tokens` stay on the GPU at once per `--kv-codec` (evicted one by one). Table on
 * stdout, progress on stderr when it is a terminal, `--out` JSON.
 */
import { parseArgs } from "node:util";
import { type KvTierStats, sampling, type StorageTierProfile } from "../api/types.ts";
import { Engine, type EngineOptions } from "../engine/engine.ts";
import { BLOCK } from "../engine/kv/blocks.ts";
import type { GpuModel } from "../engine/model/gpu_model.ts";
import { status } from "../engine/model/progress.ts";
import { SHAPES, syntheticModel } from "../engine/model/synthetic.ts";
import { SessionStore } from "../engine/sessions/store.ts";
import { getGpu, type Gpu, isCpuAdapter } from "../gpu/device.ts";
import { parseKvDtype } from "../gpu/dtype.ts";
import { DEFAULT_MODEL } from "./bench_options.ts";
import { rng } from "./rng.ts";

export const RESUME_USAGE = `deno task bench --resume: time to first token of a session resumed
from host memory, from spill files and from the snapshot store (Deno KV), against recomputing it

  --shape NAME          a random-weight shape (default tinyllama-1.1b; tiny on a CPU adapter)
  --model DIR           a model folder instead of a shape
  --lengths L,...       session lengths in tokens (default 2048,8192; 64,256 on a CPU adapter)
  --tiers T,...         host, file, kv (default all three; recompute always runs)
  --runs N              timed resumes per length and tier, the median reported (default 3)
  --kv-dtype f32|f16    the KV cache's element type (default f32)
  --kv-codec C,...      KV codecs to count resident sessions for (passed to the engine as
                        kvCodec; default: none, the plain cache only)
  --resident-tokens N   tokens per session for the resident count (default 2048; 0 skips it,
                        the default on a CPU adapter)
  --kv-blocks N         the resident count's pool in blocks (default: the engine's, a memory
                        budget)
  --out FILE            write the results as JSON
  --help                this text

Goal on the H200 (issue 23): from host memory <= 20% of recompute, from files <= 35%.`;

/**
 * Random prompts of `len` ids below `vocab`, a different one each call (seeded): prompts that
 * shared blocks would be found in the GPU's cache instead of the tier measured.
 */
function prompts(vocab: number, len: number, seed: number): () => number[] {
  const r = rng(seed);
  return () => Array.from({ length: len }, () => r.int(vocab));
}

/** Tokens a resumed turn adds to the session before its first token. */
const NEW_TOKENS = BLOCK;

/** Options of {@linkcode runResumeBench}. */
export interface ResumeOptions {
  shape?: string;
  model?: string;
  lengths?: number[];
  tiers?: ("host" | "file" | "kv")[];
  runs?: number;
  kvDtype?: "f32" | "f16";
  codecs?: string[];
  residentTokens?: number;
  /** The resident count's pool (default: the engine's). */
  kvBlocks?: number;
  gpu?: Gpu;
}

/** One length and source: the resumed turn's time to first token and what came back. */
export interface ResumeRow {
  length: number;
  source: "host" | "file" | "kv" | "recompute";
  ttft_ms: number;
  /** ttft ÷ the recompute row's, same length. */
  of_recompute: number;
  cached_tokens: number;
  /** Restore GB/s: bytes brought back ÷ the time from the request to their upload. */
  restore_gb_s: number | null;
  /** GPU → host memory (host, file) and host memory → files (file) while it was evicted. */
  spill_gb_s: number | null;
  write_gb_s: number | null;
  /** The start-up profile's verdict: would restores use this tier on their own? */
  profile_uses: boolean | null;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1];
const gbs = (bytes: number, ms: number) => (ms > 0 ? bytes / 1e6 / ms : null);

/** Runs the benchmark (see the module doc). */
export async function runResumeBench(o: ResumeOptions = {}) {
  const gpu = o.gpu ?? await getGpu();
  const cpu = isCpuAdapter(gpu);
  const lengths = o.lengths ?? (cpu ? [64, 256] : [2048, 8192]);
  const tiers = o.tiers ?? ["host", "file", "kv"];
  const runs = o.runs ?? 3, kvDtype = o.kvDtype ?? "f32";
  const shape = o.model ? undefined : o.shape ?? (cpu ? "tiny" : "tinyllama-1.1b");
  status(`bench --resume: loading ${shape ? `shape ${shape}` : o.model}`);
  const shared = shape
    ? await syntheticModel(gpu, shape, { tokenizerDir: DEFAULT_MODEL })
    : undefined;
  const open = (opts: EngineOptions) =>
    shared ? Engine.open(gpu, shared, opts) : Engine.load(o.model!, { ...opts, gpu });
  const tmp = await Deno.makeTempDir({ prefix: "strata-resume-" });
  const rows: ResumeRow[] = [];
  let profile: StorageTierProfile | undefined, vocab = 0;
  try {
    for (const L of lengths) {
      const context = L + NEW_TOKENS + 2 + BLOCK;
      // One context and its spare: the long request takes every block.
      const base: EngineOptions = {
        maxSlots: 1,
        contextLength: context,
        kvBlocks: Math.ceil(context / BLOCK) + 1,
        kvDtype,
        kvTierPolicy: "always",
      };
      const measured: ResumeRow[] = [];
      for (const source of ["recompute", ...tiers] as const) {
        status(`bench --resume: ${L} tokens, ${source}`);
        const store = source === "kv"
          ? await SessionStore.open(`${tmp}/kv-${L}.sqlite`)
          : undefined;
        const engine = await open({
          ...base,
          ...(source === "host" ? { kvHostBytes: hostBytes(L, shared, context) } : {}),
          ...(source === "file"
            ? { kvHostBytes: 0, kvSpillDir: `${tmp}/spill-${L}`, kvSpillBytes: 2 ** 40 }
            : {}),
          ...(store ? { store } : {}),
        });
        try {
          vocab = Math.min(engine.config.vocabSize, engine.tokenizer.vocabSize);
          const r = await resumeRuns(engine, { L, context, runs, vocab, seed: L * 7 + 1 });
          const t: KvTierStats | undefined = engine.kvStats().tiers;
          profile ??= t?.profile;
          measured.push({
            length: L,
            source,
            ttft_ms: r.ttft,
            of_recompute: 0,
            cached_tokens: r.cached,
            restore_gb_s: t && t.restored.bytes ? gbs(t.restored.bytes, t.restored.ms) : null,
            spill_gb_s: t && t.spilled.bytes ? gbs(t.spilled.bytes, t.spilled.ms) : null,
            write_gb_s: t && t.written.bytes ? gbs(t.written.bytes, t.written.ms) : null,
            profile_uses: source === "recompute" ? null : t?.profile?.[source]?.use ?? null,
          });
        } finally {
          await engine.flushSnapshots();
          store?.close();
        }
      }
      const recompute = measured[0].ttft_ms;
      for (const m of measured) rows.push({ ...m, of_recompute: m.ttft_ms / recompute });
    }
    const resident = await residentCounts(open, o, { cpu, kvDtype, vocab });
    return {
      adapter: gpu.adapterName,
      model: shape ? `shape ${shape}` : o.model!,
      kv_dtype: kvDtype,
      new_tokens: NEW_TOKENS,
      runs,
      rows,
      resident,
      profile: profile ?? null,
      date: new Date().toISOString(),
      deno: Deno.version.deno,
    };
  } finally {
    await Deno.remove(tmp, { recursive: true });
  }
}

/** Host memory for one session of `L` tokens and then some. */
function hostBytes(L: number, model: GpuModel | undefined, context: number): number {
  const cfg = model?.config;
  const perToken = cfg ? 2 * cfg.nLayers * cfg.nKvHeads * cfg.headDim * 4 : 1 << 20;
  return Math.ceil(((Math.max(L, context) * perToken) * 1.5) / 2 ** 20) * 2 ** 20;
}

/**
 * `runs` sessions of `L` tokens, each evicted by a long request and resumed; the median time to
 * the resumed turn's first token and the tokens it found cached.
 */
async function resumeRuns(
  engine: Engine,
  o: { L: number; context: number; runs: number; vocab: number; seed: number },
) {
  const turns = prompts(o.vocab, o.L, o.seed);
  const longs = prompts(o.vocab, o.context - 1, o.seed + 1);
  const tail = prompts(o.vocab, NEW_TOKENS, o.seed + 2);
  const one = { ...sampling({ maxTokens: 1, stopAtEos: false }) };
  const gen = async (promptIds: number[], sessionId?: string) => {
    const t0 = performance.now();
    const g = engine.generate({ promptIds, sampling: one, sessionId });
    let first = 0;
    const ids: number[] = [];
    for await (const t of g) {
      first ||= performance.now();
      ids.push(t.id);
    }
    const r = await g.result;
    return { ttft: first - t0, ids, cached: r.cachedTokens };
  };
  await gen(longs()); // compiles the pipelines of the lengths used
  const ttfts: number[] = [], cached: number[] = [];
  for (let i = 0; i <= o.runs; i++) {
    const id = `resume-${i}`, prompt = turns();
    const said = await gen(prompt, id);
    await engine.flushSnapshots(); // the store's snapshot of turn 1
    await gen(longs()); // evicts the session; its GPU blocks are overwritten
    await engine.flushSnapshots(); // spills landed, files written
    const back = await gen([...prompt, ...said.ids, ...tail()], id);
    if (i === 0) continue; // the first resume compiles the resumed turn's chunk sizes
    ttfts.push(back.ttft);
    cached.push(back.cached);
  }
  return { ttft: median(ttfts), cached: median(cached) };
}

/**
 * Sessions of `--resident-tokens` held on the GPU at once, per codec: sessions are started one
 * after another on an engine with the default pool and no tier until the first one is evicted.
 */
async function residentCounts(
  open: (opts: EngineOptions) => Promise<Engine>,
  o: ResumeOptions,
  x: { cpu: boolean; kvDtype: "f32" | "f16"; vocab: number },
) {
  const tokens = o.residentTokens ?? (x.cpu ? 0 : 2048);
  if (tokens === 0) return [];
  const out: { codec: string; tokens: number; sessions: number; blocks: number }[] = [];
  for (const codec of o.codecs ?? ["none"]) {
    status(`bench --resume: sessions of ${tokens} tokens resident, codec ${codec}`);
    const opts: EngineOptions = {
      maxSlots: 1,
      contextLength: tokens + BLOCK,
      kvDtype: x.kvDtype,
      ...(o.kvBlocks ? { kvBlocks: o.kvBlocks } : {}),
    };
    if (codec !== "none") Object.assign(opts, { kvCodec: codec });
    const engine = await open(opts);
    if (codec !== "none" && (engine.opts as unknown as Record<string, unknown>).kvCodec !== codec) {
      throw new Error(`--kv-codec ${codec}: this engine does not take a KV codec`);
    }
    const next = prompts(x.vocab, tokens - 1, 0xc0dec);
    let n = 0;
    const limit = engine.kvStats().gpu.total; // more sessions than blocks cannot fit
    for (; n < limit; n++) {
      const g = engine.generate({
        promptIds: next(),
        sampling: sampling({ maxTokens: 1, stopAtEos: false }),
        sessionId: `r${n}`,
      });
      for await (const _ of g) { /* one token */ }
      await g.result;
      if (n > 0 && !(engine.session("r0")!.tokens > 0)) break;
    }
    out.push({ codec, tokens, sessions: n, blocks: engine.kvStats().gpu.total });
  }
  return out;
}

/** The results as a table. */
export function formatResume(r: Awaited<ReturnType<typeof runResumeBench>>): string {
  const f = (x: number | null, d = 2) => (x === null ? "-" : x.toFixed(d));
  const lines = [
    `strata bench --resume: ${r.model} on ${r.adapter}, ${r.kv_dtype} KV, ` +
    `${r.new_tokens} new tokens per resumed turn, median of ${r.runs}`,
    "",
    "length  source      ttft ms  of recompute  cached  restore GB/s  spill GB/s  write GB/s  profile",
  ];
  for (const x of r.rows) {
    lines.push(
      `${String(x.length).padStart(6)}  ${x.source.padEnd(9)}  ${f(x.ttft_ms, 1).padStart(9)}  ` +
        `${(x.of_recompute * 100).toFixed(1).padStart(11)}%  ${
          String(x.cached_tokens).padStart(6)
        }  ` +
        `${f(x.restore_gb_s).padStart(12)}  ${f(x.spill_gb_s).padStart(10)}  ` +
        `${f(x.write_gb_s).padStart(10)}  ${
          x.profile_uses === null ? "-" : x.profile_uses ? "uses" : "skips"
        }`,
    );
  }
  if (r.resident.length) {
    lines.push("", "sessions resident on the GPU at once");
    for (const s of r.resident) {
      lines.push(`  ${s.codec.padEnd(6)} ${s.sessions} of ${s.tokens} tokens (${s.blocks} blocks)`);
    }
  }
  if (r.profile) {
    const p = r.profile;
    lines.push(
      "",
      `profile: recompute ${f(p.recomputeTokensPerS, 0)} tok/s (${
        f(p.recomputeMsPerBlock, 3)
      } ms/block); ` +
        `GPU→host ${f(p.gpuToHost.gbPerS)} GB/s, host→GPU ${f(p.hostToGpu.gbPerS)} GB/s` +
        (p.fileToHost ? `, file→host ${f(p.fileToHost.gbPerS)} GB/s` : "") +
        (p.kvRead ? `, Deno KV→host ${f(p.kvRead.gbPerS)} GB/s` : "") +
        `; prefetch ${p.prefetchBlocks} blocks`,
    );
  }
  lines.push("", "goal on the H200: host <= 20% of recompute, files <= 35%");
  return lines.join("\n");
}

/** The CLI (`deno task bench --resume ...`). */
export async function resumeMain(args: string[]): Promise<void> {
  const { values: v } = parseArgs({
    args: args.filter((a) => a !== "--resume"),
    options: {
      shape: { type: "string" },
      model: { type: "string" },
      lengths: { type: "string" },
      tiers: { type: "string" },
      runs: { type: "string" },
      "kv-dtype": { type: "string" },
      "kv-codec": { type: "string" },
      "resident-tokens": { type: "string" },
      "kv-blocks": { type: "string" },
      out: { type: "string" },
      help: { type: "boolean" },
    },
  });
  if (v.help) return console.log(RESUME_USAGE);
  const ints = (name: string, s: string | undefined, min: number) =>
    s?.split(",").map((x) => {
      const n = Number(x.trim());
      if (!Number.isInteger(n) || n < min) {
        throw new Error(`--${name} takes integers >= ${min}; got '${s}'`);
      }
      return n;
    });
  if (v.shape !== undefined && v.model !== undefined) {
    throw new Error("give --shape or --model, not both");
  }
  if (v.shape !== undefined && !(v.shape in SHAPES)) {
    throw new Error(`--shape must be one of ${Object.keys(SHAPES).join(", ")}; got '${v.shape}'`);
  }
  const tiers = v.tiers?.split(",").map((t) => t.trim());
  for (const t of tiers ?? []) {
    if (t !== "host" && t !== "file" && t !== "kv") {
      throw new Error(`--tiers takes host, file and kv; got '${t}'`);
    }
  }
  const r = await runResumeBench({
    shape: v.shape,
    model: v.model,
    lengths: ints("lengths", v.lengths, 1),
    tiers: tiers as ResumeOptions["tiers"],
    runs: ints("runs", v.runs, 1)?.[0],
    kvDtype: parseKvDtype(v["kv-dtype"]) as "f32" | "f16",
    codecs: v["kv-codec"]?.split(",").map((c) => c.trim()),
    residentTokens: ints("resident-tokens", v["resident-tokens"], 0)?.[0],
    kvBlocks: ints("kv-blocks", v["kv-blocks"], 2)?.[0],
  });
  console.log(formatResume(r));
  if (v.out) {
    await Deno.writeTextFile(v.out, JSON.stringify(r, null, 2) + "\n");
    status(`bench --resume: wrote ${v.out}`);
  }
}
