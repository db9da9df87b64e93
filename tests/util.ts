/** Test helpers: a seeded RNG, array comparison that reports like llm.c, the adapter banner. */
import assert from "node:assert/strict";
import { createStorage, getGpu, type Gpu, readF32 } from "../gpu/device.ts";
import { type Rng, rng } from "../scripts/rng.ts";

/** The seeded RNG, from scripts/rng.ts (scripts use it too; they may not import tests/). */
export { type Rng, rng };

/** Result of {@linkcode compare}. */
export interface Comparison {
  maxAbs: number;
  maxRel: number;
  firstBad: number;
  report: string;
}

/**
 * Compares `got` against the float64 `want`: an element is bad when
 * |got - want| > atol + rtol * |want|. Returns max-abs, max relative error and the first bad
 * index, and a one-line report for the test log.
 */
export function compare(
  label: string,
  got: ArrayLike<number>,
  want: ArrayLike<number>,
  atol = 1e-4,
  rtol = 1e-3,
): Comparison {
  if (got.length !== want.length) {
    throw new Error(`${label}: length ${got.length} != expected ${want.length}`);
  }
  let maxAbs = 0, maxRel = 0, firstBad = -1;
  for (let i = 0; i < want.length; i++) {
    const d = Math.abs(got[i] - want[i]);
    if (!(d <= atol + rtol * Math.abs(want[i]))) {
      if (firstBad < 0) firstBad = i;
    }
    if (!(d <= maxAbs)) maxAbs = d;
    const r = d / Math.max(Math.abs(want[i]), 1e-6);
    if (!(r <= maxRel)) maxRel = r;
  }
  const report = `${label}: n=${want.length} max_abs=${maxAbs.toExponential(2)} ` +
    `max_rel=${maxRel.toExponential(2)}` +
    (firstBad >= 0
      ? ` FIRST MISMATCH at ${firstBad}: got ${got[firstBad]} want ${want[firstBad]}`
      : "");
  console.log(report);
  return { maxAbs, maxRel, firstBad, report };
}

/** Asserts {@linkcode compare} found no bad element. */
export function assertClose(
  label: string,
  got: ArrayLike<number>,
  want: ArrayLike<number>,
  atol = 1e-4,
  rtol = 1e-3,
): void {
  const c = compare(label, got, want, atol, rtol);
  if (c.firstBad >= 0) throw new Error(c.report);
}

/** Where a strided matrix sits in a flat buffer: `rows × cols`, row i at `offset + i * stride`. */
export interface StridedRows {
  rows: number;
  cols: number;
  offset: number;
  stride: number;
}

/** The `rows × cols` matrix at `at` in `values`, packed densely (row-major, float64). */
export function denseRows(values: ArrayLike<number>, at: StridedRows): Float64Array {
  const out = new Float64Array(at.rows * at.cols);
  for (let i = 0; i < at.rows; i++) {
    for (let j = 0; j < at.cols; j++) out[i * at.cols + j] = values[at.offset + i * at.stride + j];
  }
  return out;
}

/** f32 values as a buffer, and the same values widened back (what the GPU sees). */
export function f32Input(gpu: Gpu, values: ArrayLike<number>) {
  const f = Float32Array.from(values);
  return { buffer: createStorage(gpu, f.byteLength, f), values: Float64Array.from(f) };
}

/** {@linkcode outputRows}: the buffer, its f32 values widened, where the rows sit, its length. */
export interface OutputRows {
  buffer: GPUBuffer;
  values: Float64Array;
  at: StridedRows;
  len: number;
}

/**
 * A kernel's `rows × cols` output in a buffer of random values from `r`. With `strided`, row i
 * sits at 5 + i · (cols + 3), so the kernel's offset, stride and `+=` get tested too.
 */
export function outputRows(
  gpu: Gpu,
  r: Rng,
  rows: number,
  cols: number,
  strided: boolean,
): OutputRows {
  const at = { rows, cols, offset: strided ? 5 : 0, stride: strided ? cols + 3 : cols };
  const len = at.offset + rows * at.stride;
  return { ...f32Input(gpu, r.uniform(len)), at, len };
}

/** Reads `y` back, asserts that nothing outside its rows changed, and returns the rows packed. */
export async function readOutputRows(gpu: Gpu, y: OutputRows): Promise<Float64Array> {
  const got = await readF32(gpu, y.buffer, y.len);
  for (let i = 0; i < y.len; i++) {
    const j = (i - y.at.offset) % y.at.stride;
    if (i < y.at.offset || j >= y.at.cols) {
      assert.equal(got[i], Math.fround(y.values[i]), `y[${i}] clobbered`);
    }
  }
  return denseRows(got, y.at);
}

let printed = false;
/** The shared GPU; prints the adapter once per test process. */
export async function testGpu(): Promise<Gpu> {
  const gpu = await getGpu();
  if (!printed) {
    printed = true;
    console.log(`adapter: ${gpu.adapterName} (f16: ${gpu.hasF16})`);
  }
  return gpu;
}

/**
 * Where a server started as a child process (`main.ts serve`, `deno task start`) listens: reads
 * its `stderr` until it says "at http://…/", then goes on reading the rest in the background.
 *
 * @returns its URL (no trailing slash), port, and `closed`, settled once its stderr ends
 * @throws Error with what it printed, when it exits first
 */
export async function serverAddress(stderr: ReadableStream<Uint8Array>) {
  const reader = stderr.pipeThrough(new TextDecoderStream()).getReader();
  let log = "";
  while (!/at http:\/\/\S+\//.test(log)) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`the server exited:\n${log}`);
    log += value;
  }
  const closed = (async () => {
    while (!(await reader.read()).done) { /* drain */ }
  })();
  const url = log.match(/at (http:\/\/\S+)\//)![1];
  const port = Number(log.match(/at http:\/\/[^:]+:(\d+)\//)![1]);
  return { url, port, closed };
}

/**
 * The permission flags `deno task NAME` runs its script with (deno.json), so that a test running
 * the script as a child process checks that the task's permissions suffice.
 */
export function taskPermissions(name: string): string[] {
  const config = JSON.parse(Deno.readTextFileSync(new URL("../deno.json", import.meta.url)));
  const words = String(config.tasks[name]).split(/\s+/);
  return words.slice(2).filter((w) => w.startsWith("--"));
}
