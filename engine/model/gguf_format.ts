/**
 * The GGUF container (llama.cpp's model file), read side: header, metadata key/values, tensor
 * infos. Versions 2 and 3, little-endian.
 *
 * Layout (all little-endian): "GGUF", u32 version, u64 tensor count, u64 metadata count; each
 * metadata entry is a string key (u64 length + UTF-8 bytes), a u32 value type and the value
 * (arrays: u32 element type, u64 count, the elements); each tensor info is a string name, u32
 * n_dims, n_dims × u64 dims (innermost first: ggml's ne[0] is a row's length), u32 ggml type,
 * u64 offset from the start of the data. The data starts at the next multiple of
 * `general.alignment` (default 32) after the last tensor info; each tensor's offset is a multiple
 * of it too. docs/gguf.md has the picture.
 */
import { type StorageType } from "../../gpu/dtype.ts";
import { storageBytes } from "./gguf_quant.ts";

/** Metadata value types by their id in the file. */
export const VALUE_TYPES = [
  "u8",
  "i8",
  "u16",
  "i16",
  "u32",
  "i32",
  "f32",
  "bool",
  "string",
  "array",
  "u64",
  "i64",
  "f64",
] as const;

/** A metadata value type's name (`array` for arrays of any element type). */
export type GgufValueType = (typeof VALUE_TYPES)[number];

/**
 * A metadata value as read: numbers for 8–32-bit integers and floats, `bigint` for 64-bit
 * integers past 2^53, booleans, strings; arrays of numbers as typed arrays of their element type
 * (so `tokenizer.ggml.scores` is a Float32Array), arrays of strings, booleans or arrays as JS
 * arrays.
 */
export type GgufValue =
  | number
  | bigint
  | boolean
  | string
  | GgufValue[]
  | Uint8Array
  | Int8Array
  | Uint16Array
  | Int16Array
  | Uint32Array
  | Int32Array
  | Float32Array
  | Float64Array
  | BigUint64Array
  | BigInt64Array;

/**
 * ggml tensor type names by id (ggml.h `enum ggml_type`; ids 4, 5 were retired), to name what a
 * file holds when strata refuses it.
 */
export const GGML_TYPE_NAMES: Record<number, string> = Object.fromEntries(
  [
    "F32 F16 Q4_0 Q4_1 - - Q5_0 Q5_1 Q8_0 Q8_1 Q2_K Q3_K Q4_K Q5_K Q6_K Q8_K IQ2_XXS IQ2_XS",
    "IQ3_XXS IQ1_S IQ4_NL IQ3_S IQ2_S IQ4_XS I8 I16 I32 I64 F64 IQ1_M BF16 Q4_0_4_4 Q4_0_4_8",
    "Q4_0_8_8 TQ1_0 TQ2_0 IQ4_NL_4_4 IQ4_NL_4_8 IQ4_NL_8_8 MXFP4 NVFP4 Q1_0",
  ].join(" ").split(" ").flatMap((name, id) => (name === "-" ? [] : [[id, name]])),
);

/** The ggml types strata reads, by id. */
export const GGML_TYPES: Record<number, StorageType> = {
  0: "f32",
  1: "f16",
  2: "q4_0",
  8: "q8_0",
  12: "q4_k",
  14: "q6_k",
  30: "bf16",
};

/** The ggml id of each type strata reads (the writer's side of {@linkcode GGML_TYPES}). */
export const GGML_IDS: Record<StorageType, number> = {
  f32: 0,
  f16: 1,
  q4_0: 2,
  q8_0: 8,
  q4_k: 12,
  q6_k: 14,
  bf16: 30,
};

/** ggml's name of a type strata reads ("Q4_K"), as llama.cpp's tools print it. */
export function ggmlName(t: StorageType): string {
  return GGML_TYPE_NAMES[GGML_IDS[t]];
}

/** One tensor info of a GGUF file. */
export interface GgufTensorInfo {
  name: string;
  /** ggml's ne[]: innermost (a row's length) first; the reverse of a PyTorch shape. */
  dims: number[];
  /** The ggml type id as stored. */
  ggmlType: number;
  /** The type, when strata reads it. */
  type?: StorageType;
  /** Absolute byte offset of the tensor's first byte in the file. */
  offset: number;
  /** Bytes of data, when the type is one strata reads. */
  nbytes?: number;
}

/** A parsed GGUF header. */
export interface GgufHeader {
  path: string;
  version: number;
  metadata: Map<string, GgufValue>;
  /** Each key's value type; arrays as `array<element>` (e.g. `array<string>`). */
  types: Map<string, string>;
  tensors: GgufTensorInfo[];
  alignment: number;
  /** Absolute offset of the data section. */
  dataOffset: number;
  fileSize: number;
}

/** Thrown by {@linkcode parseGgufHeader} when the header runs past the bytes it was given. */
export class HeaderTruncated extends Error {}

/** Caps that keep a corrupt count from allocating the machine away. */
const MAX_DIMS = 4;
const MAX_COUNT = 1 << 26;

