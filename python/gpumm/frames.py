"""The user's frames in a recorded stack.

A PyTorch snapshot's stacks lead with the unwinder (``??:0 torch::unwind::unwind()``), the
caching allocator, the dispatcher (``c10::``, ``at::``) and CPython's interpreter loop; the line
that says who asked for the memory is the first Python frame in the user's own code. This
module splits a stack (innermost frame first, each ``"file:line:function"`` as
:attr:`gpumm.traces.Trace.frames` holds them) into the user's frames and library frames
(installed packages such as ``torch/nn/modules``, the standard library), and drops the rest.

>>> user_frame(["??:0:torch::unwind::unwind()",
...             "/usr/lib/python3/site-packages/torch/nn/modules/linear.py:125:forward",
...             "/home/me/train.py:40:step"])
Frame(file='/home/me/train.py', line=40, name='step', kind='user')
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

__all__ = ["Frame", "parse_frame", "classify", "useful_frames", "user_frame", "group_key",
           "short_path", "holders"]

_FRAME = re.compile(r"^(.*?):(\d+):(.*)$", re.S)
#: path parts that mark an installed package or the standard library (POSIX or Windows)
_LIBRARY = re.compile(r"[\\/](site-packages|dist-packages)[\\/]|[\\/]lib[\\/]python\d[\d.]*[\\/]"
                      r"|[\\/]Lib[\\/]|^<frozen ", re.I)
#: torch's own Python plumbing: a frame there never says who asked for memory
_PLUMBING = re.compile(r"[\\/]torch[\\/](utils[\\/]_contextlib|_tensor|_ops|overrides|"
                       r"cuda[\\/]memory|_dynamo|_inductor|autograd[\\/]function)|"
                       r"[\\/]torch[\\/]nn[\\/]modules[\\/]module\.py$")


@dataclass(frozen=True)
class Frame:
    """One frame: ``kind`` is "user" (the user's Python code), "library" (an installed
    package's or the standard library's Python code) or "internal" (native code, CPython's
    loop, frozen modules, torch's own plumbing)."""

    file: str
    line: int
    name: str
    kind: str

    def __str__(self) -> str:
        return f"{short_path(self.file)}:{self.line} {self.name}"


def short_path(path: str, parts: int = 2) -> str:
    """The last ``parts`` components of a POSIX or Windows path."""
    bits = [b for b in re.split(r"[\\/]", path) if b]
    return "/".join(bits[-parts:]) if bits else path


def classify(file: str) -> str:
    """"user", "library" or "internal" for a frame's file name (see :class:`Frame`)."""
    if not file.endswith((".py", ".pyx")) or file.startswith("<"):
        return "internal"
    if _PLUMBING.search(file):
        return "internal"
    if _LIBRARY.search(file):
        return "library"
    return "user"


def parse_frame(text: str) -> Frame:
    """A ``"file:line:function"`` string as a :class:`Frame` (a Windows drive letter and a C++
    name's ``::`` are kept whole)."""
    m = _FRAME.match(text)
    if not m:
        return Frame(text, 0, "?", "internal")
    file, line, name = m.group(1), int(m.group(2)), m.group(3)
    return Frame(file, line, name, classify(file))


def useful_frames(stack: Iterable[str]) -> List[Frame]:
    """The user's frames (innermost first), then the library frames; internal ones dropped."""
    frames = [parse_frame(s) for s in stack]
    return ([f for f in frames if f.kind == "user"] + [f for f in frames if f.kind == "library"])


def user_frame(stack: Iterable[str]) -> Optional[Frame]:
    """The first frame of the user's code, else the first library frame, else None."""
    useful = useful_frames(stack)
    return useful[0] if useful else None


def group_key(stack: Sequence[str]) -> str:
    """What a stack's memory is grouped under: its :func:`user_frame`, or "(no Python frame)"
    when it has none."""
    f = user_frame(stack)
    return str(f) if f else "(no Python frame)"


def holders(items: Iterable[Tuple[int, Sequence[str]]], limit: int = 10
            ) -> List[Tuple[str, int, int, List[str]]]:
    """(bytes, stack) pairs grouped by :func:`group_key`, largest first: each (key, bytes,
    count, the first such stack's useful frames as text)."""
    groups: Dict[str, List] = {}
    for nbytes, stack in items:
        key = group_key(stack)
        g = groups.setdefault(key, [0, 0, [str(f) for f in useful_frames(stack)[:6]]])
        g[0] += nbytes
        g[1] += 1
    ranked = sorted(groups.items(), key=lambda kv: -kv[1][0])[:limit]
    return [(k, b, n, s) for k, (b, n, s) in ranked]
