"""A float32 ``exp`` that LLVM vectorises, for the softmax of a training step.

numba's ``np.exp`` calls libm one element at a time (numba vectorises it only with
Intel's SVML, which pip wheels lack), and numpy's float32 ``exp`` runs on one thread:
both took about 2.5 ms for the million exponentials of a batch's shared negatives, more
than the matrix product that made the logits. :func:`exp32` is the classic range
reduction ``exp(x) = 2**n * exp(r)`` with ``|r| <= ln(2) / 2``, a degree-6 polynomial
for ``exp(r)`` and ``2**n`` written straight into the exponent bits: branch-free, so a
loop of it compiles to SIMD. Relative error under 1e-6 (libm's float32 is under 4e-7);
softmax arguments are at most about 0, so the overflow side is only clamped.
"""

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

#: Below this, exp underflows float32's normal range: the result is 0 (also for -inf).
UNDERFLOW = np.float32(-87.33)
#: Arguments are clamped here: exp(88) = 1.65e38 is finite, 2**128 would not be.
CLAMP = np.float32(88.0)


@intrinsic
def _as_float32(typingctx, bits):
    """The float32 whose bits are the int32 ``bits`` (a register move, no memory)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@numba.njit(cache=True, nogil=True, inline="always", fastmath={"contract"})
def exp32(x):
    """``exp(x)`` in float32 for ``x <= 88`` (0 below -87.33 and for ``-inf``; NaN
    stays NaN, so a diverged step still shows)."""
    y = min(max(x, UNDERFLOW), CLAMP)
    n = np.floor(y * np.float32(1.4426950408889634) + np.float32(0.5))
    # ln 2 split in two (Cody-Waite) so that r = y - n ln 2 keeps its low bits
    r = y - n * np.float32(0.693145751953125) - n * np.float32(1.428606765330187e-06)
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    p = p * r * r + r + np.float32(1.0)
    scale = _as_float32((np.int32(n) + np.int32(127)) << np.int32(23))
    return np.float32(0.0) if x < UNDERFLOW else p * scale  # NaN stays NaN
