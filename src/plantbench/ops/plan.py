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
  ``ENCODER_TOKENS`` tokens, ``2 P`` per token; MiniLM (``features.encoder`` names
  ``minilm``, the default study's) is ``MINILM`` (22.7M parameters, 256 tokens).
* Scoring: ``2 D`` FLOPs per (query, pool window) pair for the gradient methods (times the
  TracIn checkpoints for the TracIn ones); the others are memory-bound and not counted.
* GPU-hours = FLOPs / (bf16 dense peak x utilisation) / 3600; CPU-only stages (corpus,
  tokenizer, stream, pool, BM25, curvature, analysis) have none.
* Memory (``mem``): the peak resident memory of one job of the stage, what ``mem_mb`` of that
  rule needs (on a GPU node: host memory; the device's own is about the same tensors). A job
  starts at ``BASE_BYTES`` (Python, pandas, pyarrow) or ``TORCH_BASE_BYTES`` (with torch and
  transformers); a model costs 4 bytes a parameter, training 16 (weights, gradients, two Adam
  moments) per data-parallel process; a window's activations ``act_bytes`` = the head's logits
  (``LOGIT_BYTES`` per vocabulary entry and token: fp32 logits, their gradient, the log-softmax)
  plus ``LAYER_BYTES`` per layer, width and intermediate entry and token; the rest is the stage's
  own arrays (the sketch's tables, the Fisher and its eigendecomposition, EK-FAC's factors and a
  chunk of preconditioned queries). Calibrated on the rehearsal (``plantbench plan --measured``).
* Disk: the token stream (uint16 when the vocabulary fits) plus ~40 bytes of manifest per
  window, checkpoints as fp32 safetensors (4 bytes/param), the resumable state (fp32 weights and
  two Adam moments, 12 bytes/param, rounded up to 16 for the optimizer's bookkeeping and RNG),
  the gradient store ``(pool + queries) x D x bytes`` per (model, checkpoint).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from plantbench import layout
from plantbench.paths import MODELS

# bf16 dense tensor-core peaks (vendor data sheets, no sparsity), FLOP/s
GPU_PEAK_BF16: dict[str, float] = {
    "h200": 989e12,  # H200 SXM (same compute as H100 SXM)
    "h100": 989e12,  # H100 SXM5
    "a100": 312e12,  # A100 SXM / PCIe
    "a4500": 94.6e12,  # RTX A4500 (20 GB)
}
DEFAULT_UTILISATION = 0.40
BASE_BYTES = 0.15e9  # a job's Python with pandas and pyarrow
ROW_GROUP_CHARS = 128e6  # characters a streaming data step holds at once (corpus, stream)
TORCH_BASE_BYTES = 0.75e9  # ... with torch and transformers imported
LOGIT_BYTES = 12  # per token and vocabulary entry: fp32 logits, their gradient, log-softmax
GRAD_LOGIT_BYTES = 6  # the per-example gradient pass: its logits freed once their gradient is
# formed (measured on the rehearsal: 1.6 GB a job at 4 windows x 1,024 x 32,768)
LAYER_BYTES = 6  # per token, layer and (8 x width + 4 x intermediate) entry: saved activations
ENCODER_PARAMS = 110_000_000  # bge-base / BERT-base
ENCODER_TOKENS = 512
MINILM = (22_700_000, 256)  # all-MiniLM-L6-v2: parameters, max_seq_length


def encoder_size(cfg: dict[str, Any]) -> tuple[int, int]:
    """(parameters, tokens a text is truncated to) of ``features.encoder``."""
    name = str(cfg["features"].get("encoder", "")).lower()
    return MINILM if "minilm" in name else (ENCODER_PARAMS, ENCODER_TOKENS)


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
    mem_bytes: float = 0.0  # peak resident memory of one job
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

    def decoder_flops_per_token(self) -> float:
        """Forward without the output head (hidden states; a prefix whose logits are dropped)."""
        return 2 * self.block_linear_params + self.attn_flops_per_token

    def grad_flops_per_token(self) -> float:
        return 4 * self.matmul_params + 2 * self.attn_flops_per_token

    def act_bytes(self, tokens: float, logit_bytes: int = LOGIT_BYTES) -> float:
        """Activations of a forward and backward over ``tokens`` tokens (logits dominate)."""
        per_layer = 8 * self.width + 4 * self.intermediate
        return tokens * (logit_bytes * self.vocab + LAYER_BYTES * self.n_layer * per_layer)


def shape_of(cfg: dict[str, Any]) -> Shape:
    m = cfg["model"]
    return Shape(
        int(m["n_layer"]),
        int(m["n_embd"]),
        int(m["intermediate"]),
        int(m.get("vocab_size") or cfg["tokenizer"]["vocab_size"]),
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
    return layout.grad_dims(cfg, 7 * int(cfg["model"]["n_layer"]))


@dataclass(frozen=True)
class _Sizes:
    """The counts that :func:`plan` builds every stage from (read from the config once)."""

    s: Shape
    nm: int  # models
    steps: int
    batch: int  # windows per optimizer step
    n_win: int  # training windows per model
    tokens_per_model: int
    tok_bytes: int  # bytes per stored token
    params: int
    ckpts: int
    counts: dict[str, int]  # pool windows by kind
    n_pool: int
    D: int  # projected gradient dimensions
    k_tr: int  # TracIn checkpoints
    gbytes: int  # bytes per stored gradient entry
    facts: int
    n_queries: int
    shards: int
    query_tokens: int

    @property
    def W(self) -> int:
        return self.s.window


def _sizes(cfg: dict[str, Any], query_tokens: int) -> _Sizes:
    t, s = cfg["train"], shape_of(cfg)
    nm = len(MODELS)
    steps, B, W = int(t["steps"]), int(t["batch_windows"]), s.window
    n_win = steps * B
    tokens_per_model = n_win * W
    tok_bytes = 2 if s.vocab <= 65536 else 4
    params = s.total_params(bool(cfg["model"]["tie_embeddings"]))
    ckpts = len(layout.checkpoint_steps(t))
    counts = layout.pool_counts(cfg)
    n_pool = sum(counts.values())
    D = grad_dims(cfg)
    k_tr = len(layout.tracin_checkpoints(cfg))
    gbytes = 2 if cfg["features"]["grad_dtype"] == "float16" else 4
    facts = n_facts(cfg)
    n_queries = 2 * facts  # two forms per fact, scored on both models
    shards = layout.n_shards(cfg)
    return _Sizes(
        s,
        nm,
        steps,
        B,
        n_win,
        tokens_per_model,
        tok_bytes,
        params,
        ckpts,
        counts,
        n_pool,
        D,
        k_tr,
        gbytes,
        facts,
        n_queries,
        shards,
        query_tokens,
    )


def plan(cfg: dict[str, Any], query_tokens: int = 32) -> list[Stage]:
    """Every stage's work and disk. ``query_tokens``: tokens of one query + answer (estimate)."""
    z = _sizes(cfg, query_tokens)
    out = _data_stages(cfg, z)
    out.append(_pretrain_stage(cfg, z))
    out.append(_causal_stage(cfg, z))
    out.append(_pool_stage(z))
    out.append(_grads_stage(cfg, z))
    out += _curvature_stages(cfg, z)
    out += _forward_stages(cfg, z)
    out.append(_score_stage(cfg, z))
    out.append(
        Stage(
            "analysis+report",
            2,
            "AP, correlations, bootstrap, figures",
            disk_bytes=5e7,
            mem_bytes=BASE_BYTES + 0.05e9,  # tables and matplotlib
        )
    )
    return out


def _data_stages(cfg: dict[str, Any], z: _Sizes) -> list[Stage]:
    """corpus, tokenizer and the token stream (CPU)."""
    s, nm, n_win, W = z.s, z.nm, z.n_win, z.W
    corpus_bytes = float(cfg["corpus"]["max_bytes"]) or z.tokens_per_model * 4.0
    # a row group of documents as Python strings (4 bytes a character at worst); measured: corpus
    # 0.69 GB and stream 0.68 GB on 400 MB of jsonl, tokenizer 0.34 GB (docs/results/2026-12.md)
    batch_text = min(corpus_bytes, ROW_GROUP_CHARS) * 4.0
    corpus = Stage(
        "corpus",
        1,
        f"collect up to {_si(corpus_bytes)}B of text",
        disk_bytes=corpus_bytes,
        mem_bytes=BASE_BYTES + batch_text,
    )
    cap = float(cfg["tokenizer"].get("max_train_bytes", 0))
    on = f"a {_si(cap)}B sample" if cap and cap < corpus_bytes else "the corpus"
    sample = min(cap, corpus_bytes) if cap else corpus_bytes
    tokenizer = Stage(
        "tokenizer",
        1,
        f"BPE {s.vocab:,} on {on}",
        disk_bytes=5e6,
        mem_bytes=BASE_BYTES + 0.5 * sample,  # BPE's word counts and pair index
    )
    stream = Stage(
        "stream",
        1,
        f"{nm} x {n_win:,} windows x {W:,} tokens",
        tokens=nm * z.tokens_per_model,
        disk_bytes=nm * (z.tokens_per_model * z.tok_bytes + n_win * 40),
        # a row group of documents (the tokens go to a memory-mapped scratch file)
        mem_bytes=BASE_BYTES + batch_text,
    )
    return [corpus, tokenizer, stream]


def _pretrain_stage(cfg: dict[str, Any], z: _Sizes) -> Stage:
    nm, tokens_per_model = z.nm, z.tokens_per_model
    devices, micro = int(cfg["train"]["devices"]), int(cfg["train"]["micro_batch_windows"])
    per_process = TORCH_BASE_BYTES + 16 * z.params + z.s.act_bytes(micro * z.W)
    launcher = BASE_BYTES if devices > 1 else 0.0  # torchrun's own process
    return Stage(
        "pretrain",
        nm,
        f"{nm} x {z.steps:,} steps x {z.batch} x {z.W:,} = {nm} x {_si(tokens_per_model)} tokens; "
        f"{z.params / 1e6:.1f}M params, {z.ckpts} checkpoints",
        tokens=nm * tokens_per_model,
        flops=nm * tokens_per_model * z.s.train_flops_per_token(),
        disk_bytes=nm * (z.ckpts * z.params * 4 + z.params * 16),
        mem_bytes=devices * per_process + launcher,
        gpu=True,
    )


def _causal_stage(cfg: dict[str, Any], z: _Sizes) -> Stage:
    nm, n_queries, query_tokens = z.nm, z.n_queries, z.query_tokens
    n_cand = int(cfg["facts"]["candidates"])
    k_ctx = layout.context_segments(cfg)
    # + the in-context check: 2 context conditions, each prompt run once (k segments of about a
    # query's length, then the query), its cache shared by the candidates' answer tokens
    # (the prefix keeps its last position's logits only: no head over the context)
    ic_prefix = nm * n_queries * 2 * (k_ctx + 1) * query_tokens
    full = nm * n_queries * (query_tokens * n_cand + 2 * n_cand * query_tokens // 4)
    c_tok = full + ic_prefix
    flops = full * z.s.forward_flops_per_token() + ic_prefix * z.s.decoder_flops_per_token()
    return Stage(
        "causal",
        1,
        f"{z.facts} facts x 2 forms x {nm} models (+ candidates, + {k_ctx}-segment contexts)",
        tokens=c_tok,
        flops=flops,
        gpu=True,
        disk_bytes=1e6,
        # a batch of prompts with their context segments, forward only (no gradient: a third)
        mem_bytes=TORCH_BASE_BYTES
        + 4 * z.params
        + z.s.act_bytes(int(cfg["causal"]["batch_size"]) * (k_ctx + 1) * query_tokens) / 3,
    )


def _pool_stage(z: _Sizes) -> Stage:
    nm, counts = z.nm, z.counts
    return Stage(
        "pool",
        nm,
        f"{nm} x {z.n_pool:,} windows ({counts['planted']:,} planted, "
        f"{counts['distractor']:,} distractor, {counts['background']:,} random)",
        disk_bytes=nm * z.n_pool * 60,
        mem_bytes=BASE_BYTES + z.n_pool * 200,  # the pool and manifest tables
    )


def _factor_squares(s: Shape) -> int:
    """Sum over the block linears of ``in^2 + out^2``: the size of EK-FAC's Kronecker factors."""
    d, f = s.width, s.intermediate
    return s.n_layer * (8 * d * d + 3 * (d * d + f * f))


def _ekfac_checkpoints(cfg: dict[str, Any], k_tr: int) -> int:
    """Checkpoints per model with an EK-FAC fit (their grads_pool jobs sum its factors)."""
    enabled = cfg["methods"]["enabled"]
    return int("ekfac" in enabled) + (k_tr - 1 if "tracin_ekfac" in enabled else 0)


def _grads_stage(cfg: dict[str, Any], z: _Sizes) -> Stage:
    s, nm, k_tr, n_pool, n_queries = z.s, z.nm, z.k_tr, z.n_pool, z.n_queries
    g_tok = nm * k_tr * (n_pool * z.W + n_queries * z.query_tokens)
    # where an EK-FAC fit follows, the same pass sums its Kronecker factors (2 (in^2 + out^2)
    # flops a token, float64 sums kept by the job)
    f_tok = nm * _ekfac_checkpoints(cfg, k_tr) * n_pool * z.W
    squares = _factor_squares(s)
    # a count sketch forms every window's exact block-linear gradient: 2 P_b flops per token
    sketch = cfg["features"]["projection"] == "sketch"
    sketch_flops = 2 * s.block_linear_params if sketch else 0
    b = int(cfg["features"]["batch_windows"])
    # the model, a batch's activations, the batch's exact per-example gradients of one layer's
    # linears (a sketch: float32), the sketch's bucket and sign tables (int64 + float32 a
    # weight), the shard's rows in float32 before the store's dtype
    per_layer = s.block_linear_params // max(1, s.n_layer)
    mem = (
        TORCH_BASE_BYTES
        + 4 * z.params
        + s.act_bytes(b * z.W, GRAD_LOGIT_BYTES)
        + (b * per_layer * 4 + s.block_linear_params * 12 if sketch else 0)
        + int(cfg["features"]["shard_windows"]) * z.D * 4
        + (8 * squares if f_tok else 0)
    )
    return Stage(
        "grads",
        nm * k_tr * (z.shards + 1),
        f"{nm} models x {k_tr} checkpoints x ({z.shards} shards + queries), D = {z.D:,}",
        tokens=g_tok,
        flops=g_tok * (s.grad_flops_per_token() + sketch_flops) + f_tok * 2 * squares,
        disk_bytes=nm * k_tr * (n_pool + n_queries) * z.D * z.gbytes,
        mem_bytes=mem,
        gpu=True,
    )


def _curvature_stages(cfg: dict[str, Any], z: _Sizes) -> list[Stage]:
    """The Fisher of the gradient store, then EK-FAC's passes when enabled."""
    s, nm, k_tr, n_pool, n_queries = z.s, z.nm, z.k_tr, z.n_pool, z.n_queries
    budget = layout.ekfac_memory_bytes(cfg)
    b = int(cfg["features"]["batch_windows"])
    blocks = 7 * s.n_layer
    kk = int(cfg["features"]["grad_k_in"]) * int(cfg["features"]["grad_k_out"])
    per_module = cfg["curvature"]["mode"] == "block" and cfg["features"]["projection"] == "logra"
    cov = blocks * kk * kk if per_module else z.D * z.D  # a sketch is one block
    n_blocks = blocks if per_module else 1
    out = [
        Stage(
            "curvature",
            nm * k_tr,
            f"{cfg['curvature']['mode']} Fisher of {n_pool:,} rows",
            # the sums, then the eigendecomposition (about 9 n^3 a block with its vectors)
            flops=nm * k_tr * (2 * n_pool * cov + 9 * cov * math.sqrt(cov / max(1, n_blocks))),
            disk_bytes=nm * k_tr * cov * 8 * 2,
            # float64 sums, eigenvectors and LAPACK's workspace, each the size of the blocks
            # (+ 0.2 GB: the job's LAPACK and gradient-store reader, measured on the rehearsal)
            mem_bytes=BASE_BYTES + 0.2e9 + 3 * cov * 8,
        )
    ]
    if "ekfac" in cfg["methods"]["enabled"]:
        out.append(_ekfac_stage(s, nm, n_pool, n_queries, budget, b))
    if "tracin_ekfac" in cfg["methods"]["enabled"] and k_tr > 1:
        more = f"as ekfac, at {k_tr - 1} more TracIn checkpoint(s) per model"
        out.append(
            replace(
                _ekfac_stage(s, nm * (k_tr - 1), n_pool, n_queries, budget, b, final=False),
                work=more,
            )
        )
    return out


def _forward_stages(cfg: dict[str, Any], z: _Sizes) -> list[Stage]:
    """hidden states and text embeddings of the pool and the queries."""
    s, nm, W, n_pool, n_queries = z.s, z.nm, z.W, z.n_pool, z.n_queries
    h_tok = nm * (n_pool * W + n_queries * z.query_tokens)
    hidden = Stage(
        "hidden",
        nm,
        "final-checkpoint forward of pool + queries",
        tokens=h_tok,
        flops=h_tok * s.decoder_flops_per_token(),  # the decoder only: no output head
        gpu=True,
        disk_bytes=nm * (n_pool + n_queries) * s.width * 4,
        # forward only (no logits), batches of twice features.batch_windows
        mem_bytes=TORCH_BASE_BYTES
        + 4 * z.params
        + s.act_bytes(2 * int(cfg["features"]["batch_windows"]) * W, logit_bytes=0) / 3,
    )
    enc, enc_tokens = encoder_size(cfg)
    e_tok = nm * (n_pool * min(W, enc_tokens) + n_queries * z.query_tokens)
    embed = Stage(
        "embed",
        nm + 1,  # the shared job embeds both pools' texts once; one job per twin reads it
        f"encoder (~{enc / 1e6:.0f}M params) on pool + queries",
        tokens=e_tok,
        flops=e_tok * 2 * enc,
        gpu=True,
        disk_bytes=nm * (n_pool + n_queries) * 768 * 4,
        mem_bytes=TORCH_BASE_BYTES + 4 * enc,
    )
    return [hidden, embed]


def _score_stage(cfg: dict[str, Any], z: _Sizes) -> Stage:
    nm, n_queries, n_pool, D, k_tr = z.nm, z.n_queries, z.n_pool, z.D, z.k_tr
    methods = list(cfg["methods"]["enabled"])
    pairs = n_queries * n_pool
    sflops = 0.0
    for m in methods:
        if m in GRAD_METHODS:
            sflops += nm * pairs * 2 * D
        elif m in TRACIN_METHODS:
            sflops += nm * pairs * 2 * D * k_tr
    k = int(cfg["scoring"]["top_k"])
    return Stage(
        "score",
        nm * len(methods),
        f"{len(methods)} methods x {nm} models x {n_queries:,} queries x "
        f"{n_pool:,} windows = {_si(nm * len(methods) * pairs)} pairs",
        flops=sflops,
        disk_bytes=nm * len(methods) * n_queries * (k * 32 + 64),
        # the pool's and the queries' features in float32, float64 tiles of scores
        mem_bytes=BASE_BYTES
        + (n_pool + n_queries) * D * 4
        + 3 * 8 * int(cfg["scoring"]["query_block"]) * int(cfg["scoring"]["pool_block"]),
    )


def _ekfac_stage(
    s: Shape, nm: int, n_pool: int, n_queries: int, budget: int, b: int, final: bool = True
) -> Stage:
    """EK-FAC (:mod:`plantbench.attribution.ekfac`): passes over the pool at the final
    checkpoint (corrected eigenvalues, then scores once per chunk of queries whose preconditioned
    gradients fit in :data:`plantbench.layout.EKFAC_MEMORY_BYTES`), full weight gradients, never
    stored; the Kronecker factors come from the checkpoint's grads pass (:func:`_grads_stage`)."""
    p = s.block_linear_params
    squares = _factor_squares(s)  # sum over modules of in^2 + out^2
    chunk_list = layout.ekfac_query_chunks(n_queries, p, budget)
    chunks, per_chunk = len(chunk_list), max(e - a for a, e in chunk_list)
    # the model, a batch's activations, float64 factors (in^2 + out^2 a module) with their
    # eigenvectors, the eigenvalues and a batch's weight gradients (float64), one chunk of
    # preconditioned float32 query gradients
    mem = (
        TORCH_BASE_BYTES
        + 4 * s.total_params(True)
        + s.act_bytes(b * s.window)
        + 2 * squares * 8
        + 2 * p * 8
        + per_chunk * p * 4
    )
    passes = 1 + chunks  # eigenvalues, scores per chunk (the factors: the grads pass)
    # each pass's frozen forward and backward and per-example gradients; the eigenvalue pass's
    # rotations into the Kronecker eigenbases
    per_token = passes * (s.grad_flops_per_token() + 2 * p) + 2 * squares
    tokens = nm * passes * n_pool * s.window
    return Stage(
        "ekfac" if final else "ekfac_tracin",
        nm,
        f"{nm} models x {passes} passes over {n_pool:,} windows ({chunks} query chunk"
        f"{'s' if chunks > 1 else ''}), {p:,} weights unprojected",
        tokens=tokens,
        flops=nm * n_pool * s.window * per_token + nm * 2 * n_pool * n_queries * p,
        gpu=True,
        disk_bytes=nm * n_pool * n_queries * 8,
        mem_bytes=mem,
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
    head = ["stage", "jobs", "work", "tokens", "FLOPs", "disk", "mem/job"]
    head += [f"{g.upper()} h" for g in gpus]
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
            f"{_si(st.mem_bytes)}B",
        ] + hours
        lines.append("| " + " | ".join(row) + " |")
        tot_f += st.flops if st.gpu else 0.0
        tot_d += st.disk_bytes
    total = [f"{gpu_hours(tot_f, g, utilisation):.1f}" for g in gpus]
    lines.append(
        "| **total** | | | | " + f"{_si(tot_f)} | {_si(tot_d)}B | | " + " | ".join(total) + " |"
    )
    per_tok = s.train_flops_per_token()
    lines += [
        "",
        f"Model: {s.n_layer} layers x {s.width} (SwiGLU {s.intermediate}), vocab {s.vocab:,}, "
        f"{s.total_params(bool(cfg['model']['tie_embeddings'])):,} parameters; N (matmul) = "
        f"{s.matmul_params:,}; training FLOPs/token = 6N + 12·L·d·T = {per_tok / 1e6:.1f}M.",
        f"GPU-hours at {utilisation:.0%} of the bf16 dense peak ("
        + ", ".join(f"{g.upper()} {GPU_PEAK_BF16[g] / 1e12:.0f} TFLOP/s" for g in gpus)
        + "); '-' = CPU stage. Per model, pretraining takes half the pretrain row. mem/job: "
        "one job's peak resident memory (its rule's mem_mb; pretrain: all train.devices "
        "processes of a twin).",
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
