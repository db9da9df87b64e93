/**
 * The WebGPU device strata runs on: one adapter, one device with the largest limits the adapter
 * allows, `shader-f16` and `timestamp-query` when present. Everything else takes a `Gpu`.
 */

/** A device plus the facts kernels need to choose their code path. */
export interface Gpu {
  device: GPUDevice;
  adapter: GPUAdapter;
  /** Human-readable adapter description, e.g. "llvmpipe (LLVM 15.0.6, 256 bits)". */
  adapterName: string;
  /** Whether `enable f16;` shaders may be compiled (false on GL/llvmpipe). */
  hasF16: boolean;
  hasTimestamps: boolean;
  /** Largest storage-buffer binding in bytes (128 MiB on llvmpipe, 2 GiB on the H200). */
  maxBinding: number;
  maxBuffer: number;
  maxWorkgroupStorage: number;
}

/** Options for {@linkcode createGpu}. */
export interface GpuOptions {
  /** Ask for `shader-f16` when the adapter has it (default true). */
  f16?: boolean;
}

let shared: Promise<Gpu> | undefined;

/**
 * Returns the process-wide GPU, creating it on first use.
 *
 * @throws Error when Deno exposes no WebGPU adapter (set XDG_RUNTIME_DIR=/tmp on headless Linux).
 */
export function getGpu(): Promise<Gpu> {
  shared ??= createGpu();
  return shared;
}

/** Creates a new device with raised limits. Prefer {@linkcode getGpu}. */
export async function createGpu(options: GpuOptions = {}): Promise<Gpu> {
  if (!("gpu" in navigator)) throw new Error("WebGPU is not available in this Deno build");
  // wgpu's GL and Vulkan loaders want a runtime dir; headless machines often have none.
  if (!Deno.env.get("XDG_RUNTIME_DIR")) Deno.env.set("XDG_RUNTIME_DIR", "/tmp");
  const adapter = await navigator.gpu.requestAdapter({ powerPreference: "high-performance" });
  if (!adapter) {
    throw new Error(
      "no WebGPU adapter found: install Mesa (GL or mesa-vulkan-drivers) or a GPU driver, " +
        "and set XDG_RUNTIME_DIR=/tmp",
    );
  }
  const want: GPUFeatureName[] = [];
  const hasF16 = (options.f16 ?? true) && adapter.features.has("shader-f16");
  if (hasF16) want.push("shader-f16");
  const hasTimestamps = adapter.features.has("timestamp-query");
  if (hasTimestamps) want.push("timestamp-query");
  const L = adapter.limits;
  const cap = 2 ** 31 - 4; // wgpu refuses bindings of 2 GiB and more on some backends
  const maxBinding = Math.min(L.maxStorageBufferBindingSize, cap);
  const maxBuffer = Math.min(L.maxBufferSize, cap * 2);
  const device = await adapter.requestDevice({
    requiredFeatures: want,
    requiredLimits: {
      maxStorageBufferBindingSize: maxBinding,
      maxBufferSize: maxBuffer,
      maxStorageBuffersPerShaderStage: L.maxStorageBuffersPerShaderStage,
      maxComputeWorkgroupStorageSize: L.maxComputeWorkgroupStorageSize,
      maxComputeInvocationsPerWorkgroup: L.maxComputeInvocationsPerWorkgroup,
      maxComputeWorkgroupSizeX: L.maxComputeWorkgroupSizeX,
      maxComputeWorkgroupsPerDimension: L.maxComputeWorkgroupsPerDimension,
      maxBindGroups: L.maxBindGroups,
    },
  });
  device.addEventListener("uncapturederror", (e) => {
    console.error(`WebGPU error: ${(e as GPUUncapturedErrorEvent).error.message}`);
  });
  const info = adapter.info;
  return {
    device,
    adapter,
    adapterName: info.description || `${info.vendor} ${info.architecture} ${info.device}`.trim(),
    hasF16,
    hasTimestamps,
    maxBinding,
    maxBuffer,
    maxWorkgroupStorage: L.maxComputeWorkgroupStorageSize,
  };
}

/** True for software adapters (Mesa llvmpipe/lavapipe, SwiftShader): the GPU is the CPU. */
export function isCpuAdapter(gpu: Pick<Gpu, "adapterName">): boolean {
  return /llvmpipe|lavapipe|swiftshader/i.test(gpu.adapterName);
}

/** Usage for buffers kernels read and write and tests fill and read back. */
export const STORAGE = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC;

/** Creates a storage buffer of `bytes` (rounded up to 16), optionally filled from `data`. */
export function createStorage(
  gpu: Gpu,
  bytes: number,
  data?: ArrayBufferView,
  label?: string,
): GPUBuffer {
  const size = Math.max(16, Math.ceil(bytes / 16) * 16);
  const buffer = gpu.device.createBuffer({ size, usage: STORAGE, label });
  if (data) writeBuffer(gpu, buffer, 0, data);
  return buffer;
}

/** Writes any typed array into a buffer; pads the write to a multiple of 4 bytes. */
export function writeBuffer(gpu: Gpu, buffer: GPUBuffer, offset: number, data: ArrayBufferView) {
  const bytes = new Uint8Array(data.buffer as ArrayBuffer, data.byteOffset, data.byteLength);
  if (bytes.byteLength % 4 === 0) {
    gpu.device.queue.writeBuffer(buffer, offset, bytes);
  } else {
    const padded = new Uint8Array(Math.ceil(bytes.byteLength / 4) * 4);
    padded.set(bytes);
    gpu.device.queue.writeBuffer(buffer, offset, padded);
  }
}

/**
 * Copies `bytes` from `src` (at `offset`) to the host. Costs ≥ 10 ms on Deno (timer polling):
 * use it in tests and tools; the engine reads through gpu/readback.ts.
 */
export async function readBuffer(
  gpu: Gpu,
  src: GPUBuffer,
  bytes = src.size,
  offset = 0,
): Promise<ArrayBuffer> {
  const size = Math.ceil(bytes / 4) * 4;
  const staging = gpu.device.createBuffer({
    size,
    usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  });
  const enc = gpu.device.createCommandEncoder();
  enc.copyBufferToBuffer(src, offset, staging, 0, size);
  gpu.device.queue.submit([enc.finish()]);
  await staging.mapAsync(GPUMapMode.READ);
  const out = staging.getMappedRange().slice(0, bytes);
  staging.unmap();
  staging.destroy();
  return out;
}

/** Reads a buffer back as f32. */
export async function readF32(gpu: Gpu, src: GPUBuffer, count: number, offset = 0) {
  return new Float32Array(await readBuffer(gpu, src, count * 4, offset));
}

/** Reads a buffer back as u32. */
export async function readU32(gpu: Gpu, src: GPUBuffer, count: number, offset = 0) {
  return new Uint32Array(await readBuffer(gpu, src, count * 4, offset));
}
