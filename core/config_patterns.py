"""The name patterns a checkpoint's config lists, compiled once into one matcher per field,
matched in time linear in the name: ModelOpt ``exclude_modules`` globs and compressed-tensors
``ignore`` / ``targets`` entries (``re:`` regexes, or exact names).

A checkpoint is untrusted input, so its patterns never reach a backtracking engine: Python's
``re.match`` runs ``re:(\\w+\\.?)+x$`` for minutes on a 40-character name, and fnmatch
compiles each glob to such a regex. Here:
- an entry with no wildcard (a glob without ``*?[``, a compressed-tensors name) is a set
  member, looked up in O(1) whatever the count;
- every other entry is translated once (a glob to the regex fnmatch would build; a ``re:``
  regex kept as written) and all of one field's go into one RE2 program (linear time, no
  backtracking), so a name costs one match, not one per pattern.

Semantics kept: a glob matches as ``fnmatch.fnmatchcase`` (whole name, case sensitive, ``*``
and ``?`` cross dots, ``[...]`` classes as fnmatch reads them); a ``re:`` entry matches as
compressed-tensors' ``re.match`` (anchored at the start, not the end). Each regex is compiled by
Python's ``re`` too, so an entry Python refuses is refused as compressed-tensors would, and an
entry Python accepts but RE2 cannot run (a backreference, a lookaround, ``\\Z``, verbose mode)
is refused naming the file, the field and the entry. Two constructs both engines accept but
read differently are refused as well: ``{,n}`` (Python: 0 to n; RE2: the literal text) and a
POSIX class ``[:name:]`` (RE2: a class; Python: the characters).

Caps (each refused naming the file and field): ``MAX_ENTRIES`` entries per field (a set
lookup each: 2^18 covers an explicit per-expert list of a 61-layer, 384-expert model, 70,000
names, with room); ``MAX_COMPILED`` wildcard or regex entries and ``MAX_COMPILED_CHARS`` of
their text per field (real lists hold tens to a few hundred, each under 100 characters);
``MAX_ENTRY_CHARS`` per entry. RE2 bounds each match by (name length x program size), which
these caps bound, but a crafted list can still make RE2's DFA give up and every match cost
milliseconds; so the time spent matching one field is counted, and past ``MATCH_BUDGET_S``
the field is refused in one line rather than left to run (real lists spend milliseconds).
Trap: RE2's ``\\d \\w \\s \\b`` are ASCII and its ``$`` is the end of the text (Python's also
matches before a final newline): the same verdicts as Python's ``re`` on ASCII names without
control characters, which is every module name a spec admits.
"""

from __future__ import annotations

import fnmatch
import re
import time
import warnings
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from specbind.core.errors import CheckpointError

if TYPE_CHECKING:
    import re2
else:
    re2 = None  # imported on first use (``_re2``): only a quantized checkpoint's lists need it


def _re2() -> Any:
    """The ``re2`` module, imported on first use: 30 ms that a bind of an unquantized
    checkpoint (and every CLI start) would otherwise pay."""
    global re2
    if re2 is None:
        import re2 as module

        re2 = module
    return re2


MAX_ENTRIES = 1 << 18
MAX_COMPILED = 2048
MAX_COMPILED_CHARS = 128 * 1024
MAX_ENTRY_CHARS = 4096
MATCH_BUDGET_S = 10.0
Kind = Literal["glob", "compressed_tensors"]


def _options(max_mem: int = 8 << 20) -> Any:
    o = _re2().Options()
    o.log_errors = False  # a refusal is our one line, not RE2's log on stderr
    o.never_capture = True  # groups only group: two entries may name the same group
    o.max_mem = max_mem
    return o


class NameMatcher:
    """One config field's entries (``where``: ``"config.json quantization_config.ignore"``),
    checked and compiled once; ``matches`` says whether any entry matches a name."""

    def __init__(self, entries: Sequence[str], kind: Kind, where: str) -> None:
        if len(entries) > MAX_ENTRIES:
            raise CheckpointError(
                f"{where}: {len(entries)} entries, over the cap of {MAX_ENTRIES}; refusing "
                "a pattern list this long"
            )
        self.where = where
        self.kind = kind
        compiled = [e for e in dict.fromkeys(entries) if _compiled(e, kind)]  # once, in order
        self._names = frozenset(entries) - set(compiled)
        n_chars = sum(len(e) for e in compiled)
        if len(compiled) > MAX_COMPILED or n_chars > MAX_COMPILED_CHARS:
            what = "wildcard globs" if kind == "glob" else "re: regexes"
            raise CheckpointError(
                f"{where}: {len(compiled)} {what} ({n_chars} characters), over the cap of "
                f"{MAX_COMPILED} ({MAX_COMPILED_CHARS} characters); refusing a pattern list "
                "this costly"
            )
        # (entry as written, its RE2 source), each checked alone so a refusal names it
        self._sources = [(e, _source(e, kind, where)) for e in compiled]
        self._rx: Any = None
        if self._sources:
            joined = "|".join(f"(?:{s})" for _, s in self._sources)
            try:
                self._rx = _re2().compile(joined, _options(64 << 20))
            except re2.error as e:
                raise CheckpointError(
                    f"{where}: its {len(self._sources)} patterns together are too large to "
                    f"match in bounded memory ({_why(e)})"
                ) from None
        self._spent = 0.0

    def matches(self, name: str) -> bool:
        if name in self._names:
            return True
        if self._rx is None:
            return False
        t0 = time.perf_counter()
        try:
            hit = self._rx.fullmatch(name) if self.kind == "glob" else self._rx.match(name)
        except UnicodeEncodeError:  # RE2 matches UTF-8; a lone surrogate has none
            raise CheckpointError(
                f"{self.where}: the module name {name!r} is not text (a lone surrogate)"
            ) from None
        self._spent += time.perf_counter() - t0
        if self._spent > MATCH_BUDGET_S:
            raise CheckpointError(
                f"{self.where}: matching its {len(self._sources)} patterns against the "
                f"checkpoint's module names took over {MATCH_BUDGET_S:g} s; refusing a "
                "pattern list this costly"
            )
        return hit is not None

    def any(self, names: Iterable[str]) -> bool:
        return any(self.matches(n) for n in names)

    def first(self, name: str) -> str | None:
        """The first entry, as written, that matches ``name`` (for a message); None if none."""
        if name in self._names:
            return name
        for entry, src in self._sources:
            rx = _re2().compile(src, _options())
            if (rx.fullmatch(name) if self.kind == "glob" else rx.match(name)) is not None:
                return entry
        return None


