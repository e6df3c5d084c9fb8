"""Parse and format the Extreme Classification Repository text format, byte by byte.

The body parser never raises: it returns an error record (code, 1-based line, offending
token's byte range, a value) and the caller builds the message. Floats are parsed and
formatted here (digits, '.', exponent), so that ``parse(format(x))`` is exactly
:func:`quantize6` of ``x`` and ``format(parse(s)) == s`` for 6-significant-digit ``s``.

Over 400 lines: the parser and the formatter are one contract (each the other's inverse),
checked together.
"""

import numba
import numpy as np

# error codes returned by parse_body (err[0])
OK = 0
ERR_FEW_POINTS = 1  # file ends before the header's N_points lines; err[4] = points read
ERR_EXTRA = 2  # a non-blank line after N_points points; err[4] = first blank line read, or 0
ERR_LABEL_TOKEN = 3  # label token is not a non-negative integer (err[5:7] = labels field)
ERR_LABEL_RANGE = 4  # label id >= n_labels
ERR_LABEL_DUP = 5  # err[4] = the duplicated label
ERR_FEATURE_TOKEN = 6  # feature token is not id:value (bad id or no colon)
ERR_FEATURE_RANGE = 7  # feature id >= n_features
ERR_VALUE = 8  # value is empty or not a number (incl. nan/inf spelled out)
ERR_VALUE_OVERFLOW = 9  # |value| > VALUE_MAX: float32 arithmetic on it would overflow
ERR_FEATURE_DUP = 10  # err[4] = the duplicated feature

_LF = 10
_CR = 13
_SP = 32
_TAB = 9
_COMMA = 44
_COLON = 58
_DOT = 46
_MINUS = 45
_PLUS = 43
_ZERO = 48
_NINE = 57
_ID_CAP = 1 << 40  # ids saturate here (anything this large is out of range anyway)
#: The largest magnitude a value may have. A row's values are squared and summed in
#: float32 (its L2 norm) and multiplied through the network: at 1e15 a row may hold 3e8
#: of them before the sum overflows (at 1e19 two do, and a prediction turns to zeros).
VALUE_MAX = 1e15

_P10 = np.array([10.0**k for k in range(23)], np.float64)  # exact in float64


@numba.njit(cache=True, nogil=True)
def _is_space(c: np.uint8) -> bool:
    return c in (_SP, _TAB, _CR)


@numba.njit(cache=True, nogil=True)
def _is_sep(c: np.uint8) -> bool:
    return c in (_SP, _TAB, _CR, _LF)


@numba.njit(cache=True, nogil=True)
def decimal_to_f64(m: np.int64, e10: np.int64) -> float:
    """``m * 10**e10`` (m >= 0); correctly rounded when m < 2**53 and |e10| <= 22."""
    if m == 0:
        return 0.0
    if e10 > 400:
        return np.inf
    if e10 < -400:
        return 0.0
    x = float(m)
    if 0 <= e10 <= 22:
        return x * _P10[e10]
    if -22 <= e10 < 0:
        return x / _P10[-e10]
    # rare: scale in steps of 1e22 (a few ulps of float64, far below float32 precision)
    while e10 > 22:
        x *= _P10[22]
        e10 -= 22
    while e10 < -22:
        x /= _P10[22]
        e10 += 22
    return x * _P10[e10] if e10 >= 0 else x / _P10[-e10]


@numba.njit(cache=True, nogil=True)
def _scaled_round(a: float, k: int | np.integer) -> np.int64:
    """round(a * 10**k) for a > 0 (ties to even)."""
    if 0 <= k <= 22:
        x = a * _P10[k]
    elif -22 <= k < 0:
        x = a / _P10[-k]
    else:
        x = a
        while k > 22:
            x *= _P10[22]
            k -= 22
        while k < -22:
            x /= _P10[22]
            k += 22
        x = x * _P10[k] if k >= 0 else x / _P10[-k]
    r = np.floor(x + 0.5)
    if r - x == 0.5 and r % 2 == 1:  # an exact tie: round half to even, like '%g'
        r -= 1.0
    return np.int64(r)


