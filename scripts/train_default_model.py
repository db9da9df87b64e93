#!/usr/bin/env python3
"""Train strata's small default model: a byte-level BPE tokenizer and a ~16M-parameter Llama.

Real run (GPU machine: torch 2.x, transformers 5.x, tokenizers, safetensors, numpy):

    python3 scripts/train_default_model.py --corpus corpus --out /tmp/model_out --minutes 8

writes /tmp/model_out/{tokenizer.json, checkpoint.pt, train_log.json} and the Hugging Face
folder /tmp/model_out/export/ (config.json, model.safetensors, generation_config.json,
tokenizer.json, tokenizer_config.json with chat_template, train_log.json). `--resume` continues
from checkpoint.pt (same schedule; a fresh --minutes budget for this call).

Local smoke test (CPU, Debian's python3-torch, no tokenizers/transformers):

    python3 scripts/train_default_model.py --smoke --out /tmp/smoke

uses a 260-symbol byte tokenizer and a tiny plain-torch Llama-like module to exercise the data
pipeline, chat mixture, schedule, evaluation, checkpoint/resume and sampling. The real path
always uses transformers' LlamaForCausalLM and a trained `tokenizers` BPE.

Data: corpus/train.txt and corpus/val.txt hold documents separated by "\\n\\n\\n" (see
scripts/build_corpus.ts). Every document becomes <s> ids </s> in one token stream; training
samples random contiguous windows from it. A small chat-style mixture (quotes, definitions and
passage continuations rewritten as <|im_start|>user/assistant turns) is mixed into every batch so
the chat template and the <|im_end|> stop token are learned. It is format training, not
instruction tuning: the "assistant" only ever quotes, defines or continues text from the corpus.
"""

import argparse
import json
import math
import os
import random
import re
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

BOS, EOS, IM_START, IM_END = "<s>", "</s>", "<|im_start|>", "<|im_end|>"
SPECIALS = [BOS, EOS, IM_START, IM_END]

# ChatML-style turns. The tokenizer's post-processor prepends <s> on encode, so the template
# renders {{ bos_token }} itself and its output is encoded without special tokens (as Hugging
# Face's apply_chat_template does). `render_chat` below must produce the same string.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

RESUME_KEYS = ("vocab", "hidden", "layers", "heads", "kv_heads", "intermediate", "max_pos",
               "rope_theta", "seq", "batch", "lr", "min_lr_frac", "warmup", "weight_decay",
               "grad_clip", "chat_frac", "chat_final_frac", "chat_final_portion", "seed")
SAMPLE_PROMPTS = ["The king said", "In the beginning", "A hacker is", "The jury said", "Love is"]
CHAT_PROMPTS = ["Tell me a fortune.", 'What does "kludge" mean?', 'Define "friendship".']


def render_chat(messages, add_generation_prompt=False):
    """The chat template's output minus the leading bos token (added as an id instead)."""
    text = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)
    return text + (f"{IM_START}assistant\n" if add_generation_prompt else "")


