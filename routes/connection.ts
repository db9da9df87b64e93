/**
 * One client connection of the listener (routes/listen.ts): its requests in flight, its idle
 * timer, and the two pumps between the client and the loopback connection to the inner server.
 */

/** A response in the OpenAI error shape, for errors no route sees. */
export function errorResponse(status: number, message: string, code: string): Response {
  const type = status >= 500 ? "server_error" : "invalid_request_error";
  const body = JSON.stringify({ error: { message, type, param: null, code } });
  return new Response(body, { status, headers: { "content-type": "application/json" } });
}

/** Whether an error says the process (or system) has no file descriptor left. */
export function isOutOfFds(e: unknown): boolean {
  const code = (e as { code?: unknown })?.code;
  return code === "EMFILE" || code === "ENFILE" || /too many open files/i.test(String(e));
}

/** The raw 503 a shed connection gets before its request is read. */
const SHED_RESPONSE = (() => {
  const message = "the server has no connection to spare (every one is busy); retry in a second";
  const body = JSON.stringify({
    error: { message, type: "server_error", param: null, code: "server_busy" },
  });
  return new TextEncoder().encode(
    "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n" +
      `connection: close\r\ncontent-length: ${body.length}\r\n\r\n${body}`,
  );
})();

/** Most shed connections lingering at once; past it, new ones are closed without a reply. */
const MAX_SHEDDING = 32;
/** How long a shed connection may take to read its 503 (ms). */
const SHED_LINGER_MS = 1000;
/** Bytes one pump reads at a time. */
const CHUNK = 16 * 1024;
/** How long a closing connection's inner side may take to finish and close (ms). */
const CLOSE_GRACE_MS = 1000;

let shedding = 0;

/** Shed connections still lingering (each holds a descriptor). */
export function sheddingNow(): number {
  return shedding;
}

function closeQuietly(conn: Deno.Conn | undefined): void {
  try {
    conn?.close();
  } catch { /* already closed */ }
}

async function writeAll(conn: Deno.Conn, bytes: Uint8Array): Promise<void> {
  for (let off = 0; off < bytes.length;) off += await conn.write(bytes.subarray(off));
}

/** Callbacks of a {@linkcode Connection} into its listener. */
export interface ConnectionEvents {
  /** The last request in flight ended (start the idle timer, or close when shutting down). */
  onIdle(c: Connection): void;
  /** The header or idle timer closed the connection. */
  onTimeout(c: Connection): void;
}

/** A client connection piped to the inner server (see routes/listen.ts). */
export class Connection {
  /** The client's address (what the handler sees as `remoteAddr`). */
  readonly remoteAddr: Deno.NetAddr;
  /** Aborted when the client's side ends: it closed, half-closed or reset the connection. */
  readonly gone: AbortSignal;
  /** Resolves once both sides are closed. */
  readonly closed: Promise<void>;
  /** Local port of the loopback leg, once connected. */
  upstreamPort?: number;
  /** Its loopback leg is being connected (a socket, without the inner server's end yet). */
  connecting = false;
  /** When it last became idle (performance.now(), ms). */
  idleSince = performance.now();
  readonly #client: Deno.TcpConn;
  readonly #events: ConnectionEvents;
  readonly #gone = new AbortController();
  #upstream?: Deno.TcpConn;
  #inflight = 0;
  #timer?: ReturnType<typeof setTimeout>;
  #closing = false;
  #destroyed = false;
  /** A request reached the inner server. */
  #served = false;
  #resolveClosed!: () => void;

