// api/errors.ts: the context-length error names a value the caller can use, in both of its cases
// (a max_tokens that is too large, a prompt that is too long on its own), as checkRequest raises it.
import assert from "node:assert/strict";
import { checkRequest, ContextLengthError, contextLengthMessage } from "../api/errors.ts";
import { sampling } from "../api/types.ts";

/** The error checkRequest throws for a prompt of `prompt` tokens, or undefined when it fits. */
function refusal(prompt: number, maxTokens: number, limit: number) {
  const request = {
    promptIds: Array.from({ length: prompt }, () => 1),
    sampling: sampling({ maxTokens }),
  };
  try {
    checkRequest(request, 10, limit);
  } catch (e) {
    return e as ContextLengthError;
  }
}

Deno.test("context length: a max_tokens that is too large gets the largest one that fits", () => {
  const e = refusal(100, 50, 128)!;
  assert.ok(e instanceof ContextLengthError);
  assert.equal(
    e.message,
    "prompt (100 tokens) + max_tokens (50) exceeds the context length of 128 tokens; " +
      "lower max_tokens to 28 or less, or shorten the prompt",
  );
  assert.deepEqual([e.promptTokens, e.maxTokens, e.limit, e.code], [
    100,
    50,
    128,
    "context_length_exceeded",
  ]);
  // The value it names fits; one more does not.
  assert.equal(refusal(100, 28, 128), undefined);
  assert.ok(refusal(100, 29, 128) instanceof ContextLengthError);
  // A prompt one token short of the context leaves room for exactly one.
  assert.match(refusal(127, 2, 128)!.message, /lower max_tokens to 1 or less/);
});

Deno.test("context length: a prompt that fills the context on its own says so", () => {
  for (const prompt of [128, 300]) {
    const e = refusal(prompt, 1, 128)!;
    assert.equal(
      e.message,
      `prompt (${prompt} tokens) + max_tokens (1) exceeds the context length of 128 tokens; ` +
        "the prompt alone is too long: shorten it to 127 tokens or fewer",
    );
    assert.doesNotMatch(e.message, /max_tokens to/, "no max_tokens can help");
  }
  assert.equal(refusal(127, 1, 128), undefined, "the length it names fits");
  assert.equal(contextLengthMessage(128, 4, 128), new ContextLengthError(128, 4, 128).message);
});