# ---- arguments ---------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--corpus", default="corpus", help="folder with train.txt and val.txt")
    p.add_argument("--out", default="/tmp/model_out")
    p.add_argument("--minutes", type=float, default=8.0, help="wall-clock budget of this call")
    p.add_argument("--reserve-s", type=float, default=45.0, help="kept back for export/samples")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--smoke", action="store_true", help="CPU toy run without HF libraries")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--seed", type=int, default=1234)
    # tokenizer
    p.add_argument("--vocab", type=int, default=8192)
    # model (defaults: 15,735,168 parameters with vocab 8192)
    p.add_argument("--hidden", type=int, default=384)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=1024)
    p.add_argument("--max-pos", type=int, default=1024)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    # training
    p.add_argument("--seq", type=int, default=1024, help="training window (<= --max-pos)")
    p.add_argument("--batch", type=int, default=16, help="windows per step")
    p.add_argument("--epochs", type=float, default=6.0, help="passes over train tokens")
    p.add_argument("--steps", type=int, default=0, help="override the step count from --epochs")
    p.add_argument("--lr", type=float, default=1.5e-3)
    p.add_argument("--min-lr-frac", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--weight-decay", type=float, default=0.3)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--chat-frac", type=float, default=0.1, help="share of rows from chat data")
    p.add_argument("--chat-final-frac", type=float, default=0.3, help="share in the last part")
    p.add_argument("--chat-final-portion", type=float, default=0.1, help="last part of steps")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--ckpt-every", type=int, default=500)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--compile", action="store_true", help="torch.compile the training model")
    p.add_argument("--export-dtype", choices=["float16", "bfloat16"], default="float16")
    p.add_argument("--sample-tokens", type=int, default=48)
    p.add_argument("--smoke-docs", type=int, default=400, help="--smoke: documents used")
    a = p.parse_args(argv)
    if a.smoke:  # toy scale unless the caller says otherwise on the command line
        given = {s.split("=")[0] for s in (argv if argv is not None else sys.argv[1:])}
        toy = {"--hidden": ("hidden", 64), "--layers": ("layers", 2), "--heads": ("heads", 4),
               "--kv-heads": ("kv_heads", 2), "--intermediate": ("intermediate", 176),
               "--max-pos": ("max_pos", 128), "--seq": ("seq", 128), "--batch": ("batch", 8),
               "--steps": ("steps", 60), "--eval-every": ("eval_every", 20),
               "--ckpt-every": ("ckpt_every", 25), "--warmup": ("warmup", 10),
               "--log-every": ("log_every", 10), "--reserve-s": ("reserve_s", 5.0),
               "--sample-tokens": ("sample_tokens", 24), "--lr": ("lr", 3e-3)}
        for flag, (name, value) in toy.items():
            if flag not in given:
                setattr(a, name, value)
    if a.seq > a.max_pos:
        p.error(f"--seq {a.seq} must be <= --max-pos {a.max_pos}")
    if a.hidden % a.heads or a.heads % a.kv_heads:
        p.error("--hidden must divide by --heads, and --heads by --kv-heads")
    return a


# ---- tokenizers --------------------------------------------------------------------------


class ByteTokenizer:
    """--smoke only: ids 0..3 are the special tokens, 4..259 the bytes."""

    def __init__(self):
        self.vocab_size = 256 + len(SPECIALS)

    def id(self, token):
        return SPECIALS.index(token)

    def encode(self, texts):
        out = []
        for t in texts:
            ids, rest = [], t
            while rest:  # special tokens written in the text map to their ids, like HF
                m = re.search("|".join(re.escape(s) for s in SPECIALS), rest)
                head = rest[: m.start()] if m else rest
                ids += [b + len(SPECIALS) for b in head.encode("utf-8")]
                if not m:
                    break
                ids.append(SPECIALS.index(m.group(0)))
                rest = rest[m.end():]
            out.append(ids)
        return out

    def decode(self, ids):
        return bytes(i - len(SPECIALS) for i in ids if i >= len(SPECIALS)).decode("utf-8", "replace")

    def to_json(self):
        return json.dumps({"type": "bytes", "specials": SPECIALS})


class BpeTokenizer:
    """Hugging Face `tokenizers` byte-level BPE with <s> prepended by the post-processor."""

    def __init__(self, tok):
        self.tok = tok
        self.vocab_size = tok.get_vocab_size()

    @staticmethod
    def train(docs, vocab_size):
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=2,
            special_tokens=SPECIALS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
        bos_id = tok.token_to_id(BOS)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
        )
        return BpeTokenizer(tok)

    @staticmethod
    def from_json(s):
        from tokenizers import Tokenizer

        return BpeTokenizer(Tokenizer.from_str(s))

    def id(self, token):
        i = self.tok.token_to_id(token)
        if i is None:
            raise KeyError(f"internal error: {token!r} is not in the vocabulary")
        return i

    def encode(self, texts):
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids):
        return self.tok.decode(ids, skip_special_tokens=False)

    def to_json(self):
        return self.tok.to_str()


# ---- data --------------------------------------------------------------------------------


