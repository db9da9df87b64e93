/**
 * Reading results back to the host without Deno's 10 ms sleep.
 *
 * Deno 2.9.6's `GPUBuffer.mapAsync` polls the device with `Maintain::wait` inside the call, so
 * when the call returns, everything submitted has finished and wgpu has mapped the buffer. Its
 * promise, though, resolves only after a 10 ms sleep that follows that poll
 * (`ext/webgpu/buffer.rs`). `getMappedRange` asks wgpu, not the promise, whether the buffer is
 * mapped: called right after `mapAsync` returns it hands out the finished data at once.
 *
 * Two guards keep this safe. Deno's `getMappedRange` unwraps the mode recorded when a mapping
 * promise resolved, so a buffer is read early only after one mapping of it has resolved
 * ("primed"; the pool primes its buffers when created, and a new one takes the slow path once).
 * And when wgpu says the buffer is not mapped yet (a runtime that maps asynchronously), the read
 * falls back to awaiting the promise. A buffer goes back to the pool only once its promise has
 * settled, so Deno's view of it is consistent whenever it is mapped again.
 *
 * Measured with `scripts/probe_map.ts`: llvmpipe through Vulkan and GL, and the H200.
 */

const READ_USAGE = GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST;

/** What a pool's reads did so far (for tests and the bench). */
export interface ReadbackStats {
  /** Reads served as soon as `mapAsync` returned. */
  early: number;
  /** Reads that waited for the mapping promise (unprimed buffer, or not mapped yet). */
  awaited: number;
}

/** Mappable buffers of one size, reused so that reads can skip the promise's sleep. */
export class ReadbackPool {
  readonly stats: ReadbackStats = { early: 0, awaited: 0 };
  readonly #free: GPUBuffer[] = [];
  readonly #primed = new WeakSet<GPUBuffer>();
  readonly #all = new Set<GPUBuffer>();
  /** Mappings whose promise has not settled yet. */
  readonly #pending = new Set<Promise<unknown>>();

  /**
   * @param size bytes per buffer (rounded up to 4), the most one read returns
   * @param prime buffers to prime now (each costs one mapping, resolved in the background).
   *   A read early lends its buffer for the ≈ 10 ms until its promise settles, so a pool needs
   *   about as many as it reads in 10 ms; it grows when short, at one slow read per new buffer.
   */
  constructor(readonly device: GPUDevice, readonly size: number, prime = 4) {
    this.size = Math.max(4, Math.ceil(size / 4) * 4);
    for (let i = 0; i < prime; i++) {
      const b = this.#create();
      this.#track(
        b.mapAsync(GPUMapMode.READ).then(() => {
          b.unmap();
          this.#primed.add(b);
          this.#free.push(b);
        }, () => this.#drop(b)),
      );
    }
  }

  /** Resolves when every mapping requested so far has settled (its buffer is back or dropped). */
  async idle(): Promise<void> {
    while (this.#pending.size) await Promise.all(this.#pending);
  }

  /** A buffer to copy results into; hand it back through {@linkcode read} or {@linkcode give}. */
  take(): GPUBuffer {
    return this.#free.pop() ?? this.#create();
  }

  /** Returns a buffer that was taken but never read (its copy was never submitted). */
  give(b: GPUBuffer): void {
    this.#free.push(b);
  }

  /**
   * Maps `b` (taken from this pool, its copy submitted) and resolves with a copy of its first
   * `bytes` bytes; `b` returns to the pool. The call blocks the host until the GPU has finished
   * all submitted work (Deno 2.9.6), and its promise resolves at once when `b` is primed.
   *
   * @throws Error (rejects) when the mapping fails, e.g. the GPU rejected the submission.
   */
  read(b: GPUBuffer, bytes: number): Promise<ArrayBuffer> {
    if (bytes > this.size) throw new Error(`internal error: read of ${bytes} > ${this.size} bytes`);
    const mapped = b.mapAsync(GPUMapMode.READ, 0, this.size);
    if (this.#primed.has(b)) {
      let early: ArrayBuffer | undefined;
      try {
        early = b.getMappedRange(0, this.size).slice(0, bytes);
        b.unmap();
      } catch {
        // Not mapped yet: wait for the promise below.
      }
      if (early) {
        this.stats.early++;
        this.#track(mapped.then(() => this.#free.push(b), () => this.#drop(b)));
        return Promise.resolve(early);
      }
    }
    this.stats.awaited++;
    const out = mapped.then(() => {
      const out = b.getMappedRange(0, this.size).slice(0, bytes);
      b.unmap();
      this.#primed.add(b);
      this.#free.push(b);
      return out;
    }, (e) => {
      this.#drop(b);
      throw e;
    });
    this.#track(out.catch(() => {}));
    return out;
  }

  /** Destroys every buffer of the pool. */
  destroy(): void {
    for (const b of this.#all) b.destroy();
    this.#all.clear();
    this.#free.length = 0;
  }

  #track(p: Promise<unknown>): void {
    this.#pending.add(p);
    p.finally(() => this.#pending.delete(p));
  }

  #create(): GPUBuffer {
    const b = this.device.createBuffer({ size: this.size, usage: READ_USAGE, label: "readback" });
    this.#all.add(b);
    return b;
  }

  #drop(b: GPUBuffer): void {
    this.#all.delete(b);
    b.destroy();
  }
}
