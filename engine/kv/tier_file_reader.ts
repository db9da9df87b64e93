/**
 * A reader thread of the file tier (engine/kv/tier_file_readers.ts starts it): reads each job's
 * spill file into the job's shared buffer with `readRecord` and answers `{id, ok}`. It says
 * "ready" first: a message sent before it listens would be lost.
 */
import { parentPort } from "node:worker_threads";
import { readRecord } from "./tier_file.ts";
import type { ReadMessage } from "./tier_file_readers.ts";

if (!parentPort) throw new Error("engine/kv/tier_file_reader.ts runs as a worker thread");
const port = parentPort;
port.on("message", (job: ReadMessage) => {
  let ok = false;
  try {
    const into = new Uint8Array(job.memory, job.offset, job.length);
    ok = readRecord(job.path, job.hash, job.tokens, into);
  } catch {
    ok = false;
  }
  port.postMessage({ id: job.id, ok });
});
port.postMessage("ready");
