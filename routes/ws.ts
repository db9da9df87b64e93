/**
 * `GET /v1/chat/ws`: chat over a WebSocket, several conversations at once, told apart by id.
 *
 * Client → server: `{"type":"start","id","messages",...chat fields}`, `{"type":"cancel","id"}`,
 * `{"type":"ping"}`. Server → client: `{"type":"delta","id","text","token_id"}` per token,
 * `{"type":"done","id","finish_reason","usage","timings","seed"}`, `{"type":"error","id"?,
 * "error":{...}}`, `{"type":"pong"}`. A bad message gets an error and the socket stays open;
 * closing the socket cancels its conversations. docs/api.md has the full protocol.
 */
import { Hono } from "hono";
import { upgradeWebSocket } from "hono/deno";
import type { WSContext } from "hono/ws";
import { admit, type ServerContext } from "./context.ts";
import { chatLogprob } from "./chat.ts";
import { ApiError, badRequest, toApiError } from "./errors.ts";
import { engineRequest, type Run, sessionOf, startScoped, usageOf } from "./generation.ts";
import { type Body, parseJsonObject } from "./fields.ts";
import { wsGuard } from "./guard.ts";
import type { ServeInfo } from "./listen.ts";
import { requestTenant } from "./tenants.ts";
import { parseChat, samplingFor } from "./validate.ts";

/** Most conversations running at once on one socket. */
export const MAX_CONVERSATIONS = 16;

function send(ws: WSContext, message: object): void {
  if (ws.readyState === 1) ws.send(JSON.stringify(message));
}

function sendError(ws: WSContext, err: unknown, id?: string): void {
  const api = toApiError(err);
  if (api.code === "internal_error") console.error(err);
  send(ws, { type: "error", ...(id === undefined ? {} : { id }), ...api.body() });
}

function conversationId(msg: Body): string {
  const id = msg.id;
  if (typeof id !== "string" || id.length === 0 || id.length > 128) {
    throw badRequest(
      "id",
      `id must be a string of 1-128 characters naming the conversation; got ${JSON.stringify(id)}`,
    );
  }
  return id;
}

/**
 * The `/v1/chat/ws` sub-app (426 for a plain GET). The upgrade is checked first (routes/guard.ts:
 * origin, handshake headers); the socket's conversations run as the tenant of the key it
 * connected with, and an open socket holds its connection busy (routes/listen.ts).
 */
export function wsRoutes(ctx: ServerContext): Hono {
  const { engine } = ctx;
  return new Hono().get(
    "/",
    wsGuard(ctx.corsOrigins),
    upgradeWebSocket((c) => {
      const running = new Map<string, Run>();
      /**
       * Conversations whose prompt is still being tokenized: their id is taken, and a cancel
       * meanwhile (or the socket closing) ends them before they start.
       */
      const starting = new Map<string, { cancelled: boolean }>();
      const tenant = requestTenant(c);
      const hold = (c.env as Partial<ServeInfo> | undefined)?.holdConnection;
      let open = false;
      let release: (() => void) | undefined;

      async function start(ws: WSContext, id: string, msg: Body): Promise<void> {
        if (running.has(id) || starting.has(id)) {
          // This error answers the rejected start; the running conversation goes on.
          throw new ApiError(
            400,
            `conversation "${id}" is already running; cancel it or use a new id`,
            { param: "id", code: "duplicate_id" },
          );
        }
        if (running.size + starting.size >= MAX_CONVERSATIONS) {
          throw badRequest(
            null,
            `${MAX_CONVERSATIONS} conversations are already running on this socket; ` +
              "wait for one to finish or open another socket",
          );
        }
        const pending = { cancelled: false };
        starting.set(id, pending);
        let req;
        try {
          req = await parseChat(engine, msg, undefined, "/v1/chat/ws");
        } finally {
          starting.delete(id);
        }
        if (pending.cancelled) {
          return send(ws, { type: "done", id, finish_reason: "cancelled" });
        }
        if (req.n !== 1) throw badRequest("n", "n must be 1 over the WebSocket; start more ids");
        admit(ctx);
        const scope = {
          sessionId: req.sessionId,
          tenant,
          speculation: req.speculation,
          constraint: req.constraint,
        };
        const sampling = samplingFor(req, req.logprobs ? req.topLogprobs : 0, 0);
        const run = startScoped(ctx, engineRequest(req.promptIds, sampling, scope), scope);
        running.set(id, run);
        try {
          for await (const ev of run.events) {
            const delta = { type: "delta", id, text: ev.text, token_id: ev.id };
            send(ws, req.logprobs ? { ...delta, logprobs: chatLogprob(engine, ev) } : delta);
          }
          const r = await run.result;
          send(ws, {
            type: "done",
            id,
            finish_reason: r.finishReason,
            usage: usageOf([req.promptIds], [r]),
            timings: r.timings,
            seed: String(r.seed),
            ...sessionOf(req.sessionId, r),
          });
        } finally {
          running.delete(id);
        }
      }

      function onMessage(data: unknown, ws: WSContext): void {
        let id: string | undefined;
        try {
          if (typeof data !== "string") {
            throw badRequest(null, "send JSON text messages, not binary ones");
          }
          if (data.length > ctx.maxBodyBytes) {
            throw new ApiError(413, `the message is over ${ctx.maxBodyBytes} bytes; send less`, {
              code: "message_too_large",
            });
          }
          const msg = parseJsonObject(data);
          if (msg.type === "ping") return send(ws, { type: "pong" });
          if (msg.type !== "start" && msg.type !== "cancel") {
            throw badRequest(
              "type",
              `type must be "start", "cancel" or "ping"; got ${JSON.stringify(msg.type)}`,
            );
          }
          id = conversationId(msg);
          if (msg.type === "cancel") {
            const run = running.get(id), pending = starting.get(id);
            if (pending) {
              pending.cancelled = true; // its "done" follows once its prompt is tokenized
              return;
            }
            if (!run) {
              throw new ApiError(404, `no conversation "${id}" is running on this socket`, {
                param: "id",
                code: "conversation_not_found",
              });
            }
            return run.cancel(); // its "done" follows with finish_reason "cancelled"
          }
          const started = id;
          start(ws, started, msg).catch((e) => sendError(ws, e, started));
        } catch (e) {
          sendError(ws, e, id);
        }
      }

      return {
        onOpen: () => {
          open = true;
          release = hold?.();
          ctx.metrics.sockets.open++;
        },
        onMessage: (evt, ws) => onMessage(evt.data, ws),
        onClose: () => {
          if (open) ctx.metrics.sockets.open--;
          open = false;
          release?.();
          for (const run of running.values()) run.cancel();
          running.clear();
          for (const pending of starting.values()) pending.cancelled = true;
        },
      };
    }),
    () => {
      throw new ApiError(
        426,
        "GET /v1/chat/ws is a WebSocket endpoint; connect with a WebSocket client (ws://.../v1/chat/ws)",
        { code: "upgrade_required", headers: { Upgrade: "websocket" } },
      );
    },
  );
}
