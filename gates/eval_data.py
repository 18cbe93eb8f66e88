"""The eval set: JSONL rows {"prompt", "expected"} validated with Great Expectations before use.

Validation runs in an ephemeral GX context (nothing written to disk, progress bars off) and checks the
schema (columns present, strings), nulls, lengths, the label set and the row count. The first failed
expectation becomes one InputError naming the file and, where it applies, the line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gates.jsonl import Record, read_jsonl
from release.core.errors import InputError
from release.core.hashing import sha256_file

COLUMNS = ("prompt", "expected")
SCHEMA_HINT = 'every line needs string keys "prompt" and "expected"'


class DataRules(BaseModel):
    """The expectations an eval set must meet (`gates.eval.expectations` in release.yaml)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_rows: int = Field(default=1, ge=1, description="fewest rows that make the metrics meaningful")
    max_rows: int | None = Field(default=None, ge=1)
    max_prompt_chars: int = Field(default=4096, ge=1)
    max_expected_chars: int = Field(default=4096, ge=1)
    label_set: list[str] | None = Field(default=None, description="when set, every `expected` must be one of these")


@dataclass(frozen=True)
class EvalRow:
    line: int
    prompt: str
    expected: str


@dataclass(frozen=True)
class EvalSet:
    path: Path
    rows: tuple[EvalRow, ...]
    sha256: str  # of the file's bytes: MLflow's dataset digest misses changed rows


def load_eval_set(path: Path, rules: DataRules) -> EvalSet:
    """Read and validate the eval set at `path`; raise InputError on the first failed expectation."""
    records = read_jsonl(path, "eval set")
    validate_records(path, records, rules)
    rows = tuple(EvalRow(r.line, r.data["prompt"], r.data["expected"]) for r in records)
    return EvalSet(path=path, rows=rows, sha256=sha256_file(path))


def separator_warning(path: Path, separator: str) -> str | None:
    """A warning when expected strings start with whitespace and `separator` is not empty: token accuracy and
    perplexity score prompt + separator + expected, so those rows are scored with two separators (an eval
    set of model continuations, ' 42', scored that way once made int4 read 8.5 points better than fp32).
    None when the file is fine or unreadable (the gate's own checks report that)."""
    if not separator:
        return None
    try:
        records = read_jsonl(path, "eval set")
    except InputError:
        return None
    padded = [r for r in records if isinstance(r.data.get("expected"), str) and r.data["expected"][:1].isspace()]
    if not padded:
        return None
    return (f"gates.eval: {len(padded)} of {len(records)} expected strings in {path.name} start with whitespace "
            f"(line {padded[0].line}: {padded[0].data['expected'][:20]!r}), and the eval gate scores prompt + "
            f"separator {separator!r} + expected, so token accuracy and perplexity see the separator twice on "
            "those rows; if expected is the model's own continuation, set gates.eval.separator: '' in "
            "release.yaml, else strip the leading whitespace from expected")


def validate_records(path: Path, records: list[Record], rules: DataRules) -> None:
    """Run the GX suite over `records`; the first failure (in a fixed order) is raised as InputError."""
    import great_expectations as gx  # noqa: PLC0415 - lazy: great_expectations is heavy
    import pandas as pd  # noqa: PLC0415 - pandas comes with GX, only when an eval set is validated
    from great_expectations.data_context.types.base import (  # noqa: PLC0415 - lazy: heavy
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    # In memory only, no data-docs site, and no progress bars on the user's terminal.
    config = DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
        progress_bars=ProgressBarsConfig(globally=False, metric_calculations=False),
    )
    context = gx.get_context(mode="ephemeral", project_config=config)
    batch = (
        context.data_sources.add_pandas("eval_set")
        .add_dataframe_asset("rows")
        .add_batch_definition_whole_dataframe("all")
        .get_batch(batch_parameters={"dataframe": pd.DataFrame.from_records([r.data for r in records])})
    )
    suite = gx.ExpectationSuite(name="relctl-eval-set")
    for expectation in _expectations(rules):
        suite.add_expectation(expectation)
    outcome = batch.validate(suite, result_format={"result_format": "COMPLETE"})
    failures = {_key(res.expectation_config): res.result for res in outcome.results if not res.success}
    for key in _keys(rules):
        if key in failures:
            raise _to_error(path, key, failures[key], [r.line for r in records], rules)


