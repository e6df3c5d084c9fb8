"""The whole answer of a model with neighbours, in ``dslide bench topk``.

A default model fuses the network's top candidates with the votes of a row's nearest
training points (``docs/accuracy.md``), so what a user is served is more than the output
layer's top k. When the model was saved with its neighbour index, the benchmark also
answers the rows as :meth:`SlideClassifier.predict_topk` does: every label and every
point scored ("fused exact"), then through the serving indexes
:meth:`~SlideClassifier.build_index` makes (the output index, the points' hidden-space
search, the input's postings less the common features'). The second row's recall is
against the first: the share of the fused exact top k it returns. A model saved with its
output index is answered exactly first, then through an index built again with the
stored one's settings.
"""

from __future__ import annotations

import dataclasses
import time


def fused_rows(url: str, storage_options: dict, X, k: int, args) -> list[dict]:
    """The two fused contenders' rows (``ids``, rows/s, one-row latency, build seconds,
    ``recall`` against the fused exact answer), or none when the model keeps no
    neighbours."""
    from dslide_dask import SlideClassifier
    from dslide_dask.inference.recall import recall_at_k
    from dslide_workflows.bench.latency import timed_answers

    clf = SlideClassifier.load(url, storage_options=storage_options, answering=True)
    if clf.neighbours_ is None or clf.neighbour_weight_ is None:
        return []
    clf.set_params(n_threads=args.threads)
    a, b, *c = clf.neighbour_weight_
    print(
        f"neighbours: {clf.neighbours_.n_points} points, weights input {a} / hidden {b}"
        + (f" / label classifiers {c[0]}" if c else "")
        + (f" / label centroids {c[1]}" if len(c) > 1 else "")
        + f", tail {clf.tail_exponent_}, mix {clf.neighbour_mix}"
    )

    stored = clf.output_index_  # a model saved with its index: answered exactly first
    clf.drop_index()

    def measure() -> dict:
        def answer(rows):
            return clf.predict_topk(rows, k)

        return timed_answers(answer, X, args.batch, args.repeat, args.latency_rows)

    exact = measure()
    exact.update(recall=1.0, **{"recall@1": 1.0})
    nan = float("nan")  # candidates a row are the network's and the votes': not one count
    rows = [{"setting": "fused exact", "scored_per_row": nan, **exact}]
    t0 = time.perf_counter()
    try:
        clf.build_index(**({} if stored is None else dataclasses.asdict(stored.settings)))
    except ImportError as err:  # faiss missing: the exact answer alone
        print(f"fused, indexes: left out ({err})")
        return rows
    build_s = time.perf_counter() - t0
    served = measure()
    served.update(build_s=build_s, recall=recall_at_k(served["ids"], exact["ids"]))
    served["recall@1"] = recall_at_k(served["ids"][:, :1], exact["ids"][:, :1])
    return [*rows, {"setting": "fused, indexes", "scored_per_row": nan, **served}]
