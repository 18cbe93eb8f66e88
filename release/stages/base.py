"""The stage contract: a named unit with declared inputs, a typed result and a run function.

    class MergeStage(Stage[MergeInputs, MergeResult]):
        name = "merge"
        result_type = MergeResult
        def run(self, out: Path) -> MergeResult: ...

- `inputs` (a StageInputs model) is everything the stage's output depends on, and nothing more: its
  fingerprint decides whether a finished stage can be resumed. Fields declared with `location()` say
  *where* an upstream output lives, not what it is (the upstream fingerprint, also an input, covers
  that), so they are left out of the fingerprint.
- `run(out)` writes into the folder `out` and returns the result; paths in the result are relative to
  `out`, so a resumed stage's paths stay valid wherever the work folder is.
- Resources that are not inputs (the registry client, a progress printer) are constructor arguments.

`Pipeline` runs a stage with resume; each `relctl <stage>` subcommand runs the very same object.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from release.core.hashing import sha256_json


def location() -> Any:
    """A field naming where an upstream output lives: not part of the fingerprint."""
    return Field(exclude=True)


def output_folder(out: Path, into: str) -> Path:
    """Where a stage writes inside its folder: `into` below it ("" for the folder itself, as the subcommands
    ask, which write straight into the user's OUT)."""
    return out / into if into else out


class StageInputs(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def fingerprint(self) -> str:
        return sha256_json(self.model_dump(mode="json"))


class StageResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


InputsT = TypeVar("InputsT", bound=StageInputs)
ResultT = TypeVar("ResultT", bound=StageResult)


class Stage(ABC, Generic[InputsT, ResultT]):
    name: ClassVar[str]
    result_type: ClassVar[type[StageResult]]
    # A stage whose state lives outside the work folder (register: the registry) is never resumed from a
    # manifest; it is idempotent against that state instead.
    resumable: ClassVar[bool] = True

    def __init__(self, inputs: InputsT) -> None:
        self.inputs = inputs

    @property
    def label(self) -> str:
        """The name shown in progress lines and used for the stage's folder (a stage may run twice)."""
        return self.name

    @abstractmethod
    def run(self, out: Path) -> ResultT:
        """Do the work into `out` (an empty folder) and return the result."""

    def summary(self, result: ResultT) -> str:
        """One line for the progress output."""
        return ""

    def load_result(self, data: dict[str, Any]) -> ResultT:
        result: ResultT = self.result_type.model_validate(data)  # type: ignore[assignment]
        return result