@numba.njit(cache=True, nogil=True)
def digits6(a: float) -> tuple[np.int64, np.int64]:
    """For a > 0: (m, e) with 100000 <= m <= 999999 and a ~= m * 10**(e - 5)."""
    e = np.int64(np.floor(np.log10(a)))
    m = _scaled_round(a, 5 - e)
    if m >= 1000000:
        e += 1
        m = _scaled_round(a, 5 - e)
    elif m < 100000:
        e -= 1
        m = _scaled_round(a, 5 - e)
        if m >= 1000000:  # a sits on a rounding boundary: take the shorter form
            e += 1
            m = _scaled_round(a, 5 - e)
    return m, e


@numba.njit(cache=True, nogil=True)
def quantize6(v: float) -> np.float32:
    """``v`` rounded to 6 significant digits as float32: what format + parse yields."""
    if v == 0.0 or v != v:
        return np.float32(v)
    a = abs(v)
    m, e = digits6(a)
    q = np.float32(decimal_to_f64(m, e - 5))
    return q if v > 0 else -q


@numba.njit(cache=True, nogil=True)
def quantize6_array(values: np.ndarray) -> None:
    """In place: every value rounded to 6 significant digits (see :func:`quantize6`)."""
    for i in range(len(values)):
        values[i] = quantize6(values[i])


@numba.njit(cache=True, nogil=True)
def _parse_float(buf: np.ndarray, pos: int, n: int) -> tuple[float, int, int]:
    """Parse a float token at ``pos``; returns (value, code, pos after the token).

    The token must end at a separator or EOF. ``code`` is OK, ERR_VALUE or
    ERR_VALUE_OVERFLOW (finite text whose magnitude is over :data:`VALUE_MAX`).
    """
    neg = False
    if pos < n and (buf[pos] == _MINUS or buf[pos] == _PLUS):
        neg = buf[pos] == _MINUS
        pos += 1
    m = np.int64(0)
    nsig = 0
    e10 = np.int64(0)
    ndig = 0
    while pos < n:
        c = buf[pos]
        if c < _ZERO or c > _NINE:
            break
        ndig += 1
        if nsig < 18:
            if m != 0 or c != _ZERO:
                m = m * 10 + (c - _ZERO)
                nsig += 1
        else:
            e10 += 1
        pos += 1
    if pos < n and buf[pos] == _DOT:
        pos += 1
        while pos < n:
            c = buf[pos]
            if c < _ZERO or c > _NINE:
                break
            ndig += 1
            if nsig < 18:
                if m != 0 or c != _ZERO:
                    m = m * 10 + (c - _ZERO)
                    nsig += 1
                e10 -= 1
            pos += 1
    if ndig == 0:
        return 0.0, ERR_VALUE, pos
    if pos < n and (buf[pos] == 101 or buf[pos] == 69):  # e E
        pos += 1
        eneg = False
        if pos < n and (buf[pos] == _MINUS or buf[pos] == _PLUS):
            eneg = buf[pos] == _MINUS
            pos += 1
        ex = np.int64(0)
        edig = 0
        while pos < n:
            c = buf[pos]
            if c < _ZERO or c > _NINE:
                break
            if ex < 100000:
                ex = ex * 10 + (c - _ZERO)
            edig += 1
            pos += 1
        if edig == 0:
            return 0.0, ERR_VALUE, pos
        e10 += -ex if eneg else ex
    if pos < n and not _is_sep(buf[pos]):
        return 0.0, ERR_VALUE, pos
    x = decimal_to_f64(m, e10)
    if x > VALUE_MAX:
        return 0.0, ERR_VALUE_OVERFLOW, pos
    return (-x if neg else x), OK, pos


@numba.njit(cache=True, nogil=True)
def count_bytes(buf: np.ndarray, start: int) -> tuple[int, int, int]:
    """Counts of ':', ',' and newline bytes in ``buf[start:]`` (capacity bounds)."""
    colons = 0
    commas = 0
    lines = 0
    for i in range(start, len(buf)):
        c = buf[i]
        if c == _COLON:
            colons += 1
        elif c == _COMMA:
            commas += 1
        elif c == _LF:
            lines += 1
    return colons, commas, lines


@numba.njit(cache=True, nogil=True)
def _token_end(buf: np.ndarray, pos: int, n: int, stop_at_comma: bool) -> int:
    while pos < n:
        c = buf[pos]
        if _is_sep(c) or (stop_at_comma and c == _COMMA):
            break
        pos += 1
    return pos


