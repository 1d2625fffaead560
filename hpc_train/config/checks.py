"""How every group checks its own values: the bounds they must fit, and the ``Checked`` mixin whose helpers raise
a ``ConfigError`` naming the key, the value and the fix.

Pure: a check reads the values it is given, never the filesystem, the environment or this machine (those checks
run at submission, in ``hpc_train.launch.preflight``), so a saved config validates the same everywhere.
"""

from __future__ import annotations

import difflib
import math
import re
import shlex
from collections.abc import Mapping
from dataclasses import fields
from typing import Any, ClassVar

from omegaconf import DictConfig

from hpc_train.core.errors import ConfigError

__all__ = [
    "FLOAT32_MAX",
    "INT32_MAX",
    "INT64_MAX",
    "SLURM_U16_MAX",
    "YEAR_MIN",
    "YEAR_S",
    "Checked",
    "check_target",
    "control_character",
    "invalid",
    "shell_words",
]

INT32_MAX = 2**31 - 1
"""The largest C int: torch's ranks and world size, thread and process counts, Slurm's 32-bit counts."""
INT64_MAX = 2**63 - 1
"""The largest int64: step and sample counts (torch tensors and checkpoints hold them as int64)."""
SLURM_U16_MAX = 0xFFFD
"""Slurm keeps CPUs per task and tasks per node in 16 bits, with 0xFFFE and 0xFFFF as its own markers."""
YEAR_S = 365 * 24 * 3600
"""The longest timeout in seconds (365 days): well inside what timedelta, threading and faulthandler take."""
YEAR_MIN = YEAR_S // 60
FLOAT32_MAX = 3.4028234663852886e38
"""The largest float32: a hyper-parameter beyond it (a learning rate, a weight decay) turns float32 tensors to inf."""
F32 = "the largest float32"


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def control_character(value: Any) -> tuple[str, str] | None:
    """The first control character (newline, tab, escape, ...) anywhere in a string, list or mapping, as
    (where, the character's repr), or None. ``where`` is ``""`` for the value itself, ``[2]`` for a list item,
    ``.key`` for a mapping value and ``{key}`` for a mapping key."""
    if isinstance(value, str):
        found = _CONTROL.search(value)
        return ("", repr(found[0])) if found else None
    if isinstance(value, Mapping | DictConfig):
        for key, item in value.items():
            hit = control_character(str(key))
            if hit:
                return f"{{{key!r}}}", hit[1]
            hit = control_character(item)
            if hit:
                return f".{key}{hit[0]}", hit[1]
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            hit = control_character(item)
            if hit:
                return f"[{i}]{hit[0]}", hit[1]
    return None


def invalid(key: str, value: Any, rule: str, hint: str) -> ConfigError:
    """The error for a bad value of the dotted ``key``: ``<key>=<value> is invalid: <rule>. HINT: <hint>``."""
    return ConfigError(f"{key}={value!r} is invalid: {rule}. HINT: {hint}")


def shell_words(text: str) -> list[str]:
    """``text`` split like a shell would; [] when it cannot be (unbalanced quotes)."""
    try:
        return shlex.split(text)
    except ValueError:
        return []


class Checked:
    """Mixin: ``self._require(ok, field, rule, hint)`` raises a ConfigError naming ``<group>.<field>``."""

    _group: ClassVar[str]
    _raw_shell: ClassVar[tuple[str, ...]] = ()
    """Fields that are never written into a script or command (or are raw shell by design): not checked for
    control characters."""

    def _refuse_control_characters(self) -> None:
        """No value may carry a newline or another control character into a generated script: bash reads an
        ``#SBATCH`` line as a comment, quotes and all, so a newline in a value starts a command of its own."""
        for f in fields(self):  # type: ignore[arg-type]
            if f.name in self._raw_shell:
                continue
            hit = control_character(getattr(self, f.name))
            if hit:
                where, char = hit
                raise ConfigError(
                    f"{self._group}.{f.name}{where} holds the control character {char}, which would let the value "
                    f"run as a shell command in the job script. HINT: remove it from the value (look in the profile "
                    f"or experiment file that sets it); only cluster.slurm.setup lines may hold shell code."
                )

    def _require(self, ok: bool, key: str, rule: str, hint: str) -> None:
        if not ok:
            raise invalid(f"{self._group}.{key}", getattr(self, key), rule, hint)

    def _bounded(
        self, key: str, low: float, high: float, example: object, *, above: bool = False, why: str = ""
    ) -> None:
        """``<group>.<key>`` is a finite number from ``low`` (more than ``low`` when ``above``) to ``high``, so that
        it fits where it goes (a seed into torch's generators, seconds into a timedelta, a count into a C int)
        instead of failing on every rank after launch. Whole-number bounds word the rule for an integer key;
        ``why`` says where ``high`` comes from; ``example`` is the value the hint suggests."""
        value = getattr(self, key)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        finite = number and (isinstance(value, int) or math.isfinite(value))  # (an int may be too big for a float)
        if finite and (value > low if above else value >= low) and value <= high:
            return
        note = f" ({why})" if why else ""
        if isinstance(low, int) and isinstance(high, int):
            rule = f"must be a whole number from {low} to {high}{note}"
        else:
            rule = f"must be a finite number {'above' if above else 'from'} {_plain(low)} "
            rule += f"{'and at most' if above else 'to'} {_plain(high)}{note}"
        self._require(False, key, rule, f"e.g. {self._group}.{key}={example}")

    def _one_of(self, key: str, choices: tuple[str, ...]) -> None:
        value = getattr(self, key)
        close = difflib.get_close_matches(str(value), choices, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        self._require(
            value in choices,
            key,
            f"must be one of {', '.join(choices)}",
            f"{hint}e.g. {self._group}.{key}={choices[0]}",
        )


def _plain(number: float) -> str:
    """A bound as people write it: 31536000, not 3.1536e+07; 0.5 stays 0.5."""
    return str(int(number)) if float(number).is_integer() and abs(number) < 1e15 else f"{number:g}"


def check_target(node: Checked, key: str) -> None:
    """A user-code field is None or a Hydra node naming what to call in ``_target_``."""
    value = getattr(node, key)
    node._require(
        value is None or (isinstance(value, Mapping) and isinstance(value.get("_target_"), str)),
        key,
        "must name a callable in _target_",
        f"e.g. {node._group}.{key}={{_target_: mypkg.mymodule.build}}",
    )