def read_docs(path):
    with open(path, encoding="utf-8") as f:
        docs = [d.strip("\n") for d in f.read().split("\n\n\n")]
    # A special token written in plain text would be read as the token itself.
    return [re.sub(r"<(/?s|\|im_(start|end)\|)>", "", d) for d in docs if d.strip()]


DEVIL = re.compile(r"^([A-Z][A-Z' -]*[A-Z]), ((?:[a-z]+\.)+(?: [a-z]+\.)*)\s+(.+)$", re.S)
JARGON = re.compile(r"^([^\n:]{1,40}):(?: ([^\n]{0,80}))?$")
ASK_FORTUNE = ["Tell me a fortune.", "Say something.", "Tell me something funny.",
               "Give me a fortune cookie.", "Share a quote."]
SYSTEMS = ["You are a helpful assistant.", "You are strata's small default model.",
           "Answer briefly."]


def clip(text, limit=700):
    """Cut at a line or sentence end before `limit` characters."""
    if len(text) <= limit:
        return text
    cut = max(text.rfind("\n", 0, limit), text.rfind(". ", 0, limit) + 1)
    return text[: cut if cut > limit // 3 else limit].rstrip()


def chat_pairs(doc, rng):
    """(user, assistant) pairs made from one corpus document; see the module docstring."""
    lines = doc.split("\n")
    paras = doc.split("\n\n")
    m = DEVIL.match(doc)
    if m:
        return [(f'Define "{m.group(1).lower()}".', clip(m.group(3)))]
    m = JARGON.match(paras[0])
    if m and len(paras) > 1:
        return [(f'What does "{m.group(1)}" mean?', clip("\n\n".join(paras[1:])))]
    if "\n\n" not in doc and len(lines) >= 5 and max(map(len, lines)) > 100:  # a Bible chapter
        out = []
        for _ in range(3):
            i = rng.randrange(len(lines) - 1)
            out.append((f"Continue the passage:\n{lines[i]}", lines[i + 1]))
        return out
    if len(paras) >= 4:  # a long prose document (Brown)
        out = []
        for _ in range(4):
            i = rng.randrange(len(paras) - 1)
            out.append((f"Continue this text:\n{clip(paras[i])}", clip(paras[i + 1])))
        return out
    if len(doc) <= 1200:  # a fortune
        if len(lines) >= 2 and lines[-1].startswith("-- ") and len(lines[-1]) < 80:
            quote, author = "\n".join(lines[:-1]), lines[-1][3:]
            if rng.random() < 0.5:
                return [(f"Who said this?\n{quote}", author)]
            return [(f"Give me a quote by {author}.", quote)]
        return [(rng.choice(ASK_FORTUNE), doc)]
    return []


def chat_conversations(docs, seed):
    """Conversations (lists of messages): some with a system turn, some with two exchanges."""
    rng = random.Random(seed)
    pairs = [pr for d in docs for pr in chat_pairs(d, rng)]
    rng.shuffle(pairs)
    convs, i = [], 0
    while i < len(pairs):
        n = 2 if rng.random() < 0.2 and i + 1 < len(pairs) else 1
        msgs = [{"role": "system", "content": rng.choice(SYSTEMS)}] if rng.random() < 0.25 else []
        for user, assistant in pairs[i : i + n]:
            msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        convs.append(msgs)
        i += n
    return convs


def token_stream(seqs, bos, eos, min_len):
    """One int16 stream of <s> seq </s> ..., repeated if shorter than `min_len` (smoke only)."""
    total = sum(len(s) + 2 for s in seqs)
    arr = np.empty(total, dtype=np.int64)
    pos = 0
    for s in seqs:
        arr[pos] = bos
        arr[pos + 1 : pos + 1 + len(s)] = s
        arr[pos + 1 + len(s)] = eos
        pos += len(s) + 2
    if len(arr) < min_len:
        arr = np.tile(arr, min_len // len(arr) + 1)
    assert arr.max() < 32768, "internal error: int16 stream needs vocab < 32768"
    return torch.from_numpy(arr.astype(np.int16))


# ---- models ------------------------------------------------------------------------------


class TinyLlama(nn.Module):
    """--smoke only: the Llama block structure in plain torch (RMSNorm, RoPE, GQA, SwiGLU)."""

    def __init__(self, vocab, hidden, layers, heads, kv_heads, inter, theta):
        super().__init__()
        self.heads, self.kv, self.hd = heads, kv_heads, hidden // heads
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList()
        for _ in range(layers):
            b = nn.Module()
            b.n1, b.n2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)  # RMSNorm stand-in
            b.q = nn.Linear(hidden, hidden, bias=False)
            b.k = nn.Linear(hidden, kv_heads * self.hd, bias=False)
            b.v = nn.Linear(hidden, kv_heads * self.hd, bias=False)
            b.o = nn.Linear(hidden, hidden, bias=False)
            b.gate = nn.Linear(hidden, inter, bias=False)
            b.up = nn.Linear(hidden, inter, bias=False)
            b.down = nn.Linear(inter, hidden, bias=False)
            self.blocks.append(b)
        self.norm = nn.LayerNorm(hidden)
        self.inv_freq = 1.0 / theta ** (torch.arange(0, self.hd, 2).float() / self.hd)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def rope(self, x):  # x: [B, h, T, hd]
        t = torch.arange(x.shape[2], device=x.device).float()
        ang = torch.outer(t, self.inv_freq.to(x.device))
        cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
        x1, x2 = x[..., : self.hd // 2], x[..., self.hd // 2 :]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def forward(self, ids):  # ids: [B, T] -> logits [B, T, vocab]
        B, T = ids.shape
        x = self.embed(ids)
        mask = torch.full((T, T), float("-inf"), device=ids.device).triu(1)
        for b in self.blocks:
            h = b.n1(x)
            q = self.rope(b.q(h).view(B, T, self.heads, self.hd).transpose(1, 2))
            k = self.rope(b.k(h).view(B, T, self.kv, self.hd).transpose(1, 2))
            v = b.v(h).view(B, T, self.kv, self.hd).transpose(1, 2)
            rep = self.heads // self.kv
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            att = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd) + mask
            x = x + b.o((att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, -1))
            h = b.n2(x)
            x = x + b.down(F.silu(b.gate(h)) * b.up(h))
        return self.norm(x) @ self.embed.weight.t()


def llama_config(a, vocab, bos, eos, im_end):
    import inspect

    from transformers import LlamaConfig

    kw = dict(
        vocab_size=vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
        num_hidden_layers=a.layers, num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads, head_dim=a.hidden // a.heads,
        max_position_embeddings=a.max_pos, rms_norm_eps=1e-5, hidden_act="silu",
        tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
        bos_token_id=bos, eos_token_id=eos, pad_token_id=eos, initializer_range=0.02,
    )
    params = inspect.signature(LlamaConfig.__init__).parameters
    if "rope_parameters" in params:  # transformers 5
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": a.rope_theta}
    else:  # transformers 4
        kw["rope_theta"] = a.rope_theta
    return LlamaConfig(**kw)


def build_model(a, vocab, ids):
    """(model, hf_config or None). The real path is transformers' LlamaForCausalLM."""
    if a.smoke:
        return TinyLlama(vocab, a.hidden, a.layers, a.heads, a.kv_heads, a.intermediate,
                         a.rope_theta), None
    from transformers import LlamaForCausalLM

    cfg = llama_config(a, vocab, ids["bos"], ids["eos"], ids["im_end"])
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg), cfg


