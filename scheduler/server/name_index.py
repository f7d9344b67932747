"""Where node names sit in a request body, and their snapshot positions, without decoding.

kube-scheduler sends the same candidate list (``NodeNames``) to filter and prioritize, pod
after pod. ``wire.NamesMemo`` recognises a list sent before by its bytes; for a new list,
:func:`scan` finds the offsets of its strings in the raw body (when the array is written
plainly: no escapes, no comma or quote inside a name), and :class:`NameIndex` maps those
bytes to snapshot positions by a hash of their 64-bit words, in numpy, without making a
``str`` per name. Anything unusual returns None and the caller decodes the JSON instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import orjson


def scan(
    raw: bytes, lo: int, hi: int, count: int | None = None
) -> tuple[np.ndarray, np.ndarray] | None:
    """Start and end offsets of the strings of the JSON array ``raw[lo:hi]``, if it is
    written ``["...","...",...]`` (``count`` items if given), no backslash and no comma
    or quote inside a string (see :meth:`scheduler.server.wire.NamesMemo.locate`); else None."""
    if hi - lo < 4 or raw[lo : lo + 2] != b'["' or raw[hi - 2 : hi] != b'"]':
        return None
    if raw.find(b"\\", lo, hi) >= 0:
        return None
    b = np.frombuffer(raw, np.uint8, hi - lo, lo)
    commas = (b == _COMMA).nonzero()[0]
    if count is None:
        count = len(commas) + 1
    elif len(commas) != count - 1:
        return None
    quotes = b == _QUOTE
    if np.count_nonzero(quotes) != 2 * count:
        return None
    # (count_nonzero: C, without the Python wrapper of ndarray.all / any.)
    if count > 1 and not (
        np.count_nonzero(quotes.take(commas - 1)) == count - 1
        and np.count_nonzero(quotes.take(commas + 1)) == count - 1
    ):
        return None
    starts = np.empty(count, np.int64)
    ends = np.empty(count, np.int64)
    starts[0] = lo + 2
    ends[-1] = hi - 2
    np.add(commas, lo + 2, out=starts[1:])
    np.add(commas, lo - 1, out=ends[:-1])
    if count > 1 and np.count_nonzero(ends < starts):  # two commas share a quote: `","` in a string
        return None
    return starts, ends


_COMMA = ord(",")
_QUOTE = ord('"')


class NameIndex:
    """Snapshot positions of node names, looked up by the names' UTF-8 bytes in place.

    Each name is read as ``width`` little-endian 64-bit words (its bytes zero-padded to
    ``8 width``, see :func:`_words`) plus its length, and hashed with a multiply-add over
    the words. The table is a cuckoo hash table: every indexed name sits in one of two
    slots its hash picks, so a lookup reads both slots and compares each name there word
    by word and by length with the one sought. A name matches exactly when its bytes do;
    the hash only picks where to compare. A request's names are gathered straight from
    the body, and every step is a numpy operation over all of them at once; nothing is
    done per name in Python.

    Names that cannot appear unescaped in a compact JSON array (a quote, backslash,
    control character or comma in them) are left out: a request naming them is not read
    by bytes at all (:func:`_scan` refuses it).

    Args:
        index: node name -> position (a snapshot's ``index``).

    Raises:
        ValueError: a name longer than :data:`MAX_NAME_BYTES`, or the names do not fit
            the table under any of the fixed seeds (the caller then looks names up as
            Python strings).
    """

    MAX_NAME_BYTES = 64
    """Longer names would cost more word operations than a dict lookup."""

    SLOTS_PER_NAME = 2.5
    """At least this many slots per name (rounded up to a power of two), so that the
    table is at most 40 % full, well below where cuckoo insertion starts to fail."""

    SEEDS = 8
    """Hash seeds tried, in order (deterministic), until every name finds a slot."""

    def __init__(self, index: Mapping[str, int]) -> None:
        names = list(index)
        positions = np.fromiter(index.values(), dtype=np.int64, count=len(names))
        blob = orjson.dumps(names)
        if b"\\" in blob or any("," in n for n in names):
            keep = [i for i, n in enumerate(names) if _plain(n)]
            names = [names[i] for i in keep]
            positions = positions[keep]
            blob = orjson.dumps(names)
        if not names:
            raise ValueError("no node names to index")
        found = scan(blob, 0, len(blob), len(names))
        if found is None:  # pragma: no cover - plain names always scan
            raise ValueError("node names do not scan")
        starts, ends = found
        lengths = ends - starts
        longest = int(lengths.max())
        if longest > self.MAX_NAME_BYTES:
            raise ValueError("node names too long for the byte index")
        self.width = width = max(1, (longest + 7) // 8)
        words = _words(blob, starts, lengths, width)
        fields = [(f"w{j}", np.uint64) for j in range(width)]
        self.dtype = np.dtype([*fields, ("n", np.int64), ("pos", np.int64)])
        rows = np.empty(len(names), dtype=self.dtype)
        for j, w in enumerate(words.T):
            rows[f"w{j}"] = w
        rows["n"] = lengths
        rows["pos"] = positions
        self.by_position = np.empty(int(positions.max()) + 1, dtype=object)
        self.by_position[positions] = names
        """The indexed names by snapshot position (the index's own strings)."""
        bits = max(4, math.ceil(math.log2(self.SLOTS_PER_NAME * len(names))))
        self.shift = np.uint64(64 - bits)
        for seed in range(self.SEEDS):
            self.mult = _multipliers(width + 2, seed)
            first, second = self._slots(self._hash(words, lengths))
            slot_rows = _cuckoo(first.tolist(), second.tolist(), 1 << bits)
            if slot_rows is not None:
                break
        else:  # pragma: no cover - would take a pathological set of names
            raise ValueError("node names do not fit the cuckoo table")
        self.slots = np.zeros(1 << bits, dtype=self.dtype)
        self.slots["n"] = -1  # matches no name
        taken = slot_rows >= 0
        self.slots[taken] = rows[slot_rows[taken]]
        # The same table split into plain arrays for the common case (see resolve): each
        # slot's hash and position, and each position's name as words and length.
        self.slot_hash = np.zeros(1 << bits, dtype=np.uint64)
        self.slot_hash[taken] = self._hash(words, lengths)[slot_rows[taken]]
        self.slot_pos = np.full(1 << bits, -1, dtype=np.int64)
        self.slot_pos[taken] = positions[slot_rows[taken]]
        size = int(positions.max()) + 2  # the last entry answers position -1: no name
        self.name_length = np.full(size, -1, dtype=np.int64)
        self.name_length[positions] = lengths
        self.name_words = np.zeros((width, size), dtype=np.uint64)
        self.name_words[:, positions] = words.T

    def _hash(self, words: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        m = self.mult
        h = lengths.view(np.uint64) * m[-1]  # lengths are not negative
        for j, w in enumerate(words.T):
            h += w * m[j]
        h ^= h >> np.uint64(29)
        h *= m[-2]
        return h

    def _slots(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The two slots of each hash: its top bits, and the top bits of its product with
        an odd multiplier."""
        other = h * self.mult[0]
        return h >> self.shift, other >> self.shift

    def names_at(self, positions: np.ndarray) -> list[str]:
        """The names at ``positions`` (each a position of an indexed name)."""
        out: list[str] = self.by_position.take(positions).tolist()
        return out

    def _match(self, rows: np.ndarray, words: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Where the names ``rows`` hold are exactly the names ``words``/``lengths``."""
        hit = rows["n"] == lengths
        for j, w in enumerate(words.T):
            hit &= rows[f"w{j}"] == w
        return hit

    def resolve(self, raw: bytes, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, bool]:
        """(positions of the names ``raw[starts[i]:ends[i]]``, -1 where unknown; whether
        all are known).

        Each name is looked up in the slot of its two whose stored hash equals its own
        (else the second), and then compared word by word and by length with the name at
        the position found. Names that do not match there (unknown names, or a 64-bit
        hash shared by two names) are looked up again in both slots, exactly."""
        lengths = ends - starts
        words = _words(raw, starts, lengths, self.width)
        h = self._hash(words, lengths)
        first, second = self._slots(h)
        slot = np.where(self.slot_hash.take(first) == h, first, second)
        pos = self.slot_pos.take(slot)
        hit = self.name_length.take(pos) == lengths
        for j, w in enumerate(words.T):
            hit &= self.name_words[j].take(pos) == w
        if np.count_nonzero(hit) == len(hit):
            return pos, True
        miss = np.flatnonzero(~hit)
        words, lengths = words[miss], lengths[miss]
        one = self.slots.take(first[miss])
        two = self.slots.take(second[miss])
        in_one = self._match(one, words, lengths)
        again = np.where(in_one, one["pos"], two["pos"])
        in_one |= self._match(two, words, lengths)
        again[~in_one] = -1
        pos[miss] = again
        return pos, bool(in_one.all())


def _cuckoo(first: list[int], second: list[int], size: int) -> np.ndarray | None:
    """Row per slot (-1: empty) placing every row i in slot ``first[i]`` or
    ``second[i]``, by cuckoo insertion (a row finding its slot taken evicts the occupant
    to that one's other slot); None if some row finds no place."""
    table = [-1] * size
    for start in range(len(first)):
        row, slot = start, first[start]
        for _ in range(64 + 8 * size.bit_length()):
            row, table[slot] = table[slot], row
            if row < 0:
                break
            slot = second[row] if slot == first[row] else first[row]
        else:
            return None
    return np.array(table, dtype=np.int64)


def _words(raw: bytes, starts: np.ndarray, lengths: np.ndarray, width: int) -> np.ndarray:
    """Each name ``raw[start:start + length]`` as ``width`` little-endian 64-bit words
    (one row per name): its bytes, zero-padded to ``8 width`` (longer names: their first
    ``8 width`` bytes). One gather of ``8 width`` bytes per name, then the bytes past
    each name are masked off. ``starts`` ascend (as :func:`_scan` gives them)."""
    size = 8 * width
    limit = len(raw) - size
    # A window of overlapping records, one starting at every byte. Indexing, not ``take``:
    # the window is not contiguous, and ``take`` would copy it.
    window = np.ndarray((max(limit + 1, 0),), dtype=f"V{size}", buffer=raw, strides=(1,))
    # The last names, closer than ``size`` to the end (``starts`` ascend, as from _scan).
    if not len(starts) or starts[-1] <= limit:
        records = window[starts]
    else:
        over = np.arange(int(np.searchsorted(starts, limit, side="right")), len(starts))
        at = starts.take(over)
        if limit >= 0:
            records = window[np.minimum(starts, limit)]
        else:
            records = np.empty_like(starts, f"V{size}")
        first = int(at.min())
        tail = raw[first:] + bytes(size)
        window = np.ndarray((len(tail) - size + 1,), dtype=f"V{size}", buffer=tail, strides=(1,))
        records[over] = window[at - first]
    words = records.view("<u8").reshape(len(starts), width)
    shortest = int(lengths.min()) if len(lengths) else 0
    for j in range(width):
        if shortest < 8 * (j + 1):
            words[:, j] &= _MASK_BY_LENGTH[j].take(lengths, mode="clip")
    return words


_MASKS = np.array([(1 << (8 * v)) - 1 for v in range(9)], dtype=np.uint64)
"""The low ``v`` bytes of a word, for v in 0..8."""

_MASK_BY_LENGTH = _MASKS.take(np.clip(np.arange(65)[None, :] - 8 * np.arange(8)[:, None], 0, 8))
"""Row j, column n: the bytes of word j that a name of n bytes fills (n past 64: all)."""


def _multipliers(count: int, seed: int) -> np.ndarray:
    """``count`` odd 64-bit multipliers, fixed per ``seed`` (deterministic)."""
    out, x = [], 0x9E3779B97F4A7C15 + seed
    for _ in range(count):  # splitmix64
        x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        out.append((z ^ (z >> 31)) | 1)
    return np.array(out, dtype=np.uint64)


def _plain(name: str) -> bool:
    """True if ``name`` is written in JSON as its own UTF-8 bytes and has no comma."""
    return "," not in name and orjson.dumps(name) == b'"' + name.encode("utf-8", "replace") + b'"'
