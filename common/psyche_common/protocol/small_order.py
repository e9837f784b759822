"""Which 32-byte ed25519 public keys are points of small order (pure Python, no I/O).

A public key whose point has order dividing 8 (the identity, the point of order 2, the two of
order 4 and the four of order 8) needs no secret: with R the identity and S = 0, a signature
verifies under it for every message whose hash is a multiple of the point's order, so anyone
can "hold" such an identity, and several parties can share one. `SMALL_ORDER_ENCODINGS` is
every encoding of those eight points, computed once at import from the curve itself (not a
list copied from elsewhere): each y-coordinate as it is (canonical) and, where it still fits
in 255 bits, plus p (non-canonical), each with both sign bits (for x = 0 the sign bit 1 is
non-canonical too; for x != 0 the other sign bit names the negated point, also of small
order). `is_small_order` checks one encoding by arithmetic ([8]P is the identity), for tests
and for encodings outside the set; `identity.check_public_key` refuses the set's keys.

Edwards25519 here: -x^2 + y^2 = 1 + d x^2 y^2 over GF(p), p = 2^255 - 19, d = -121665/121666,
the complete addition law (d is not a square), in projective coordinates inside `multiply`.
"""

from __future__ import annotations

P = 2**255 - 19
"""The field's prime."""
D = (-121665 * pow(121666, P - 2, P)) % P
"""The curve's constant d."""
GROUP_ORDER = 2**252 + 27742317777372353535851937790883648493
"""The prime order L of the subgroup that honest keys lie in (the curve has 8 L points)."""
COFACTOR = 8
_SQRT_MINUS_ONE = pow(2, (P - 1) // 4, P)
_Y_MASK = (1 << 255) - 1

Point = tuple[int, int]
"""An affine point (x, y), both reduced mod p."""
IDENTITY: Point = (0, 1)


def _inverse(value: int) -> int:
    return pow(value, P - 2, P)


def add(a: Point, b: Point) -> Point:
    """The sum of two points (complete: valid for doubling and the identity too)."""
    x1, y1 = a
    x2, y2 = b
    t = D * x1 * x2 * y1 * y2 % P
    x3 = (x1 * y2 + y1 * x2) * _inverse(1 + t) % P
    y3 = (y1 * y2 + x1 * x2) * _inverse(1 - t) % P
    return x3, y3


_Projective = tuple[int, int, int]
"""(X, Y, Z) with x = X/Z, y = Y/Z: additions without a field inversion each."""


def _add_projective(a: _Projective, b: _Projective) -> _Projective:
    x1, y1, z1 = a
    x2, y2, z2 = b
    za = z1 * z2 % P
    zb = za * za % P
    c = x1 * x2 % P
    e = y1 * y2 % P
    t = D * c * e % P
    f = zb - t
    g = zb + t
    x3 = za * f * ((x1 + y1) * (x2 + y2) - c - e) % P
    y3 = za * g * (e + c) % P
    return x3, y3, f * g % P


def multiply(scalar: int, point: Point) -> Point:
    """[scalar] point, by double-and-add (scalar >= 0)."""
    if scalar < 0:
        raise ValueError(f"scalar must be >= 0, got {scalar}")
    result: _Projective = (0, 1, 1)
    addend: _Projective = (point[0], point[1], 1)
    while scalar:
        if scalar & 1:
            result = _add_projective(result, addend)
        addend = _add_projective(addend, addend)
        scalar >>= 1
    x, y, z = result
    z_inverse = _inverse(z)
    return x * z_inverse % P, y * z_inverse % P


def _sqrt(value: int) -> int | None:
    """A square root of `value` mod p, or None when it has none."""
    root = pow(value, (P + 3) // 8, P)
    if root * root % P == value % P:
        return root
    root = root * _SQRT_MINUS_ONE % P
    if root * root % P == value % P:
        return root
    return None


def decode(encoding: bytes) -> Point | None:
    """The point a 32-byte encoding names, or None when it names none. Lenient, as some
    verifiers are: y may be non-canonical (>= p, reduced mod p) and x = 0 may come with the
    sign bit set."""
    if len(encoding) != 32:
        raise ValueError(f"an ed25519 point encoding is 32 bytes, got {len(encoding)}")
    value = int.from_bytes(encoding, "little")
    y = (value & _Y_MASK) % P
    sign = value >> 255
    x = _sqrt((y * y - 1) * _inverse(D * y * y + 1) % P)
    if x is None:
        return None
    if x & 1 != sign:
        x = (P - x) % P
    return x, y


def encode(point: Point, *, sign: int | None = None, y_offset: int = 0) -> bytes:
    """A 32-byte encoding of `point`: the canonical one by default; `sign` forces the sign
    bit and `y_offset` (0 or p) writes y + offset (non-canonical when not 0)."""
    x, y = point
    bit = x & 1 if sign is None else sign
    value = y + y_offset
    if value > _Y_MASK:
        raise ValueError(f"y + {y_offset} does not fit in 255 bits")
    return (value | bit << 255).to_bytes(32, "little")


def is_small_order(encoding: bytes) -> bool:
    """True when `encoding` names a point P with [8]P the identity (the check by arithmetic)."""
    point = decode(encoding)
    return point is not None and multiply(COFACTOR, point) == IDENTITY


def torsion_points() -> frozenset[Point]:
    """The eight points of order dividing 8: the multiples of a point of order 8, found as
    [L]Q for the first curve point Q (by y = 2, 3, ...) whose [L]Q has order 8."""
    for y in range(2, 1000):
        candidate = decode(y.to_bytes(32, "little"))
        if candidate is None:
            continue
        torsion = multiply(GROUP_ORDER, candidate)
        if multiply(COFACTOR // 2, torsion) != IDENTITY:  # order exactly 8
            points = {IDENTITY}
            current = torsion
            while current != IDENTITY:
                points.add(current)
                current = add(current, torsion)
            return frozenset(points)
    raise RuntimeError("no point of order 8 found among the first y values")  # never: 1/2 do


def small_order_encodings() -> frozenset[bytes]:
    """Every 32-byte encoding of a point of small order (see the module docstring)."""
    found: set[bytes] = set()
    for point in torsion_points():
        for y_offset in (0, P):
            if point[1] + y_offset > _Y_MASK:
                continue
            for sign in (0, 1):
                found.add(encode(point, sign=sign, y_offset=y_offset))
    return frozenset(found)


SMALL_ORDER_ENCODINGS: frozenset[bytes] = small_order_encodings()
"""Every encoding of a point of small order: a public key among them is refused."""
