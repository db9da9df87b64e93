/** A single-consumer async queue: the engine pushes, one `for await` reads. */
export class Channel<T> implements AsyncIterable<T> {
  #items: T[] = [];
  #waiting: ((r: IteratorResult<T>) => void) | undefined;
  #closed = false;
  #error: unknown;

  push(item: T): void {
    if (this.#closed) return;
    if (this.#waiting) {
      const w = this.#waiting;
      this.#waiting = undefined;
      w({ value: item, done: false });
    } else this.#items.push(item);
  }

  /** Ends the stream after the queued items; with `error`, the reader throws it. */
  close(error?: unknown): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#error = error;
    if (this.#waiting && this.#items.length === 0) {
      const w = this.#waiting;
      this.#waiting = undefined;
      if (error === undefined) w({ value: undefined, done: true });
      else w(Promise.reject(error) as never);
    }
  }

  async *[Symbol.asyncIterator](): AsyncIterator<T> {
    while (true) {
      if (this.#items.length) {
        yield this.#items.shift()!;
        continue;
      }
      if (this.#closed) {
        if (this.#error !== undefined) throw this.#error;
        return;
      }
      const r = await new Promise<IteratorResult<T>>((resolve) => (this.#waiting = resolve));
      if (r.done) return;
      yield r.value;
    }
  }
}
