"""EK-FAC influence on the block linears, unprojected: the curvature, its fit and the scores.

Eigenvalue-corrected Kronecker-factored curvature (George et al. 2018; Grosse et al. 2023, the
estimator of kronfluence and of bergson's ``ekfac``). For every block linear ``m`` with inputs
``x`` (``in``) and output gradients ``delta`` (``out``) of a window's summed next-token loss,
and the window's weight gradient ``G_m = sum_t delta_t x_t^T``:

1. Kronecker factors over all tokens of the fit windows: ``A_m = E[x x^T]``,
   ``S_m = E[delta delta^T]``; their eigenbases ``A_m = Q_A D_A Q_A^T``, ``S_m = Q_S D_S Q_S^T``.
2. Eigenvalue correction over the fit windows: ``Lambda_m[i, j] = E[(Q_S^T G_m Q_A)_ij^2]``,
   the Fisher's exact diagonal in the Kronecker eigenbasis (what K-FAC's ``D_S kron D_A``
   only approximates).
3. Damping ``lambda_m = damping_ratio * mean(Lambda_m)`` per module (the curvature's
   ``damping_ratio``, kronfluence's heuristic), and the preconditioned query gradient
   ``P_m(q) = Q_S [(Q_S^T G_m(q) Q_A) / (Lambda_m + lambda_m)] Q_A^T``.
4. ``score(q, d) = sum_m <P_m(q), G_m(d)>``: ``g_q^T (F_EK + lambda)^-1 g_d``.

The Fisher is the empirical one (each window's own next tokens), fitted on the pool windows,
like the projected curvature of ``influence``; the fit and the scoring pass read every pool
window at the final checkpoint. Scale and sign: the first-order decrease of the query's loss per
unit of upweighting ``d``; > 0 = proponent.

Artifact ``<replicate>/features/<model>/ekfac/``: ``scores.npy`` (float64
``[n_queries, n_pool]`` in pool-row order) and ``meta.json`` (per-module damping and eigenvalue
summary, seconds of each pass). ``tracin_ekfac`` (off by default) also needs the same at each
other TracIn checkpoint: ``features/<model>/ekfac_tracin/<checkpoint>/`` (:func:`folder_of`,
``plantbench ekfac --checkpoint``), fitted and scored at that checkpoint.
"""