def logits_of(model, x):
    if isinstance(model, TinyLlama) or isinstance(getattr(model, "_orig_mod", None), TinyLlama):
        return model(x)
    return model(input_ids=x, use_cache=False).logits


# ---- training helpers --------------------------------------------------------------------


def lr_at(step, a, total):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    frac = min(1.0, (step - a.warmup) / max(1, total - a.warmup))
    return a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * frac)))


def windows(data, n, T, gen):
    """n random windows of T+1 tokens -> (inputs [n, T], targets [n, T]) as int64."""
    starts = torch.randint(0, data.numel() - T - 1, (n,), device=data.device, generator=gen)
    w = data[starts[:, None] + torch.arange(T + 1, device=data.device)].long()
    return w[:, :-1], w[:, 1:]


@torch.no_grad()
def evaluate(model, data, T, B, amp):
    """Mean next-token loss over consecutive non-overlapping windows covering `data`."""
    model.eval()
    n = (data.numel() - 1) // T
    total, count = 0.0, 0
    for i in range(0, n, B):
        starts = torch.arange(i, min(n, i + B), device=data.device) * T
        w = data[starts[:, None] + torch.arange(T + 1, device=data.device)].long()
        with amp():
            logits = logits_of(model, w[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), w[:, 1:].flatten(), reduction="sum")
        total, count = total + loss.item(), count + w[:, 1:].numel()
    model.train()
    return total / max(1, count)


