"""One rank of the data-parallel baseline: PyTorch DistributedDataParallel over gloo.

The dense network of :mod:`dslide_workflows.bench.torch_dense` (sparse input -> ReLU
hidden layers -> full softmax, fused Adam), wrapped in DDP: every step all-reduces every
gradient, which is what Horovod does on CPUs. One rank runs in each node of an emulated
cluster (:mod:`dslide_workflows.cluster.netns`); the gloo rendezvous is a TCP store at
``--master`` on the emulated network and gloo binds to ``eth0`` there::

    python -m dslide_workflows.bench.ddp --rank 0 --world 4 --master 10.231.0.10:29500 \\
        --data bench.npz --result rank0.json

The global batch is split over the ranks (``batch_size / world`` rows each; DDP averages
the gradients), so one step trains the same rows as one step of dslide-dask. All ranks
start from the same seeded weights (no initial broadcast). Rank 0 times the steps after
the warm-up between two barriers, reads the switch's byte counters around them when
given ``--switch-netns``, optionally scores P@1/3/5 and writes JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from dslide_workflows.args import hidden_sizes
from dslide_workflows.bench.flags import add_batch_size

IFNAME = "eth0"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True, help="number of ranks")
    parser.add_argument("--master", required=True, metavar="HOST:PORT", help="rank 0's store")
    parser.add_argument("--data", type=Path, required=True, help=".npz of bench.engine")
    parser.add_argument("--result", type=Path, default=None, help="rank 0 writes JSON here")
    parser.add_argument("--steps", type=int, default=4, help="steps in all (default: 4)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed first steps (default: 1)")
    add_batch_size(parser, about="global batch")
    parser.add_argument("--hidden", type=hidden_sizes, default=(128,), metavar="W[,W...]")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--evaluate", action="store_true", help="rank 0 scores P@k at the end")
    parser.add_argument("--switch-netns", default=None, help="read these byte counters")
    parser.add_argument("--ifname", default=IFNAME, help=f"gloo's interface (default: {IFNAME})")


def rank_rows(batch_size: int, world: int, rank: int) -> tuple[int, int]:
    """[start, stop) of ``rank``'s rows within a global batch (the first ranks get the
    remainder)."""
    base, extra = divmod(batch_size, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def _counters(switch_netns: str | None):
    if switch_netns is None:
        return None
    from dslide_workflows.cluster.netns import read_counters

    return read_counters(switch_netns)


def train_rank(args: argparse.Namespace) -> dict[str, Any] | None:
    """Train this rank; rank 0 returns the measurements, the others None."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", args.ifname)
    import torch
    import torch.distributed as dist

    from dslide_dask.metrics import precision_at_k
    from dslide_workflows.bench.data import load_datasets
    from dslide_workflows.bench.torch_dense import build_model, peak_rss_mb, predict_topk

    if not 0 <= args.warmup < args.steps:
        raise ValueError(f"--warmup must be in [0, --steps), got {args.warmup}")
    train, test = load_datasets(args.data)
    if args.steps * args.batch_size > train.n_points:
        raise ValueError(
            f"{args.steps} steps need {args.steps * args.batch_size} rows, "
            f"the data has {train.n_points}"
        )
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = build_model(
        torch, train.n_features, tuple(args.hidden), train.n_labels, "embedding_bag"
    )

    class Loss(torch.nn.Module):
        """DDP hooks into ``forward``: make it the loss of the dense model."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, X, Y):
            return self.model.loss(X, Y)

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{args.master}",
        rank=args.rank,
        world_size=args.world,
        timeout=datetime.timedelta(minutes=30),
    )
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(
            Loss(), init_sync=False, gradient_as_bucket_view=True
        )
        opt = torch.optim.Adam(ddp.parameters(), lr=args.lr, fused=True)
        lo, hi = rank_rows(args.batch_size, args.world, args.rank)
        step_seconds, c0, t0 = [], None, 0.0
        for step in range(args.steps):
            if step == args.warmup:
                dist.barrier()
                c0, t0 = (
                    _counters(args.switch_netns if args.rank == 0 else None),
                    time.perf_counter(),
                )
            base = step * args.batch_size
            batch = train.slice(base + lo, base + hi)
            t = time.perf_counter()
            opt.zero_grad(set_to_none=False)
            loss = ddp(batch.X, batch.Y)
            loss.backward()
            opt.step()
            step_seconds.append(time.perf_counter() - t)
        dist.barrier()
        window = time.perf_counter() - t0
        c1 = _counters(args.switch_netns if args.rank == 0 else None)
    finally:
        dist.destroy_process_group()
    if args.rank != 0:
        return None
    from dslide_workflows.cluster.netns import bytes_sent

    timed = args.steps - args.warmup
    out: dict[str, Any] = {
        "contender": "ddp",
        "world": args.world,
        "steps": args.steps,
        "timed_steps": timed,
        "samples": args.steps * args.batch_size,
        "step_seconds": step_seconds,
        "window_seconds": window,
        "seconds_per_step": window / timed,
        "bytes_per_step": bytes_sent(c0, c1) / timed if c0 is not None else None,
        "n_params": int(sum(p.numel() for p in model.parameters())),
        "final_loss": float(loss.item()),
        "peak_rss_mb": peak_rss_mb(),
    }
    if args.evaluate:
        out.update(precision_at_k(predict_topk(model, test.X, 5), test.Y, (1, 3, 5)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dslide_workflows.bench.ddp",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    out = train_rank(args)
    if out is not None and args.result is not None:
        tmp = args.result.with_suffix(".tmp")
        tmp.write_text(json.dumps(out, indent=2))
        os.replace(tmp, args.result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
