#!/usr/bin/env python3
"""strata vs HF transformers on the same weights (run on the GPU machine).

  python3 scripts/hf_compare.py make  --shape SHAPE --out DIR      # random HF model folder
  python3 scripts/hf_compare.py check --model DIR --strata OUT.json  # teacher-forced compare

SHAPE: tinyllama, qwen2, mistral-window (a Mistral whose sliding_window of 200 is far shorter than
the prompts it is given), tinyllama-linear (linear rope scaling x4, 8k positions), tinyllama-yarn
(yarn x16, 32k positions), tinyllama-yarn128k (yarn x64, 128k positions).

`make` writes a random model with HF itself (weights scaled so logits are not flat) plus the
default model's tokenizer (the model vocab is larger, as HF allows). strata then generates with
`deno task generate --model DIR --prompt-ids ... --json` (or scripts/long_generate.ts for prompts
too long for one argument); `check` runs HF in float32 over the prompt + strata's tokens and
reports, per generated step, whether strata's token is HF's argmax (where HF's top-1 margin > 0.05)
and |strata logprob - HF logprob|. Only the generated positions go through the LM head, so a 128k
sequence's logits never exist whole.
"""
import argparse
import json
import os
import shutil
import sys

import torch

SHAPES = {
    # TinyLlama-1.1B: 22 layers, hidden 2048, 32/4 heads, ffn 5632, vocab 32000
    "tinyllama": dict(arch="llama", hidden_size=2048, num_hidden_layers=22, num_attention_heads=32,
                      num_key_value_heads=4, intermediate_size=5632, vocab_size=32000,
                      tie_word_embeddings=False, dtype=torch.bfloat16),
    # Qwen2-0.5B-like: q/k/v biases, tied embeddings, head_dim 64 (vocab cut to keep it small)
    "qwen2": dict(arch="qwen2", hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, intermediate_size=4864, vocab_size=32000,
                  tie_word_embeddings=True, dtype=torch.float16),
    # A Mistral whose window (200: not a multiple of a 16-token block or a 64-key tile) is far
    # shorter than its prompts; 8 layers keep HF's masked attention quick.
    "mistral-window": dict(arch="mistral", hidden_size=1024, num_hidden_layers=8,
                           num_attention_heads=16, num_key_value_heads=4, intermediate_size=2816,
                           vocab_size=32000, tie_word_embeddings=False, dtype=torch.bfloat16,
                           sliding_window=200, max_position_embeddings=8192),
}
TINY = {k: v for k, v in SHAPES["tinyllama"].items()}
# RoPE scaling on the TinyLlama shape; yarn's max_position_embeddings = factor x original, where
# transformers 4.x (which recomputes the factor from them) and 5.x agree.
SHAPES["tinyllama-linear"] = dict(TINY, max_position_embeddings=8192,
                                  rope_scaling={"rope_type": "linear", "factor": 4.0})
SHAPES["tinyllama-yarn"] = dict(TINY, max_position_embeddings=32768, rope_scaling={
    "rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 2048})
SHAPES["tinyllama-yarn128k"] = dict(TINY, max_position_embeddings=131072, rope_scaling={
    "rope_type": "yarn", "factor": 64.0, "original_max_position_embeddings": 2048})
HERE = os.path.dirname(os.path.abspath(__file__))
TOKENIZER_FROM = os.path.join(HERE, "..", "models", "strata-default")


def make(shape: str, out: str) -> None:
    from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                              Qwen2Config, Qwen2ForCausalLM)
    s = dict(SHAPES[shape])
    arch, dtype = s.pop("arch"), s.pop("dtype")
    torch.manual_seed(0)
    common = dict(max_position_embeddings=s.pop("max_position_embeddings", 2048),
                  rope_theta=10000.0, rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=1,
                  initializer_range=0.02)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**s, **common))
    elif arch == "mistral":
        model = MistralForCausalLM(MistralConfig(**s, **common))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**s, **common, use_sliding_window=False))
    with torch.no_grad():
        # Larger embeddings and biases give peaked logits (a flat model tests nothing). Tied
        # embeddings are also the LM head: at std 1 the logits saturate (every logprob is 0 and
        # the input token always wins), so they get std 0.15 (logit std ~4 over normed states).
        model.model.embed_tokens.weight.normal_(0, 0.15 if s["tie_word_embeddings"] else 1.0)
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
    model.to(dtype).save_pretrained(out, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOKENIZER_FROM, f), os.path.join(out, f))
    print(f"wrote {out}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, {dtype}")


def check(model_dir: str, strata_json: str, attn=None) -> dict:
    from transformers import AutoModelForCausalLM
    with open(strata_json) as f:
        lines = [l for l in f.read().splitlines() if l.startswith("{")]
    got = json.loads(lines[-1])
    prompt, tokens, logprobs = got["prompt_ids"], got["tokens"], got["logprobs"]
    # attn "eager" for a sliding window: the one implementation every transformers version
    # masks with it (a [T, T] score matrix per head: keep such prompts to a few thousand tokens).
    extra = {"attn_implementation": attn} if attn else {}
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **extra)
    model = model.cuda().eval()
    ids = torch.tensor([prompt + tokens], device="cuda")
    n = len(prompt)
    with torch.no_grad():
        # The decoder's last hidden states, then the LM head over the generated positions only:
        # [T, vocab] logits of a long sequence would not fit.
        hidden = model.model(input_ids=ids).last_hidden_state[0, n - 1:n - 1 + len(tokens)]
        logits = model.lm_head(hidden).double()
    lp = torch.log_softmax(logits, -1)
    compared = agree = 0
    worst = 0.0
    for i, t in enumerate(tokens):
        row = logits[i]
        top2 = torch.topk(row, 2).values
        if (top2[0] - top2[1]).item() > 0.05:
            compared += 1
            agree += int(int(torch.argmax(row)) == t)
        worst = max(worst, abs(lp[i, t].item() - logprobs[i]))
    cfg = model.config
    report = {"model": model_dir, "prompt_tokens": n, "generated": len(tokens),
              "sliding_window": getattr(cfg, "sliding_window", None),
              "rope_scaling": getattr(cfg, "rope_scaling", None),
              "attn_implementation": getattr(cfg, "_attn_implementation", None),
              "argmax_checked": compared, "argmax_agree": agree, "max_abs_dlogprob": worst}
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["make", "check"])
    ap.add_argument("--shape", default="tinyllama")
    ap.add_argument("--out")
    ap.add_argument("--model")
    ap.add_argument("--strata")
    ap.add_argument("--attn", help="attn_implementation for check (eager, sdpa; default HF's)")
    a = ap.parse_args()
    if a.cmd == "make":
        make(a.shape, a.out)
    else:
        r = check(a.model, a.strata, a.attn)
        sys.exit(0 if r["argmax_agree"] == r["argmax_checked"] and r["max_abs_dlogprob"] <= 0.05 else 1)