def _expectations(rules: DataRules) -> list[Any]:
    import great_expectations as gx  # noqa: PLC0415 - lazy: great_expectations is heavy

    ex: Any = gx.expectations
    out: list[Any] = [ex.ExpectTableRowCountToBeBetween(min_value=rules.min_rows, max_value=rules.max_rows)]
    limits = {"prompt": rules.max_prompt_chars, "expected": rules.max_expected_chars}
    for col in COLUMNS:
        out += [
            ex.ExpectColumnToExist(column=col),
            ex.ExpectColumnValuesToNotBeNull(column=col),
            ex.ExpectColumnValuesToBeOfType(column=col, type_="str"),
            ex.ExpectColumnValueLengthsToBeBetween(column=col, min_value=1, max_value=limits[col]),
        ]
    if rules.label_set is not None:
        out.append(ex.ExpectColumnValuesToBeInSet(column="expected", value_set=rules.label_set))
    return out


def _key(config: Any) -> tuple[str, str]:
    return str(config.type), str(config.kwargs.get("column", ""))


def _keys(rules: DataRules) -> list[tuple[str, str]]:
    """Failure priority: an empty set or a missing column explains every later failure."""
    keys = [("expect_table_row_count_to_be_between", "")]
    keys += [("expect_column_to_exist", c) for c in COLUMNS]
    keys += [("expect_column_values_to_not_be_null", c) for c in COLUMNS]
    keys += [("expect_column_values_to_be_of_type", c) for c in COLUMNS]
    keys += [("expect_column_value_lengths_to_be_between", c) for c in COLUMNS]
    if rules.label_set is not None:
        keys.append(("expect_column_values_to_be_in_set", "expected"))
    return keys


def _to_error(path: Path, key: tuple[str, str], result: dict[str, Any], lines: list[int],
              rules: DataRules) -> InputError:
    kind, col = key
    name = path.name
    if kind == "expect_table_row_count_to_be_between":
        count = result.get("observed_value", 0)
        if count == 0:
            return InputError(f"{name}: the eval set is empty",
                              hint=f"add rows (the gate needs at least {rules.min_rows})")
        limit = f"at least {rules.min_rows}" if count < rules.min_rows else f"at most {rules.max_rows}"
        return InputError(f"{name}: {count} rows, the eval gate needs {limit}",
                          hint="change the eval set or gates.eval.expectations")
    if kind == "expect_column_to_exist":
        return InputError(f"{name}: column '{col}' is missing", hint=SCHEMA_HINT)
    indexes = result.get("unexpected_index_list") or [0]
    where = f"{name}: line {lines[int(indexes[0])]}"
    count = len(result.get("unexpected_index_list") or [])
    more = f" (and {count - 1} more rows)" if count > 1 else ""
    if kind == "expect_column_values_to_not_be_null":
        return InputError(f"{where}: '{col}' is missing or null{more}", hint=SCHEMA_HINT)
    if kind == "expect_column_values_to_be_of_type":
        return InputError(f"{where}: '{col}' must be a string{more}", hint=SCHEMA_HINT)
    if kind == "expect_column_value_lengths_to_be_between":
        most = rules.max_prompt_chars if col == "prompt" else rules.max_expected_chars
        return InputError(f"{where}: '{col}' must have 1 to {most} characters{more}",
                          hint=f"shorten or drop the row, or raise gates.eval.expectations.max_{col}_chars")
    return InputError(f"{where}: 'expected' is not in the label set{more}",
                      hint="fix the label or extend gates.eval.expectations.label_set")
