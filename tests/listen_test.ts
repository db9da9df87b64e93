/**
 * routes/listen.ts on real sockets, with a small handler of the test's own: a silent connection
 * is closed by the header timeout, a kept-alive one by the idle timeout; at the connection limit
 * a new connection closes the one idle longest, or gets a 503 in the OpenAI error shape when
 * every connection is busy; a WebSocket holds its connection past the timeouts; shutdown lets a
 * request in flight finish.
 */
import assert from "node:assert/strict";
import { listen, type ServeInfo } from "../routes/listen.ts";

/** A handler whose `/wait` requests answer only when the test says so. */
function testServer(options: { max?: number; headerMs?: number; idleMs?: number }) {
  const waiting: (() => void)[] = [];
  const handler = (req: Request, info: ServeInfo): Response | Promise<Response> => {
    const path = new URL(req.url).pathname;
    if (path === "/ws") {
      const { socket, response } = Deno.upgradeWebSocket(req);
      const release = info.holdConnection();
      socket.onmessage = (e) => socket.send(`echo ${e.data}`);
      socket.onclose = release;
      return response;
    }
    if (path === "/wait") return new Promise((r) => waiting.push(() => r(new Response("done"))));
    return new Response("ok");
  };
  const server = listen(handler, {
    hostname: "127.0.0.1",
    port: 0,
    maxConnections: options.max ?? 64,
    headerTimeoutMs: options.headerMs ?? 10_000,
    idleTimeoutMs: options.idleMs ?? 10_000,
    log: () => {},
  });
  const release = () => waiting.splice(0).forEach((w) => w());
  return { server, port: server.addr.port, release, waiting };
}

const enc = new TextEncoder();

/** A raw client connection that reads all the time: what arrived, and whether it closed. */
async function peer(port: number) {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  const p = { conn, text: "", closed: false, ended: Promise.resolve() };
  p.ended = (async () => {
    const buf = new Uint8Array(4096);
    while (true) {
      const n = await conn.read(buf).catch(() => null);
      if (n === null) break;
      p.text += new TextDecoder().decode(buf.subarray(0, n));
    }
    p.closed = true;
  })();
  return p;
}

/** Whether `p` closes within `ms`. */
async function closesWithin(p: { ended: Promise<void> }, ms: number): Promise<boolean> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const closed = await Promise.race([
    p.ended.then(() => true),
    new Promise<false>((r) => (timer = setTimeout(() => r(false), ms))),
  ]);
  clearTimeout(timer);
  return closed;
}

async function until(what: string, cond: () => boolean, ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    assert.ok(Date.now() < end, what);
    await new Promise((r) => setTimeout(r, 20));
  }
}

Deno.test("listen: a silent connection is closed by the header timeout", async () => {
  const { server, port } = testServer({ headerMs: 300 });
  try {
    const p = await peer(port);
    await p.conn.write(enc.encode("GET / HTTP/1.1\r\nHost: x\r\n")); // half a head, then nothing
    assert.ok(await closesWithin(p, 3000), "the header timeout never closed the connection");
    assert.equal(p.text, "", "closed without a response");
    p.conn.close();
    assert.equal(server.stats().timedOut, 1);
  } finally {
    await server.shutdown();
  }
});

Deno.test("listen: a kept-alive connection is closed by the idle timeout, not before", async () => {
  const { server, port } = testServer({ idleMs: 400 });
  try {
    const p = await peer(port);
    await p.conn.write(enc.encode("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
    assert.equal(await closesWithin(p, 200), false, "closed before the idle timeout");
    await p.conn.write(enc.encode("GET / HTTP/1.1\r\nHost: x\r\n\r\n")); // reused in time
    assert.ok(await closesWithin(p, 3000), "the idle timeout never closed the connection");
    assert.equal(p.text.match(/HTTP\/1\.1 200/g)?.length, 2, p.text);
    p.conn.close();
  } finally {
    await server.shutdown();
  }
});

Deno.test("listen: at the limit the longest idle connection makes room; all busy: 503", async () => {
  const { server, port, release, waiting } = testServer({ max: 2 });
  try {
    const idle = await peer(port);
    await until("idle connection not accepted", () => server.stats().open === 1);
    const busy = fetch(`http://127.0.0.1:${port}/wait`).then((r) => r.text());
    await until("request not in flight", () => waiting.length === 1);
    // The third connection closes the idle one and is served.
    assert.equal(await (await fetch(`http://127.0.0.1:${port}/`)).text(), "ok");
    assert.ok(await closesWithin(idle, 2000), "the idle connection was not closed");
    assert.equal(idle.text, "");
    idle.conn.close();
    assert.equal(server.stats().evicted, 1);
    // Now both connections are busy: a new one is shed with a 503 in the OpenAI error shape.
    const second = fetch(`http://127.0.0.1:${port}/wait`).then((r) => r.text());
    await until("second request not in flight", () => waiting.length === 2);
    const shed = await fetch(`http://127.0.0.1:${port}/`);
    assert.equal(shed.status, 503);
    assert.equal(shed.headers.get("retry-after"), "1");
    const body = await shed.json();
    assert.equal(body.error.code, "server_busy");
    assert.equal(body.error.type, "server_error");
    release();
    assert.deepEqual(await Promise.all([busy, second]), ["done", "done"]);
    assert.equal(server.stats().shed, 1);
  } finally {
    release();
    await server.shutdown();
  }
});

Deno.test("listen: an open WebSocket is busy: not timed out, not evicted", async () => {
  const { server, port } = testServer({ max: 2, idleMs: 200 });
  try {
    const ws = new WebSocket(`ws://127.0.0.1:${port}/ws`);
    await new Promise((r, j) => {
      ws.onopen = r;
      ws.onerror = j;
    });
    const echo = () =>
      new Promise((r) => {
        ws.onmessage = (e) => r(e.data);
        ws.send("hi");
      });
    await new Promise((r) => setTimeout(r, 600)); // three idle timeouts
    assert.equal(await echo(), "echo hi");
    // Two plain connections in turn: each evicts the other, never the socket.
    for (let i = 0; i < 2; i++) {
      assert.equal(await (await fetch(`http://127.0.0.1:${port}/`)).text(), "ok");
    }
    assert.equal(await echo(), "echo hi");
    const closed = new Promise((r) => (ws.onclose = r));
    ws.close();
    await closed;
  } finally {
    await server.shutdown();
  }
});

Deno.test("listen: shutdown lets the request in flight finish", async () => {
  const { server, port, release, waiting } = testServer({});
  const answer = fetch(`http://127.0.0.1:${port}/wait`).then((r) => r.text());
  await until("request not in flight", () => waiting.length === 1);
  const down = server.shutdown();
  await new Promise((r) => setTimeout(r, 100));
  release();
  assert.equal(await answer, "done");
  await down;
  await assert.rejects(fetch(`http://127.0.0.1:${port}/`));
});
