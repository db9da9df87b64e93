/** A model ready to serve: its config, tokenizer and weights on the GPU. */
import type { ModelConfig } from "./config.ts";
import type { TextTokenizer } from "./tokenizer.ts";
import type { ModelWeights } from "./weights.ts";

/** What `Engine.create` serves (a loaded folder, or the bench's random weights). */
export interface GpuModel {
  /** The model's id (its folder name, or the shape's name). */
  id: string;
  config: ModelConfig;
  tokenizer: TextTokenizer;
  weights: ModelWeights;
}
