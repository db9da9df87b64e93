/**
 * main.ts's flag parsing and status lines: numbers, durations and modes from flags or their
 * environment variables, refused with errors that name the flag.
 */
import type { KvStats, KvTierStats } from "../api/types.ts";
import { parseQuantize, type QuantizeMode } from "../gpu/dtype.ts";
import { parseKvCodec } from "../kernels/kv_codec.ts";

/** An integer flag (`fallback` when absent). */
export function int(name: string, v: string | undefined, fallback: number): number {
  if (v === undefined) return fallback;
  const n = Number(v);
  if (!Number.isInteger(n)) throw new Error(`--${name} must be an integer; got '${v}'`);
  return n;
}

export function num(name: string, v: string | undefined, fallback: number): number {
  if (v === undefined) return fallback;
  const n = Number(v);
  if (!Number.isFinite(n)) throw new Error(`--${name} must be a number; got '${v}'`);
  return n;
}

/** A duration flag in seconds (> 0), as milliseconds. */
export function seconds(name: string, v: string | undefined, fallback: number): number {
  const s = num(name, v, fallback);
  if (!(s > 0)) throw new Error(`--${name} must be a number of seconds > 0; got '${v}'`);
  return s * 1000;
}

/** `--speculate off|auto` (default auto: speculate where it pays; the tokens are the same). */
export function speculateFlag(v: string | undefined): "off" | "auto" {
  if (v === undefined) return "auto";
  if (v !== "off" && v !== "auto") throw new Error(`--speculate must be off or auto; got '${v}'`);
  return v;
}

/**
 * The engine options of --kv-codec and --kv-hot (flags, else STRATA_KV_CODEC / STRATA_KV_HOT).
 *
 * @throws Error naming the flag for a value it does not take
 */
export function codecOptions(codec: string | undefined, hot: string | undefined) {
  const env = (k: string) => Deno.env.get(k) || undefined;
  const h = hot ?? env("STRATA_KV_HOT");
  return {
    kvCodec: parseKvCodec(codec ?? env("STRATA_KV_CODEC")),
    ...(h !== undefined ? { kvHot: int("kv-hot", h, 0) } : {}),
  };
}

/** A comma-separated list, empty items dropped; undefined when absent. */
export function list(v: string | undefined): string[] | undefined {
  return v?.split(",").map((x) => x.trim()).filter((x) => x !== "");
}

/**
 * The engine options of --quantize and --quantize-fallback.
 *
 * @throws Error naming the flag for a value it does not take, or a fallback without --quantize
 */
export function quantizeOptions(
  q: string | undefined,
  fallback: string | undefined,
): { quantize: QuantizeMode; fallback: boolean } {
  const quantize = parseQuantize(q);
  if (fallback !== undefined && fallback !== "on" && fallback !== "off") {
    throw new Error(`--quantize-fallback must be on or off; got '${fallback}'`);
  }
  if (fallback !== undefined && quantize === "none") {
    throw new Error("--quantize-fallback applies with --quantize int8 or e4m3");
  }
  return { quantize, fallback: fallback !== "off" };
}

/** "; int8 projections, 16-bit fallback kept" for a status line (nothing when not quantized). */
export function quantNote(q: { mode: string; formats: string[]; fallback: boolean }): string {
  if (q.mode === "none") return "";
  return `; ${q.formats.join("+")} projections, 16-bit fallback ${q.fallback ? "kept" : "off"}`;
}

/**
 * The engine options of --kv-host-mb, --kv-spill and --kv-spill-mb (or their variables).
 *
 * @throws Error naming the flag for a value out of range, or --kv-spill-mb without a folder
 */
export function tierFlags(
  v: { "kv-host-mb"?: string; "kv-spill"?: string; "kv-spill-mb"?: string },
  env: (k: string) => string | undefined,
): { kvHostBytes: number; kvSpillDir?: string; kvSpillBytes?: number } {
  const hostMb = int("kv-host-mb", v["kv-host-mb"] ?? env("STRATA_KV_HOST_MB"), 1024);
  if (hostMb < 0) throw new Error(`--kv-host-mb must be >= 0; got ${hostMb}`);
  const dir = v["kv-spill"] ?? env("STRATA_KV_SPILL");
  const spillArg = v["kv-spill-mb"] ?? env("STRATA_KV_SPILL_MB");
  if (spillArg !== undefined && dir === undefined) {
    throw new Error("--kv-spill-mb needs --kv-spill DIR (the folder of the spill files)");
  }
  const spillMb = int("kv-spill-mb", spillArg, 16384);
  if (spillMb < 1) throw new Error(`--kv-spill-mb must be >= 1; got ${spillMb}`);
  return {
    kvHostBytes: hostMb * 2 ** 20,
    ...(dir !== undefined ? { kvSpillDir: dir, kvSpillBytes: spillMb * 2 ** 20 } : {}),
  };
}

/** ", evicted sessions to 1024 MiB of host memory and files" for the serving line. */
export function below(t: KvTierStats | undefined): string {
  if (!t || (t.host.budgetBytes === 0 && !t.file)) return "";
  const where = [
    ...(t.host.budgetBytes ? [`${t.host.budgetBytes / 2 ** 20} MiB of host memory`] : []),
    ...(t.file ? [`${Math.round(t.file.budgetBytes / 2 ** 20)} MiB of files`] : []),
  ];
  return `, evicted sessions to ${where.join(" and ")}`;
}

/** "4095 blocks of 16 tokens, f32", and with a codec what older blocks become. */
export function kvNote(kv: KvStats): string {
  const hot = `${kv.gpu.total} blocks of 16 tokens, ${kv.dtype}`;
  if (kv.codec === "none") return hot;
  return `${hot}, the newest ${kv.hotTokens} tokens of each sequence; ${kv.codecBlocks.total} ` +
    `${kv.codec} blocks behind them, ${Math.round(kv.capacity.tokensPerGb)} tokens per GB`;
}

export function hex(x: number): string {
  return `0x${(x >>> 0).toString(16).padStart(8, "0")}`;
}