  constructor(client: Deno.TcpConn, events: ConnectionEvents) {
    this.#client = client;
    this.#events = events;
    this.remoteAddr = client.remoteAddr;
    this.gone = this.#gone.signal;
    this.closed = new Promise((r) => (this.#resolveClosed = r));
  }

  /** Descriptors it holds: the client's, and both ends of the loopback leg once connected. */
  get fds(): number {
    if (this.#destroyed) return 0;
    return this.#upstream ? 3 : this.connecting ? 2 : 1;
  }

  /** No request in flight, no WebSocket held, not closing: it may be timed out or evicted. */
  get idle(): boolean {
    return this.#inflight === 0 && !this.#closing;
  }

  /** Marks the connection busy until the returned function is called (once). */
  busy(): () => void {
    this.#served = true;
    this.#inflight++;
    clearTimeout(this.#timer);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      if (--this.#inflight === 0 && !this.#closing) {
        this.idleSince = performance.now();
        this.#events.onIdle(this);
      }
    };
  }

  /** Closes the connection after `ms` unless a request starts first. */
  startTimer(ms: number): void {
    clearTimeout(this.#timer);
    this.#timer = setTimeout(() => {
      if (!this.idle) return;
      this.#events.onTimeout(this);
      this.close();
    }, ms);
  }

  /** Pipes the client and `upstream` both ways until either side ends. */
  pipe(upstream: Deno.TcpConn): void {
    if (this.#closing) return closeQuietly(upstream); // closed while it connected
    this.#upstream = upstream;
    this.upstreamPort = upstream.localAddr.port;
    // Client to server: when the client's side ends, its requests in flight are aborted and the
    // end is passed on (a half-closed client still reads its answer).
    this.#pump(this.#client, upstream).finally(async () => {
      this.#gone.abort();
      try {
        await upstream.closeWrite();
      } catch {
        this.destroy();
      }
    });
    // Server to client: when the inner server closes, so does the client's connection.
    this.#pump(upstream, this.#client).finally(() => this.destroy());
  }

  /**
   * Closes the connection without cutting off a response on its way: the inner server is told
   * the request stream ended, sends what it has, and closes its side (then so does this, or
   * after {@linkcode CLOSE_GRACE_MS} at the latest).
   */
  close(): void {
    if (this.#closing) return;
    this.#closing = true;
    clearTimeout(this.#timer);
    // Before its first request nothing can be on its way: close now, freeing the descriptors.
    if (!this.#upstream || !this.#served) return this.destroy();
    this.#upstream.closeWrite().catch(() => this.destroy());
    this.#timer = setTimeout(() => this.destroy(), CLOSE_GRACE_MS);
  }

  /**
   * Closes both sides now; with `busy503`, first tells the client the server is busy (it was
   * accepted but could not be served).
   */
  destroy(busy503 = false): void {
    if (this.#destroyed) return;
    this.#destroyed = this.#closing = true;
    clearTimeout(this.#timer);
    this.#gone.abort();
    closeQuietly(this.#upstream);
    if (busy503) Connection.shed(this.#client).then(() => this.#resolveClosed());
    else {
      closeQuietly(this.#client);
      this.#resolveClosed();
    }
  }

  async #pump(from: Deno.Conn, to: Deno.Conn): Promise<void> {
    const buf = new Uint8Array(CHUNK);
    try {
      while (true) {
        const n = await from.read(buf);
        if (n === null) return;
        await writeAll(to, buf.subarray(0, n));
      }
    } catch { /* reset, or closed by this side */ }
  }

  /**
   * Answers 503 before reading the request, then lets the client read it: closing with the
   * request unread would reset the connection, and the client could lose the answer.
   */
  static async shed(conn: Deno.TcpConn): Promise<void> {
    if (shedding >= MAX_SHEDDING) return closeQuietly(conn);
    shedding++;
    const timer = setTimeout(() => closeQuietly(conn), SHED_LINGER_MS);
    try {
      await writeAll(conn, SHED_RESPONSE);
      await conn.closeWrite();
      const sink = new Uint8Array(4096);
      while ((await conn.read(sink)) !== null) { /* discard the request */ }
    } catch {
      /* the client went away, or the linger timer closed it */
    } finally {
      clearTimeout(timer);
      closeQuietly(conn);
      shedding--;
    }
  }
}
