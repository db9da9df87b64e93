/**
 * Tokenizer glue: @huggingface/tokenizers for encode/decode, @huggingface/jinja for chat
 * templates, and an incremental detokenizer for streaming.
 */
import { Tokenizer } from "@huggingface/tokenizers";
import { Template } from "@huggingface/jinja";
import type { ChatMessage, ChatRenderOptions } from "../../api/types.ts";
import { templateChat, templateKnowsTools } from "./chat_tools.ts";
import { tokenIds } from "./config.ts";
import type { ModelFolder } from "./folder.ts";

export type { ChatMessage } from "../../api/types.ts";

/**
 * Stands in for the content of a message to be continued: what the template writes before it is
 * the prompt's start (a template may trim or wrap content, never this).
 */
const CONTINUE_MARK = "\uE000strata-continue\uE000";

/** Options for {@linkcode TextTokenizer.encode}. */
export interface EncodeOptions {
  /** Add BOS etc. as the tokenizer's post-processor says (default true, as HF). */
  addSpecialTokens?: boolean;
}

/** Options for {@linkcode TextTokenizer.decode} and {@linkcode TextTokenizer.createDetokenizer}. */
export interface DecodeOptions {
  skipSpecialTokens?: boolean;
  /** HF's `clean_up_tokenization_spaces`; default: tokenizer_config.json's (the decoder: false). */
  cleanUp?: boolean;
}

/**
 * Options for {@linkcode TextTokenizer.applyChatTemplate}: tools, the generation prompt and
 * continuing the last message (api/types.ts), and extra template variables.
 */
export interface ChatTemplateOptions extends ChatRenderOptions {
  /** Extra template variables. */
  extra?: Record<string, unknown>;
}

/** Extra facts for the constructor; {@linkcode TextTokenizer.load} fills them from the folder. */
export interface TextTokenizerOptions {
  /** EOS ids besides the tokenizer's own `eos_token`. */
  eosIds?: number[];
  bosId?: number;
}

/** Streaming detokenizer: push ids, get the text they add. */
export interface Detokenizer {
  /** Adds one token; returns the new text (held back while a UTF-8 character is incomplete). */
  push(id: number): string;
  /** Returns whatever is still held back (possibly U+FFFD for a truly broken byte sequence). */
  flush(): string;
}

type Json = Record<string, unknown>;

/** Text ↔ token ids for one model. */
export class TextTokenizer {
  /** The parsed tokenizer_config.json. */
  readonly tokenizerConfig: Json;
  /** The parsed tokenizer.json (constrained decoding reads each token's bytes from it). */
  readonly tokenizerJson: Json;
  /** Ids that end generation: the model's EOS ids plus the tokenizer's `eos_token`. */
  readonly eosIds: number[];
  readonly bosId?: number;
  /** Tokens the tokenizer knows (largest id + 1); the model's vocab may be larger. */
  readonly vocabSize: number;
  readonly bosToken?: string;
  readonly eosToken?: string;
  #tok: Tokenizer;
  #cleanUp: boolean;
  #special: Set<number>;
  #template?: Template;

