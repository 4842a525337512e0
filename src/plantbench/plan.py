"""``plantbench plan``: the work, disk and GPU-hours of every stage, from the config alone.

Counting rules (stated so that the table can be checked by hand):

* ``N`` = parameters that take part in matrix multiplies: the block linears (q, k, v, o, gate,
  up, down of every layer) plus the output head ``vocab x width`` (tied or not, the head is a
  matmul); norms and the embedding lookup are left out.
* Training FLOPs per token = ``6 N + 12 L d T`` (forward 2N + backward 4N, plus the attention
  scores and the weighted sum, ``2 x 2 L d T`` forward and twice that backward, counted over the
  full ``T x T`` matrix as in PaLM's MFU definition), ``L`` layers, ``d`` width, ``T`` window.
* Per-example projected gradients (LoGra): one forward and an activation-only backward, no
  weight gradients: ``4 N + 8 L d T`` per token, per checkpoint in ``features.tracin_checkpoints``
  (the final checkpoint is one of them), for every pool window and every query.
* Forward only (hidden states, the causal log-probs): ``2 N + 4 L d T`` per token.
* Text embeddings: a BERT-base-sized encoder (``ENCODER_PARAMS``), windows truncated to
  ``ENCODER_TOKENS`` tokens, ``2 P`` per token.
* Scoring: ``2 D`` FLOPs per (query, pool window) pair for the gradient methods (times the
  TracIn checkpoints for the TracIn ones); the others are memory-bound and not counted.
* GPU-hours = FLOPs / (bf16 dense peak x utilisation) / 3600; CPU-only stages (corpus,
  tokenizer, stream, pool, BM25, curvature, analysis) have none.
* Disk: the token stream (uint16 when the vocabulary fits) plus ~40 bytes of manifest per
  window, checkpoints as fp32 safetensors (4 bytes/param), the resumable state (fp32 weights and
  two Adam moments, 12 bytes/param, rounded up to 16 for the optimizer's bookkeeping and RNG),
  the gradient store ``(pool + queries) x D x bytes`` per (model, checkpoint).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from . import in_context
from . import pool as pool_mod
from .ekfac import query_chunks
from .features import grad_dims as features_grad_dims
from .features import n_shards, tracin_checkpoints
from .paths import MODELS
from .pretrain import checkpoint_steps

# bf16 dense tensor-core peaks (vendor data sheets, no sparsity), FLOP/s
GPU_PEAK_BF16: dict[str, float] = {
    "h200": 989e12,  # H200 SXM (same compute as H100 SXM)
    "h100": 989e12,  # H100 SXM5
    "a100": 312e12,  # A100 SXM / PCIe
    "a4500": 94.6e12,  # RTX A4500 (20 GB)
}
DEFAULT_UTILISATION = 0.40
ENCODER_PARAMS = 110_000_000  # bge-base / BERT-base
ENCODER_TOKENS = 512
GRAD_METHODS = {"grad_dot": 1, "grad_cos": 1, "influence": 1}  # checkpoints they read: final only
TRACIN_METHODS = ("tracin_dot", "tracin_influence")


@dataclass
class Stage:
    stage: str
    jobs: int
    work: str
    tokens: float = 0.0
    flops: float = 0.0
    disk_bytes: float = 0.0
    gpu: bool = False
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Shape:
    n_layer: int
    width: int
    intermediate: int
    vocab: int
    window: int

    @property
    def block_linear_params(self) -> int:
        d, f = self.width, self.intermediate
        return self.n_layer * (4 * d * d + 3 * d * f)

    @property
    def matmul_params(self) -> int:
        """``N``: block linears plus the output head."""
        return self.block_linear_params + self.vocab * self.width

    def total_params(self, tied: bool) -> int:
        emb = self.vocab * self.width
        norms = (2 * self.n_layer + 1) * self.width
        return self.block_linear_params + emb * (1 if tied else 2) + norms

    @property
    def attn_flops_per_token(self) -> int:
        """Forward attention FLOPs per token: ``QK^T`` and ``AV`` over the full window."""
        return 4 * self.n_layer * self.width * self.window

    def train_flops_per_token(self) -> float:
        return 6 * self.matmul_params + 3 * self.attn_flops_per_token

    def forward_flops_per_token(self) -> float:
        return 2 * self.matmul_params + self.attn_flops_per_token

    def grad_flops_per_token(self) -> float:
        return 4 * self.matmul_params + 2 * self.attn_flops_per_token


def shape_of(cfg: dict[str, Any]) -> Shape:
    m = cfg["model"]
    return Shape(
        int(m["n_layer"]),
        int(m["n_embd"]),
        int(m["intermediate"]),
        int(cfg["tokenizer"]["vocab_size"]),
        int(cfg["stream"]["window"]),
    )


def n_facts(cfg: dict[str, Any]) -> int:
    f = cfg["facts"]
    return (
        len(f["domains"])
        * len(f["n_docs"])
        * len(f["positions"])
        * len(MODELS)
        * int(f["facts_per_cell"])
    )


def grad_dims(cfg: dict[str, Any]) -> int:
    """Projected gradient dimensions: ``features.grad_dims`` for a count sketch, 7 block
    linears per layer x k_out x k_in for LoGra."""
    return features_grad_dims(cfg, 7 * int(cfg["model"]["n_layer"]))


def plan(cfg: dict[str, Any], query_tokens: int = 32) -> list[Stage]:
    """Every stage's work and disk. ``query_tokens``: tokens of one query + answer (estimate)."""
    t, s = cfg["train"], shape_of(cfg)
    nm = len(MODELS)
    steps, B, W = int(t["steps"]), int(t["batch_windows"]), s.window
    n_win = steps * B
    tokens_per_model = n_win * W
    tok_bytes = 2 if s.vocab <= 65536 else 4
    params = s.total_params(bool(cfg["model"]["tie_embeddings"]))
    ckpts = len(checkpoint_steps(t))
    counts = pool_mod.pool_counts(cfg)
    n_pool = sum(counts.values())
    D = grad_dims(cfg)
    k_tr = len(tracin_checkpoints(cfg))
    gbytes = 2 if cfg["features"]["grad_dtype"] == "float16" else 4
    facts = n_facts(cfg)
    n_queries = 2 * facts  # two forms per fact, scored on both models
    shards = n_shards(cfg)
    out: list[Stage] = []

    corpus_bytes = float(cfg["corpus"]["max_bytes"]) or tokens_per_model * 4.0
    out.append(
        Stage("corpus", 1, f"collect up to {_si(corpus_bytes)}B of text", disk_bytes=corpus_bytes)
    )
    cap = float(cfg["tokenizer"].get("max_train_bytes", 0))
    on = f"a {_si(cap)}B sample" if cap and cap < corpus_bytes else "the corpus"
    out.append(Stage("tokenizer", 1, f"BPE {s.vocab:,} on {on}", disk_bytes=5e6))
    out.append(
        Stage(
            "stream",
            1,
            f"{nm} x {n_win:,} windows x {W:,} tokens",
            tokens=nm * tokens_per_model,
            disk_bytes=nm * (tokens_per_model * tok_bytes + n_win * 40),
        )
    )
    out.append(
        Stage(
            "pretrain",
            nm,
            f"{nm} x {steps:,} steps x {B} x {W:,} = {nm} x {_si(tokens_per_model)} tokens; "
            f"{params / 1e6:.1f}M params, {ckpts} checkpoints",
            tokens=nm * tokens_per_model,
            flops=nm * tokens_per_model * s.train_flops_per_token(),
            disk_bytes=nm * (ckpts * params * 4 + params * 16),
            gpu=True,
        )
    )
    n_cand = int(cfg["facts"]["candidates"])
    k_ctx = in_context.n_segments(cfg)
    # + the in-context check: 2 context conditions, each prompt run once (k segments of about a
    # query's length, then the query), its cache shared by the candidates' answer tokens
    ic_tok = nm * n_queries * 2 * ((k_ctx + 1) * query_tokens + n_cand * query_tokens // 4)
    c_tok = nm * n_queries * query_tokens * n_cand + ic_tok
    out.append(
        Stage(
            "causal",
            1,
            f"{facts} facts x 2 forms x {nm} models (+ candidates, + {k_ctx}-segment contexts)",
            tokens=c_tok,
            flops=c_tok * s.forward_flops_per_token(),
            gpu=True,
            disk_bytes=1e6,
        )
    )
    out.append(
        Stage(
            "pool",
            nm,
            f"{nm} x {n_pool:,} windows ({counts['planted']:,} planted, "
            f"{counts['distractor']:,} distractor, {counts['background']:,} random)",
            disk_bytes=nm * n_pool * 60,
        )
    )
    g_tok = nm * k_tr * (n_pool * W + n_queries * query_tokens)
    # a count sketch forms every window's exact block-linear gradient: 2 P_b flops per token
    sketch_flops = 2 * s.block_linear_params if cfg["features"]["projection"] == "sketch" else 0
    out.append(
        Stage(
            "grads",
            nm * k_tr * (shards + 1),
            f"{nm} models x {k_tr} checkpoints x ({shards} shards + queries), D = {D:,}",
            tokens=g_tok,
            flops=g_tok * (s.grad_flops_per_token() + sketch_flops),
            disk_bytes=nm * k_tr * (n_pool + n_queries) * D * gbytes,
            gpu=True,
        )
    )
    blocks = 7 * s.n_layer
    kk = int(cfg["features"]["grad_k_in"]) * int(cfg["features"]["grad_k_out"])
    per_module = cfg["curvature"]["mode"] == "block" and cfg["features"]["projection"] == "logra"
    cov = blocks * kk * kk if per_module else D * D  # a sketch is one block
    out.append(
        Stage(
            "curvature",
            nm * k_tr,
            f"{cfg['curvature']['mode']} Fisher of {n_pool:,} rows",
            flops=nm * k_tr * 2 * n_pool * cov,
            disk_bytes=nm * k_tr * cov * 8 * 2,
        )
    )
    if "ekfac" in cfg["methods"]["enabled"]:
        out.append(_ekfac_stage(s, nm, n_pool, n_queries))
    if "tracin_ekfac" in cfg["methods"]["enabled"] and k_tr > 1:
        more = f"as ekfac, at {k_tr - 1} more TracIn checkpoint(s) per model"
        out.append(
            replace(_ekfac_stage(s, nm * (k_tr - 1), n_pool, n_queries, final=False), work=more)
        )
    h_tok = nm * (n_pool * W + n_queries * query_tokens)
    out.append(
        Stage(
            "hidden",
            nm,
            "final-checkpoint forward of pool + queries",
            tokens=h_tok,
            flops=h_tok * s.forward_flops_per_token(),
            gpu=True,
            disk_bytes=nm * (n_pool + n_queries) * s.width * 4,
        )
    )
    e_tok = nm * (n_pool * min(W, ENCODER_TOKENS) + n_queries * query_tokens)
    out.append(
        Stage(
            "embed",
            nm,
            f"encoder (~{ENCODER_PARAMS / 1e6:.0f}M params) on pool + queries",
            tokens=e_tok,
            flops=e_tok * 2 * ENCODER_PARAMS,
            gpu=True,
            disk_bytes=nm * (n_pool + n_queries) * 768 * 4,
        )
    )
    methods = list(cfg["methods"]["enabled"])
    pairs = n_queries * n_pool
    sflops = 0.0
    for m in methods:
        if m in GRAD_METHODS:
            sflops += nm * pairs * 2 * D
        elif m in TRACIN_METHODS:
            sflops += nm * pairs * 2 * D * k_tr
    k = int(cfg["scoring"]["top_k"])
    out.append(
        Stage(
            "score",
            nm * len(methods),
            f"{len(methods)} methods x {nm} models x {n_queries:,} queries x "
            f"{n_pool:,} windows = {_si(nm * len(methods) * pairs)} pairs",
            flops=sflops,
            disk_bytes=nm * len(methods) * n_queries * (k * 32 + 64),
        )
    )
    out.append(Stage("analysis+report", 2, "AP, correlations, bootstrap, figures", disk_bytes=5e7))
    return out


def _ekfac_stage(s: Shape, nm: int, n_pool: int, n_queries: int, final: bool = True) -> Stage:
    """EK-FAC (:mod:`plantbench.ekfac`): passes over the pool at the final checkpoint (Kronecker
    factors, corrected eigenvalues, then scores once per chunk of queries whose preconditioned
    gradients fit in :data:`plantbench.ekfac.MEMORY_BYTES`), full weight gradients, never stored."""
    d, f, p = s.width, s.intermediate, s.block_linear_params
    squares = s.n_layer * (8 * d * d + 3 * (d * d + f * f))  # sum over modules of in^2 + out^2
    passes = 2 + len(query_chunks(n_queries, p))  # factors, eigenvalues, scores per chunk
    per_token = passes * s.grad_flops_per_token() + 4 * squares + 2 * (passes - 1) * p
    tokens = nm * passes * n_pool * s.window
    return Stage(
        "ekfac" if final else "ekfac_tracin",
        nm,
        f"{nm} models x {passes} passes over {n_pool:,} windows, {p:,} weights unprojected",
        tokens=tokens,
        flops=nm * n_pool * s.window * per_token + nm * 2 * n_pool * n_queries * p,
        gpu=True,
        disk_bytes=nm * n_pool * n_queries * 8,
    )


def _si(x: float) -> str:
    if x == 0:
        return "0"
    for unit, div in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"


def gpu_hours(flops: float, gpu: str, utilisation: float = DEFAULT_UTILISATION) -> float:
    if gpu not in GPU_PEAK_BF16:
        raise ValueError(f"unknown GPU '{gpu}'; known: {', '.join(GPU_PEAK_BF16)}")
    return flops / (GPU_PEAK_BF16[gpu] * utilisation) / 3600.0


def format_markdown(
    cfg: dict[str, Any],
    stages: list[Stage],
    gpus: list[str],
    utilisation: float = DEFAULT_UTILISATION,
) -> str:
    s = shape_of(cfg)
    head = ["stage", "jobs", "work", "tokens", "FLOPs", "disk"] + [f"{g.upper()} h" for g in gpus]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    tot_f = tot_d = 0.0
    for st in stages:
        hours = [f"{gpu_hours(st.flops, g, utilisation):.2f}" if st.gpu else "-" for g in gpus]
        row = [
            st.stage,
            str(st.jobs),
            st.work,
            _si(st.tokens) if st.tokens else "-",
            _si(st.flops) if st.flops else "-",
            f"{_si(st.disk_bytes)}B",
        ] + hours
        lines.append("| " + " | ".join(row) + " |")
        tot_f += st.flops if st.gpu else 0.0
        tot_d += st.disk_bytes
    total = [f"{gpu_hours(tot_f, g, utilisation):.1f}" for g in gpus]
    lines.append(
        "| **total** | | | | " + f"{_si(tot_f)} | {_si(tot_d)}B | " + " | ".join(total) + " |"
    )
    per_tok = s.train_flops_per_token()
    lines += [
        "",
        f"Model: {s.n_layer} layers x {s.width} (SwiGLU {s.intermediate}), vocab {s.vocab:,}, "
        f"{s.total_params(bool(cfg['model']['tie_embeddings'])):,} parameters; N (matmul) = "
        f"{s.matmul_params:,}; training FLOPs/token = 6N + 12·L·d·T = {per_tok / 1e6:.1f}M.",
        f"GPU-hours at {utilisation:.0%} of the bf16 dense peak ("
        + ", ".join(f"{g.upper()} {GPU_PEAK_BF16[g] / 1e12:.0f} TFLOP/s" for g in gpus)
        + "); '-' = CPU stage. Per model, pretraining takes half the pretrain row.",
    ]
    return "\n".join(lines)


def wall_hours_pretrain(
    cfg: dict[str, Any], gpu: str, utilisation: float = DEFAULT_UTILISATION
) -> float:
    """Wall-clock hours of one model's pretraining on ``train.devices`` GPUs of that kind."""
    st = next(x for x in plan(cfg) if x.stage == "pretrain")
    return gpu_hours(st.flops / len(MODELS), gpu, utilisation) / max(
        1, int(cfg["train"]["devices"])
    )


def check_finite(stages: list[Stage]) -> None:
    for st in stages:
        for v in (st.tokens, st.flops, st.disk_bytes):
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"stage {st.stage}: bad estimate {v}")
