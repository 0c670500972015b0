"""Text from submissions, made inert for each place it ends up: a CSV cell, Markdown, a terminal, a file name.

Student ids, file names, exception messages and printed output are all chosen by students. Each output
format gets one function here, and the report writers use nothing else:

* ``csv_cell``: no control characters (a bare CR splits a record in every CSV reader), and OWASP's rule
  against formula injection: a cell starting with ``= + - @``, TAB or CR gets a leading ``'`` — except
  a plain number, which stays a number.
* ``md_text`` / ``md_code``: Markdown that renders literally (every ASCII punctuation mark backslash-escaped,
  one line), and fenced code whose fence is longer than any backtick run inside.
* ``terminal``: no escape sequences (colours, OSC 52 clipboard writes, cursor moves) or control characters.
* ``strip_controls`` (under all of these): removes escape sequences, C0/C1 control characters but TAB and LF, and
  Unicode's invisible format characters (category Cf: bidirectional overrides and isolates such as U+202E and
  U+2066-2069, zero-width characters); line and paragraph separators (U+2028/2029, NEL) become newlines. This is
  the one definition of "control character" in the grader.
* ``file_stem``: a readable, length-bounded prefix plus a hash of the exact id: distinct ids, distinct files.
"""
import hashlib
import re
import string

ESCAPES = re.compile(r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]|\x9b[0-9;?]*[ -/]*[@-~]")
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")            # everything but TAB and LF
# Unicode's format characters (category Cf, Unicode 14), spelled out: scanning all code points costs 0.25 s per import.
INVISIBLE = re.compile("[\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e\u200b-\u200f\u202a-\u202e"
                       "\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U00013438"
                       "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]")
SEPARATORS = re.compile("[\u2028\u2029\x85]")
FORMULA_START = tuple("=+-@\t\r") + ("\uff1d", "\uff0b", "\uff0d", "\uff20")  # full-width forms too
NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
MD_SPECIAL = re.compile("([" + re.escape(string.punctuation) + "])")


def strip_controls(text: str, *, keep_newlines: bool = True) -> str:
    text = ESCAPES.sub("", str(text)).replace("\r\n", "\n").replace("\r", "\n")
    text = INVISIBLE.sub("", CONTROL.sub("", SEPARATORS.sub("\n", text)))
    return text if keep_newlines else re.sub(r"[\n\t]+", " ", text)


def csv_cell(value) -> str:
    text = strip_controls(value, keep_newlines=False)
    if NUMBER.match(text):
        return text
    return "'" + text if text.lstrip(" ").startswith(FORMULA_START) else text


def md_text(text: str) -> str:
    """One line of literal text in Markdown: no heading, link, image, HTML, comment or emphasis survives."""
    return MD_SPECIAL.sub(r"\\\1", strip_controls(text, keep_newlines=False))


def md_code(text: str) -> list[str]:
    """Lines of a fenced code block showing ``text`` exactly (control characters removed)."""
    body = strip_controls(text).rstrip("\n")
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + "text", *body.split("\n"), fence]


def terminal(text: str) -> str:
    return strip_controls(text, keep_newlines=False)


def file_stem(student: str, *, prefix_chars: int = 40) -> str:
    """``<readable prefix>-<10 hex of sha256(id)>``: unique per exact id, at most 51 characters, portable."""
    readable = "".join(ch if ch.isascii() and (ch.isalnum() or ch in "-_.@") else "_" for ch in student)
    readable = readable.lstrip(".")[:prefix_chars] or "student"
    return f"{readable}-{hashlib.sha256(student.encode('utf-8', 'surrogateescape')).hexdigest()[:10]}"