/**
 * Parses a GGUF header from the first bytes of a file.
 *
 * @param bytes the file's first bytes (all of them, or enough for the header)
 * @param fileSize the whole file's size (offsets are checked against it)
 * @param path the file, for error messages
 * @returns the header; tensor data is not read
 * @throws {HeaderTruncated} when `bytes` ends inside the header (read more and try again);
 *   Error naming the problem when the file is not GGUF, is big-endian, v1, or inconsistent
 */
export function parseGgufHeader(bytes: Uint8Array, fileSize: number, path: string): GgufHeader {
  const r = new Cursor(bytes, path);
  if (bytes.byteLength < 4 || r.ascii(4) !== "GGUF") {
    throw new Error(
      `${path} is not a GGUF file (it does not start with "GGUF"); strata reads GGUF v2/v3 ` +
        `files and Hugging Face folders`,
    );
  }
  const version = r.u32();
  if ((version & 0xffff) === 0 && version !== 0) {
    throw new Error(
      `${path} is a big-endian GGUF file; strata reads little-endian ones (convert it with ` +
        `llama.cpp's gguf_convert_endian.py)`,
    );
  }
  if (version !== 2 && version !== 3) {
    throw new Error(
      `${path} is GGUF version ${version}; strata reads versions 2 and 3 (re-convert the model ` +
        `with a current llama.cpp)`,
    );
  }
  const nTensors = r.count("tensor count");
  const nKv = r.count("metadata count");
  const metadata = new Map<string, GgufValue>();
  const types = new Map<string, string>();
  for (let i = 0; i < nKv; i++) {
    const key = r.string();
    if (metadata.has(key)) throw new Error(`${path}: metadata key '${key}' appears twice`);
    const [value, type] = r.value(r.u32());
    metadata.set(key, value);
    types.set(key, type);
  }
  const infos: GgufTensorInfo[] = [];
  const names = new Set<string>();
  for (let i = 0; i < nTensors; i++) {
    const name = r.string();
    if (names.has(name)) throw new Error(`${path}: tensor '${name}' appears twice`);
    names.add(name);
    const nDims = r.u32();
    if (nDims < 1 || nDims > MAX_DIMS) {
      throw new Error(`${path}: tensor '${name}' has ${nDims} dimensions (ggml allows 1 to 4)`);
    }
    const dims = Array.from({ length: nDims }, () => r.count(`a dimension of '${name}'`));
    const ggmlType = r.u32();
    const offset = r.count(`the offset of '${name}'`);
    infos.push({ name, dims, ggmlType, offset, ...typeOf(ggmlType) });
  }
  const align = metadata.get("general.alignment") ?? 32;
  if (typeof align !== "number" || align <= 0 || (align & (align - 1)) !== 0) {
    throw new Error(
      `${path}: general.alignment must be a power of two; got ${String(align)}`,
    );
  }
  const dataOffset = Math.ceil(r.pos / align) * align;
  for (const t of infos) {
    if (t.offset % align !== 0) {
      throw new Error(
        `${path}: tensor '${t.name}' starts at data offset ${t.offset}, not a multiple of the ` +
          `file's alignment ${align}; the file is corrupt`,
      );
    }
    t.offset += dataOffset;
    if (t.type) {
      t.nbytes = storageBytes(t.type, t.dims, `tensor '${t.name}' in ${path}`);
      if (t.offset + t.nbytes > fileSize) {
        throw new Error(
          `${path} ends at byte ${fileSize}, inside tensor '${t.name}' (bytes ${t.offset} to ` +
            `${t.offset + t.nbytes}); the file is truncated: download it again`,
        );
      }
    }
  }
  return {
    path,
    version,
    metadata,
    types,
    tensors: infos,
    alignment: align,
    dataOffset,
    fileSize,
  };
}

function typeOf(id: number): { type?: StorageType } {
  const type = GGML_TYPES[id];
  return type ? { type } : {};
}

/**
 * Reads and parses the header of a GGUF file, reading more of the file while the header needs it
 * (a 150 000-token vocabulary's strings take several MiB).
 *
 * @param path the .gguf file
 * @returns the parsed header
 * @throws as {@linkcode parseGgufHeader}, and when the file ends inside the header
 */
export async function readGgufHeader(path: string): Promise<GgufHeader> {
  const f = await Deno.open(path, { read: true });
  try {
    const size = (await f.stat()).size;
    let want = Math.min(size, 1 << 20);
    while (true) {
      const bytes = new Uint8Array(want);
      await f.seek(0, Deno.SeekMode.Start);
      let got = 0;
      while (got < want) {
        const n = await f.read(bytes.subarray(got));
        if (n === null) break;
        got += n;
      }
      try {
        return parseGgufHeader(bytes.subarray(0, got), size, path);
      } catch (e) {
        if (!(e instanceof HeaderTruncated)) throw e;
        if (want >= size) {
          throw new Error(
            `${path} ends inside its GGUF header (${size} bytes); the file is truncated: ` +
              `download it again`,
          );
        }
        want = Math.min(size, want * 4);
      }
    }
  } finally {
    f.close();
  }
}

