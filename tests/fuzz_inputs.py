"""Seeded random damage to XC text files, converted chunks, checkpoint folders, run
configs (with YAML anchors and aliases among the edits) and folders with links out.

Run as a script (``python -m tests.fuzz_inputs SEED N OUT``) by ``test_fuzz_inputs``, in
its own process so that a segfault or hang fails the test instead of killing pytest.
Every mutated input must be read correctly or refused with a ValueError (the project's
errors: XCFormatError, CheckpointError...); anything else, or a byte changed outside the
folder a link led out of, is printed and exits 1. The
peak memory of the whole run is written to OUT as JSON for the test to bound.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import resource
import shutil
import sys
import tempfile
import traceback
from pathlib import Path

import numpy as np

KINDS = ("text", "chunks", "checkpoint", "config", "links")


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One to three random edits: flip, set, insert, delete, truncate, duplicate, or
    overwrite digits (to reach sizes and counts)."""
    b = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(7)
        i = rng.randrange(len(b)) if b else 0
        if op == 0 and b:
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1 and b:
            b[i] = rng.choice(b"0123456789 ,:\n\t-.e\x00\xff")
        elif op == 2:
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 3 and b:
            del b[i : i + rng.randint(1, 16)]
        elif op == 4:
            del b[rng.randrange(len(b) + 1) :]
        elif op == 5 and b:
            j = rng.randrange(len(b))
            b[i:i] = b[j : j + rng.randint(1, 64)]
        else:
            b[i:i] = str(rng.choice([2**31 - 1, 2**31, 10**12, 2**63, 0, -1, 99999])).encode()
    return bytes(b)


def check_text(path: Path, data: bytes) -> None:
    from dslide_dask.data.source import read_dataset
    from dslide_dask.data.xc_text import read_xc

    path.write_bytes(data)
    for read in (lambda: read_xc(str(path)), lambda: read_dataset(str(path))[0]):
        try:
            got = read()
        except ValueError:
            continue
        _check_valid(got)


def _check_valid(d) -> None:
    """A dataset that was accepted must be consistent (ids within its declared sizes)."""
    for m in (d.X, d.Y):
        if m.nnz:
            assert m.indices.min() >= 0 and m.indices.max() < m.n_cols, "id out of range"
    if d.X.data is not None:
        assert np.isfinite(d.X.data).all(), "non-finite value accepted"


def check_chunks(base: Path, work: Path, rng: random.Random) -> None:
    from dslide_dask.data.source import read_dataset

    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(base, work)
    files = sorted(p for p in work.iterdir() if p.is_file())
    target = rng.choice(files)
    target.write_bytes(mutate(target.read_bytes(), rng))
    try:
        got = read_dataset(str(work))[0]
    except ValueError:
        return
    _check_valid(got)


def check_checkpoint(base: Path, work: Path, rng: random.Random) -> None:
    from dslide_dask import SlideClassifier
    from dslide_dask.checkpoint import CheckpointError

    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(base, work)
    files = sorted(p for p in work.rglob("*") if p.is_file())
    weights = [2.0 if p.name in ("meta.json", "LATEST") else 1.0 for p in files]
    target = rng.choices(files, weights)[0]
    target.write_bytes(mutate(target.read_bytes(), rng))
    try:
        clf = SlideClassifier.load(str(work))
        clf.predict_topk(np.eye(1, 20, 3, dtype=np.float32), k=2)
    except (ValueError, CheckpointError):
        return


#: A run config `dslide train --config` takes; the fuzz damages it.
CONFIG = (
    b"train: t.txt\nepochs: 2\nbatch_size: 4\nstorage_options: {anon: true, key: k}\n"
    b"model: {hidden: [8], lr: 0.01, K: 2, L: 2, min_active: 2}\n"
)
#: YAML edits a hostile config would make: anchors, aliases, a "billion laughs" head.
YAML_EDITS = [
    b"&a ",
    b"*a",
    b" &a [1, 2]",
    b"\nx: &b [*a, *a, *a]\n",
    b"!!python/object ",
    b"<<: *a\n",
    b"{",
    b"\n  - ",
    b": :",
    b"\t",
    b"9" * 40,
]