@numba.njit(cache=True, nogil=True)
def shell_sort(keys: np.ndarray, values: np.ndarray) -> None:
    """Sort ``keys`` ascending in place, permuting ``values`` alike (pass ``keys`` twice
    to sort keys alone). Small and quick to compile, unlike ``np.sort`` in numba."""
    n = len(keys)
    gap = 1
    while gap < n // 3:
        gap = 3 * gap + 1
    while gap > 0:
        for i in range(gap, n):
            k = keys[i]
            v = values[i]
            j = i
            while j >= gap and keys[j - gap] > k:
                keys[j] = keys[j - gap]
                values[j] = values[j - gap]
                j -= gap
            keys[j] = k
            values[j] = v
        gap //= 3


@numba.njit(cache=True, nogil=True)
def _first_duplicate(ids: np.ndarray, lo: int, hi: int) -> int:
    """-1 if ``ids[lo:hi]`` has no repeated value, else a repeated value."""
    ascending = True
    for p in range(lo + 1, hi):
        if ids[p] <= ids[p - 1]:
            ascending = False
            break
    if ascending:
        return -1
    s = ids[lo:hi].copy()
    shell_sort(s, s)
    for p in range(1, len(s)):
        if s[p] == s[p - 1]:
            return s[p]
    return -1


@numba.njit(cache=True, nogil=True)
def count_lines(buf: np.ndarray, start: int, stop: int) -> int:
    """Newline bytes in ``buf[start:stop]``."""
    lines = 0
    for i in range(start, stop):
        if buf[i] == _LF:
            lines += 1
    return lines


@numba.njit(cache=True, nogil=True)
def find_byte(buf: np.ndarray, start: int, stop: int, byte: int) -> int:
    """The first index in ``buf[start:stop]`` holding ``byte``, else -1."""
    for i in range(start, stop):
        if buf[i] == byte:
            return i
    return -1


@numba.njit(cache=True, nogil=True)
def last_non_blank(buf: np.ndarray, start: int, stop: int) -> int:
    """The last index in ``buf[start:stop]`` that is not a blank or newline, else -1."""
    for i in range(stop - 1, start - 1, -1):
        if not _is_sep(buf[i]):
            return i
    return -1


@numba.njit(cache=True, nogil=True)
def _row_error(err: np.ndarray, code: int, line: int, t0: int, t1: int, value: int) -> None:
    err[0] = code
    err[1] = line
    err[2] = t0
    err[3] = t1
    err[4] = value


@numba.njit(cache=True, nogil=True)
def _parse_row(buf, pos, n, n_features, n_labels, x_idx, x_val, y_idx, nx, ny, err, line):
    """Parse the line at ``pos`` into ``x_*``/``y_idx`` from ``nx``/``ny`` on.

    Returns ``(pos after the line, nx, ny)``; on a bad line ``err[0]`` is set (see
    :func:`parse_lines`) and the returned position and counts are meaningless.
    """
    nx0 = nx
    ny0 = ny
    # labels: comma-separated ids, unless the line starts with a separator
    if not _is_sep(buf[pos]):
        field = pos
        while True:
            tok = pos
            v = np.int64(0)
            while pos < n:
                c = buf[pos]
                if c < _ZERO or c > _NINE:
                    break
                if v < _ID_CAP:
                    v = v * 10 + (c - _ZERO)
                pos += 1
            c = buf[pos] if pos < n else _LF
            if pos == tok or not (_is_sep(c) or c == _COMMA):
                _row_error(err, ERR_LABEL_TOKEN, line, tok, _token_end(buf, tok, n, True), 0)
                err[5] = field
                err[6] = _token_end(buf, field, n, False)
                return pos, nx, ny
            if v >= n_labels:
                _row_error(err, ERR_LABEL_RANGE, line, tok, pos, v)
                return pos, nx, ny
            y_idx[ny] = v
            ny += 1
            if c != _COMMA:
                break
            pos += 1
    # features: id:value tokens separated by blanks
    while True:
        while pos < n and _is_space(buf[pos]):
            pos += 1
        if pos >= n or buf[pos] == _LF:
            break
        tok = pos
        v = np.int64(0)
        while pos < n:
            c = buf[pos]
            if c < _ZERO or c > _NINE:
                break
            if v < _ID_CAP:
                v = v * 10 + (c - _ZERO)
            pos += 1
        if pos == tok or pos >= n or buf[pos] != _COLON:
            _row_error(err, ERR_FEATURE_TOKEN, line, tok, _token_end(buf, tok, n, False), 0)
            return pos, nx, ny
        if v >= n_features:
            _row_error(err, ERR_FEATURE_RANGE, line, tok, pos, v)
            return pos, nx, ny
        pos += 1
        x, code, pos = _parse_float(buf, pos, n)
        if code != OK:
            _row_error(err, code, line, tok, _token_end(buf, tok, n, False), 0)
            return pos, nx, ny
        x_idx[nx] = v
        x_val[nx] = x
        nx += 1
    if pos < n:
        pos += 1  # the newline
    dup = _first_duplicate(y_idx, ny0, ny)
    if dup >= 0:
        _row_error(err, ERR_LABEL_DUP, line, 0, 0, dup)
        return pos, nx, ny
    dup = _first_duplicate(x_idx, nx0, nx)
    if dup >= 0:
        _row_error(err, ERR_FEATURE_DUP, line, 0, 0, dup)
    return pos, nx, ny


