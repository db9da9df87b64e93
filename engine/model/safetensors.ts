/**
 * safetensors: header parsing (single file or sharded index), reading one tensor's bytes at a
 * time (of any {@linkcode TensorInfo}: GGUF tensors are read the same way), and writing (for the
 * test-model maker).
 *
 * Layout: u64 little-endian header length N, N bytes of JSON header
 * `{name: {dtype, shape, data_offsets: [begin, end]}, __metadata__?}`, then the data; offsets are
 * relative to the start of the data (byte 8 + N).
 */
import { basename, dirname, join } from "node:path";
import { BYTES, type DType, isQuantized, type StorageType } from "../../gpu/dtype.ts";
import { permuteRows } from "./gguf_names.ts";

/** Where one tensor lives on disk. */
export interface TensorInfo {
  /** Its Hugging Face name. */
  name: string;
  /**
   * How it is stored: f32, f16, bf16 (safetensors and GGUF), or a block-quantized type (GGUF
   * only; rows of `shape[1]` values are whole blocks, engine/model/gguf_quant.ts).
   */
  dtype: StorageType;
  /** Hugging Face's shape (linear weights `[out, in]`). */
  shape: number[];
  /** The .safetensors or .gguf file holding it. */
  file: string;
  /** Absolute byte offset of the tensor's first byte in `file`. */
  offset: number;
  nbytes: number;
  /**
   * Set for a llama GGUF's q and k projections: the rows are stored in llama.cpp's interleaved
   * RoPE order over this many heads, and {@linkcode readTensor} returns them in Hugging Face's
   * order (engine/model/gguf_names.ts `permuteRows`).
   */
  permutedHeads?: number;
}

/** A tensor to write with {@linkcode writeSafetensors}. */
export interface TensorData {
  name: string;
  /** f32, f16 or bf16 (safetensors holds no block-quantized type). */
  dtype: StorageType;
  shape: number[];
  /** Raw little-endian bytes; may carry the ≤ 2 padding bytes that `encode()` adds. */
  data: Uint8Array;
}

const FROM_ST: Record<string, DType> = { F32: "f32", F16: "f16", BF16: "bf16" };
const TO_ST: Record<DType, string> = { f32: "F32", f16: "F16", bf16: "BF16" };
/** The reference implementation refuses headers over 100 MB; so do we. */
const MAX_HEADER = 100_000_000;

