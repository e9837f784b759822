"""What a checkpoint `repo_id` names: a builtin preset, a Hub repo, or a local directory.

The rule, decided from the text alone (never from what happens to exist on disk):

1. `builtin:NAME` is a packaged preset;
2. text that has the form of a Hugging Face Hub repo id, `NAME` or `OWNER/NAME` with each
   part made of letters, digits, `.`, `_` and `-` (not starting or ending with `.` or `-`,
   not `.` or `..`), is a Hub repo, even when a local directory of that name exists;
3. anything else is a local path: absolute (`/data/model`), explicitly relative
   (`./model`, `../models/m`), under the home directory (`~/m`), or with more than one `/`
   (`checkpoints/run/step-9`).

Why: the coordinator broadcasts the checkpoint's `repo_id`, and resolving a repo id as a
local path first let whoever set it point every client at a directory on its own disk. A
local directory is now loaded only when it is written as a path; write `./org/model` for a
relative directory whose name looks like a repo id.

API: `SourceKind`, `classify_source(source) -> SourceKind`, `BUILTIN_PREFIX`.
"""

from __future__ import annotations

import enum
import re

BUILTIN_PREFIX = "builtin:"

_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?"
_REPO_ID = re.compile(rf"{_PART}(?:/{_PART})?")


class SourceKind(enum.Enum):
    BUILTIN = "builtin"
    HUB = "hub"
    LOCAL = "local"


def looks_like_repo_id(source: str) -> bool:
    """Whether `source` has the form of a Hub repo id (`NAME` or `OWNER/NAME`)."""
    return _REPO_ID.fullmatch(source) is not None and ".." not in source


def classify_source(source: str) -> SourceKind:
    """Which kind of model source `source` names (see the module docstring)."""
    if source.startswith(BUILTIN_PREFIX):
        return SourceKind.BUILTIN
    if looks_like_repo_id(source):
        return SourceKind.HUB
    return SourceKind.LOCAL
