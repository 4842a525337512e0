"""The audit server, the seed's deployment prototype: ``plantbench serve --model A``.

It loads a twin and the probe its membership pass fitted (``membership/<model>/probe.json``: the
target layers, their PC1 and supervised directions, and the L3-only CRM-LR, which the seed's
Table 2 shows loses nothing against the full probe), and answers

- ``POST /audit`` with ``{"context": ..., "query": ...}``: the per-layer LTS trajectory (both
  directions) and the membership probability, as JSON; one forward pass per condition, both in
  one batch. An empty context or query, or a context whose prompt does not fit the twin's
  window, is refused with HTTP 422 and the reason;
- ``GET /``: a small dashboard that posts a context and a query and plots the trajectory;
- ``GET /health``: the twin, its probe's layers and the window.
"""

# no `from __future__ import annotations`: FastAPI reads the request model from the
# annotation of the endpoint defined inside app()
import json
from pathlib import Path
from typing import Any

import numpy as np

from plantbench import artifacts
from plantbench.data import tokenizer
from plantbench.suites.membership.trace import last_states


class AuditError(ValueError):
    """A request the auditor refuses (HTTP 422)."""


class Auditor:
    def __init__(self, model: Any, tok: Any, probe: dict[str, Any]):
        self.model, self.tok, self.probe = model, tok, probe
        self.window = int(model.config.max_position_embeddings)
        self.layers = [int(x) for x in probe["layers"]]
        self.pc1, self.sup = np.array(probe["pc1"]), np.array(probe["sup"])
        self.mean, self.scale = np.array(probe["mean"]), np.array(probe["scale"])
        self.coef, self.intercept = np.array(probe["coef"]), float(probe["intercept"])

    def prompts(self, context: str, query: str) -> tuple[list[int], list[int]]:
        scalar_text("context", context)
        scalar_text("query", query)
        if not context.strip():
            raise AuditError("the context is empty: give the document to audit")
        if not query.strip():
            raise AuditError("the query is empty: give the question to answer from the context")
        q = tokenizer.encode_batch(self.tok, [query])[0]
        full = self.probe["template"].format(context=context, query=query)
        c = tokenizer.encode_batch(self.tok, [full])[0]
        if 1 + len(c) > self.window:
            raise AuditError(
                f"the context and query take {1 + len(c)} tokens, more than the twin's window of "
                f"{self.window}; shorten the context"
            )
        return [tokenizer.BOS_ID, *q], [tokenizer.BOS_ID, *c]

    def audit(self, context: str, query: str) -> dict[str, Any]:
        p0, pc = self.prompts(context, query)
        h = last_states(self.model, [p0, pc])
        d = (h[1] - h[0])[self.layers]  # [k, dim]
        pc1 = np.einsum("kd,kd->k", d, self.pc1)
        sup = np.einsum("kd,kd->k", d, self.sup)
        z = (np.concatenate([pc1, sup]) - self.mean) / self.scale
        logit = float(z @ self.coef + self.intercept)
        return {
            "model": self.probe["model"],
            "layers": self.layers,
            "lts_pc1": pc1.tolist(),
            "lts_sup": sup.tolist(),
            "displacement_norm": np.linalg.norm(h[1] - h[0], axis=1).tolist(),
            "probability": 1.0 / (1.0 + np.exp(-logit)),
            "tokens": len(pc),
        }


