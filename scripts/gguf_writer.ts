/**
 * A GGUF v3 (or v2) writer, test side: the container format of engine/model/gguf_format.ts
 * written back, so tests and scripts/write_gguf.ts can make files (well-formed ones, and, by
 * editing the bytes, broken ones). What goes into the file is the caller's: this knows the
 * container, not models.
 */
import { VALUE_TYPES } from "../engine/model/gguf_format.ts";

/**
 * One metadata entry: `type` as the reader reports it (`u32`, `f32`, `string`, `bool`, …, and
 * `array<u32>`, `array<string>`, `array<array<u8>>` for arrays); `value` a number, bigint,
 * boolean or string, or an array (JS or typed) of them for arrays.
 */
export interface GgufEntry {
  key: string;
  type: string;
  value: unknown;
}

/** One tensor: its bytes as stored, ggml dims innermost first. */
export interface GgufTensorData {
  name: string;
  /** ggml type id (engine/model/gguf_format.ts GGML_IDS). */
  ggmlType: number;
  dims: number[];
  data: Uint8Array;
}

/** What {@linkcode encodeGguf} writes. */
export interface GgufSpec {
  /** 3 (default) or 2: the layouts are the same for these (counts and lengths are u64). */
  version?: number;
  /** Data alignment (default 32); written as general.alignment when not 32. */
  alignment?: number;
  metadata: GgufEntry[];
  tensors: GgufTensorData[];
}

/**
 * Encodes a GGUF file: header, metadata, tensor infos, padding to the alignment, then each
 * tensor's bytes at an aligned offset.
 *
 * @param spec version, alignment, metadata and tensors (in file order)
 * @returns the whole file
 * @example
 * ```ts
 * const bytes = encodeGguf({ metadata: [{ key: "general.architecture", type: "string",
 *   value: "llama" }], tensors: [] });
 * ```
 */
export function encodeGguf(spec: GgufSpec): Uint8Array<ArrayBuffer> {
  const align = spec.alignment ?? 32;
  const w = new ByteWriter();
  w.bytes(new TextEncoder().encode("GGUF"));
  w.u32(spec.version ?? 3);
  w.u64(spec.tensors.length);
  const metadata = [...spec.metadata];
  if (align !== 32 && !metadata.some((e) => e.key === "general.alignment")) {
    metadata.push({ key: "general.alignment", type: "u32", value: align });
  }
  w.u64(metadata.length);
  for (const e of metadata) {
    w.string(e.key);
    writeValue(w, e.type, e.value);
  }
  let offset = 0;
  const offsets: number[] = [];
  for (const t of spec.tensors) {
    offsets.push(offset);
    offset = Math.ceil((offset + t.data.byteLength) / align) * align;
  }
  spec.tensors.forEach((t, i) => {
    w.string(t.name);
    w.u32(t.dims.length);
    for (const d of t.dims) w.u64(d);
    w.u32(t.ggmlType);
    w.u64(offsets[i]);
  });
  w.pad(align);
  spec.tensors.forEach((t) => {
    w.bytes(t.data);
    w.pad(align);
  });
  return w.finish();
}

function typeId(name: string): number {
  const id = (VALUE_TYPES as readonly string[]).indexOf(name);
  if (id < 0) throw new Error(`internal error: no GGUF value type '${name}'`);
  return id;
}

function writeValue(w: ByteWriter, type: string, value: unknown): void {
  const m = /^array<(.+)>$/.exec(type);
  if (m) {
    w.u32(typeId("array"));
    writeArray(w, m[1], value as ArrayLike<unknown>);
    return;
  }
  w.u32(typeId(type));
  writeScalar(w, type, value);
}

function writeArray(w: ByteWriter, element: string, values: ArrayLike<unknown>): void {
  const inner = /^array<(.+)>$/.exec(element);
  w.u32(typeId(inner ? "array" : element));
  w.u64(values.length);
  for (let i = 0; i < values.length; i++) {
    if (inner) writeArray(w, inner[1], values[i] as ArrayLike<unknown>);
    else writeScalar(w, element, values[i]);
  }
}

function writeScalar(w: ByteWriter, type: string, v: unknown): void {
  const n = v as number;
  switch (type) {
    case "u8":
      return w.raw(1, (d, at) => d.setUint8(at, n));
    case "i8":
      return w.raw(1, (d, at) => d.setInt8(at, n));
    case "u16":
      return w.raw(2, (d, at) => d.setUint16(at, n, true));
    case "i16":
      return w.raw(2, (d, at) => d.setInt16(at, n, true));
    case "u32":
      return w.raw(4, (d, at) => d.setUint32(at, n, true));
    case "i32":
      return w.raw(4, (d, at) => d.setInt32(at, n, true));
    case "f32":
      return w.raw(4, (d, at) => d.setFloat32(at, n, true));
    case "f64":
      return w.raw(8, (d, at) => d.setFloat64(at, n, true));
    case "bool":
      return w.raw(1, (d, at) => d.setUint8(at, v ? 1 : 0));
    case "u64":
      return w.raw(8, (d, at) => d.setBigUint64(at, BigInt(v as number | bigint), true));
    case "i64":
      return w.raw(8, (d, at) => d.setBigInt64(at, BigInt(v as number | bigint), true));
    case "string":
      return w.string(v as string);
  }
  throw new Error(`internal error: no GGUF scalar type '${type}'`);
}

/** A growing little-endian byte buffer. */
class ByteWriter {
  #buf = new Uint8Array(1 << 16);
  #view = new DataView(this.#buf.buffer);
  #at = 0;

  #reserve(n: number): number {
    if (this.#at + n > this.#buf.byteLength) {
      const next = new Uint8Array(Math.max(this.#buf.byteLength * 2, this.#at + n));
      next.set(this.#buf.subarray(0, this.#at));
      this.#buf = next;
      this.#view = new DataView(next.buffer);
    }
    const at = this.#at;
    this.#at += n;
    return at;
  }

  raw(n: number, put: (d: DataView, at: number) => void): void {
    const at = this.#reserve(n);
    put(this.#view, at);
  }

  u32(v: number): void {
    this.raw(4, (d, at) => d.setUint32(at, v, true));
  }

  u64(v: number): void {
    this.raw(8, (d, at) => d.setBigUint64(at, BigInt(v), true));
  }

  bytes(b: Uint8Array): void {
    const at = this.#reserve(b.byteLength); // may replace the buffer: reserve first
    this.#buf.set(b, at);
  }

  string(s: string): void {
    const b = new TextEncoder().encode(s);
    this.u64(b.byteLength);
    this.bytes(b);
  }

  /** Zero bytes up to the next multiple of `align`. */
  pad(align: number): void {
    this.#reserve((align - (this.#at % align)) % align);
  }

  finish(): Uint8Array<ArrayBuffer> {
    return this.#buf.slice(0, this.#at);
  }
}
