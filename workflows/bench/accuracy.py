"""``dslide bench accuracy``: time to accuracy against the tools a user would pick instead.

Every contender trains on the same shuffled rows of any XC data (``--train``/``--test``
URLs, or a synthetic ``--preset``) in its own fresh Python process with the same number
of threads, and is scored on the same test rows by P@k, nDCG@k and PSP@k (propensities
from the training labels; PSP normalised by the best achievable, as the XC Repository
reports it):

- ``engine``: ``SlideClassifier`` in-process, scored after every epoch;
- ``engine-share0`` and ``engine-network``: the same fit with the network's share of the
  fused answer at 0, and the network alone (:data:`ABLATIONS`): what the network adds,
  and what it answers by itself, from one command;
- ``engine-tree``: the same fit's label trees alone, each test row's labels found by the
  trees' own search (their best leaf nodes): our best tree, beside the libraries' trees;
- ``engine-cluster``: the same on a LocalCluster of ``--threads`` one-thread worker
  processes (started before the clock, closed at the end);
- ``engine-ensemble``: a ``SlideEnsemble`` of ``--members`` differently seeded
  classifiers of ``--member-epochs`` epochs each, trained one after another, scored after
  each member (the ensemble so far);
- ``dense``: the PyTorch full-softmax baseline of ``bench engine``, with the engine's
  network and optimiser settings, scored after every epoch;
- ``omikuji``, ``napkinxc`` and ``pecos`` (PECOS XR-Linear): label-tree libraries from
  PyPI with their default settings, one point each; their runners are in
  :mod:`dslide_workflows.bench.trees`, which says how to install them.

"train s" is the wall-clock time from constructing the model to the end of training
(JIT compilation included; scoring after each epoch excluded), so each per-epoch point
is P@1 against the time a user would have waited for that model. The first run after
installing (or changing) the engine includes compiling its kernels, which numba then
caches on disk; run twice to see the steady state.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dslide_workflows.args import add_storage_arguments, positive_int
from dslide_workflows.bench import engine as engine_bench
from dslide_workflows.bench import trees
from dslide_workflows.bench.accuracy_report import format_report, plot_p1
from dslide_workflows.bench.contender import FILTER_HELP, PRESET_POINTS, prepare_data
from dslide_workflows.bench.data import load_datasets
from dslide_workflows.bench.flags import add_preset
from dslide_workflows.bench.trees import answer_width, scorer
from dslide_workflows.classifier import make_classifier

SUMMARY = "time to accuracy: SLIDE engine vs dense PyTorch and label-tree libraries"
#: The engine's fused model with a part taken away, each run as a contender of its own so
#: that one command reports what the network adds: "engine-share0", the same fit with the
#: network's share at 0 (its softmax and hidden-space votes unweighed), and
#: "engine-network", the network alone (no neighbours, centroids or trees).
ABLATIONS: dict[str, dict[str, Any]] = {
    "engine-share0": {"neighbour_weight": (1.0, 0.0)},
    "engine-network": {"neighbours": 0},
}
ENGINES = ("engine", *ABLATIONS, "engine-tree", "engine-cluster", "engine-ensemble")
CONTENDERS = (*ENGINES, "dense", *trees.RUNNERS)
#: The module each contender needs, and how to get it when it is missing.
REQUIRES = {
    "dense": ("torch", "pip install 'dslide-dask[bench]'"),
    **{name: (name, pip) for name, pip in trees.INSTALL.items()},  # module = contender
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``dslide bench accuracy``."""
    d = parser.add_argument_group("data (XC text URLs, or a synthetic preset)")
    d.add_argument("--train", metavar="URL", help="training data: XC text, any fsspec URL")
    d.add_argument("--test", metavar="URL", help="test data (with --train)")
    add_preset(d, default=None, about="synthetic preset instead of --train/--test (e.g. small)")
    for split, n in zip(("train", "test"), PRESET_POINTS, strict=True):
        d.add_argument(
            f"--{split}-points",
            type=positive_int,
            default=None,
            metavar="N",
            help=f"use the first N points of the shuffled {split} split (default: all of "
            f"a URL's, {n} of a preset's)",
        )
    d.add_argument("--filter-labels", metavar="URL", help=FILTER_HELP)
    d.add_argument("--data-seed", type=int, default=0, help="shuffle/generator seed (default: 0)")
    d.add_argument("--cache-dir", type=Path, default=None, help="cache of generated presets")
    d.add_argument("--refresh-data", action="store_true", help="regenerate a preset if cached")
    add_storage_arguments(d)
    c = parser.add_argument_group("contenders")
    c.add_argument(
        "--contenders",
        type=_contender_list,
        default=CONTENDERS,
        metavar="A,B,...",
        help=f"which to run, in order (default: {','.join(CONTENDERS)})",
    )
    c.add_argument("--epochs", type=positive_int, default=5, help="engine and dense (default: 5)")
    c.add_argument(
        "--members", type=positive_int, default=3, help="engine-ensemble's models (default: 3)"
    )
    c.add_argument(
        "--member-epochs",
        type=positive_int,
        default=2,
        help="epochs of each engine-ensemble member (default: 2)",
    )
    c.add_argument("--threads", type=positive_int, default=2, help="per contender (default: 2)")
    c.add_argument("--seed", type=int, default=0, help="model seed (default: 0)")
    c.add_argument(
        "--repeats",
        type=positive_int,
        default=1,
        metavar="N",
        help="run each contender N times, with model seeds SEED ... SEED+N-1 (omikuji "
        "takes no seed: its runs differ by themselves); the table gives the means, a line "
        "each contender's runs (default: 1)",
    )
    engine_bench.add_engine_opt(
        c,
        "hidden=[512] --engine-opt lr=0.02 (default: the classifier's defaults); the dense "
        "baseline takes the same hidden, batch_size, lr, betas and init_std",
    )
    c.add_argument(
        "--log-every",
        type=int,
        default=0,
        metavar="N",
        help="engine and dense print progress every N batches (default: 0, never)",
    )
    m = parser.add_argument_group("metrics and output")
    m.add_argument("--propensity-a", type=float, default=0.55, help="PSP's A (default: 0.55)")
    m.add_argument("--propensity-b", type=float, default=1.5, help="PSP's B (default: 1.5)")
    m.add_argument("--json", type=Path, default=None, metavar="OUT", help="write results as JSON")
    m.add_argument(
        "--plot", type=Path, default=None, metavar="PNG", help="draw P@1 against training seconds"
    )


