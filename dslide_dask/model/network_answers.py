"""The network's own P@k from the pass that scores the fused model: no second pass.

The fused answer asks the network for each row's best candidates, exactly when asked for
exact answers; their first ``k`` are the network's own top-k. :class:`Recorded` keeps
what the network answered, so an evaluation reports the whole model's P@k and the
network's beside it (as ``dslide train``'s summary does) from one pass over the rows.
"""

from __future__ import annotations

import numpy as np

from dslide_dask.data.csr import CSR
from dslide_dask.metrics import metrics_of_sums, xc_metrics
from dslide_dask.model.fused import FusedModel, Network
from dslide_dask.model.tree_shards import TreeLosses


class Recorded:
    """``net`` (a :class:`~dslide_dask.model.fused.Network`), keeping the ids of each
    ``topk_scores`` answer in order."""

    def __init__(self, net: Network) -> None:
        self.net = net
        self.answers: list[np.ndarray] = []

    def topk_scores(self, X: CSR, k: int, exact: bool = True):
        ids, scores = self.net.topk_scores(X, k, exact)
        self.answers.append(ids)
        return ids, scores

    def embed(self, X: CSR) -> np.ndarray:
        return self.net.embed(X)

    def top(self, n_rows: int, k: int) -> np.ndarray | None:
        """The network's top ``k`` of ``n_rows`` rows asked once each, in order (None: it
        was not asked so, e.g. a model that does not weigh it)."""
        if not self.answers:
            return None
        top = np.concatenate(self.answers)
        return top[:, :k] if top.shape == (n_rows, top.shape[1]) and top.shape[1] >= k else None


def metrics_with_network(
    fused: FusedModel,
    net: Network,
    X: CSR,
    Y: CSR,
    ks: tuple[int, ...],
    exact: bool,
    trees: TreeLosses | None = None,
) -> dict[str, float]:
    """The whole model's P@k, nDCG@k and PSP@k on rows ``X`` with labels ``Y``, and,
    with exact answers, the network's own P@k as ``network P@k`` from the same pass."""
    recorded = Recorded(net)
    scores = metrics_of_sums(fused.metric_sums(recorded, X, Y, ks, exact, trees))
    top = recorded.top(X.n_rows, max(ks)) if exact else None
    if top is not None:
        alone = xc_metrics(top, Y, ks)
        scores.update({f"network P@{k}": alone[f"P@{k}"] for k in ks})
    return scores
