/**
 * The HTTP listener: strata's own accept loop on `Deno.listen` in front of `Deno.serve`, with
 * limits no client can get past.
 *
 * `Deno.serve` has no connection limit and no header or idle timeout, its accept loop ends at
 * the first accept error (with the descriptors used up by idle sockets, "Too many open files"
 * stopped the server and the process died), and it misses a client that goes away while a
 * response is being computed when the request's body came in a read of its own (Python's
 * `requests` sends head and body in two writes): Deno watches the connection then only while it
 * sends a response. So the front loop accepts, and pipes each connection to a `Deno.serve` on a
 * loopback port that only it uses:
 *
 * - at most `maxConnections` connections (WebSockets included); past it, a new connection
 *   closes the connection idle longest (no request in flight), or, when every one is busy, gets
 *   a 503 in the OpenAI error shape;
 * - a connection must send a complete request head within `headerTimeoutMs` of opening, and a
 *   kept-alive one its next request within `idleTimeoutMs` of the last response; a request in
 *   flight (a long generation, a stream) is never timed out here;
 * - when the client's side of a connection ends, its requests in flight are aborted
 *   (`request.signal`), whatever they were waiting for;
 * - when descriptors run out (EMFILE, ENFILE), idle connections go first, the limit drops below
 *   what the process could hold (leaving {@linkcode RESERVED_FDS} for its files), and the loop
 *   backs off and retries; an inner server that dies of it is started again.
 *
 * A connection costs three descriptors: the client's, and both ends of the loopback one. The
 * inner server sees requests as `Deno.serve` does (HTTP/1.1, SSE, WebSocket upgrades).
 */
import { Connection, errorResponse, isOutOfFds, sheddingNow } from "./connection.ts";

export { errorResponse } from "./connection.ts";

/** Options of {@linkcode listen}. */
export interface ListenOptions {
  hostname: string;
  /** 0 picks a free port. */
  port: number;
  /** Most connections open at once, WebSockets included (default 512). */
  maxConnections?: number;
  /** A new connection's request head must arrive within this (ms; default 10 000). */
  headerTimeoutMs?: number;
  /** A kept-alive connection's next request must arrive within this (ms; default 30 000). */
  idleTimeoutMs?: number;
  /** Called once listening, with the bound address. */
  onListen?: (addr: Deno.NetAddr) => void;
  /** Where warnings go (default `console.error`). */
  log?: (message: string) => void;
}

/** What a request's handler gets besides the request (Hono: `c.env`). */
export interface ServeInfo extends Deno.ServeHandlerInfo<Deno.NetAddr> {
  /**
   * Marks this connection busy after the response, until the returned function is called: an
   * open WebSocket holds its connection, which then is neither timed out nor evicted as idle.
   */
  holdConnection(): () => void;
}

/** A request handler (a Hono app's `fetch`). */
export type Handler = (req: Request, info: ServeInfo) => Response | Promise<Response>;

/** Counters of {@linkcode Listener.stats}. */
export interface ListenerStats {
  /** Connections open now (WebSockets included). */
  open: number;
  /** The connection limit now (lower than configured after running out of descriptors). */
  limit: number;
  accepted: number;
  /** Connections answered 503: every connection was busy, or the inner server was down. */
  shed: number;
  /** Idle connections closed to make room for new ones. */
  evicted: number;
  /** Connections closed by the header or idle timeout. */
  timedOut: number;
  /** Accept calls that failed (for lack of descriptors, mostly). */
  acceptErrors: number;
  /** Times the inner server had to be started again. */
  restarts: number;
}

/** Descriptors left to the rest of the process (store, model files) once they ran out. */
export const RESERVED_FDS = 16;
/** How long shutdown waits for the last responses to reach their clients (ms). */
const DRAIN_MS = 5000;

