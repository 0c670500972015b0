"""Similar submissions: one exercise's cells compared across the class, by winnowed fingerprints (as MOSS does).

Schleimer, Wilkerson and Aiken, "Winnowing: local algorithms for document fingerprinting" (SIGMOD 2003), the
algorithm behind MOSS: a cell becomes a sequence of normalised tokens; every k consecutive tokens (a k-gram) are
hashed; in every window of w consecutive hashes the smallest is kept. Two cells that share a passage of at least
k + w - 1 tokens are guaranteed to share a fingerprint, and noise shorter than k tokens never matches.

* Tokens come from Python's own ``tokenize``: comments and blank lines dropped; a variable, parameter or function
  name becomes ``V`` (renaming them changes nothing), and so does an attribute of ``self`` (``self.shards``), but
  keywords, builtins and other attribute names stay (``.step``, ``.zero_grad``: the method is the substance); every
  string becomes ``S``, every number ``0``.
* The released scaffold (signature, docstring, TODO comments) is subtracted: fingerprints it has are not evidence.
  So is what many students wrote alike (MOSS's ``-m``): a fingerprint found in more than ``COMMON_SHARE`` of the
  class's cells (and in more than ``COMMON_MIN``) is the idiom the exercise's API forces, not a copy.
* similarity = shared fingerprints / fingerprints of the smaller cell (MOSS's "percentage matched" of the cell
  that is contained), reported for pairs at or above the threshold; cells with fewer than ``MIN_FINGERPRINTS``
  fingerprints of their own (a blank scaffold, a one-liner) are not compared.

Why not a library: copydetect (the maintained winnowing package on PyPI) pulls in numpy, matplotlib and pygments
into the class grader's process, which stays free of numpy and torch (tests/project/test_layering.py), and works on files
with boilerplate files; for one Python cell per student the standard library's tokenizer and sixty lines do it.
A flagged pair is a reason to read both cells, never a verdict.
"""
import builtins
import hashlib
import io
import keyword
import tokenize
from dataclasses import dataclass
from itertools import combinations

K, WINDOW = 12, 8          # k-gram length and winnowing window, in tokens (MOSS's typical values are 5-50)
THRESHOLD = 0.6            # pairs at or above this similarity are listed
MIN_FINGERPRINTS = 8       # cells with fewer fingerprints of their own are not compared
COMMON_SHARE, COMMON_MIN = 0.2, 4
KEEP = set(keyword.kwlist) | set(dir(builtins)) | {"self", "torch", "nn", "dist", "F"}
SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER}


@dataclass(frozen=True)
class Pair:
    exercise: str
    a: str
    b: str
    similarity: float
    shared: int               # fingerprints in common


def tokens(source: str) -> list[str]:
    """The cell's normalised tokens (empty when it does not tokenize)."""
    out, previous, before = [], "", ""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type in SKIP:
                continue
            if tok.type == tokenize.NAME:
                mine = previous == "." and before == "self"
                text = tok.string if (tok.string in KEEP or previous == ".") and not mine else "V"
            elif tok.type == tokenize.STRING or tok.type == getattr(tokenize, "FSTRING_START", -1):
                text = "S"
            elif tok.type in (getattr(tokenize, "FSTRING_MIDDLE", -1), getattr(tokenize, "FSTRING_END", -1)):
                continue
            elif tok.type == tokenize.NUMBER:
                text = "0"
            elif tok.type in (tokenize.INDENT, tokenize.DEDENT, tokenize.NEWLINE):
                text = {tokenize.INDENT: ">", tokenize.DEDENT: "<", tokenize.NEWLINE: ";"}[tok.type]
            else:
                text = tok.string
            out.append(text)
            before, previous = previous, tok.string
    except (tokenize.TokenError, IndentationError, SyntaxError, ValueError):
        return out
    return out


def _hash(gram: tuple[str, ...]) -> int:
    return int.from_bytes(hashlib.blake2b(" ".join(gram).encode(), digest_size=8).digest(), "big")


def fingerprints(source: str, k: int = K, window: int = WINDOW) -> set[int]:
    """Winnowing: the smallest k-gram hash of every window of ``window`` consecutive hashes."""
    toks = tokens(source)
    hashes = [_hash(tuple(toks[i:i + k])) for i in range(len(toks) - k + 1)]
    if len(hashes) <= window:
        return set(hashes)
    chosen = set()
    for start in range(len(hashes) - window + 1):
        part = hashes[start:start + window]
        low = min(part)
        chosen.add(low)
    return chosen


def similar_pairs(cells: dict[str, dict[str, str]], scaffolds: dict[str, str], *,
                  threshold: float = THRESHOLD) -> list[Pair]:
    """Pairs of students whose cells of one exercise are at least ``threshold`` similar, most similar first.

    ``cells``: exercise -> {student: cell source}; ``scaffolds``: exercise -> the released cell (subtracted)."""
    found = []
    for exercise, by_student in sorted(cells.items()):
        common = fingerprints(scaffolds.get(exercise, ""))
        prints = {s: fingerprints(src) - common for s, src in by_student.items()}
        seen = {}
        for p in prints.values():
            for f in p:
                seen[f] = seen.get(f, 0) + 1
        limit = max(COMMON_MIN, COMMON_SHARE * len(prints))
        prints = {s: {f for f in p if seen[f] <= limit} for s, p in prints.items()}
        prints = {s: p for s, p in prints.items() if len(p) >= MIN_FINGERPRINTS}
        for a, b in combinations(sorted(prints), 2):
            shared = len(prints[a] & prints[b])
            score = shared / min(len(prints[a]), len(prints[b]))
            if score >= threshold:
                found.append(Pair(exercise, a, b, round(score, 3), shared))
    return sorted(found, key=lambda p: (-p.similarity, p.exercise, p.a, p.b))