def _contender_list(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in CONTENDERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown contender(s) {','.join(unknown) or '(none)'}; choose from "
            f"{','.join(CONTENDERS)}"
        )
    return tuple(dict.fromkeys(names))


# -- data --------------------------------------------------------------------------------------
def _describe(info: dict[str, Any], train, test) -> str:
    name = info.get("preset") or f"{info['train']} / {info['test']}"
    pairs = f", {info['excluded_pairs']} test pairs filtered" if "excluded_pairs" in info else ""
    return (
        f"{name}: {train.n_points} train / {test.n_points} test points, {train.n_features} "
        f"features, {train.n_labels} labels, {train.Y.nnz / max(train.n_points, 1):.1f} "
        f"labels a point{pairs}"
    )


# -- contenders (each runs in its own process) -------------------------------------------------
def run_engine(
    train, test, config: dict[str, Any], client=None, name: str | None = None
) -> dict[str, Any]:
    """Fit a SlideClassifier for ``epochs``, scoring it on ``test`` after each epoch and
    as the fit returns it (the last epoch's point: the whole fit's seconds), off the
    clock (``name``: an :data:`ABLATIONS` entry, its parameters over the classifier's)."""
    from dslide_workflows.bench.torch_dense import peak_rss_mb

    score = scorer(train, test, config)
    params = {**config["classifier"], **ABLATIONS.get(name or "", {})}
    clf = make_classifier(params).set_params(client=client)
    # rows held out of the network's training (to weigh the neighbours) are not stepped on
    steps_per_epoch = -(-clf.n_network_rows(train.n_points) // clf.batch_size)
    name = name or ("engine" if client is None else "engine-cluster")
    report = engine_bench._progress(
        name, clf.n_network_rows(train.n_points) * clf.epochs, config["log_every"]
    )
    curve: list[dict[str, Any]] = []
    seen, paused = [0], [0.0]

    def evaluate(step: int, final: bool = False) -> None:
        if curve and curve[-1]["step"] == step:
            if not final:
                return
            # the fit ends after its last epoch (held rows indexed, the label tree built):
            # the model returned, and the whole fit's seconds, replace the epoch's point
            curve.pop()
        t = time.perf_counter()
        topk = clf.predict_topk(test.X, answer_width(config))
        point = {"epoch": step / steps_per_epoch, "step": step, "samples": seen[0], "fitted": final}
        curve.append({**point, "seconds": t - t0 - paused[0], **score(topk)})
        paused[0] += time.perf_counter() - t

    def callback(stats: dict) -> None:
        seen[0] += stats["samples"]
        report(stats["step"], seen[0])
        if stats["step"] % steps_per_epoch == 0:
            # on a cluster, statistics come in chunks of a few steps after they ran: the
            # model scored may be those few steps further on
            evaluate(stats["step"])

    t0 = time.perf_counter()
    clf.fit(train.X, train.Y, callback=callback)
    evaluate(clf.n_steps_, final=True)
    rss = peak_rss_mb()
    if client is not None:  # the model lives in the workers
        rss += sum(client.run(peak_rss_mb).values())
    clf.close()
    last = curve[-1]
    return {
        **last,
        "contender": name,
        "train_seconds": last["seconds"],
        "samples_per_s": last["samples"] / last["seconds"],
        "curve": curve,
        "params": {k: v for k, v in clf.get_params().items() if k != "client"},
        "peak_rss_mb": rss,
    }


def run_engine_tree(train, test, config: dict[str, Any]) -> dict[str, Any]:
    """The default fit's label trees alone, each row's labels those of least path loss
    in the trees' best :data:`~dslide_dask.model.label_tree.SEARCH_BEAM` leaf nodes
    (:meth:`~dslide_dask.model.neighbours.NeighbourIndex.tree_search`). One point, at
    the end: the trees are built as the fit ends, so its seconds are the whole fit's."""
    from dslide_dask.model.label_tree import SEARCH_BEAM

    score = scorer(train, test, config)
    clf = make_classifier(config["classifier"])
    t0 = time.perf_counter()
    clf.fit(train.X, train.Y)
    seconds = time.perf_counter() - t0
    fused = clf.fused_model()
    if fused is None or not fused.index.trees:
        raise ValueError("engine-tree: the fit built no label tree (neighbours or label_tree 0)")
    ids, _ = fused.index.tree_search(test.X, SEARCH_BEAM, answer_width(config))
    clf.close()
    params = {k: v for k, v in clf.get_params().items() if k != "client"}
    return {**trees.tree_result("engine-tree", seconds, score(ids)), "params": params}


def run_engine_ensemble(train, test, config: dict[str, Any]) -> dict[str, Any]:
    """A SlideEnsemble of ``members`` classifiers of ``member_epochs`` epochs, scored after
    each member joins (off the clock): P@1 against the time spent on the members so far."""
    from dslide_dask.ensemble import SlideEnsemble
    from dslide_workflows.bench.torch_dense import peak_rss_mb

    score = scorer(train, test, config)
    base = make_classifier({**config["classifier"], "epochs": config["member_epochs"]})
    curve: list[dict[str, Any]] = []
    paused = [0.0]

    def evaluate(member: int, ensemble: SlideEnsemble) -> None:
        t = time.perf_counter()
        point = {"members": member + 1, "epoch": (member + 1) * base.epochs}
        point["samples"] = point["epoch"] * train.n_points
        topk = ensemble.predict_topk(test.X, answer_width(config))
        curve.append({**point, "seconds": t - t0 - paused[0], **score(topk)})
        paused[0] += time.perf_counter() - t

    t0 = time.perf_counter()
    ensemble = SlideEnsemble(base, n_models=config["members"]).fit(train.X, train.Y, evaluate)
    ensemble.close()
    last = curve[-1]
    return {
        **last,
        "contender": "engine-ensemble",
        "train_seconds": last["seconds"],
        "samples_per_s": last["samples"] / last["seconds"],
        "curve": curve,
        "params": {**config["classifier"], "epochs": base.epochs, "members": len(curve)},
        "peak_rss_mb": peak_rss_mb(),
    }


def run_engine_cluster(train, test, config: dict[str, Any]) -> dict[str, Any]:
    """:func:`run_engine` on a LocalCluster of ``n_threads`` one-thread worker processes."""
    from distributed import Client, LocalCluster

    n = config["classifier"]["n_threads"]
    t0 = time.perf_counter()
    with (
        LocalCluster(
            n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        start = time.perf_counter() - t0
        out = run_engine(train, test, config, client)
    return {**out, "cluster_start_seconds": start, "workers": n}


def run_dense(train, test, config: dict[str, Any]) -> dict[str, Any]:
    """bench engine's dense baseline, scored after each epoch off the clock."""
    score = scorer(train, test, config)
    curve: list[dict[str, Any]] = []

    def on_epoch(epoch: int, seconds: float, topk: Callable) -> None:
        curve.append(
            {"epoch": epoch, "seconds": seconds, **score(topk(test.X, answer_width(config)))}
        )

    out = engine_bench.run_dense(train, test, config, on_epoch=on_epoch)
    return {**out, **curve[-1], "contender": "dense", "curve": curve}


RUNNERS: dict[str, Callable[..., dict[str, Any]]] = {
    "engine": run_engine,
    **{name: functools.partial(run_engine, name=name) for name in ABLATIONS},
    "engine-tree": run_engine_tree,
    "engine-cluster": run_engine_cluster,
    "engine-ensemble": run_engine_ensemble,
    "dense": run_dense,
    **trees.RUNNERS,
}


# -- the command -------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    """``dslide bench accuracy``: data, each contender in its own process, table and plot."""
    if (args.train is None) != (args.test is None):
        raise ValueError("--train and --test go together")
    if (args.train is None) == (args.preset is None):
        raise ValueError("give either --train URL --test URL or --preset NAME")
    params = {"epochs": args.epochs, "n_threads": args.threads, "seed": args.seed}
    params.update(args.engine_opt)
    clf = make_classifier(params)  # bad parameters fail now, not after reading the data
    for name in ABLATIONS.keys() & set(args.contenders):
        make_classifier({**params, **ABLATIONS[name]})
    if "engine-tree" in args.contenders and not (clf.neighbours and clf.label_tree):
        raise ValueError(
            "engine-tree ranks by the fit's label trees: it needs neighbours and label_tree above 0"
        )
    config = {
        "classifier": {k: v for k, v in clf.get_params().items() if k != "client"},
        "dense_input": "embedding_bag",
        "log_every": args.log_every,
        "propensity": [args.propensity_a, args.propensity_b],
        "members": args.members,
        "member_epochs": args.member_epochs,
    }
    missing = {n: REQUIRES[n] for n in args.contenders if n in REQUIRES}
    missing = {n: pip for n, (mod, pip) in missing.items() if importlib.util.find_spec(mod) is None}
    if "pecos" in args.contenders and "pecos" not in missing and (why := trees.pecos_conflict()):
        missing["pecos"] = why
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="dslide-bench-accuracy-") as tmp:
        data, info = prepare_data(args, Path(tmp))
        config.update(data=str(data), excluded_widest=info.pop("excluded_widest", 0))
        train, test = load_datasets(data)
        description = _describe(info, train, test)
        if "omikuji" in args.contenders and "omikuji" not in missing:
            from dslide_dask.data.xc_text import write_xc

            config["train_text"] = str(Path(tmp) / "train.txt")
            write_xc(config["train_text"], train)
        del train, test
        for name in args.contenders:
            if name in missing:
                results.append({"contender": name, "skipped": missing[name]})
                continue
            for i in range(args.repeats):
                of = f" (run {i + 1} of {args.repeats})" if args.repeats > 1 else ""
                print(f"running {name}{of} ...", flush=True)
                seeded = {
                    **config,
                    "classifier": {**config["classifier"], "random_state": args.seed + i},
                }
                module = "dslide_workflows.bench.accuracy"
                result = engine_bench.run_contender(name, data, seeded, module)
                results.append({**result, "run": i, "seed": args.seed + i})
    print()
    print(f"{description}; {args.epochs} epoch(s), {args.threads} thread(s)")
    print(format_report(results))
    if args.plot:
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        args.plot.write_bytes(plot_p1(results, description.split(":")[0]))
        print(f"wrote {args.plot}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {"data": info, "config": config, "results": results, "host": engine_bench._host()}
        args.json.write_text(json.dumps(report, indent=2, default=str))
        print(f"wrote {args.json}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m dslide_workflows.bench.accuracy --worker ...``: one contender."""
    return engine_bench.bench_main("accuracy", RUNNERS, argv)


if __name__ == "__main__":
    import sys

    sys.exit(main())
