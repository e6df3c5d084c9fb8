"""Where a model's hidden stack runs: whole on the coordinator, or split by units over
the workers of the first shards (D-SLIDE's model-parallel input layer).

The input layer is ``n_features x hidden`` (337K features x 1,024 units is 345M
parameters, 4 GB with Adam's state): too large for one small node. Split by units, each
worker holds the rows of every feature for its units; a step sends the batch's sparse
input to each, gets their units' activations back (float32, so the whole vector is
packed for the wire exactly as one worker would pack it) and later sends each its
units' part of the gradient. Every unit's arithmetic is its own, so the split layer
trains exactly as the whole one. Only one-layer stacks split (deeper stacks' later
layers are small and dense).

Both classes offer the same awaitable calls; the coordinator does not ask which it has.
"""

from __future__ import annotations

import numpy as np

from dslide_dask.data.csr import CSR
from dslide_dask.model.hidden import HiddenLayers
from dslide_dask.model.wire import payload_bytes


class LocalHidden:
    """The whole stack on the coordinator's kernel thread (``compute`` runs a call there)."""

    def __init__(self, hidden: HiddenLayers, compute) -> None:
        self.hidden = hidden
        self._compute = compute

    def take_traffic(self) -> tuple[int, int]:
        """Bytes sent and received for the stack since the last call: none."""
        return 0, 0

    async def forward(self, X: CSR, key: int | None):
        """``(h, handle)``: the last layer's activations and what backward needs."""
        return await self._compute(self.hidden.forward, X)

    async def backward(self, X: CSR, handle, grad_h: np.ndarray) -> None:
        await self._compute(self.hidden.backward, X, handle, grad_h)

    async def remember(self) -> None:
        await self._compute(self.hidden.remember)

    async def recall(self) -> bool:
        return await self._compute(self.hidden.recall)

    async def params(self) -> list[np.ndarray]:
        return self.hidden.params()


class SplitHidden:
    """The input layer's units over ``holders`` (shard handles, local shard first), unit
    range ``units[i]`` on ``holders[i]``; ``gather`` awaits calls to all of them."""

    def __init__(self, holders: list, units: tuple[tuple[int, int], ...], gather) -> None:
        self.holders = holders
        self.units = units
        self._gather = gather
        self._sent = self._received = 0

    def take_traffic(self) -> tuple[int, int]:
        """Bytes sent to and received from the other workers' units since the last call."""
        out = self._sent, self._received
        self._sent = self._received = 0
        return out

    async def forward(self, X: CSR, key: int | None):
        parts = await self._gather([s.hidden_forward(X, key) for s in self.holders], "hidden")
        remote = len(self.holders) - 1
        self._sent += remote * payload_bytes(X)
        self._received += sum(p.nbytes for p in parts[1:])
        return np.concatenate(parts, axis=1), key

    async def backward(self, X: CSR, key: int, grad_h: np.ndarray) -> None:
        grads = [np.ascontiguousarray(grad_h[:, a:b]) for a, b in self.units]
        calls = [s.hidden_backward(key, g) for s, g in zip(self.holders, grads, strict=True)]
        await self._gather(calls, "hidden update")
        self._sent += sum(g.nbytes for g in grads[1:])

    async def remember(self) -> None:
        """Nothing: each holder keeps its units when its shard does."""

    async def recall(self) -> bool:
        return True  # each holder's shard answers for its units

    async def params(self) -> list[np.ndarray]:
        """The whole layer's weights and biases, gathered (tests, small models only)."""
        parts = await self._gather([s.hidden_weights() for s in self.holders], "weights")
        (W, b) = zip(*parts, strict=True)
        return [np.concatenate(W, axis=1), np.concatenate(b)]
