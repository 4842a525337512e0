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
* Forward only (hidden states): ``2 N + 4 L d T`` per token.
* Text embeddings: a BERT-base-sized encoder (``ENCODER``), windows truncated to its maximum
  length, ``2 P`` per token for the ``P`` parameters of its matmuls (not the token embedding
  table; attention's own FLOPs, ~5% at 128 tokens, left out); MiniLM (``features.encoder``
  names ``minilm``, the default study's) is ``MINILM`` (22.7M parameters, 10.6M in matmuls,
  256 tokens). Each distinct text once: the pool windows both twins share and the queries in
  the shared job, each twin's planted windows (its own documents) in its own.
* Scoring: ``2 D`` FLOPs per (query, pool window) pair for the gradient methods (times the
  TracIn checkpoints for the TracIn ones); the others are memory-bound and not counted.
* GPU-hours = FLOPs / (bf16 dense peak x utilisation) / 3600; CPU-only stages (facts, corpus,
  tokenizer, stream, pool, BM25, curvature, the suites' table steps, analysis) have none.
* Memory (``mem``): the peak resident memory of one job of the stage, what ``mem_mb`` of that
  rule needs (on a GPU node: host memory; the device's own is about the same tensors). A job
  starts at ``BASE_BYTES`` (Python, pandas, pyarrow) or ``TORCH_BASE_BYTES`` (with torch and
  transformers); a model costs 4 bytes a parameter, training 16 (weights, gradients, two Adam
  moments) per data-parallel process; a window's activations ``act_bytes`` = the head's logits
  (``LOGIT_BYTES`` per vocabulary entry and token: fp32 logits, their gradient, the log-softmax)
  plus ``LAYER_BYTES`` per layer, width and intermediate entry and token; the rest is the stage's
  own arrays (the sketch's tables, the Fisher and its eigendecomposition, EK-FAC's factors and a
  chunk of preconditioned queries). Calibrated on the rehearsal (``plantbench plan --measured``).
* The shared prefix (``train.prefix_steps``) is trained once (``pretrain_prefix``); each twin
  then trains ``train.steps - prefix_steps`` steps (``pretrain``).
* The suites and the other steps that run a twin forward count, per forward, ``2 P_b`` per
  token for the block linears, ``2 V d`` per token that gets the output head, and ``4 L d S``
  per token that attends to ``S`` positions (:meth:`Shape.fwd_flops`). Text lengths are the
  template facts' (``SENTENCE_TOKENS`` a context segment, ``PROMPT_TOKENS`` a query with
  ``<bos>``, ``ANSWER_TOKENS`` a candidate row padded to its fact's longest, ``DOC_TOKENS`` a
  planted document); a batch of different facts' texts runs ``PAD`` x longer (padded to its
  longest). ``c`` = ``facts.candidates``, ``Q`` = queries (2 per fact), ``k`` a context's
  segments.
* Candidates (:func:`plantbench.model.queries.batch_candidate_logprobs`): ``n`` prompts of
  ``t`` tokens with the head at their last position only, then ``n c`` rows of
  ``ANSWER_TOKENS`` with the head, attending to ``t + ANSWER_TOKENS``.
* ``causal``: 1 job; per twin and fact, the candidates of both forms' prompts alone
  (``PROMPT_TOKENS``), then of the in-context check's two conditions x both forms, prompts of
  ``k`` segments (``causal.context_segments``) and the query.
* ``reading``: 1 job; per twin, per checkpoint (and the fork when there is a prefix), per fact
  the twin never read (half the facts): the candidates of both forms' in-context prompts.
