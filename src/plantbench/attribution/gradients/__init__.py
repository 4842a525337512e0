"""LoGra-style projected per-example gradients and the sharded gradient store.

What is projected
-----------------
Every ``nn.Linear`` inside the transformer blocks (:func:`plantbench.model.modeling.block_linear_names`;
for Llama: q, k, v, o, gate, up, down of every layer; weights only, Llama's linears have no bias).
For a module with input size ``i`` and output size ``o`` the per-example weight gradient is
``G_n = sum_t delta_{n,t} x_{n,t}^T`` (``o x i``), where ``x`` is the module's input and
``delta = dL_n/d(output)``. Two fixed Gaussian matrices ``P_in`` (``k_in x i``) and ``P_out``
(``k_out x o``), entries ``N(0, 1/k)`` so that norms are preserved in expectation, give

    g_n = vec(P_out G_n P_in^T) = sum_t (P_out delta_{n,t}) (P_in x_{n,t})^T      (k_out x k_in)

which equals ``(P_out kron P_in) vec(G_n)`` with row-major ``vec``. We project first (forward
hooks project ``x``, tensor hooks on the module output project ``delta``) and never form ``G_n``:
the cost per module is ``O(T (i k_in + o k_out + k_in k_out))`` per example instead of
``O(i o)`` memory and ``O(i o k_in k_out)`` time for a dense projection of the full gradient.
Module blocks are concatenated in ``block_linear_names`` order into one vector of
``D = sum_m k_out k_in`` values; :attr:`Projector.slices` says where each module lives.

Projection matrices are never stored: they are regenerated in float64 from
``plantbench.rng.rng(seed, "proj", module_name, side)`` (``side`` = ``"in"`` / ``"out"``) and
then cast, so a seed plus the module list identifies them on any machine.

Default dimensions: ``k_in = k_out = 8`` per module (64 values per module; 28 modules of the
default 4-layer model -> ``D = 1,792``), chosen so that the default study's store and the full
Fisher stay small (1,792^2 float64 = 25 MB) while every module keeps a 64-dim block. The paper
preset asks for 15,360 dims over the seed's 60 linear layers, i.e. 256 per module = 16 x 16;
:func:`choose_module_dims` splits a total target into ``(k_out, k_in)`` (a 12-layer Llama has 84
block linears: 15,360 -> 13 x 14 per module, D = 15,288).

Loss
----
Per example: the *sum* over target positions of next-token cross-entropy. ``loss_mask[n, t]``
marks token ``t`` as a target (predicted from tokens ``< t``); column 0 has no prediction and is
ignored. Pool windows use every position; queries mark only answer tokens. With an
``attention_mask`` (1 = real token) a target also needs itself and its predecessor to be real,
and positions are counted from the first real token, so right or left padding gives the same
gradient as the unpadded example. Each example's loss depends only on its own row, so summing
the per-example losses and back-propagating once gives every example its own gradient; with the
eager (math) attention kernel and ``model.eval()`` batching does not change an example's
gradient beyond floating-point reassociation (exact in float64 up to ~1e-12).

The parameter gradients themselves are never computed: parameters are frozen for the call and
gradient flows from the (detached, grad-requiring) input embeddings, so backward computes only
activation gradients. Nor are the logits: the output layer and the loss are one chunked step
that computes the gradient of every target row's loss with respect to the final hidden state
in closed form (:mod:`plantbench.model.headloss`; the same gradients, in float64 to ~1e-12), so rows
that are not targets cost nothing and no ``[n, T, V]`` tensor is held.

Store layout (one shard = one folder)
-------------------------------------
::

    <shard>/grads.bin     raw C-order little-endian array [rows, D], float16 or float32
    <shard>/shard.json    identity (format, module names and (k_out, k_in), D, dtype,
                          projection seed, model label, checkpoint name/step, manifest hash,
                          config hash), rows, keys (window indices, row order), "complete",
                          byte size and xxh3 of grads.bin

A shard is built in ``<parent>/.<name>.partial/`` (same files, plus ``progress.json``: the
identity, the keys and the finished row ranges) and renamed to ``<shard>`` only when every row is
written, so a finished shard is never half-written. ``progress.json`` is rewritten (atomically)
only after the rows it lists were flushed to ``grads.bin``, so an interrupted job resumes from
the rows it lists and recomputes at most one batch. A partial folder made for a different
identity or key list is discarded and started over.
"""
