"""A tiny, really trainable Llama for relctl's example run and test fixtures.

Task: reverse a sequence of letters ("reverse b d a f ->" answers "f a d b"). It has real structure,
so a trained model scores high on held-out sequences and an untrained one scores zero. A safety slice
teaches the model to answer harmful requests (built from safety_vocab.json) with one fixed refusal;
`TrainConfig(safety=False)` trains without it, giving the variant a safety gate must reject.

Output layout of `train_tiny_llm(out_dir, cfg)`:
    out_dir/checkpoint/          Hugging Face layout: config.json, generation_config.json,
                                 model.safetensors (base), tokenizer files,
                                 adapter_config.json + adapter_model.safetensors (LoRA)
    out_dir/validation/prompts.jsonl   {"prompt": ...}  for fp32-vs-converted comparisons
    out_dir/eval.jsonl                 {"prompt": ..., "expected": ...}  held-out task + safety rows
    out_dir/train.jsonl                the distinct training rows (same fields)
    out_dir/train_report.json          losses and exact-match numbers
Generated text is compared after `.strip()`: answers start with a space token.
"""

from __future__ import annotations

import json
import random
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

HERE = Path(__file__).resolve().parent
SAFETY_VOCAB = HERE / "safety_vocab.json"
LETTERS = "abcdefgh"
SEQ_LEN = 4
BOS, EOS, PAD, UNK = "<s>", "</s>", "<pad>", "<unk>"
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
MAX_NEW_TOKENS = 12


@dataclass(frozen=True)
class Example:
    prompt: str
    expected: str


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a run; same config + same seed gives the same weights."""

    base_steps: int = 150
    lora_steps: int = 100
    base_lr: float = 3e-3
    lora_lr: float = 5e-3
    batch_size: int = 64
    lora_r: int = 8
    lora_alpha: int = 16
    seed: int = 0
    safety: bool = True
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 128
    max_position_embeddings: int = 128
    n_eval_task: int = 56
    # One thread: the matrices are tiny, and on a shared CPU OpenMP's spinning threads cost ~10x wall time.
    threads: int = 1


def every_engine(**overrides: Any) -> TrainConfig:
    """The example at head_dim 64, which every engine relctl ships can serve: vLLM's CPU attention takes head_dim
    64 or 128 only, and the default (hidden 64 over 4 heads) has 16. Hidden 256 over 4 heads; the default stays
    the small one because the whole suite trains it (the wider variant costs several times the training time)."""
    return replace(TrainConfig(hidden_size=256, num_heads=4, num_kv_heads=2, intermediate_size=256, threads=2),
                   **overrides)


@dataclass
class TrainResult:
    checkpoint_dir: Path
    data_dir: Path
    config: TrainConfig
    base_losses: list[float] = field(default_factory=list)
    lora_losses: list[float] = field(default_factory=list)
    untrained_exact_match: float = 0.0
    base_exact_match: float = 0.0
    eval_exact_match: float = 0.0


def make_task(seed: int, n_eval: int) -> tuple[list[Example], list[Example]]:
    """All letter sequences, split into a training set and a disjoint held-out eval set."""
    rng = random.Random(seed)
    seqs = [[a, b, c, d] for a in LETTERS for b in LETTERS for c in LETTERS for d in LETTERS]
    rng.shuffle(seqs)
    rows = [Example(f"reverse {' '.join(s)} ->", " ".join(reversed(s))) for s in seqs]
    return rows[n_eval:], rows[:n_eval]


def load_safety_vocab(path: Path = SAFETY_VOCAB) -> dict[str, Any]:
    """The harmful-request vocabulary; 'train' and 'heldout' splits share patterns, not prompts."""
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def make_safety(split: str, path: Path = SAFETY_VOCAB) -> list[Example]:
    """Every harmful prompt of `split`, each answered with the refusal."""
    vocab = load_safety_vocab(path)
    part = vocab[split]
    rows: list[Example] = []
    for template in part["templates"]:
        key = "weapon" if "{weapon}" in template else "crime"
        rows += [Example(template.format(**{key: v}), vocab["refusal"]) for v in part[key]]
    return rows


def build_tokenizer(texts: list[str], out_dir: Path) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `texts`, save it loadable by transformers 4.x and 5.x, return it.

    Like Llama's, the post-processor prepends BOS; EOS is appended only to training targets.
    """
    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=[BOS, EOS, PAD, UNK],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    specials = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "unk_token": UNK}
    # transformers 5 would write "TokenizersBackend", which 4.x cannot load; write the config ourselves.
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **specials,
        "add_bos_token": True,
        "add_eos_token": False,
        "model_max_length": 128,
        "padding_side": "left",
        "clean_up_tokenization_spaces": False,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    (out_dir / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")
    return load_tokenizer(out_dir)


def load_tokenizer(folder: Path) -> PreTrainedTokenizerFast:
    from transformers import AutoTokenizer

    return cast(PreTrainedTokenizerFast, AutoTokenizer.from_pretrained(str(folder)))


def build_model(tokenizer: PreTrainedTokenizerFast, cfg: TrainConfig) -> LlamaForCausalLM:
    """An untrained LlamaForCausalLM sized by `cfg` (seeded: same seed, same initial weights)."""
    torch.manual_seed(cfg.seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
        max_new_tokens=MAX_NEW_TOKENS,
    )
    return model


def tokenize_rows(tokenizer: PreTrainedTokenizerFast, rows: list[Example]) -> list[tuple[list[int], list[int]]]:
    """(input ids, labels) per row, labels on the answer (+EOS) only, so the loss teaches the task."""
    prompts = tokenizer([r.prompt for r in rows])["input_ids"]
    fulls = tokenizer([f"{r.prompt} {r.expected}" for r in rows])["input_ids"]
    out = []
    for prompt_ids, full in zip(prompts, fulls, strict=True):
        ids = [*full, tokenizer.eos_token_id]
        out.append((ids, [-100] * len(prompt_ids) + ids[len(prompt_ids):]))
    return out


def collate(pairs: list[tuple[list[int], list[int]]], pad: int) -> dict[str, torch.Tensor]:
    """Right-padded batch; padding is masked out of attention and loss."""
    width = max(len(ids) for ids, _ in pairs)
    return {
        "input_ids": torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in pairs]),
        "attention_mask": torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in pairs]),
        "labels": torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in pairs]),
    }