/** A running listener (see the module's comment). */
export class Listener {
  /** The bound address (the real port when 0 was asked for). */
  readonly addr: Deno.NetAddr;
  /** Resolves when the accept loop has stopped (after {@linkcode shutdown}). */
  readonly finished: Promise<void>;
  readonly #listener: Deno.TcpListener;
  readonly #handler: Handler;
  readonly #conns = new Set<Connection>();
  /** Connections by the local port of their loopback leg (the inner server's remote port). */
  readonly #byPort = new Map<number, Connection>();
  readonly #headerMs: number;
  readonly #idleMs: number;
  readonly #log: (message: string) => void;
  #inner?: Deno.HttpServer<Deno.NetAddr>;
  #innerStarting?: Promise<void>;
  /** Connections of each inner server (the current one, and dead ones still serving some). */
  readonly #users = new Map<Deno.HttpServer<Deno.NetAddr>, number>();
  /** The limit was lowered once already: the process's descriptor budget is known. */
  #calibrated = false;
  #limit: number;
  #closing = false;
  readonly #stats = {
    accepted: 0,
    shed: 0,
    evicted: 0,
    timedOut: 0,
    acceptErrors: 0,
    restarts: 0,
  };

  constructor(handler: Handler, options: ListenOptions) {
    this.#handler = handler;
    this.#limit = options.maxConnections ?? 512;
    this.#headerMs = options.headerTimeoutMs ?? 10_000;
    this.#idleMs = options.idleTimeoutMs ?? 30_000;
    this.#log = options.log ?? ((m) => console.error(m));
    this.#startInner();
    try {
      this.#listener = Deno.listen({ hostname: options.hostname, port: options.port });
    } catch (e) {
      this.#closing = true;
      this.#inner?.shutdown().catch(() => {});
      throw e;
    }
    this.addr = this.#listener.addr;
    options.onListen?.(this.addr);
    this.finished = this.#acceptLoop();
  }

  /** Connections, limit and what the limits did so far. */
  stats(): ListenerStats {
    return { open: this.#conns.size, limit: this.#limit, ...this.#stats };
  }

  /**
   * Stops accepting and closes idle connections; requests in flight finish (WebSockets get a
   * Close 1001), then their connections close. Resolves when all have.
   */
  async shutdown(): Promise<void> {
    if (!this.#closing) {
      this.#closing = true;
      this.#listener.close();
      for (const c of this.#conns) if (c.idle) c.close();
    }
    await this.finished;
    await this.#inner?.shutdown().catch(() => {});
    // The inner server has closed its side of every connection; the last bytes are still on
    // their way to the clients.
    const drained = Promise.all([...this.#conns].map((c) => c.closed));
    let timer: ReturnType<typeof setTimeout> | undefined;
    await Promise.race([drained, new Promise((r) => (timer = setTimeout(r, DRAIN_MS)))]);
    clearTimeout(timer);
    for (const c of this.#conns) c.destroy();
  }

  /** Starts the inner server; when it dies (its accept failed), starts another. */
  #startInner(): void {
    let inner: Deno.HttpServer<Deno.NetAddr>;
    try {
      inner = Deno.serve({
        hostname: "127.0.0.1",
        port: 0,
        onListen: () => {},
        onError: (e) => {
          this.#log(`strata: unhandled error: ${(e as Error)?.stack ?? e}`);
          const message = `internal error: ${(e as Error)?.message ?? e}`;
          return errorResponse(500, message, "internal_error");
        },
      }, (req, info) => this.#request(req, info));
    } catch (e) {
      this.#log(`strata: could not start the inner server: ${(e as Error).message}; retrying`);
      this.#restartLater();
      return;
    }
    this.#inner = inner;
    this.#users.set(inner, 0);
    inner.finished.catch((e) => {
      if (this.#closing || this.#inner !== inner) return;
      this.#log(`strata: the inner server stopped (${(e as Error).message}); starting another`);
      this.#inner = undefined;
      this.#release(inner, 0);
      this.#restartLater();
    });
  }

  #restartLater(): void {
    if (this.#innerStarting) return;
    this.#stats.restarts++;
    this.#innerStarting = new Promise<void>((resolve) =>
      setTimeout(() => {
        this.#innerStarting = undefined;
        if (!this.#closing) this.#startInner();
        resolve();
      }, 100)
    );
  }

  /**
   * Counts a connection of `inner` off (`by` = 1). A dead inner server keeps serving the
   * connections it had; once the last is gone it is shut down, which frees its resources.
   */
  #release(inner: Deno.HttpServer<Deno.NetAddr>, by: number): void {
    const n = (this.#users.get(inner) ?? 0) - by;
    if (n > 0 || inner === this.#inner) return void this.#users.set(inner, n);
    this.#users.delete(inner);
    inner.shutdown().catch(() => {});
  }

  async #acceptLoop(): Promise<void> {
    let backoff = 0;
    while (!this.#closing) {
      let conn: Deno.TcpConn;
      try {
        conn = await this.#listener.accept();
      } catch (e) {
        if (this.#closing || e instanceof Deno.errors.BadResource) return;
        this.#stats.acceptErrors++;
        // Out of descriptors: make room now; anything else (a connection reset before it was
        // accepted): retry. Either way back off, so a persistent error cannot spin the loop.
        const freed = isOutOfFds(e) ? this.#outOfFds() : 0;
        if (!isOutOfFds(e) && this.#stats.acceptErrors <= 3) {
          this.#log(`strata: accept failed: ${(e as Error).message}; retrying`);
        }
        backoff = freed > 0 ? 1 : Math.min(1000, Math.max(10, backoff * 2));
        await new Promise((r) => setTimeout(r, backoff));
        continue;
      }
      backoff = 0;
      this.#stats.accepted++;
      if (this.#conns.size < this.#limit) this.#serve(conn);
      else if (this.#evictIdle(1) === 0) this.#shed(conn);
      else {
        this.#serve(conn);
        // Let the inner server close its side of the evicted connection before the next
        // accept: under a flood, its descriptors would otherwise pile up faster than it can.
        await new Promise((r) => setTimeout(r, 1));
      }
    }
  }

  /**
   * Lowers the limit below what the process could hold, once, and closes idle connections to
   * it. Later shortages come from descriptors in passing (connections closing under a flood,
   * a dead inner server's): they only close idle connections, else the limit would ratchet
   * down with every flood.
   */
  #outOfFds(): number {
    const open = this.#conns.size;
    let fds = sheddingNow();
    for (const c of this.#conns) fds += c.fds;
    const limit = Math.max(4, Math.floor((fds - RESERVED_FDS) / 3));
    if (!this.#calibrated && limit < this.#limit) {
      this.#calibrated = true;
      this.#log(
        `strata: out of file descriptors with ${open} connections open (${fds} descriptors ` +
          `between them); serving at most ` +
          `${limit} from now on (raise the limit with ulimit -n, or lower --max-connections)`,
      );
      this.#limit = limit;
    }
    return this.#evictIdle(Math.max(1, open - this.#limit));
  }

  /** Closes up to `n` idle connections, idle longest first; returns how many. */
  #evictIdle(n: number): number {
    const idle = [...this.#conns].filter((c) => c.idle).sort((a, b) => a.idleSince - b.idleSince)
      .slice(0, n);
    for (const c of idle) {
      this.#stats.evicted++;
      c.close();
    }
    return idle.length;
  }

  #shed(conn: Deno.TcpConn): void {
    this.#stats.shed++;
    Connection.shed(conn);
  }

  /** Serves `conn`; nothing it does may reject unhandled (that would end the process). */
  #serve(conn: Deno.TcpConn): void {
    this.#open(conn).catch((e) => {
      this.#log(`strata: a connection failed: ${(e as Error)?.message ?? e}`);
      try {
        conn.close();
      } catch { /* closed */ }
    });
  }

  /** Connects `conn` to the inner server and pipes the two. */
  async #open(conn: Deno.TcpConn): Promise<void> {
    const c = new Connection(conn, {
      onIdle: (c) => this.#closing ? c.close() : c.startTimer(this.#idleMs),
      onTimeout: () => this.#stats.timedOut++,
    });
    this.#conns.add(c);
    c.closed.then(() => {
      this.#conns.delete(c);
      if (c.upstreamPort !== undefined) this.#byPort.delete(c.upstreamPort);
    });
    c.startTimer(this.#headerMs);
    if (!this.#inner) await this.#innerStarting; // it died: its successor starts in 100 ms
    const inner = this.#inner;
    let upstream: Deno.TcpConn;
    try {
      if (!inner) throw new Error("the inner server is not running");
      c.connecting = true;
      upstream = await Deno.connect({ hostname: "127.0.0.1", port: inner.addr.port });
    } catch (e) {
      c.connecting = false;
      if (isOutOfFds(e)) this.#outOfFds();
      this.#stats.shed++;
      return c.destroy(true);
    }
    this.#users.set(inner, (this.#users.get(inner) ?? 0) + 1);
    c.closed.then(() => this.#release(inner, 1));
    this.#byPort.set(upstream.localAddr.port, c);
    c.pipe(upstream);
  }

  /** A request from the inner server: its connection's bookkeeping, then the handler. */
  async #request(req: Request, info: Deno.ServeHandlerInfo<Deno.NetAddr>): Promise<Response> {
    const c = this.#byPort.get(info.remoteAddr.port);
    if (!c) {
      return errorResponse(403, "connect to the server's own address", "forbidden");
    }
    const release = c.busy();
    info.completed.then(release, release);
    // A WebSocket upgrade must see Deno's own request; other requests get the connection's
    // abort signal, so that a client that goes away cancels them.
    const upgrade = req.headers.get("upgrade") !== null;
    const request = upgrade
      ? req
      : new Request(req, { signal: AbortSignal.any([req.signal, c.gone]) });
    const serveInfo: ServeInfo = {
      remoteAddr: c.remoteAddr,
      completed: info.completed,
      holdConnection: () => c.busy(),
    };
    return await this.#handler(request, serveInfo);
  }
}

/**
 * Listens on `hostname:port` and serves `handler` with connection limits and timeouts (see the
 * module's comment).
 *
 * @param handler the request handler, e.g. a Hono app's `fetch`
 * @param options address, limits and timeouts; see {@linkcode ListenOptions}
 * @returns the running {@linkcode Listener}
 * @throws when the address cannot be bound
 *
 * @example
 * ```ts
 * const server = listen(app.fetch, { hostname: "127.0.0.1", port: 8000, maxConnections: 256 });
 * Deno.addSignalListener("SIGTERM", () => server.shutdown());
 * ```
 */
export function listen(handler: Handler, options: ListenOptions): Listener {
  return new Listener(handler, options);
}