@numba.njit(cache=True, nogil=True)
def _blank_line(buf: np.ndarray, pos: int, n: int) -> bool:
    """Whether the line at ``pos`` holds only blanks."""
    while pos < n and buf[pos] != _LF:
        if not _is_space(buf[pos]):
            return False
        pos += 1
    return True


@numba.njit(cache=True, nogil=True)
def parse_lines(
    buf: np.ndarray,
    pos: int,
    n_points: int,
    n_features: int,
    n_labels: int,
    nnz_cap: int,
    labels_cap: int,
    first_line: int,
    skip: bool,
):
    """Parse ``n_points`` lines of ``buf`` (uint8) from byte ``pos`` (line ``first_line``);
    only blank lines may follow them.

    Returns ``(x_indptr, x_indices, x_data, y_indptr, y_indices, err, skipped, n_skipped)``.
    ``err`` is int64 ``[code, line, tok_start, tok_end, value, field_start, field_end]``
    with code 0 (OK) or one of the ERR_* codes; on error the arrays are partial. With
    ``skip``, a bad line (any code but ERR_FEW_POINTS / ERR_EXTRA) is dropped instead:
    ``n_skipped`` counts them, ``skipped`` is the first one's record, and the arrays hold
    ``n_points - n_skipped`` rows.
    """
    n = len(buf)
    err = np.zeros(7, np.int64)
    skipped = np.zeros(7, np.int64)
    row_err = np.zeros(7, np.int64)
    x_indptr = np.zeros(n_points + 1, np.int64)
    y_indptr = np.zeros(n_points + 1, np.int64)
    x_idx = np.empty(nnz_cap, np.int32)
    x_val = np.empty(nnz_cap, np.float32)
    y_idx = np.empty(labels_cap, np.int32)
    nx = 0
    ny = 0
    rows = 0
    n_skipped = 0
    blank = 0  # line number of the first blank line read as an (empty) point
    line = first_line
    for _ in range(n_points):
        if pos >= n:
            err[0] = ERR_FEW_POINTS
            err[1] = line
            err[4] = rows + n_skipped
            break
        start = pos
        pos, nx2, ny2 = _parse_row(
            buf, pos, n, n_features, n_labels, x_idx, x_val, y_idx, nx, ny, row_err, line
        )
        if row_err[0] != OK:
            if not skip:
                err[:] = row_err
                break
            if n_skipped == 0:
                skipped[:] = row_err
            n_skipped += 1
            row_err[:] = 0
            pos = start
            while pos < n and buf[pos] != _LF:
                pos += 1
            pos += 1
        else:
            if nx2 == nx and ny2 == ny and blank == 0 and _blank_line(buf, start, n):
                blank = line
            nx = nx2
            ny = ny2
            rows += 1
            x_indptr[rows] = nx
            y_indptr[rows] = ny
        line += 1
    if err[0] == OK:  # only blank lines may follow
        while pos < n:
            c = buf[pos]
            if c == _LF:
                line += 1
            elif not _is_space(c):
                err[0] = ERR_EXTRA
                err[1] = line
                err[4] = blank
                err[2] = pos
                err[3] = _token_end(buf, pos, n, False)
                break
            pos += 1
    return (
        x_indptr[: rows + 1],
        x_idx[:nx],
        x_val[:nx],
        y_indptr[: rows + 1],
        y_idx[:ny],
        err,
        skipped,
        n_skipped,
    )