def scalar_text(field: str, text: str) -> None:
    """Refuse text that is not a sequence of Unicode scalar values (JSON can carry a lone
    surrogate such as ``"\\ud800"``, which has no UTF-8 form)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise AuditError(
            f"the {field} holds U+{ord(text[exc.start]):04X} at character {exc.start}, a lone "
            "surrogate that is not a Unicode scalar value; send valid UTF-8 text"
        ) from None


# membership.max_request_bytes: the largest request body the server reads (a context longer than
# the twin's window is refused anyway; this bounds the memory and time spent before that)
MAX_REQUEST_BYTES = 1_000_000


def max_request_bytes(cfg: dict[str, Any]) -> int:
    """``membership.max_request_bytes`` (default :data:`MAX_REQUEST_BYTES`)."""
    return int((cfg.get("membership") or {}).get("max_request_bytes", MAX_REQUEST_BYTES))


class BodyLimit:
    """ASGI middleware: the request body is read here, at most ``limit`` bytes of it; a larger
    one (by its Content-Length or as it streams in) is answered with HTTP 413 before the
    endpoint sees it."""

    def __init__(self, inner: Any, limit: int):
        self.inner, self.limit = inner, limit

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await self._refuse(send)
            return
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                await self.inner(scope, receive, send)
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                await self._refuse(send)
                return
            more = bool(message.get("more_body"))
        body = b"".join(chunks)
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.inner(scope, replay, send)

    async def _refuse(self, send: Any) -> None:
        detail = (
            f"the request is larger than {self.limit} bytes (membership.max_request_bytes); "
            "send a shorter context"
        )
        body = json.dumps({"detail": detail}).encode()
        start: dict[str, Any] = {"type": "http.response.start", "status": 413}
        start["headers"] = [(b"content-type", b"application/json")]
        await send(start)
        await send({"type": "http.response.body", "body": body})


def app(auditor: Auditor, max_bytes: int = MAX_REQUEST_BYTES) -> Any:
    """The FastAPI application around one auditor, reading request bodies of at most
    ``max_bytes`` bytes."""
    from fastapi import FastAPI, HTTPException
    from fastapi.responses import HTMLResponse
    from pydantic import BaseModel

    class Request(BaseModel):
        context: str
        query: str

    api = FastAPI(title="plantbench membership audit")

    @api.post("/audit")
    def audit(req: Request) -> dict[str, Any]:
        try:
            return auditor.audit(req.context, req.query)
        except AuditError as e:
            raise HTTPException(status_code=422, detail=str(e)) from None

    @api.get("/health")
    def health() -> dict[str, Any]:
        return {"model": auditor.probe["model"], "layers": auditor.layers, "window": auditor.window}

    @api.get("/", response_class=HTMLResponse)
    def dashboard() -> str:
        return DASHBOARD

    return BodyLimit(api, max_bytes)


def load(paths: Any, model_name: str) -> Auditor:
    from plantbench import io
    from plantbench.model.modeling import load_model

    folder = paths.membership(model_name)
    io.read_meta(folder, "membership_detect")
    probe = json.loads(Path(folder / "probe.json").read_text())
    model = load_model(artifacts.final_checkpoint_path(paths, model_name), attn="sdpa")
    return Auditor(model, tokenizer.load(paths.tokenizer), probe)


DASHBOARD = """<!doctype html>
<html><head><meta charset="utf-8"><title>plantbench membership audit</title>
<style>
body{font-family:sans-serif;margin:2em;max-width:900px}
textarea{width:100%;height:6em}input{width:100%}
#p{font-size:1.4em;margin:.5em 0}svg{border:1px solid #ccc;background:#fafafa}
</style></head><body>
<h1>Membership audit</h1>
<p>Was this document in the twin's training data? The probe compares the twin's last-token
hidden states with the document before the query and without it (CRM's latent trajectory
shift, one value per target layer).</p>
<label>Context<textarea id="context"></textarea></label>
<label>Query<input id="query"></label>
<p><button id="go">Audit</button></p>
<div id="p">membership probability: –</div>
<div id="err" style="color:#b00"></div>
<svg id="plot" width="640" height="260"></svg>
<script>
const q = new URLSearchParams(location.search);
document.getElementById('context').value = q.get('context') || '';
document.getElementById('query').value = q.get('query') || '';
function draw(r) {
  const svg = document.getElementById('plot'), W = 640, H = 260, m = 40;
  const ys = r.lts_pc1.concat(r.lts_sup), lo = Math.min(0, ...ys), hi = Math.max(0, ...ys) || 1;
  const x = i => m + i * (W - 2 * m) / Math.max(1, r.layers.length - 1);
  const y = v => H - m - (v - lo) * (H - 2 * m) / (hi - lo || 1);
  let s = `<line x1="${m}" y1="${y(0)}" x2="${W - m}" y2="${y(0)}" stroke="#999"/>`;
  for (const [key, col] of [['lts_pc1', '#4c72b0'], ['lts_sup', '#dd8452']]) {
    const pts = r[key].map((v, i) => `${x(i)},${y(v)}`).join(' ');
    s += `<polyline points="${pts}" fill="none" stroke="${col}" stroke-width="3"/>`;
    r[key].forEach((v, i) => s += `<circle cx="${x(i)}" cy="${y(v)}" r="5" fill="${col}"/>`);
  }
  r.layers.forEach((l, i) => s += `<text x="${x(i)}" y="${H - 10}" text-anchor="middle">layer ${l}</text>`);
  s += `<text x="${m}" y="20" fill="#4c72b0">LTS along PC1</text>`;
  s += `<text x="${m + 160}" y="20" fill="#dd8452">LTS along the supervised direction</text>`;
  svg.innerHTML = s;
}
async function go() {
  const body = {context: document.getElementById('context').value, query: document.getElementById('query').value};
  const res = await fetch('/audit', {method: 'POST', headers: {'Content-Type': 'application/json'}, body: JSON.stringify(body)});
  const r = await res.json();
  if (!res.ok) { document.getElementById('err').textContent = r.detail; return; }
  document.getElementById('err').textContent = '';
  document.getElementById('p').textContent = 'membership probability: ' + r.probability.toFixed(3);
  draw(r);
}
document.getElementById('go').onclick = go;
if (q.get('context')) go();
</script></body></html>
"""
