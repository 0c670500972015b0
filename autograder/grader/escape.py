"""Text from submissions, made inert for each place it ends up: a CSV cell, Markdown, a terminal, a file name.

Student ids, file names, exception messages and printed output are all chosen by students. Each output
format gets one function here, and the report writers use nothing else:

* ``csv_cell``: no control characters (a bare CR splits a record in every CSV reader), and OWASP's rule
  against formula injection: a cell starting with ``= + - @``, TAB or CR gets a leading ``'`` — except
  a plain number, which stays a number.
* ``md_text`` / ``md_code``: one line of Markdown that renders literally, and fenced code whose fence is longer
  than any backtick run inside. ``md_text`` escapes only the characters Markdown could read as markup where they
  stand (``loss, 1.5, is off by about 7%`` stays as it is: the .md feedback is also pasted into LMS text boxes as
  plain text); it assumes nothing about the text around it, so a construct can neither start nor end inside it.
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
PUNCTUATION = frozenset(string.punctuation)
ORDERED_ITEM = re.compile(r"\d{1,9}[.)](?=\s|$)")            # "1. " or "2) " opens an ordered list at a line start
ENTITY = re.compile(r"&#?[A-Za-z0-9]+;|&#?[A-Za-z0-9]*$")      # "&amp;", "&#38;" render as the character


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
    line = strip_controls(text, keep_newlines=False).strip()  # edge spaces: an indent, or a hard break ("  \n")
    out = []
    for i, ch in enumerate(line):
        if _is_markup(line, i) or (i == 0 and ch in PUNCTUATION):  # a first character could open a block
            out.append("\\")                                        # (# > - + * = | ` ~ [ < ...)
        out.append(ch)
    escaped = "".join(out)
    item = ORDERED_ITEM.match(escaped)
    return escaped if not item else escaped[: item.end() - 1] + "\\" + escaped[item.end() - 1:]


def _is_markup(line: str, i: int) -> bool:
    """Whether ``line[i]`` could take part in inline markup (or its end), whatever surrounds ``line``."""
    ch = line[i]
    before, after = line[i - 1] if i else "", line[i + 1] if i + 1 < len(line) else ""
    if ch in "\\`":                           # escapes, code spans
        return True
    if ch == "*":                              # emphasis: inert only with white space on both sides
        return not (before.isspace() and after.isspace())
    if ch == "_":                              # emphasis: inert inside a word (snake_case)
        return not (before.isalnum() and after.isalnum())
    if ch == "~":                              # strikethrough (~~)
        return not before or not after or "~" in (before, after)
    if ch == "<":                              # HTML, comments, autolinks (<a@b.c>): inert before a space
        return not after.isspace()
    if ch == "]":                              # a link: ](...) or ][...]
        return after in ("", "(", "[")
    if ch == "^":                              # a footnote reference, [^key], shows its escapes raw
        return before == "["
    if ch == "&":                              # an entity
        return bool(ENTITY.match(line, i))
    if ch == "#":                              # a trailing run of # closes an ATX heading
        return line[i:].strip("#") == ""
    return False


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