def _compiled(entry: str, kind: Kind) -> bool:
    """Whether an entry is a pattern (compiled), not one module's exact name (a set member)."""
    if kind == "glob":
        return any(c in entry for c in "*?[")
    return entry.startswith("re:")


def _source(entry: str, kind: Kind, where: str) -> str:
    """The RE2 source of one pattern entry, refused naming it if RE2 cannot run it."""
    if len(entry) > MAX_ENTRY_CHARS:
        raise CheckpointError(
            f"{where}: an entry of {len(entry)} characters ({entry[:40]!r}…), over the cap of "
            f"{MAX_ENTRY_CHARS}"
        )
    try:
        entry.encode("utf-8")
    except UnicodeEncodeError:  # RE2 compiles UTF-8; a lone surrogate has none
        raise CheckpointError(f"{where} entry {entry!r}: is not text (a lone surrogate)") from None
    if kind == "glob":
        src = glob_source(entry)
    else:
        src = regex_source(entry[3:], f"{where} entry {entry!r}")
    try:
        _re2().compile(src, _options())
    except re2.error as e:
        raise CheckpointError(
            f"{where} entry {entry!r}: not runnable by the linear-time engine specbind matches "
            f"checkpoint patterns with (RE2: {_why(e)}); backreferences, lookarounds, \\Z and "
            "verbose mode are not supported"
        ) from None
    return src


_DIFFERENT = (
    (re.compile(r"\{,"), "'{,n}' (Python reads 0 to n, RE2 the literal text)"),
    (re.compile(r"\[:[A-Za-z]+:\]"), "a POSIX class '[:name:]' (RE2 reads a class, Python not)"),
)


def regex_source(pattern: str, what: str) -> str:
    """A compressed-tensors ``re:`` regex as RE2 source, refused when Python's ``re`` refuses
    it or when the two engines would read it differently."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FutureWarning on a possible nested set
        try:
            re.compile(pattern)
        except (re.error, RecursionError, OverflowError, ValueError) as e:
            raise CheckpointError(f"{what}: not a valid regular expression: {e}") from None
    for rx, why in _DIFFERENT:
        if rx.search(pattern):
            raise CheckpointError(
                f"{what}: uses {why}; refused rather than matched differently from "
                "compressed-tensors"
            )
    return pattern


def glob_source(glob: str) -> str:
    """The RE2 source that matches exactly the names ``fnmatch.fnmatchcase(name, glob)`` does
    (with ``fullmatch``): ``*`` any run, ``?`` any character, ``[...]`` as fnmatch reads it."""
    out: list[str] = ["(?s)"]
    i, n = 0, len(glob)
    while i < n:
        c = glob[i]
        i += 1
        if c == "*":
            if out[-1] != ".*":
                out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[":
            j = i
            if j < n and glob[j] == "!":
                j += 1
            if j < n and glob[j] == "]":
                j += 1
            while j < n and glob[j] != "]":
                j += 1
            if j >= n:
                out.append(_char("["))
            else:
                out.append(_class(glob[i - 1 : j + 1]))
                i = j + 1
        else:
            out.append(_char(c))
    return "".join(out)


def _char(c: str) -> str:
    return c if c.isascii() and (c.isalnum() or c == "_") else f"\\x{{{ord(c):x}}}"


def _class(glob_class: str) -> str:
    """A glob's ``[...]`` as RE2 source: fnmatch's own translation of it alone (the same
    reading it gets in place), re-spelled with every member escaped."""
    inner = fnmatch.translate(glob_class)
    body = inner[len("(?s:") : -len(")\\Z")]
    if body == "(?!)":  # only empty ranges: matches nothing
        return "[^\\x00-\\x{10ffff}]"
    if body == ".":
        return "."
    assert body.startswith("[") and body.endswith("]"), body
    s = body[1:-1]
    neg = s.startswith("^")
    if neg:
        s = s[1:]
    members: list[str] = []
    k = 0
    while k < len(s):
        if s[k] == "\\":
            members.append(_char(s[k + 1]))
            k += 2
        elif s[k] == "-" and members and k + 1 < len(s):
            members.append("-")  # an unescaped hyphen between two members is a range
            k += 1
        else:
            members.append(_char(s[k]))
            k += 1
    return "[" + ("^" if neg else "") + "".join(members) + "]"


def _why(e: Exception) -> str:
    msg = e.args[0] if e.args else e
    return msg.decode("utf-8", "replace") if isinstance(msg, bytes) else str(msg)