/** The number of elements of a shape (1 for a scalar). */
export function numel(shape: number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

/**
 * Parses the header of one `.safetensors` file.
 *
 * @param file path of the file
 * @returns its tensors, in header order
 * @throws when the header is malformed or a tensor is not F32, F16 or BF16
 */
export async function readSafetensorsHeader(file: string): Promise<TensorInfo[]> {
  const f = await Deno.open(file, { read: true });
  try {
    const size = (await f.stat()).size;
    const head = new Uint8Array(8);
    await readFully(f, head, file);
    const n = Number(new DataView(head.buffer).getBigUint64(0, true));
    if (n < 2 || n > MAX_HEADER || 8 + n > size) {
      throw new Error(
        `${file} is not a safetensors file (header length ${n}, file size ${size}); ` +
          `re-download it or check the path`,
      );
    }
    const raw = new Uint8Array(n);
    await readFully(f, raw, file);
    let header: Record<string, unknown>;
    try {
      header = JSON.parse(new TextDecoder().decode(raw));
    } catch (e) {
      throw new Error(`${file}: safetensors header is not valid JSON (${(e as Error).message})`);
    }
    const dataStart = 8 + n;
    const out: TensorInfo[] = [];
    for (const [name, v] of Object.entries(header)) {
      if (name === "__metadata__") continue;
      const t = v as { dtype: string; shape: number[]; data_offsets: [number, number] };
      const dtype = FROM_ST[t.dtype];
      if (!dtype) {
        throw new Error(
          `tensor '${name}' in ${file} has dtype ${t.dtype}: strata loads F32, F16 and BF16 ` +
            `weights; use an unquantized checkpoint or convert it (e.g. to bfloat16)`,
        );
      }
      const [begin, end] = t.data_offsets;
      const nbytes = numel(t.shape) * BYTES[dtype];
      if (end - begin !== nbytes || dataStart + end > size) {
        throw new Error(
          `tensor '${name}' in ${file}: data_offsets [${begin}, ${end}] do not fit shape ` +
            `[${t.shape}] ${t.dtype} (${nbytes} bytes) in a ${size}-byte file; the file is ` +
            `truncated or corrupt`,
        );
      }
      out.push({ name, dtype, shape: t.shape, file, offset: dataStart + begin, nbytes });
    }
    return out;
  } finally {
    f.close();
  }
}

/**
 * Parses the weights of a model folder: `model.safetensors.index.json` (sharded) when present,
 * else `model.safetensors`.
 *
 * @param dir the model folder
 * @returns tensors by name
 * @throws when neither file exists, a shard is missing, or the index names a tensor its shard lacks
 */
export async function readSafetensorsIndex(dir: string): Promise<Map<string, TensorInfo>> {
  const indexPath = join(dir, "model.safetensors.index.json");
  const single = join(dir, "model.safetensors");
  const tensors = new Map<string, TensorInfo>();
  if (await exists(indexPath)) {
    const index = JSON.parse(await Deno.readTextFile(indexPath));
    const weightMap = (index.weight_map ?? {}) as Record<string, string>;
    const shards = [...new Set(Object.values(weightMap))];
    if (shards.length === 0) throw new Error(`${indexPath} has an empty weight_map`);
    const byShard = new Map<string, Map<string, TensorInfo>>();
    for (const shard of shards) {
      const path = join(dir, shard);
      if (!(await exists(path))) {
        throw new Error(`missing weight shard ${path} (listed in ${basename(indexPath)})`);
      }
      byShard.set(shard, new Map((await readSafetensorsHeader(path)).map((t) => [t.name, t])));
    }
    for (const [name, shard] of Object.entries(weightMap)) {
      const info = byShard.get(shard)!.get(name);
      if (!info) {
        throw new Error(
          `${indexPath} maps '${name}' to ${shard}, but that shard has no such tensor`,
        );
      }
      tensors.set(name, info);
    }
    return tensors;
  }
  if (await exists(single)) {
    for (const t of await readSafetensorsHeader(single)) tensors.set(t.name, t);
    return tensors;
  }
  throw new Error(
    `missing weights in ${dir}: expected model.safetensors or model.safetensors.index.json ` +
      `(strata reads safetensors only; convert .bin/.pth checkpoints first)`,
  );
}

/**
 * Reads one tensor's raw bytes (seek + read; never the whole file).
 *
 * @param info where the tensor lives
 * @returns a new `Uint8Array` of `info.nbytes` bytes
 */
export async function readTensor(info: TensorInfo): Promise<Uint8Array<ArrayBuffer>> {
  const out = new Uint8Array(info.nbytes);
  await readTensorInto(info, out);
  return out;
}

/**
 * Reads one tensor's raw bytes into `target` (e.g. a mapped GPU staging buffer), rows in Hugging
 * Face's order (see {@linkcode TensorInfo.permutedHeads}).
 *
 * @param info where the tensor lives
 * @param target at least `info.nbytes` long; bytes past `nbytes` are left untouched
 * @throws when `target` is too small or the file ends early
 */
export async function readTensorInto(info: TensorInfo, target: Uint8Array): Promise<void> {
  if (target.byteLength < info.nbytes) {
    throw new Error(
      `internal error: readTensorInto('${info.name}') target has ${target.byteLength} bytes, ` +
        `needs ${info.nbytes}`,
    );
  }
  const f = await Deno.open(info.file, { read: true });
  try {
    await f.seek(info.offset, Deno.SeekMode.Start);
    await readFully(f, target.subarray(0, info.nbytes), info.file);
    if (info.permutedHeads !== undefined) {
      const rows = target.subarray(0, info.nbytes);
      rows.set(permuteRows(rows, info.shape[0], { heads: info.permutedHeads, inverse: true }));
    }
  } finally {
    f.close();
  }
}

/** Options for {@linkcode writeSafetensors}. */
export interface WriteSafetensorsOptions {
  /** String-to-string `__metadata__` (e.g. `{format: "pt"}`). */
  metadata?: Record<string, string>;
}

/**
 * Writes a `.safetensors` file: header padded with spaces to a multiple of 8 bytes, then each
 * tensor's bytes in the given order.
 *
 * @param path output file
 * @param tensors tensors to write; `data` must hold numel × dtype bytes (plus ≤ 2 padding bytes)
 * @param options metadata
 */
export async function writeSafetensors(
  path: string,
  tensors: TensorData[],
  options: WriteSafetensorsOptions = {},
): Promise<void> {
  const header: Record<string, unknown> = {};
  if (options.metadata) header.__metadata__ = options.metadata;
  const chunks: Uint8Array[] = [];
  let at = 0;
  for (const t of tensors) {
    if (isQuantized(t.dtype)) {
      throw new Error(
        `tensor '${t.name}' is ${t.dtype.toUpperCase()}: safetensors holds F32, F16 and BF16 only`,
      );
    }
    const nbytes = numel(t.shape) * BYTES[t.dtype];
    if (t.data.byteLength < nbytes || t.data.byteLength > nbytes + 3) {
      throw new Error(
        `internal error: tensor '${t.name}' [${t.shape}] ${t.dtype} needs ${nbytes} bytes; ` +
          `got ${t.data.byteLength}`,
      );
    }
    header[t.name] = { dtype: TO_ST[t.dtype], shape: t.shape, data_offsets: [at, at + nbytes] };
    chunks.push(t.data.subarray(0, nbytes));
    at += nbytes;
  }
  let json = JSON.stringify(header);
  json += " ".repeat((8 - (new TextEncoder().encode(json).byteLength % 8)) % 8);
  const headerBytes = new TextEncoder().encode(json);
  const len = new Uint8Array(8);
  new DataView(len.buffer).setBigUint64(0, BigInt(headerBytes.byteLength), true);
  await Deno.mkdir(dirname(path), { recursive: true });
  const f = await Deno.open(path, { write: true, create: true, truncate: true });
  try {
    for (const c of [len, headerBytes, ...chunks]) await writeFully(f, c);
  } finally {
    f.close();
  }
}

async function readFully(f: Deno.FsFile, into: Uint8Array, file: string): Promise<void> {
  let got = 0;
  while (got < into.byteLength) {
    const n = await f.read(into.subarray(got));
    if (n === null) {
      throw new Error(
        `${file} ended early (read ${got} of ${into.byteLength} bytes); re-download it`,
      );
    }
    got += n;
  }
}

async function writeFully(f: Deno.FsFile, data: Uint8Array): Promise<void> {
  let done = 0;
  while (done < data.byteLength) done += await f.write(data.subarray(done));
}

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.stat(path);
    return true;
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return false;
    throw e;
  }
}