* ``fidelity``: 1 job per twin when a gradient method is enabled; ``n_w = min(fidelity.windows,
  pool)`` windows, queries in chunks of ``FIDELITY_MEMORY_BYTES / (8 P_b)``: one per-example
  gradient pass over the subset per chunk and one over the queries, each ``4 N + 8 L d T`` plus
  ``2 P_b`` (the example's weight gradient) per token, ``2 P_b`` per (query, window) product;
  per ``fidelity.sweep`` / ``sketch_sweep`` size one projected pass over the subset and the
  queries; ``2 D`` per (query, window) and method (x TracIn checkpoints) for the methods' scores.
* ``context_attribute``: 1 job per twin, all ``Q`` queries: when ``2^k <= context.lattice``
  all ``2^k`` masks, in batches of ``context.batch`` consecutive masks each padded to its
  longest prompt; else the masks the methods ask for (ablations, permutations, leave-one-out,
  LDS, conditions), as many distinct ones as that many random draws among ``2^k`` give, each of
  ``k`` segments; per mask its candidates (one prompt); plus the attention passes (AT2,
  AttnTrace: the full context and ``attntrace_subsamples`` subcontexts keeping
  ``attntrace_keep`` of the segments), prompt and answer with the head on every position.
* ``membership_detect``: 1 job per twin, ``N`` samples and ``d`` distractors
  (``membership.samples`` / ``distractors``, else the seed's 250 / 50 or what the grid has).
  A run of the two conditions (the query alone; the document then the query) per row: the
  hidden-state pass and the greedy prefix of each, ``generate_tokens - 1`` decoding steps of
  each, the KL's teacher-forced pass of each with the continuation, every position with the
  head; one run on ``N + d`` rows, three more prompt templates and two noise runs (no
  continuation) on ``N``; each document alone (likelihood baselines); the text encoder on the
  continuations (``2 P_enc`` a token).
* ``grounding_respond``: 1 job per twin, ``facts x len(grounding.conditions)`` contexts of
  ``segments x sentences_per_segment`` sentences and the question: the prompt with the head on
  every position, then ``max_new_tokens - 1`` decoding steps (at most what the window leaves; no
  row stopping early: an upper bound); a configured NLI model is not counted.
* ``facts``, ``context_build`` / ``_analysis``, ``membership_samples`` / ``_analysis``,
  ``grounding_build`` / ``_analysis``: 1 job each, tables only (memory, no FLOPs).
* The suites' memory: a twin (4 bytes a parameter; ``reading`` holds two while the next
  checkpoint loads) and what the code holds at its peak: the candidate rows' float32 logits and
  log-softmax (8 bytes a vocabulary entry) with their repeated key-value cache (``context``,
  ``reading``), every query's float64 attention weights (``context``: kept until AT2 fits), a
  batch's float64 next-token log-distributions (16 bytes an entry: ``membership``), a batch's
  prompt logits (``grounding``), the chunk of float64 query gradients, a batch of float64
  window gradients, inputs and output gradients, and the loaded query gradients and Fisher
  eigenvectors (``fidelity``).
* Disk: the token stream (uint16 when the vocabulary fits) plus ~40 bytes of manifest per
  window, checkpoints as fp32 safetensors (4 bytes/param), the resumable state (fp32 weights and
  two Adam moments, 12 bytes/param, rounded up to 16 for the optimizer's bookkeeping and RNG),
  the gradient store ``(pool + queries) x D x bytes`` per (model, checkpoint), plus, where an
  EK-FAC fit follows, every pool shard's float64 Kronecker factor sums (``8 (in^2 + out^2)`` a
  block linear: 1.8 GB a shard at the paper's 12 layers; found by the rehearsal's disk column),
  the Fisher's float64 eigenvectors per (model, checkpoint). ``plantbench plan --measured``
  puts each stage's artifact folders beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from plantbench import layout
from plantbench.paths import MODELS
from plantbench.suites.context.settings import DEFAULTS as CONTEXT_DEFAULTS
from plantbench.suites.grounding import settings as grounding_settings
from plantbench.suites.membership import settings as membership_settings

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
ENCODE_BYTES = 27 * layout.ENCODE_CHARS  # one tokenizer call's encodings (the stream step)
RECALL_WINDOW_BYTES = 500  # a recall window held: its objects, beside its ids and uint8 mask
# the corpus step's duplicate filter: one xxh3-128 hex digest in a set per kept document (~150
# bytes), documents counted at one per kB of text (an upper bound on the count: web text averages
# several kB a document)
DEDUP_BYTES_PER_DOC = 150
DOC_BYTES = 1000
MANIFEST_BYTES_PER_WINDOW = 300  # the stream step's manifest columns, held until written
LOGIT_BYTES = 12  # per token and vocabulary entry: fp32 logits, their gradient, log-softmax
GRAD_LOGIT_BYTES = 6  # the per-example gradient pass: its logits freed once their gradient is
# formed (measured on the rehearsal: 1.6 GB a job at 4 windows x 1,024 x 32,768)
LAYER_BYTES = 6  # per token, layer and (8 x width + 4 x intermediate) entry: saved activations
# text encoders: (parameters, of them in matmuls: layers x 12 x width^2, max tokens)
ENCODER = (110_000_000, 12 * 12 * 768**2, 512)  # bge-base / BERT-base: 12 layers x 768
MINILM = (22_700_000, 6 * 12 * 384**2, 256)  # all-MiniLM-L6-v2: 6 layers x 384, max_seq_length
TORCH_IMPORT_BYTES = 0.3e9  # a job that imports torch but loads no model (suite tables, report)
# Tokens of the facts' texts (the template generator's; measured with the rehearsal's BPE:
# sentences 16.6, query prompts 14.7, a fact's longest candidate 5.3, documents 63 on average)
SENTENCE_TOKENS = 17  # a fact's sentence and its line break: one context segment
PROMPT_TOKENS = 16  # <bos> and a query's prompt (or the grounding question)
ANSWER_TOKENS = 6  # a candidate row: the fact's candidates padded to its longest
DOC_TOKENS = 64  # a planted document (at most 240 characters)
PAD = 1.2  # a batch of different facts' texts runs padded to its longest: ~1.2 x their mean
CONTEXT_METHODS = (  # the context suite's registered methods (context.methods by default)
    "contextcite",
    "attribot",
    "attribot_pruned",
    "tracllm",
    "tokenshap",
    "at2",
    "attntrace",
)


def encoder_size(cfg: dict[str, Any]) -> tuple[int, int, int]:
    """(parameters, parameters in matmuls, tokens a text is truncated to) of
    ``features.encoder``."""
    name = str(cfg["features"].get("encoder", "")).lower()
    return MINILM if "minilm" in name else ENCODER


GRAD_METHODS = {"grad_dot": 1, "grad_cos": 1, "influence": 1}  # checkpoints they read: final only
TRACIN_METHODS = ("tracin_dot", "tracin_influence")
CURVATURE_METHODS = ("influence", "tracin_influence")  # score with the Fisher's eigenvectors


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

    def fwd_flops(self, tokens: float, attended: float, head: bool = True) -> float:
        """Forward FLOPs of ``tokens`` tokens that each attend to ``attended`` positions (the
        block linears, attention, and the output head when ``head``)."""
        per = 2 * self.block_linear_params + 4 * self.n_layer * self.width * attended
        return tokens * (per + (2 * self.vocab * self.width if head else 0))

    def kv_bytes(self, rows: float, tokens: float) -> float:
        """A float32 key-value cache of ``rows`` sequences of ``tokens`` tokens."""
        return rows * tokens * 2 * self.n_layer * self.width * 4

    @property
    def linear_io(self) -> int:
        """Inputs plus outputs of one layer's block linears (q, k, v, o, gate, up, down)."""
        return 11 * self.width + 3 * self.intermediate

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
    return layout.n_facts(cfg)


def grad_dims(cfg: dict[str, Any]) -> int:
    """Projected gradient dimensions: ``features.grad_dims`` for a count sketch, 7 block
    linears per layer x k_out x k_in for LoGra."""
    return layout.grad_dims(cfg, layout.tracked_linears(cfg["model"]["n_layer"]))


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
    tok_bytes = layout.token_bytes(s.vocab)
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
    out = [_facts_stage(z), *_data_stages(cfg, z)]
    out += _pretrain_stages(cfg, z) + [_causal_stage(cfg, z), _reading_stage(cfg, z)]
    out += _random_stages(cfg, z, out)
    out.append(_pool_stage(z))
    out.append(_grads_stage(cfg, z))
    out += _curvature_stages(cfg, z)
    out += _forward_stages(cfg, z)
    out.append(_score_stage(cfg, z))
    out += _fidelity_stages(cfg, z)
    out += _context_stages(cfg, z) + _membership_stages(cfg, z) + _grounding_stages(cfg, z)
    out.append(
        Stage(
            "analysis+report",
            2,
            "AP, correlations, bootstrap, figures",
            disk_bytes=5e6,  # tables and figures (1 MB at the rehearsal)
            mem_bytes=TORCH_IMPORT_BYTES + 0.05e9,  # the report imports torch and matplotlib
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
        mem_bytes=BASE_BYTES + batch_text + corpus_bytes / DOC_BYTES * DEDUP_BYTES_PER_DOC,
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
    per_window = (z.tok_bytes + 1) * W + RECALL_WINDOW_BYTES  # ids in the stream's dtype
    recall_bytes = sum(layout.recall_counts(cfg).values()) * per_window
    stream = Stage(
        "stream",
        1,
        f"{nm} x {n_win:,} windows x {W:,} tokens",
        tokens=nm * z.tokens_per_model,
        disk_bytes=nm * (z.tokens_per_model * z.tok_bytes + n_win * 40),
        # a row group of documents and one tokenizer call's encodings (the tokens go to a
        # memory-mapped scratch file), every recall window until both streams are written, and
        # one model's manifest
        mem_bytes=BASE_BYTES
        + batch_text
        + ENCODE_BYTES
        + recall_bytes
        + n_win * MANIFEST_BYTES_PER_WINDOW,
    )
    return [corpus, tokenizer, stream]


def _pretrain_stages(cfg: dict[str, Any], z: _Sizes) -> list[Stage]:
    """The shared prefix (``train.prefix_steps``, trained once) when there is one, then each
    twin from the fork to ``train.steps``."""
    nm, prefix = z.nm, layout.prefix_steps(cfg)
    devices, micro = int(cfg["train"]["devices"]), int(cfg["train"]["micro_batch_windows"])
    per_process = TORCH_BASE_BYTES + 16 * z.params + z.s.act_bytes(micro * z.W)
    launcher = BASE_BYTES if devices > 1 else 0.0  # torchrun's own process
    steps = z.steps - prefix
    tokens = steps * z.batch * z.W  # per twin
    out = [
        Stage(
            "pretrain",
            nm,
            f"{nm} x {steps:,} steps x {z.batch} x {z.W:,} = {nm} x {_si(tokens)} tokens; "
            f"{z.params / 1e6:.1f}M params, {z.ckpts} checkpoints",
            tokens=nm * tokens,
            flops=nm * tokens * z.s.train_flops_per_token(),
            disk_bytes=nm * (z.ckpts * z.params * 4 + z.params * 16),
            mem_bytes=devices * per_process + launcher,
            gpu=True,
        )
    ]
    if prefix:
        shared = prefix * z.batch * z.W
        out.insert(
            0,
            replace(
                out[0],
                stage="pretrain_prefix",
                jobs=1,
                work=f"{prefix:,} steps x {z.batch} x {z.W:,} = {_si(shared)} tokens, once",
                tokens=shared,
                flops=shared * z.s.train_flops_per_token(),
                disk_bytes=z.params * 16,  # the state at the fork
            ),
        )
    return out


def _random_stages(cfg: dict[str, Any], z: _Sizes, before: list[Stage]) -> list[Stage]:
    """The random twins (``random_twins.m`` > 0): each one twin's paired part, then one step
    that scores their answers and sums every method's full score matrix per draw (LDS)."""
    m = layout.random_draws(cfg)
    if not m:
        return []
    twin = next(st for st in before if st.stage == "pretrain")
    per = 1.0 / twin.jobs
    answers = m * z.n_queries * z.query_tokens
    matrix = z.n_queries / z.nm * z.n_pool * 4  # one method's reader rows, float32
    return [
        replace(
            twin,
            stage="random_twin",
            jobs=m,
            work=f"{m} random twins x the paired part of one twin ({_si(twin.tokens * per)} tokens)",
            tokens=twin.tokens * per * m,
            flops=twin.flops * per * m,
            disk_bytes=twin.disk_bytes * per * m,
        ),
        Stage(
            "random_effect",
            1,
            f"{m} twins x {z.n_queries:,} answers; LDS: each method's scores x {m} draws",
            tokens=answers,
            flops=answers * z.s.forward_flops_per_token(),
            disk_bytes=m * z.n_queries * 64 + 5e6,
            mem_bytes=TORCH_BASE_BYTES + z.params * 4 + 3 * matrix,
        ),
    ]


def _candidate_rows(s: Shape, prompts: int, t: float, c: int) -> tuple[float, float]:
    """(tokens, FLOPs) of :func:`plantbench.model.queries.batch_candidate_logprobs` on
    ``prompts`` prompts of ``t`` tokens and ``c`` candidates: the prompts with the head at their
    last position only, then ``prompts x c`` rows of ``ANSWER_TOKENS`` with the head, each
    attending to its prompt."""
    rows, a = prompts * c, ANSWER_TOKENS
    head = 2 * s.vocab * s.width
    flops = prompts * (s.fwd_flops(t, t, head=False) + head) + s.fwd_flops(rows * a, t + a)
    return prompts * t + rows * a, flops


def _causal_stage(cfg: dict[str, Any], z: _Sizes) -> Stage:
    nm, query_tokens = z.nm, z.query_tokens
    n_cand = int(cfg["facts"]["candidates"])
    k_ctx = layout.context_segments(cfg)
    # per twin and fact: both forms' prompts alone, then the in-context check's two conditions
    # (k segments, then the query) of both forms, the candidates continuing from each prompt
    t = k_ctx * SENTENCE_TOKENS + PROMPT_TOKENS
    alone, ctx = _candidate_rows(z.s, 2, PROMPT_TOKENS, n_cand), _candidate_rows(z.s, 4, t, n_cand)
    c_tok = nm * z.facts * (alone[0] + ctx[0])
    flops = nm * z.facts * (alone[1] + ctx[1])
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
    final = "ekfac" in enabled or layout.astra_enabled(cfg)
    return int(final) + (k_tr - 1 if "tracin_ekfac" in enabled else 0)


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
        # the rows, and each pool shard's float64 factor sums where an EK-FAC fit follows
        disk_bytes=nm * k_tr * (n_pool + n_queries) * z.D * z.gbytes
        + nm * _ekfac_checkpoints(cfg, k_tr) * z.shards * 8 * squares,
        mem_bytes=mem,
        gpu=True,
    )


def _fisher_size(cfg: dict[str, Any], z: _Sizes) -> tuple[int, int]:
    """(entries, blocks) of the projected Fisher: ``k^2 x k^2`` per block linear (LoGra in
    block mode), else one ``D x D`` block (a sketch is one block)."""
    blocks = layout.tracked_linears(z.s.n_layer)
    kk = int(cfg["features"]["grad_k_in"]) * int(cfg["features"]["grad_k_out"])
    per_module = cfg["curvature"]["mode"] == "block" and cfg["features"]["projection"] == "logra"
    return (blocks * kk * kk, blocks) if per_module else (z.D * z.D, 1)


def _curvature_stages(cfg: dict[str, Any], z: _Sizes) -> list[Stage]:
    """The Fisher of the gradient store, then EK-FAC's passes when enabled."""
    s, nm, k_tr, n_pool, n_queries = z.s, z.nm, z.k_tr, z.n_pool, z.n_queries
    budget = layout.ekfac_memory_bytes(cfg)
    b = int(cfg["features"]["batch_windows"])
    cov, n_blocks = _fisher_size(cfg, z)
    out = [
        Stage(
            "curvature",
            nm * k_tr,
            f"{cfg['curvature']['mode']} Fisher of {n_pool:,} rows",
            # the sums, then the eigendecomposition (about 9 n^3 a block with its vectors)
            flops=nm * k_tr * (2 * n_pool * cov + 9 * cov * math.sqrt(cov / max(1, n_blocks))),
            disk_bytes=nm * k_tr * cov * 8,  # the float64 eigenvectors (and eigenvalues)
            # six float64 arrays the size of the blocks: the sums, the mean and its symmetrized
            # copy, the eigenvectors and LAPACK's syevd workspace (2 n^2); + 0.2 GB: the job's
            # LAPACK and gradient-store reader. Measured at D = 15,360 under Slurm: 11.0 GB a
            # job (three arrays, the earlier count, planned 6.0 GB)
            mem_bytes=BASE_BYTES + 0.2e9 + 6 * cov * 8,
        )
    ]
    if "ekfac" in cfg["methods"]["enabled"] or layout.astra_enabled(cfg):
        ekfac = _ekfac_stage(s, nm, n_pool, n_queries, budget, b)
        out.append(
            _with_astra(cfg, ekfac, s, n_pool, n_queries, b) if layout.astra_enabled(cfg) else ekfac
        )
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
    enc, enc_matmul, enc_tokens = encoder_size(cfg)
    # distinct texts: the shared pool windows once, each twin's planted windows, the queries
    texts = n_pool + (nm - 1) * z.counts["planted"]
    e_tok = texts * min(W, enc_tokens) + n_queries * z.query_tokens
    embed = Stage(
        "embed",
        nm + 1,  # the shared job embeds both pools' texts once; one job per twin reads it
        f"encoder (~{enc / 1e6:.0f}M params) on pool + queries",
        tokens=e_tok,
        flops=e_tok * 2 * enc_matmul,
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
    # an influence job also loads the Fisher's float64 eigenvectors and forms a copy of them
    # (measured at D = 15,360 under Slurm: 4.0 GB a job)
    fisher = 2 * _fisher_size(cfg, z)[0] * 8 if set(methods) & set(CURVATURE_METHODS) else 0
    return Stage(
        "score",
        nm * len(methods),
        f"{len(methods)} methods x {nm} models x {n_queries:,} queries x "
        f"{n_pool:,} windows = {_si(nm * len(methods) * pairs)} pairs",
        flops=sflops,
        disk_bytes=nm * len(methods) * n_queries * (k * 32 + 64),
        # torch imported (plantbench.artifacts: 0.4 GB with pandas, measured), the pool's and
        # the queries' features in float32, float64 tiles of scores
        mem_bytes=BASE_BYTES
        + TORCH_IMPORT_BYTES
        + (n_pool + n_queries) * D * 4
        + 3 * 8 * int(cfg["scoring"]["query_block"]) * int(cfg["scoring"]["pool_block"])
        + fisher,
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


def _with_astra(
    cfg: dict[str, Any], st: Stage, s: Shape, n_pool: int, n_queries: int, b: int
) -> Stage:
    """The final ``ekfac`` stage with ASTRA's refinement (``ekfac_astra``,
    :mod:`plantbench.attribution.ekfac.astra`): per query ``steps`` Gauss-Newton products (and
    ``ASTRA_POWER_STEPS`` more once per model), each a forward with tangents and a backward over
    ``windows`` sample windows, counted as 1.5 gradient passes a token; its vectors share the
    query chunks' budget and ride on the same scoring passes; a second scores file; the tangents
    double a batch's activations (the logits, their tangents and the softmax's product)."""
    a = layout.astra_settings(cfg)
    products = st.jobs * (n_queries * int(a["steps"]) + layout.ASTRA_POWER_STEPS)
    tokens = products * min(int(a["windows"]), n_pool) * s.window
    return replace(
        st,
        work=f"{st.work}; ASTRA {a['steps']} steps x {a['windows']} windows a query",
        tokens=st.tokens + tokens,
        flops=st.flops + tokens * 1.5 * s.grad_flops_per_token(),
        disk_bytes=2 * st.disk_bytes,
        mem_bytes=st.mem_bytes + s.act_bytes(b * s.window),
    )


def _facts_stage(z: _Sizes) -> Stage:
    docs = z.nm * z.counts["planted"] + z.counts["distractor"]
    return Stage(
        "facts",
        1,
        f"{z.facts} facts, {docs:,} documents",
        disk_bytes=docs * 300 + z.n_queries * 100,
        mem_bytes=BASE_BYTES,  # the tables are a few MB
    )


def _reading_stage(cfg: dict[str, Any], z: _Sizes) -> Stage:
    """Each twin's checkpoints (and the fork) score the in-context prompts of the facts it never
    read: per fact one :func:`plantbench.model.queries.batch_candidate_logprobs` call."""
    s, k, c = z.s, layout.context_segments(cfg), int(cfg["facts"]["candidates"])
    per_twin = z.ckpts + (1 if layout.prefix_steps(cfg) else 0)  # + the fork
    evals = z.nm * per_twin
    t = k * SENTENCE_TOKENS + PROMPT_TOKENS  # a context prompt, both forms of a fact
    tok, flops = _candidate_rows(s, 2, t, c)
    rows = 2 * c  # both forms' prompts x the candidates
    return Stage(
        "reading",
        1,
        f"{z.nm} x {per_twin} checkpoints x {z.facts // 2} never-read facts x 2 forms, "
        f"{k} segments",
        tokens=evals * z.facts // 2 * tok,
        flops=evals * z.facts // 2 * flops,
        disk_bytes=1e4,
        # two models while the next checkpoint loads; the candidate rows' logits and
        # log-softmax (float32) and their repeated key-value cache
        mem_bytes=TORCH_BASE_BYTES
        + 8 * z.params
        + rows * ANSWER_TOKENS * s.vocab * 8
        + s.kv_bytes(rows, t + ANSWER_TOKENS),
        gpu=True,
    )


def _fidelity_stages(cfg: dict[str, Any], z: _Sizes) -> list[Stage]:
    """Exact float64 gradient products on the subset (:mod:`plantbench.attribution.fidelity`),
    one job per twin; none without a gradient method."""
    methods = [m for m in cfg["methods"]["enabled"] if m in GRAD_METHODS or m in TRACIN_METHODS]
    if not methods:
        return []
    s, p, n_q = z.s, z.s.block_linear_params, z.n_queries
    n_w = min(layout.fidelity_windows(cfg), z.n_pool)
    chunk = min(n_q, max(1, layout.FIDELITY_MEMORY_BYTES // (8 * p)))
    chunks = math.ceil(n_q / chunk)
    tok_w, tok_q = n_w * z.W, n_q * z.query_tokens
    per_token = s.grad_flops_per_token() + 2 * p  # + each example's weight gradient
    exact = (chunks * tok_w + tok_q) * per_token + 2 * n_q * n_w * p
    sweep = _sweep_flops(cfg, s, tok_w + tok_q)
    k_tr = z.k_tr if any(m in TRACIN_METHODS for m in methods) else 1
    scores = sum(2 * z.D * n_q * n_w * (z.k_tr if m in TRACIN_METHODS else 1) for m in methods)
    b = int(cfg["features"]["batch_windows"])
    cov, _ = _fisher_size(cfg, z)
    curvatures = z.k_tr if "tracin_influence" in methods else int("influence" in methods)
    n_sweep = len(layout.sweep_dims(cfg)) + len(layout.sketch_sweep_dims(cfg))
    mem = (
        TORCH_BASE_BYTES
        + 4 * z.params
        + (chunk + b) * p * 8  # a chunk of query gradients, a batch of window gradients
        + b * z.W * s.n_layer * s.linear_io * 8  # the batch's float64 inputs and deltas
        + s.act_bytes(b * z.W, GRAD_LOGIT_BYTES)
        + k_tr * n_q * z.D * 8  # the methods' query gradients and eigenvectors (float64)
        + curvatures * cov * 8
    )
    return [
        Stage(
            "fidelity",
            z.nm,
            f"{z.nm} x {n_w:,} windows x {n_q:,} queries ({chunks} chunk"
            f"{'s' if chunks > 1 else ''}), {len(methods)} methods, {n_sweep} sweep sizes",
            tokens=z.nm * ((chunks + n_sweep) * tok_w + (1 + n_sweep) * tok_q),
            flops=z.nm * (exact + sweep + scores),
            disk_bytes=z.nm * n_q * n_w * (8 + 16 * len(methods)),
            mem_bytes=mem,
            gpu=True,
        )
    ]


def _sweep_flops(cfg: dict[str, Any], s: Shape, tokens: float) -> float:
    """The fidelity sweep: per size one projected-gradient pass over the subset and queries."""
    grad, p, modules = (
        s.grad_flops_per_token(),
        s.block_linear_params,
        layout.tracked_linears(s.n_layer),
    )
    out = 0.0
    for k in layout.sweep_dims(cfg):  # LoGra k x k: project x and delta, then the outer sum
        out += tokens * (grad + 2 * k * s.n_layer * s.linear_io + 2 * k * k * modules)
    out += len(layout.sketch_sweep_dims(cfg)) * tokens * (grad + 2 * p)  # the exact gradient
    return out


def _context_masks(sec: dict[str, Any], k: int, methods: tuple[str, ...]) -> tuple[float, float]:
    """(prompt passes of one query, mean segments its batches are padded to). With 2^k at most
    ``context.lattice`` every mask runs up front in batches of consecutive keys; else the
    expected distinct masks the methods ask for, on full-length batches."""
    batch, n = int(sec["batch"]), 2**k
    if n <= int(sec["lattice"]):
        chunks = [range(i, min(i + batch, n)) for i in range(0, n, batch)]
        return n, sum(len(c) * max(x.bit_count() for x in c) for c in chunks) / n

    def distinct(draws: float, of: int) -> float:  # of ``draws`` uniform picks among ``of``
        return of * (1 - (1 - 1 / of) ** draws)

    ablations = int(sec["ablations"]) * (("contextcite" in methods) + ("at2" in methods))
    asked = distinct(ablations + int(sec["lds_masks"]), n)  # keep probability 1/2: uniform
    if "tokenshap" in methods:  # a permutation's prefix of j segments: a uniform j-subset
        perms = int(sec["shapley_permutations"])
        asked += sum(distinct(perms, math.comb(k, j)) for j in range(1, k))
    ks = {min(int(x), k) for x in (*sec["top_k"], *sec["drop_k"])}
    asked += 2 + 2 * len(ks) * len(methods)  # empty, full; each method's top-k conditions
    asked += k * ("attribot" in methods) + (2 + k) * ("attribot_pruned" in methods)
    asked += 4 * int(sec["tracllm_top"]) * math.ceil(math.log2(k)) * ("tracllm" in methods)
    return distinct(asked, n), float(k)  # the kinds of masks overlap as if drawn at random


def _context_stages(cfg: dict[str, Any], z: _Sizes) -> list[Stage]:
    """The context suite: contexts, every method's ablations under each twin, the tables."""
    s, c = z.s, int(cfg["facts"]["candidates"])
    sec = {**CONTEXT_DEFAULTS, **cfg.get("context", {})}
    k = int(sec.get("segments", layout.context_segments(cfg)))
    methods = tuple(sec.get("methods", CONTEXT_METHODS))
    masks, padded = _context_masks(sec, k, methods)
    t, full = padded * SENTENCE_TOKENS + PROMPT_TOKENS, k * SENTENCE_TOKENS + PROMPT_TOKENS
    a = ANSWER_TOKENS
    per_mask = _candidate_rows(s, 1, t, c)[1]  # a mask's prompt, then the candidates' rows
    # attention passes (AT2, AttnTrace): the full context and attntrace_subsamples subsamples
    subs = int(sec["attntrace_subsamples"]) if "attntrace" in methods else 0
    kept = float(sec["attntrace_keep"]) * k * SENTENCE_TOKENS + PROMPT_TOKENS + a
    att = {"at2", "attntrace"} & set(methods)
    att_tok = (full + a if att else 0) + subs * kept
    att_flops = (s.fwd_flops(full + a, full + a) if att else 0) + subs * s.fwd_flops(kept, kept)
    n_q, rows = z.n_queries, min(int(sec["batch"]), masks) * c
    heads = int(cfg["model"].get("n_head", 1))
    attribute = Stage(
        "context_attribute",
        z.nm,
        f"{z.nm} x {n_q:,} queries x ({masks:.0f} masks x {c} candidates + "
        f"{int(bool(att)) + subs} attention passes), {k} segments, {len(methods)} methods",
        tokens=z.nm * n_q * (masks * (t + c * a) + att_tok),
        flops=z.nm * n_q * (masks * per_mask + att_flops),
        disk_bytes=z.nm * n_q * len(methods) * (k + 8) * 40,
        # a batch's candidate rows: logits and log-softmax (float32), the repeated key-value
        # cache; every query's attention weights (float64) stay until the learned methods fit
        mem_bytes=TORCH_BASE_BYTES
        + 4 * z.params
        + rows * a * s.vocab * 8
        + s.kv_bytes(rows, full + a)
        + n_q * s.n_layer * heads * a * att_tok * 8,
        gpu=True,
    )
    return [
        _table_stage("context_build", f"{n_q:,} contexts of {k} segments", n_q * k * 200),
        attribute,
        _table_stage(  # torch and matplotlib imported
            "context_analysis", "the seed's tables, bootstrap", 1e6, TORCH_IMPORT_BYTES + 0.1e9
        ),
    ]


def _table_stage(
    name: str, work: str, disk: float, mem: float = TORCH_IMPORT_BYTES + 0.05e9
) -> Stage:
    """A suite's table step, one job, no model (by default: torch imported, the tokenizer and
    the tables)."""
    return Stage(name, 1, work, disk_bytes=disk, mem_bytes=mem)


def _conditions(s: Shape, rows: int, p: float, c: float, g: int) -> tuple[float, float]:
    """(tokens, FLOPs) of :func:`plantbench.suites.membership.trace.run_conditions`: per row
    the query alone (``p`` tokens) and the document then the query (``c``), each with the head
    on every position: the hidden states, the greedy prefix and ``g - 1`` decoding steps, and
    the KL's teacher-forced pass (+ the ``g`` continuation tokens)."""
    once = 2 * (s.fwd_flops(p, p) + s.fwd_flops(c, c))
    kl = s.fwd_flops(p + g, p + g) + s.fwd_flops(c + g, c + g)
    steps = max(g - 1, 0) * (s.fwd_flops(1, p + g) + s.fwd_flops(1, c + g))
    tokens = 3 * (p + c) + 2 * g + 2 * max(g - 1, 0)
    return rows * tokens, rows * (once + kl + steps)


def _membership_stages(cfg: dict[str, Any], z: _Sizes) -> list[Stage]:
    """The membership suite: samples, each twin's conditions, probes and controls, tables."""
    s, st = z.s, membership_settings.settings(cfg)
    n, _, d = membership_settings.sizes(st, z.counts["planted"], z.counts["distractor"])
    g, p, c = st.generate_tokens, PAD * PROMPT_TOKENS, PAD * (DOC_TOKENS + PROMPT_TOKENS)
    enc, enc_matmul, _ = encoder_size(cfg)
    # the samples and distractors once; three more templates and two noise runs (no
    # continuation) on the samples; each document alone (the likelihood baselines)
    runs = [_conditions(s, n + d, p, c, g), *[_conditions(s, n, p, c, g)] * 3]
    runs += [_conditions(s, n, p, c, 0)] * 2
    doc = PAD * DOC_TOKENS + 1
    texts = 2 * (n + d) + 3 * 2 * n  # continuations the encoder embeds (L1)
    flops = sum(f for _, f in runs) + n * s.fwd_flops(doc, doc) + texts * (g + 2) * 2 * enc_matmul
    tokens = sum(t for t, _ in runs) + n * doc
    detect = Stage(
        "membership_detect",
        z.nm,
        f"{z.nm} x ({n} samples + {d} distractors) x 6 runs of 2 conditions, {g} tokens generated",
        tokens=z.nm * tokens,
        flops=z.nm * flops,
        disk_bytes=z.nm * (n + d) * (s.n_layer + 20) * 8 * 4,
        # the encoder, and a batch's next-token log-distributions along the continuation
        # (float64 logits and their log-softmax) in the KL's teacher-forced pass
        mem_bytes=TORCH_BASE_BYTES + 4 * z.params + 4 * enc + st.batch * (c + g) * s.vocab * 16,
        gpu=True,
    )
    return [
        _table_stage("membership_samples", f"{z.nm} x {n} samples + {d} distractors", 1e5 * z.nm),
        detect,
        _table_stage("membership_analysis", "Tables 1 and 2", 1e5, BASE_BYTES + 0.05e9),
    ]


def _grounding_stages(cfg: dict[str, Any], z: _Sizes) -> list[Stage]:
    """The grounding suite: contexts, each twin's greedy responses, the tables."""
    s, st = z.s, grounding_settings.settings(cfg)
    contexts = z.facts * len(st.conditions)
    t = PAD * (st.sentences * SENTENCE_TOKENS + PROMPT_TOKENS)
    g = max(1, min(st.max_new_tokens, z.W - int(t)))
    # the prompt with the head on every position, then g - 1 steps of one token (no row
    # stopping early: an upper bound)
    flops = contexts * (s.fwd_flops(t, t) + (g - 1) * s.fwd_flops(1, t + g))
    nli = "" if st.nli_model is None else " (the NLI model not counted)"
    respond = Stage(
        "grounding_respond",
        z.nm,
        f"{z.nm} x {contexts:,} contexts of {st.sentences} sentences, up to {g} tokens{nli}",
        tokens=z.nm * contexts * (t + g - 1),
        flops=z.nm * flops,
        disk_bytes=z.nm * contexts * 400,
        # a batch's prompt logits (float32, every position) and its key-value cache
        mem_bytes=TORCH_BASE_BYTES
        + 4 * z.params
        + st.batch * t * s.vocab * 4
        + s.kv_bytes(st.batch, t + g),
        gpu=True,
    )
    return [
        _table_stage("grounding_build", f"{contexts:,} contexts", contexts * st.sentences * 200),
        respond,
        _table_stage("grounding_analysis", "CK / PK / CR tables", 1e5, BASE_BYTES + 0.05e9),
    ]


def _si(x: float) -> str:
    if x == 0:
        return "0"
    for unit, div in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"


MEM_HEADROOM = 1.25  # a rule's mem_mb over its stage's planned per-job peak


def rule_mem_mb(stages: list[Stage], stage: str, floor: int, headroom: float = MEM_HEADROOM) -> int:
    """A rule's ``mem_mb`` for its first attempt: ``stage``'s planned per-job peak memory times
    ``headroom``, in MB, at least ``floor``; ``floor`` when this config plans no such stage."""
    planned = next((st.mem_bytes for st in stages if st.stage == stage), 0.0)
    return max(int(floor), math.ceil(headroom * planned / 1e6))


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
        + "); '-' = CPU stage. Per model, pretraining takes half the pretrain row (after "
        "pretrain_prefix, trained once, when there is one). mem/job: "
        "one job's peak resident memory (its rule's mem_mb; pretrain: all train.devices "
        "processes of a twin).",
    ]
    return "\n".join(lines)


def wall_hours_pretrain(
    cfg: dict[str, Any], gpu: str, utilisation: float = DEFAULT_UTILISATION
) -> float:
    """Wall-clock hours of one model's pretraining on ``train.devices`` GPUs of that kind (the
    shared prefix, then its own steps)."""
    stages = {x.stage: x for x in plan(cfg)}
    prefix = stages["pretrain_prefix"].flops if "pretrain_prefix" in stages else 0.0
    flops = prefix + stages["pretrain"].flops / len(MODELS)
    return gpu_hours(flops, gpu, utilisation) / max(1, int(cfg["train"]["devices"]))


def check_finite(stages: list[Stage]) -> None:
    for st in stages:
        for v in (st.tokens, st.flops, st.disk_bytes):
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"stage {st.stage}: bad estimate {v}")