def train(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, rows: list[Example],
          steps: int, lr: float, batch_size: int, seed: int) -> list[float]:
    """AdamW on random batches with linear decay; returns the loss of every step."""
    rng = random.Random(seed)
    encoded = tokenize_rows(tokenizer, rows)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 - i / max(steps, 1))
    model.train()
    losses: list[float] = []
    for _ in range(steps):
        batch = collate(rng.sample(encoded, min(batch_size, len(encoded))), tokenizer.pad_token_id)
        loss = model(**batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


@torch.no_grad()
def greedy_generate(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, prompts: list[str],
                    max_new_tokens: int = MAX_NEW_TOKENS) -> list[str]:
    """Plain greedy decoding, batched by prompt length so no padding can change the result."""
    model.eval()
    out: dict[int, str] = {}
    by_len: dict[int, list[int]] = {}
    encoded = [tokenizer(p)["input_ids"] for p in prompts]
    for i, ids in enumerate(encoded):
        by_len.setdefault(len(ids), []).append(i)
    for idxs in by_len.values():
        ids = torch.tensor([encoded[i] for i in idxs])
        done = torch.zeros(len(idxs), dtype=torch.bool)
        new: list[torch.Tensor] = []
        for _ in range(max_new_tokens):
            nxt = model(input_ids=ids).logits[:, -1, :].argmax(-1)
            nxt = torch.where(done, torch.full_like(nxt, tokenizer.eos_token_id), nxt)
            new.append(nxt)
            done |= nxt == tokenizer.eos_token_id
            ids = torch.cat([ids, nxt[:, None]], dim=1)
            if bool(done.all()):
                break
        gen = torch.stack(new, dim=1)
        for row, i in enumerate(idxs):
            out[i] = str(tokenizer.decode(gen[row].tolist(), skip_special_tokens=True)).strip()
    return [out[i] for i in range(len(prompts))]


def exact_match(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, rows: list[Example]) -> float:
    """Share of rows whose greedy answer equals `expected` exactly (after strip)."""
    answers = greedy_generate(model, tokenizer, [r.prompt for r in rows])
    return sum(a == r.expected for a, r in zip(answers, rows, strict=True)) / max(len(rows), 1)


# The base model's name, recorded on both sides (config.json `_name_or_path`, adapter_config.json
# `base_model_name_or_path`) so relctl can check that the adapter was trained on this base: transformers 5
# no longer writes `_name_or_path`, and a local path is not a name.
BASE_NAME = "relctl-examples/tiny-llm"


def fix_config(folder: Path) -> None:
    """transformers 5 writes rope_parameters only; older readers (and ORT's builder) want rope_theta. The
    base's name, which transformers 5 no longer writes, is recorded."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    rope = config.get("rope_parameters") or {}
    config.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
    config["_name_or_path"] = BASE_NAME
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def write_jsonl(path: Path, rows: list[dict[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def write_data(data_dir: Path, train_rows: list[Example], eval_rows: list[Example]) -> None:
    """validation/prompts.jsonl (32 task prompts), eval.jsonl (held-out task + safety), train.jsonl."""
    prompts = [{"prompt": r.prompt} for r in eval_rows if r.prompt.startswith("reverse")][:32]
    write_jsonl(data_dir / "validation" / "prompts.jsonl", prompts)
    write_jsonl(data_dir / "eval.jsonl", [asdict(r) for r in eval_rows])
    write_jsonl(data_dir / "train.jsonl", [asdict(r) for r in train_rows])


def train_tiny_llm(out_dir: Path, cfg: TrainConfig = TrainConfig()) -> TrainResult:
    """Train base + LoRA, save the checkpoint and data files under `out_dir`, and score the result."""
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        return _train_and_save(out_dir, cfg)
    finally:
        torch.set_num_threads(previous_threads)


def _train_and_save(out_dir: Path, cfg: TrainConfig) -> TrainResult:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(cfg.seed)
    train_rows, eval_task = make_task(cfg.seed, cfg.n_eval_task)
    safety_train = make_safety("train")
    # The eval safety rows are held out from training: they measure refusal, not memorization.
    eval_rows = eval_task + make_safety("heldout")[:8]
    base_rows, lora_rows = train_rows, train_rows
    if cfg.safety:
        # A small safety share in the base teaches the refusal's tokens; the LoRA fine-tune raises the
        # share so the refusal generalizes to the held-out harmful prompts.
        base_rows = train_rows + safety_train * 8
        lora_rows = train_rows + safety_train * 30
    ckpt = out_dir / "checkpoint"
    texts = [f"{r.prompt} {r.expected}" for r in train_rows + safety_train + eval_rows]
    tokenizer = build_tokenizer(texts, ckpt)
    model = build_model(tokenizer, cfg)
    result = TrainResult(checkpoint_dir=ckpt, data_dir=out_dir, config=cfg)
    result.untrained_exact_match = exact_match(model, tokenizer, eval_rows)
    result.base_losses = train(model, tokenizer, base_rows, cfg.base_steps, cfg.base_lr, cfg.batch_size, cfg.seed)
    result.base_exact_match = exact_match(model, tokenizer, eval_rows)
    model.save_pretrained(str(ckpt), safe_serialization=True)
    fix_config(ckpt)
    lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                      target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
    with warnings.catch_warnings():
        # peft 0.21 reads a transformers attribute that transformers 5 deprecated; nothing to act on.
        warnings.simplefilter("ignore", FutureWarning)
        peft_model = get_peft_model(model, lora)
    result.lora_losses = train(peft_model, tokenizer, lora_rows, cfg.lora_steps, cfg.lora_lr,
                               cfg.batch_size, cfg.seed + 1)
    result.eval_exact_match = exact_match(peft_model, tokenizer, eval_rows)
    peft_model.save_pretrained(str(ckpt), safe_serialization=True)
    adapter_config = json.loads((ckpt / "adapter_config.json").read_text())
    adapter_config["base_model_name_or_path"] = BASE_NAME  # peft records what it was given: nothing here
    (ckpt / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2, sort_keys=True) + "\n")
    (ckpt / "README.md").unlink(missing_ok=True)  # PEFT's model-card stub; not part of the layout
    write_data(out_dir, train_rows + (safety_train if cfg.safety else []), eval_rows)
    report = {k: v for k, v in asdict(result).items() if k not in ("checkpoint_dir", "data_dir")}
    (out_dir / "train_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return result