  /**
   * @param tokenizerJson parsed tokenizer.json
   * @param tokenizerConfig parsed tokenizer_config.json (`{}` if none)
   * @param options extra EOS ids and the BOS id from config.json / generation_config.json
   */
  constructor(tokenizerJson: Json, tokenizerConfig: Json, options: TextTokenizerOptions = {}) {
    this.tokenizerConfig = tokenizerConfig;
    this.tokenizerJson = tokenizerJson;
    this.#tok = new Tokenizer(tokenizerJson, tokenizerConfig);
    this.#cleanUp = tokenizerConfig.clean_up_tokenization_spaces === true;
    const added = (tokenizerJson.added_tokens ?? []) as { id: number; special?: boolean }[];
    this.#special = new Set(added.filter((t) => t.special).map((t) => t.id));
    let max = -1;
    for (const id of this.#tok.get_vocab(true).values()) max = Math.max(max, id);
    this.vocabSize = max + 1;
    this.bosToken = tokenContent(tokenizerConfig.bos_token);
    this.eosToken = tokenContent(tokenizerConfig.eos_token);
    const eos = [...(options.eosIds ?? [])];
    const ownEos = this.eosToken === undefined ? undefined : this.#tok.token_to_id(this.eosToken);
    if (ownEos !== undefined && !eos.includes(ownEos)) eos.push(ownEos);
    this.eosIds = eos;
    const bos = options.bosId ??
      (this.bosToken === undefined ? undefined : this.#tok.token_to_id(this.bosToken));
    if (bos !== undefined) this.bosId = bos;
  }

  /**
   * Builds the tokenizer of a loaded model folder.
   *
   * @example
   * ```ts
   * const tok = TextTokenizer.load(await loadModelFolder("models/tiny"));
   * const ids = tok.encode("Hello");
   * ```
   */
  static load(
    folder: Pick<ModelFolder, "tokenizerJson" | "tokenizerConfig" | "config">,
  ): TextTokenizer {
    return new TextTokenizer(folder.tokenizerJson, folder.tokenizerConfig, {
      eosIds: tokenIds(folder.config.eosIds),
      bosId: folder.config.bosId,
    });
  }

  /** Token ids of `text`. */
  encode(text: string, options: EncodeOptions = {}): number[] {
    if (text === "" && options.addSpecialTokens === false) return [];
    return this.#tok.encode(text, { add_special_tokens: options.addSpecialTokens ?? true }).ids;
  }

  /** Text of `ids`; ids the tokenizer does not know (model pad rows) decode to nothing. */
  decode(ids: number[], options: DecodeOptions = {}): string {
    const known = ids.filter((id) => id >= 0 && this.#tok.id_to_token(id) !== undefined);
    if (known.length === 0) return "";
    return this.#tok.decode(known, {
      skip_special_tokens: options.skipSpecialTokens ?? false,
      clean_up_tokenization_spaces: options.cleanUp ?? this.#cleanUp,
    });
  }

  /** Whether the tokenizer has a token `id` (model rows past its vocabulary are padding). */
  knows(id: number): boolean {
    return Number.isInteger(id) && id >= 0 && this.#tok.id_to_token(id) !== undefined;
  }

  /** Whether `id` is a special added token (BOS, EOS, chat markers). */
  isSpecial(id: number): boolean {
    return this.#special.has(id);
  }

  /** The text of one token on its own (for `top_logprobs`); "" for unknown ids. */
  tokenText(id: number): string {
    return this.decode([id], { cleanUp: false });
  }

  /** Whether the chat template takes `tools` (else strata writes them out: chat_tools.ts). */
  get templateKnowsTools(): boolean {
    return templateKnowsTools(this.#templateSource());
  }

  /**
   * Renders the chat with tokenizer_config.json's `chat_template`, passing `messages`, `tools`,
   * `add_generation_prompt`, `bos_token`, `eos_token` and `raise_exception` as HF does (tools
   * and tool messages as engine/model/chat_tools.ts says). With `continueFinalMessage` the text
   * ends with the last message's content, open, as transformers' `continue_final_message`.
   *
   * @throws when the tokenizer has no chat template, the template raises, or the last message
   *   to be continued is not rendered
   */
  applyChatTemplate(messages: ChatMessage[], options: ChatTemplateOptions = {}): string {
    const source = this.#templateSource();
    this.#template ??= new Template(source);
    const special: Json = {};
    for (const key of ["bos_token", "eos_token", "unk_token", "pad_token"]) {
      const v = tokenContent(this.tokenizerConfig[key]);
      if (v !== undefined) special[key] = v;
    }
    const cont = options.continueFinalMessage ?? false;
    const last = messages.at(-1);
    if (cont && !last) throw new Error("there is no final message to continue");
    const shown = cont
      ? [...messages.slice(0, -1), { ...last!, content: CONTINUE_MARK }]
      : messages;
    const chat = templateChat(shown, options, templateKnowsTools(source));
    let text: string;
    // @huggingface/jinja defines raise_exception (and strftime_now, range) itself.
    try {
      text = this.#template.render({
        ...special,
        ...options.extra,
        ...chat,
        add_generation_prompt: options.addGenerationPrompt ?? !cont,
      });
    } catch (e) {
      throw new Error(`chat template error: ${(e as Error).message}`);
    }
    if (!cont) return text;
    const at = text.lastIndexOf(CONTINUE_MARK);
    if (at < 0) {
      throw new Error(
        "the chat template does not write the final message's content, so it cannot be continued",
      );
    }
    return text.slice(0, at) + last!.content;
  }

  /** Token ids of a rendered chat (the template supplies BOS, so no special tokens are added). */
  encodeChat(messages: ChatMessage[], options: ChatTemplateOptions = {}): number[] {
    return this.encode(this.applyChatTemplate(messages, options), { addSpecialTokens: false });
  }

  /**
   * A streaming detokenizer. It decodes a short window of recent ids and emits the difference
   * (the TGI/vLLM prefix-offset scheme, equivalent to HF TextStreamer's full re-decode), holding
   * text back while it ends in U+FFFD (an incomplete multi-byte character). Concatenating every
   * `push()` and the final `flush()` gives `decode(ids, {cleanUp: false, ...options})`.
   */
  createDetokenizer(options: DecodeOptions = {}): Detokenizer {
    const ids: number[] = [];
    let prefix = 0; // window start: decoded together so merges/leading spaces are right
    let read = 0; // ids up to here have been emitted
    const dec = (from: number, to: number) =>
      this.decode(ids.slice(from, to), {
        skipSpecialTokens: options.skipSpecialTokens,
        cleanUp: options.cleanUp ?? false,
      });
    return {
      push: (id: number) => {
        ids.push(id);
        const before = dec(prefix, read);
        const now = dec(prefix, ids.length);
        if (now.length > before.length && !now.endsWith("\uFFFD")) {
          prefix = read;
          read = ids.length;
          return now.slice(before.length);
        }
        return "";
      },
      flush: () => {
        const before = dec(prefix, read);
        const now = dec(prefix, ids.length);
        prefix = read = ids.length;
        return now.slice(before.length);
      },
    };
  }

  #templateSource(): string {
    const t = this.tokenizerConfig.chat_template;
    if (typeof t === "string") return t;
    if (Array.isArray(t)) {
      const named = t as { name: string; template: string }[];
      const pick = named.find((x) => x.name === "default") ?? named[0];
      if (pick) return pick.template;
    }
    throw new Error(
      "this model has no chat template (no chat_template in tokenizer_config.json or " +
        "chat_template.jinja); use the completions endpoint, or add a chat_template",
    );
  }
}

/** `bos_token` etc. may be a string or an AddedToken object `{content, ...}`. */
function tokenContent(v: unknown): string | undefined {
  if (typeof v === "string") return v;
  if (v && typeof v === "object" && typeof (v as Json).content === "string") {
    return (v as Json).content as string;
  }
  return undefined;
}