def mutate_yaml(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.6:
            i = rng.randrange(len(b) + 1)
            b[i:i] = rng.choice(YAML_EDITS)
        else:
            b = bytearray(mutate(bytes(b), rng))
    return bytes(b)


def check_config(path: Path, data: bytes) -> None:
    """``dslide train --config`` as far as the settings go: read, checked, masked and
    written out (what a run does before it starts), or refused with a ValueError."""
    import yaml

    from dslide_dask import SlideConfig
    from dslide_workflows.cli import build_parser
    from dslide_workflows.endpoints import nul_setting
    from dslide_workflows.run_settings import resolve
    from dslide_workflows.secrets import mask

    path.write_bytes(data)
    args = build_parser().parse_args(["train", "--config", str(path)])
    try:  # as cmd_train does
        run, model = resolve(args)
        if nul_setting(run.to_dict()) is not None:
            return
        cfg = SlideConfig.from_dict(model)
    except ValueError:
        return
    yaml.safe_dump(mask({**run.to_dict(), "model": cfg.to_dict()}), sort_keys=False)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() if p.is_file() else b"<dir>" for p in sorted(root.rglob("*"))}


def check_links(clf, base: Path, work: Path, victim: Path, rng: random.Random) -> None:
    """A model folder with one file or folder replaced by a link out of it (to a file or
    a folder of someone else's): loading it refuses or reads the rest, and saving into
    it writes nothing through the link."""
    from dslide_dask import SlideClassifier

    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(base, work)
    target = rng.choice(sorted(work.rglob("*")))
    if target.is_dir():
        shutil.rmtree(target)
    else:
        target.unlink()
    target.symlink_to(rng.choice([victim / "file", victim / "folder", victim / "missing"]))
    before = _snapshot(victim)
    with contextlib.suppress(ValueError):
        SlideClassifier.load(str(work)).predict_topk(np.eye(1, 20, 3, dtype=np.float32), k=2)
    with contextlib.suppress(ValueError):
        clf.save(str(work))
    assert _snapshot(victim) == before, f"a link at {target.relative_to(work)} was written through"


def main(seed: int, n: int, out: str) -> int:
    from dslide_dask import SlideClassifier
    from dslide_dask.data.convert import convert
    from dslide_dask.data.xc_text import parse_xc
    from tests.hostile import TRAIN

    rng = random.Random(seed)
    tmp = Path(tempfile.mkdtemp(prefix="dslide-fuzz-"))
    try:
        text = tmp / "train.txt"
        text.write_bytes(TRAIN)
        convert(str(text), str(tmp / "chunks"), chunk_points=2)
        data = parse_xc(TRAIN)
        clf = SlideClassifier(
            hidden=(8,), L=2, K=2, min_active=2, max_active=5, threshold=1, batch_size=2
        ).fit(data.X, data.Y)
        clf.save(str(tmp / "model"))
        check_checkpoint(tmp / "model", tmp / "m", rng)  # warm the JIT up before measuring
        base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        victim = tmp / "victim"
        (victim / "folder").mkdir(parents=True)
        (victim / "file").write_bytes(b"someone else's\n")
        (victim / "folder" / "inside").write_bytes(b"theirs too\n")
        kinds = dict.fromkeys(KINDS, 0)
        biggest = max(p.stat().st_size for p in tmp.rglob("*") if p.is_file())
        for i in range(n):
            kind = KINDS[i % len(KINDS)]
            kinds[kind] += 1
            try:
                if kind == "text":
                    check_text(tmp / "t.txt", mutate(TRAIN, rng))
                elif kind == "chunks":
                    check_chunks(tmp / "chunks", tmp / "c", rng)
                elif kind == "checkpoint":
                    check_checkpoint(tmp / "model", tmp / "m", rng)
                elif kind == "config":
                    check_config(tmp / "c.yaml", mutate_yaml(CONFIG, rng))
                else:
                    check_links(clf, tmp / "model", tmp / "l", victim, rng)
            except Exception:
                print(f"case {i} ({kind}) raised:", file=sys.stderr)
                traceback.print_exc()
                return 1
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        Path(out).write_text(
            json.dumps(
                {"base_rss": base_rss, "peak_rss": peak, "biggest_file": biggest, "kinds": kinds}
            )
        )
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]))
