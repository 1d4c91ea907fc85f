"""memwall's errors as Python exceptions: the CLI's ``error:``/``hint:`` lines, parsed."""

from __future__ import annotations

import re
from typing import List, Optional, Sequence

__all__ = ["MemwallError", "MemwallWarning"]

# the first flag an error line names: `invalid --batch/-b 0: …`, `does not support --optimizer`,
# clap's `invalid value 'x' for '--precision <PRECISION>'`, `unexpected argument '--foo' found`
_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
# `invalid model field `num_hidden_layers`` (a field of the model's config, not a flag)
_CONFIG_FIELD = re.compile(r"model field `([^`]+)`")
# a config field a cause names: `missing required field `x``, `inconsistent fields `a` and `b``
_NAMED_FIELD = re.compile(r"`([A-Za-z_][A-Za-z0-9_.]*)`")
# errors about the model itself, which name no flag
_MODEL_ERROR = re.compile(
    r"^(unknown model|no such file|model |cannot use model|cannot read model|"
    r"cannot use the config|cannot use the quantization_config|cannot count the parameters)"
)


class MemwallError(ValueError):
    """An input memwall cannot use: the message names the offending value, the hint what to do.

    Attributes:
        message: what went wrong (the CLI's ``error:`` line, with its ``caused by:`` lines).
        hint: what to do about it (the CLI's ``hint:`` line), or ``None``.
        flag: the CLI flag at fault (``"--batch"``), or ``None``.
        field: the keyword argument at fault (``"batch"``), or, when the model's config is at
            fault, the first config field the error names (``"num_attention_heads"``; the flag
            is then ``--model``), or ``None``.
        lines: the error report as the CLI prints it on stderr.
    """

    message: str
    hint: Optional[str]
    flag: Optional[str]
    field: Optional[str]
    lines: List[str]

    def __init__(
        self,
        message: str,
        hint: Optional[str] = None,
        *,
        field: Optional[str] = None,
        flag: Optional[str] = None,
        lines: Optional[Sequence[str]] = None,
    ) -> None:
        self.message = message
        self.hint = hint
        self.field = field
        self.flag = flag
        if lines is None:
            lines = [f"error: {message}"] + ([f"hint: {hint}"] if hint else [])
        self.lines = list(lines)
        super().__init__(message if hint is None else f"{message}\nhint: {hint}")

    @classmethod
    def _from_lines(cls, text: str) -> "MemwallError":
        """The exception for the CLI's error report (``error: …``, causes, ``hint: …``)."""
        lines = [line for line in text.splitlines() if line.strip()]
        hint = None
        body: List[str] = []
        for line in lines:
            if line.startswith("hint: "):
                hint = line[len("hint: ") :]
            else:
                body.append(line[len("error: ") :] if line.startswith("error: ") else line)
        message = "\n".join(body) if body else text.strip()
        first = body[0] if body else ""
        flag = None
        field = None
        m = _FLAG.search(first)
        c = _CONFIG_FIELD.search(message)
        if m:
            flag = m.group(1)
            field = flag[2:].replace("-", "_")
        elif c:
            # the model's config is at fault: the flag that gave it, and the config field
            flag, field = "--model", c.group(1)
        elif _MODEL_ERROR.match(first):
            flag, field = "--model", "model"
            for cause in body[1:]:
                named = _NAMED_FIELD.search(cause)
                if named:
                    field = named.group(1)
                    break
        return cls(message, hint, field=field, flag=flag, lines=lines)


class MemwallWarning(UserWarning):
    """A warning from memwall (the training callback's "this run will not fit")."""
