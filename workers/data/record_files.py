"""The files and datasets records are read from, by what they are: JSONL, a JSON array,
Parquet, or a Hugging Face dataset (a hub id, a ``save_to_disk`` folder, a folder of data files).

Each reader returns ``(line or row number from 1, record)`` pairs for ``ingest.parse_records``,
and names the file, line and cause when it cannot read one: a Parquet file was read as text
("not valid UTF-8"), a local file given as a dataset was looked up on the hub for 25 s, and a
folder whose only split is ``train`` failed on the default ``test``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from stepq.models.errors import InputError, SourceUnavailable

PARQUET = (".parquet", ".pq")


def read_records(path: Path) -> list[tuple[int, Any]]:
    """A local file's records, read by its extension: Parquet, else JSONL or a JSON array."""
    if path.suffix.lower() in PARQUET:
        return read_parquet(path)
    return read_objects(path)


def read_parquet(path: Path) -> list[tuple[int, Any]]:
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except OSError as exc:
        raise InputError(str(path), None, None, f"cannot read as Parquet: {exc}") from None
    return [(i + 1, row) for i, row in enumerate(rows)]


def _decode(path: Path, raw: bytes) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise InputError(str(path), line, None, f"not valid UTF-8 (byte 0x{raw[exc.start]:02x})") from None


def read_objects(path: Path) -> list[tuple[int, Any]]:
    """(line, value) for every record of a JSONL file or a JSON array."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(str(path), None, None, f"cannot read file: {exc.strerror}") from None
    text = _decode(path, raw).replace("\r\n", "\n")
    if not text.strip():
        raise InputError(str(path), None, None, "file is empty")
    if text.lstrip().startswith("["):
        return _read_array(path, text)
    out = []
    for no, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            out.append((no, _decode_json(line)))
        except (ValueError, RecursionError) as exc:
            raise InputError(str(path), no, None, _json_error(exc)) from None
    return out


def _read_array(path: Path, text: str) -> list[tuple[int, Any]]:
    decoder = json.JSONDecoder(parse_constant=_refuse_constant)
    i = text.index("[") + 1
    out: list[tuple[int, Any]] = []

    def skip(j: int) -> int:
        while j < len(text) and text[j] in " \t\n\r":
            j += 1
        return j

    def fail(j: int, msg: str) -> InputError:
        return InputError(str(path), text.count("\n", 0, j) + 1, None, msg)

    i = skip(i)
    if i < len(text) and text[i] == "]":
        return out
    while True:
        i = skip(i)
        try:
            value, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            raise fail(exc.pos, f"invalid JSON: {exc.msg}") from None
        except (ValueError, RecursionError) as exc:
            raise fail(i, _json_error(exc)) from None
        out.append((text.count("\n", 0, i) + 1, value))
        i = skip(end)
        if i < len(text) and text[i] == ",":
            i += 1
            continue
        if i < len(text) and text[i] == "]":
            if text[i + 1 :].strip():
                raise fail(i + 1, "invalid JSON: extra data after the array")
            return out
        raise fail(i, "invalid JSON: expected ',' or ']'")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a database can store")


def _decode_json(text: str) -> Any:
    """``json.loads`` that names what no database can store: NaN and Infinity are refused."""
    return json.loads(text, parse_constant=_refuse_constant)


def _json_error(exc: Exception) -> str:
    if isinstance(exc, RecursionError):
        return "invalid JSON: nested too deeply"
    if isinstance(exc, json.JSONDecodeError):
        return f"invalid JSON: {exc.msg} at column {exc.colno}"
    return f"invalid JSON: {exc}"  # an integer past Python's digit limit, NaN, Infinity


def read_dataset(
    source: str, split: str | None = None, config: str | None = None
) -> tuple[str | None, list[tuple[int, Any]]]:
    """(the split read, None for a file or a dataset without splits; its rows) of a Hugging
    Face dataset: a local data file (read as a file), a ``save_to_disk`` folder, a folder of
    data files, or a hub id.  ``split`` None takes the only split there is and lists them
    when there are several."""
    local = Path(source)
    if local.is_file():
        return None, read_records(local)
    import datasets

    try:
        if (local / "dataset_info.json").is_file() or (local / "dataset_dict.json").is_file():
            loaded: Any = datasets.load_from_disk(str(local))
        else:
            loaded = datasets.load_dataset(source, config)
    except (FileNotFoundError, ValueError) as exc:
        if not local.exists() and _looks_unreachable(exc):
            raise _unreachable(source, exc) from None
        raise InputError(source, None, None, f"cannot load the dataset: {exc}") from None
    except Exception as exc:  # the hub's own errors: offline, unreachable, no such repository
        if local.exists() or not _looks_unreachable(exc):
            raise InputError(source, None, None, f"cannot load the dataset: {type(exc).__name__}: {exc}") from None
        raise _unreachable(source, exc) from None
    if not isinstance(loaded, datasets.DatasetDict):
        return split, [(i + 1, dict(row)) for i, row in enumerate(loaded)]
    splits = sorted(loaded)
    chosen = split if split is not None else (splits[0] if len(splits) == 1 else None)
    if chosen is None or chosen not in loaded:
        asked = f"no split '{split}'" if split is not None else "several splits"
        raise InputError(source, None, None, f"{asked}: it has {', '.join(splits)} (choose one with --split)")
    return chosen, [(i + 1, dict(row)) for i, row in enumerate(loaded[chosen])]


_UNREACHABLE = ("offline", "connection", "resolve", "timed out", "timeout", "couldn't reach", "unreachable", "network")


def _looks_unreachable(exc: Exception) -> bool:
    text = f"{type(exc).__name__} {exc}".lower()
    return any(word in text for word in _UNREACHABLE) or bool(os.environ.get("HF_HUB_OFFLINE"))


def _unreachable(source: str, exc: Exception) -> SourceUnavailable:
    offline = (
        " (HF_HUB_OFFLINE is set: the hub is not asked, only its local cache)"
        if os.environ.get("HF_HUB_OFFLINE")
        else ""
    )
    return SourceUnavailable(
        f"{source}: not a local file or folder, and the Hugging Face hub cannot be reached{offline}: "
        f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    )