const utf8 = new TextDecoder();

/** Little-endian reads over the header's bytes; {@linkcode HeaderTruncated} past the end. */
class Cursor {
  pos = 0;
  #view: DataView;
  #bytes: Uint8Array;
  #path: string;

  constructor(bytes: Uint8Array, path: string) {
    this.#bytes = bytes;
    this.#view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.#path = path;
  }

  #take(n: number): number {
    const at = this.pos;
    if (at + n > this.#bytes.byteLength) throw new HeaderTruncated(this.#path);
    this.pos += n;
    return at;
  }

  ascii(n: number): string {
    const at = this.#take(n);
    return String.fromCharCode(...this.#bytes.subarray(at, at + n));
  }

  u32(): number {
    return this.#view.getUint32(this.#take(4), true);
  }

  /** A u64 that counts or locates something: a safe integer, else the file is corrupt. */
  count(what: string): number {
    const v = this.#view.getBigUint64(this.#take(8), true);
    if (v > BigInt(Number.MAX_SAFE_INTEGER)) {
      throw new Error(`${this.#path}: ${what} is ${v}; the file is corrupt`);
    }
    return Number(v);
  }

  string(): string {
    const n = this.count("a string length");
    const at = this.#take(n);
    return utf8.decode(this.#bytes.subarray(at, at + n));
  }

  /** One value of type id `t`, and its type's name. */
  value(t: number): [GgufValue, string] {
    const name = VALUE_TYPES[t];
    if (name === undefined) {
      throw new Error(
        `${this.#path}: metadata value type ${t} is not a GGUF type (0 to 12); the file is ` +
          `corrupt or from a newer GGUF version`,
      );
    }
    if (name !== "array") return [this.scalar(name), name];
    const et = this.u32();
    const n = this.count("an array length");
    // Every element takes at least one byte: a longer count cannot be real.
    if (n > MAX_COUNT || this.pos + n > this.#bytes.byteLength) {
      if (n > MAX_COUNT) throw new Error(`${this.#path}: an array of ${n} elements; corrupt`);
      throw new HeaderTruncated(this.#path);
    }
    const ename = VALUE_TYPES[et];
    const typed = ename === undefined ? undefined : TYPED[ename];
    if (typed) {
      const [Ctor, size] = typed;
      const at = this.#take(n * size);
      // Copy: the header's buffer is aligned to nothing in particular.
      const copy = this.#bytes.slice(at, at + n * size);
      return [new Ctor(copy.buffer), `array<${ename}>`];
    }
    const out: GgufValue[] = [];
    let inner: string = ename ?? String(et);
    for (let i = 0; i < n; i++) {
      const [v, type] = this.value(et);
      out.push(v);
      inner = type;
    }
    return [out, `array<${inner}>`];
  }

  scalar(name: Exclude<GgufValueType, "array">): GgufValue {
    const v = this.#view;
    switch (name) {
      case "u8":
        return v.getUint8(this.#take(1));
      case "i8":
        return v.getInt8(this.#take(1));
      case "u16":
        return v.getUint16(this.#take(2), true);
      case "i16":
        return v.getInt16(this.#take(2), true);
      case "u32":
        return v.getUint32(this.#take(4), true);
      case "i32":
        return v.getInt32(this.#take(4), true);
      case "f32":
        return v.getFloat32(this.#take(4), true);
      case "bool":
        return v.getUint8(this.#take(1)) !== 0;
      case "string":
        return this.string();
      case "u64":
        return safe(v.getBigUint64(this.#take(8), true));
      case "i64":
        return safe(v.getBigInt64(this.#take(8), true));
      case "f64":
        return v.getFloat64(this.#take(8), true);
    }
  }
}

/** A 64-bit integer as a number when it is exactly one. */
function safe(v: bigint): number | bigint {
  return v <= BigInt(Number.MAX_SAFE_INTEGER) && v >= BigInt(Number.MIN_SAFE_INTEGER)
    ? Number(v)
    : v;
}

type TypedCtor = new (buffer: ArrayBuffer) => GgufValue;

/** Numeric element types read as typed arrays: constructor and element size. */
const TYPED: Partial<Record<GgufValueType, [TypedCtor, number]>> = {
  u8: [Uint8Array, 1],
  i8: [Int8Array, 1],
  u16: [Uint16Array, 2],
  i16: [Int16Array, 2],
  u32: [Uint32Array, 4],
  i32: [Int32Array, 4],
  f32: [Float32Array, 4],
  u64: [BigUint64Array, 8],
  i64: [BigInt64Array, 8],
  f64: [Float64Array, 8],
};

/** A value for an error message. */
export function describe(v: GgufValue | undefined): string {
  if (typeof v === "string") return `'${v}'`;
  if (typeof v === "object") return "an array";
  return String(v);
}