@torch.no_grad()
def greedy(model, prompt_ids, n_new, stop_ids, max_pos, amp):
    model.eval()
    ids = list(prompt_ids)
    for _ in range(n_new):
        x = torch.tensor([ids[-max_pos:]], device=next(model.parameters()).device)
        with amp():
            nxt = int(logits_of(model, x)[0, -1].float().argmax())
        ids.append(nxt)
        if nxt in stop_ids:
            break
    model.train()
    return ids[len(prompt_ids):]


def save_atomic(obj, path):
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


# ---- export (real path) ------------------------------------------------------------------


def export_hf(a, cfg, state, tok, ids, out_dir):
    """save_pretrained in 16-bit + tokenizer files; returns a reload check for the log."""
    from transformers import (AutoModelForCausalLM, AutoTokenizer, GenerationConfig,
                              LlamaForCausalLM, PreTrainedTokenizerFast)

    dtype = getattr(torch, a.export_dtype)
    model = LlamaForCausalLM(cfg)
    model.load_state_dict(state)
    model = model.to(dtype)
    eos_ids = [ids["eos"], ids["im_end"]]
    model.generation_config = GenerationConfig(
        bos_token_id=ids["bos"], eos_token_id=eos_ids, pad_token_id=ids["eos"],
        do_sample=True, temperature=0.8, top_k=40, top_p=0.95, max_new_tokens=256,
    )
    model.save_pretrained(out_dir)

    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok.tok, bos_token=BOS, eos_token=EOS, pad_token=EOS,
        model_max_length=a.max_pos,
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    hf_tok.save_pretrained(out_dir)
    # transformers 5 may keep the template only in chat_template.jinja: put it in the config too.
    tc_path = os.path.join(out_dir, "tokenizer_config.json")
    with open(tc_path, encoding="utf-8") as f:
        tc = json.load(f)
    tc.update(chat_template=CHAT_TEMPLATE, bos_token=BOS, eos_token=EOS, pad_token=EOS)
    with open(tc_path, "w", encoding="utf-8") as f:
        json.dump(tc, f, indent=2, ensure_ascii=False)
        f.write("\n")

    # Reload exactly as a user would and check the chat template against render_chat.
    check = {"files": sorted(os.listdir(out_dir))}
    rtok = AutoTokenizer.from_pretrained(out_dir)
    msgs = [{"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "Tell me a fortune."}]
    want = [ids["bos"]] + tok.encode([render_chat(msgs, add_generation_prompt=True)])[0]
    got = rtok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    if not isinstance(got, list):  # some versions return a BatchEncoding
        got = got["input_ids"]
    if got and isinstance(got[0], list):
        got = got[0]
    check["chat_template_matches_training"] = list(got) == want
    check["plain_encode_prepends_bos"] = rtok("hello")["input_ids"][0] == ids["bos"]
    rmodel = AutoModelForCausalLM.from_pretrained(out_dir, dtype=dtype).to(a.device).eval()
    greedy_cfg = GenerationConfig(do_sample=False, max_new_tokens=a.sample_tokens,
                                  eos_token_id=eos_ids, pad_token_id=ids["eos"])
    samples = {}
    for prompt in SAMPLE_PROMPTS[:2]:
        x = rtok(prompt, return_tensors="pt")["input_ids"].to(a.device)
        y = rmodel.generate(x, generation_config=greedy_cfg)
        samples[prompt] = rtok.decode(y[0, x.shape[1]:], skip_special_tokens=False)
    x = torch.tensor([got], device=a.device)
    y = rmodel.generate(x, generation_config=greedy_cfg)
    samples["<chat> Tell me a fortune."] = rtok.decode(y[0, x.shape[1]:], skip_special_tokens=False)
    check["reloaded_greedy_samples"] = samples
    return check


# ---- main --------------------------------------------------------------------------------


def main(argv=None):
    a = parse_args(argv)
    t0 = time.time()
    deadline = t0 + a.minutes * 60 - a.reserve_s
    a.device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    torch.manual_seed(a.seed)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    os.makedirs(a.out, exist_ok=True)
    ckpt_path = os.path.join(a.out, "checkpoint.pt")

    def amp():
        return torch.autocast(device_type=dev.type, dtype=torch.bfloat16)

    def log(msg):
        print(f"[{time.time() - t0:7.1f}s] {msg}", flush=True)

    # Corpus and tokenizer.
    train_docs = read_docs(os.path.join(a.corpus, "train.txt"))
    val_docs = read_docs(os.path.join(a.corpus, "val.txt"))
    if a.smoke:
        train_docs, val_docs = train_docs[: a.smoke_docs], val_docs[: max(20, a.smoke_docs // 20)]
    log(f"corpus: {len(train_docs)} train docs, {len(val_docs)} val docs")
    # Our own file: it holds plain Python objects besides tensors, hence weights_only=False.
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False) if a.resume else None
    if a.resume:
        # The model shape and schedule come from the checkpoint, not from this call's flags.
        for k in RESUME_KEYS:
            setattr(a, k, ckpt["args"][k])
        log(f"resuming from {ckpt_path} at step {ckpt['step']}")
    if a.smoke:
        tok = ByteTokenizer()
    elif ckpt is not None:
        tok = BpeTokenizer.from_json(ckpt["tokenizer_json"])
    else:
        tok = BpeTokenizer.train(train_docs, a.vocab)
        log(f"trained BPE tokenizer: {tok.vocab_size} tokens")
    if not a.smoke:
        with open(os.path.join(a.out, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(tok.to_json())
    ids = {"bos": tok.id(BOS), "eos": tok.id(EOS), "im_start": tok.id(IM_START),
           "im_end": tok.id(IM_END)}

    # Token streams: plain documents and chat conversations, each <s> ... </s>.
    min_len = 4 * (a.seq + 1)
    train_ids = token_stream(tok.encode(train_docs), ids["bos"], ids["eos"], min_len).to(dev)
    val_ids = token_stream(tok.encode(val_docs), ids["bos"], ids["eos"], min_len).to(dev)
    chat_train = chat_conversations(train_docs, a.seed)
    chat_val = chat_conversations(val_docs, a.seed + 1)
    chat_ids = token_stream(tok.encode([render_chat(c) for c in chat_train]),
                            ids["bos"], ids["eos"], min_len).to(dev)
    chat_val_ids = token_stream(tok.encode([render_chat(c) for c in chat_val]),
                                ids["bos"], ids["eos"], min_len).to(dev)
    val_bytes = sum(len(d.encode("utf-8")) for d in val_docs)
    val_tok_per_byte = (val_ids.numel() - 2 * len(val_docs)) / max(1, val_bytes)
    log(f"tokens: train {train_ids.numel():,}, val {val_ids.numel():,}, chat {chat_ids.numel():,}"
        f" ({len(chat_train)} conversations), chat val {chat_val_ids.numel():,}")

    # Model and optimiser.
    torch.manual_seed(a.seed)
    model, cfg = build_model(a, tok.vocab_size, ids)
    model.to(dev)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
    n_params = sum(p.numel() for p in model.parameters())
    n_embed = tok.vocab_size * a.hidden
    log(f"model: {n_params:,} parameters ({n_params - n_embed:,} without the tied embedding)")
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": a.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    extra = {"fused": True} if cuda else {}
    opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.95), eps=1e-8, **extra)
    if ckpt is not None:
        opt.load_state_dict(ckpt["optimizer"])

    tokens_per_step = a.batch * a.seq
    if ckpt is not None:
        step, total = ckpt["step"], ckpt["total_steps"]
        best = ckpt["best"]
        tokens_seen = ckpt["tokens_seen"]
    else:
        step = 0
        total = a.steps or max(1, math.ceil(a.epochs * train_ids.numel() / tokens_per_step))
        best = {"val_loss": float("inf"), "step": -1, "state": None}
        tokens_seen = 0
    history = ckpt["history"] if ckpt is not None else []
    log(f"schedule: {total} steps of {tokens_per_step:,} tokens "
        f"({total * tokens_per_step / train_ids.numel():.1f} epochs), lr {a.lr}")

    train_model = model
    if a.compile and hasattr(torch, "compile"):
        train_model = torch.compile(model)
        log("torch.compile enabled (compiles on the first step)")

    gen = torch.Generator(device=dev)
    gen.manual_seed(a.seed * 1_000_003 + step)

    def checkpoint():
        save_atomic({
            "model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
            "total_steps": total, "tokens_seen": tokens_seen, "best": best,
            "history": history, "args": vars(a), "tokenizer_json": tok.to_json(),
            "hf_config": cfg.to_dict() if cfg is not None else None,
        }, ckpt_path)

    def run_eval():
        vl = evaluate(model, val_ids, a.seq, a.batch, amp)
        cl = evaluate(model, chat_val_ids, a.seq, a.batch, amp)
        history.append({"step": step, "val_loss": vl, "chat_val_loss": cl,
                        "tokens_seen": tokens_seen, "time_s": time.time() - t0})
        if vl < best["val_loss"]:
            best.update(val_loss=vl, step=step,
                        state={k: v.detach().to("cpu", copy=True)
                               for k, v in model.state_dict().items()})
        log(f"eval step {step}: val loss {vl:.4f} (ppl {math.exp(vl):.2f}), chat val {cl:.4f}"
            f"; best {best['val_loss']:.4f} at step {best['step']}")

    # Training loop.
    model.train()
    timing_from, timing_t = None, None
    run_steps, stop_reason = 0, "schedule done"
    step_t0 = time.time()
    while step < total:
        if time.time() > deadline:
            stop_reason = "time budget"
            break
        portion_left = 1 - step / total
        frac = a.chat_final_frac if portion_left <= a.chat_final_portion else a.chat_frac
        n_chat = min(a.batch - 1, round(a.batch * frac))
        x1, y1 = windows(train_ids, a.batch - n_chat, a.seq, gen)
        x2, y2 = windows(chat_ids, n_chat, a.seq, gen)
        x, y = torch.cat([x1, x2]), torch.cat([y1, y2])
        lr = lr_at(step, a, total)
        for g in opt.param_groups:
            g["lr"] = lr
        try:
            with amp():
                logits = logits_of(train_model, x)
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
            loss.backward()
        except Exception as e:  # a torch.compile failure shows on the first call
            if train_model is model or run_steps > 0:
                raise
            log(f"torch.compile failed ({type(e).__name__}: {e}); continuing eagerly")
            train_model = model
            opt.zero_grad(set_to_none=True)
            continue
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        run_steps += 1
        tokens_seen += tokens_per_step

        if step % a.log_every == 0 or step == total:
            lv = loss.item()  # syncs
            if not math.isfinite(lv):
                raise RuntimeError(f"loss is {lv} at step {step}: lower --lr")
            rate = run_steps * tokens_per_step / (time.time() - step_t0)
            log(f"step {step}/{total} loss {lv:.4f} lr {lr:.2e} gnorm {float(gnorm):.2f} "
                f"{rate / 1e3:.0f}k tok/s")
        # After a few steps (past compilation), shrink the schedule to fit the time budget so
        # the cosine decay still ends where training ends.
        if run_steps == 5:
            if cuda:
                torch.cuda.synchronize()
            timing_from, timing_t = step, time.time()
        if run_steps == 25 and timing_t is not None:
            if cuda:
                torch.cuda.synchronize()
            per_step = (time.time() - timing_t) / (step - timing_from)
            eval_cost = 1.05  # evaluations and checkpoints
            fit = step + int((deadline - time.time()) / (per_step * eval_cost))
            if fit < total:
                log(f"{per_step * 1e3:.1f} ms/step: shrinking schedule {total} -> {fit} steps")
                total = max(step + 1, fit)
        if step % a.eval_every == 0 or step == total:
            run_eval()
        if step % a.ckpt_every == 0:
            checkpoint()
    if not history or history[-1]["step"] != step:
        run_eval()
    checkpoint()
    train_s = time.time() - t0
    log(f"stopped at step {step}/{total} ({stop_reason}); checkpoint written")

    # Samples from the best weights (greedy, in the training module).
    if best["state"] is not None:
        model.load_state_dict(best["state"])
    stop_ids = {ids["eos"], ids["im_end"]}
    samples = {}
    for prompt in SAMPLE_PROMPTS:
        p_ids = [ids["bos"]] + tok.encode([prompt])[0]
        samples[prompt] = tok.decode(greedy(model, p_ids, a.sample_tokens, stop_ids, a.max_pos,
                                            amp))
    for q in CHAT_PROMPTS:
        p_ids = [ids["bos"]] + tok.encode([render_chat([{"role": "user", "content": q}],
                                                       add_generation_prompt=True)])[0]
        samples[f"<chat> {q}"] = tok.decode(greedy(model, p_ids, a.sample_tokens, stop_ids,
                                                   a.max_pos, amp))
    for k, v in samples.items():
        log(f"sample {k!r} -> {v!r}")

    final = history[-1]
    result = {
        "params": n_params,
        "params_without_embedding": n_params - n_embed,
        "vocab_size": tok.vocab_size,
        "special_token_ids": ids,
        "model": {k: getattr(a, k) for k in ("hidden", "layers", "heads", "kv_heads",
                                              "intermediate", "max_pos", "rope_theta")},
        "train_tokens": train_ids.numel(),
        "chat_tokens": chat_ids.numel(),
        "chat_conversations": len(chat_train),
        "val_tokens": val_ids.numel(),
        "tokens_per_step": tokens_per_step,
        "steps": step,
        "scheduled_steps": total,
        "stop_reason": stop_reason,
        "tokens_seen": tokens_seen,
        "epochs_seen": tokens_seen / train_ids.numel(),
        "final_val_loss": final["val_loss"],
        "final_chat_val_loss": final["chat_val_loss"],
        "best_val_loss": best["val_loss"],
        "best_step": best["step"],
        "val_perplexity": math.exp(best["val_loss"]),
        "val_bits_per_byte": best["val_loss"] / math.log(2) * val_tok_per_byte,
        "exported_weights": "best validation loss",
        "wall_time_s": round(train_s, 1),
        "samples_greedy": samples,
        "history": history,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
        "args": {k: v for k, v in vars(a).items()},
    }

    if not a.smoke:
        import transformers

        result["transformers"] = transformers.__version__
        export_dir = os.path.join(a.out, "export")
        result["export"] = export_hf(a, cfg, best["state"] or model.state_dict(), tok, ids,
                                     export_dir)
        result["export_dir"] = export_dir
        log(f"exported {export_dir}: {json.dumps(result['export'], ensure_ascii=False)}")
    result["total_wall_time_s"] = round(time.time() - t0, 1)
    text = json.dumps(result, indent=2, ensure_ascii=False) + "\n"
    with open(os.path.join(a.out, "train_log.json"), "w", encoding="utf-8") as f:
        f.write(text)
    if not a.smoke:
        with open(os.path.join(a.out, "export", "train_log.json"), "w", encoding="utf-8") as f:
            f.write(text)
    summary = {k: result[k] for k in ("params", "tokens_seen", "steps", "final_val_loss",
                                      "best_val_loss", "val_perplexity", "val_bits_per_byte",
                                      "wall_time_s", "total_wall_time_s")}
    print(json.dumps(summary, indent=2))
    return result


if __name__ == "__main__":
    main()