@numba.njit(cache=True, nogil=True)
def parse_body(
    buf: np.ndarray,
    pos: int,
    n_points: int,
    n_features: int,
    n_labels: int,
    nnz_cap: int,
    labels_cap: int,
):
    """:func:`parse_lines` of a whole file's body (line 2 on), stopping at the first error:
    ``(x_indptr, x_indices, x_data, y_indptr, y_indices, err)``."""
    out = parse_lines(buf, pos, n_points, n_features, n_labels, nnz_cap, labels_cap, 2, False)
    return out[0], out[1], out[2], out[3], out[4], out[5]


# ---------------------------------------------------------------------------- formatting


@numba.njit(cache=True, nogil=True)
def _write_uint(out: np.ndarray, p: int, v: np.int64) -> int:
    if v == 0:
        out[p] = _ZERO
        return p + 1
    nd = 0
    t = v
    while t > 0:
        t //= 10
        nd += 1
    q = p + nd - 1
    while v > 0:
        out[q] = _ZERO + v % 10
        v //= 10
        q -= 1
    return p + nd


@numba.njit(cache=True, nogil=True)
def write_float(out: np.ndarray, p: int, v: float) -> int:
    """Write finite ``v`` at ``out[p]`` like ``'%.6g'`` (exponent without zero padding);
    returns the new position (at most 13 bytes written)."""
    if v == 0.0:
        out[p] = _ZERO
        return p + 1
    if v < 0:
        out[p] = _MINUS
        p += 1
        v = -v
    m, e = digits6(v)
    d = np.empty(6, np.uint8)
    for j in range(5, -1, -1):
        d[j] = _ZERO + m % 10
        m //= 10
    nd = 6
    while nd > 1 and d[nd - 1] == _ZERO:
        nd -= 1
    if -4 <= e < 6:
        if e >= 0:
            for j in range(e + 1):
                out[p] = d[j] if j < nd else _ZERO
                p += 1
            if nd > e + 1:
                out[p] = _DOT
                p += 1
                for j in range(e + 1, nd):
                    out[p] = d[j]
                    p += 1
        else:
            out[p] = _ZERO
            out[p + 1] = _DOT
            p += 2
            for _ in range(-e - 1):
                out[p] = _ZERO
                p += 1
            for j in range(nd):
                out[p] = d[j]
                p += 1
    else:
        out[p] = d[0]
        p += 1
        if nd > 1:
            out[p] = _DOT
            p += 1
            for j in range(1, nd):
                out[p] = d[j]
                p += 1
        out[p] = 101  # e
        p += 1
        if e < 0:
            out[p] = _MINUS
            p += 1
            e = -e
        p = _write_uint(out, p, e)
    return p


@numba.njit(cache=True, nogil=True)
def format_rows(
    x_indptr: np.ndarray,
    x_idx: np.ndarray,
    x_val: np.ndarray,
    y_indptr: np.ndarray,
    y_idx: np.ndarray,
    lo: int,
    hi: int,
) -> np.ndarray:
    """Lines ``lo:hi`` as text bytes (uint8): ``l1,l2 f:v f:v\\n`` per row."""
    cap = 0
    for r in range(lo, hi):
        cap += 1 + 11 * (y_indptr[r + 1] - y_indptr[r]) + 26 * (x_indptr[r + 1] - x_indptr[r])
    out = np.empty(cap, np.uint8)
    p = 0
    for r in range(lo, hi):
        for j in range(y_indptr[r], y_indptr[r + 1]):
            if j > y_indptr[r]:
                out[p] = _COMMA
                p += 1
            p = _write_uint(out, p, np.int64(y_idx[j]))
        for j in range(x_indptr[r], x_indptr[r + 1]):
            out[p] = _SP
            p = _write_uint(out, p + 1, np.int64(x_idx[j]))
            out[p] = _COLON
            p = write_float(out, p + 1, np.float64(x_val[j]))
        out[p] = _LF
        p += 1
    return out[:p]
