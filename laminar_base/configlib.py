"""One config loader for both daemons: defaults < TOML file < ``LAMINAR_*`` environment < flags.

A daemon's config is a frozen dataclass whose fields are frozen dataclasses
(sections). Every leaf field has a default and ``metadata={"doc": ...}`` with
its unit. Keys are ``section.key`` in TOML (``[section] key = ...``), in the
environment ``LAMINAR_SECTION_KEY``, and in flag overrides. A field whose
metadata has ``"unit": "bytes"`` accepts sizes like ``"10GiB"``; ``"seconds"``
accepts durations like ``"250ms"``. Any invalid value raises one
:class:`ConfigError` naming the key. Nothing reads the environment after
start-up: callers pass ``os.environ`` in once.
"""

from __future__ import annotations

import dataclasses
import textwrap
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from laminar_base.errors import ConfigError, InvalidArgument
from laminar_base.units import parse_duration, parse_size

T = TypeVar("T")

ENV_PREFIX = "LAMINAR_"

#: Default largest message either daemon accepts or sends (``server.max_message_bytes``);
#: larger ones get RESOURCE_EXHAUSTED from gRPC before any handler runs.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
#: Bounds of ``server.max_message_bytes``: below 64 KiB a full inventory or job list no
#: longer fits; above 64 MiB one caller can make a daemon hold too much memory per call.
MIN_MESSAGE_BYTES_LIMIT = 64 * 1024
MAX_MESSAGE_BYTES_LIMIT = 64 * 1024 * 1024


def max_message_bytes_field() -> Any:
    """``server.max_message_bytes``, the same key with the same default in both daemons."""
    return dataclasses.field(
        default=MAX_MESSAGE_BYTES,
        metadata=doc(
            "largest gRPC message received or sent; larger ones get RESOURCE_EXHAUSTED",
            unit="bytes",
        ),
    )


def check_message_bytes(value: int, key: str) -> None:
    """Validate a ``server.max_message_bytes`` setting (raises ConfigError naming ``key``)."""
    if not MIN_MESSAGE_BYTES_LIMIT <= value <= MAX_MESSAGE_BYTES_LIMIT:
        raise ConfigError(
            f"must be between {MIN_MESSAGE_BYTES_LIMIT} and {MAX_MESSAGE_BYTES_LIMIT} bytes, "
            f"got {value}",
            field=key,
        )


def doc(text: str, *, unit: str | None = None) -> dict[str, str]:
    """Field metadata helper: ``field(default=1.0, metadata=doc("lease TTL", unit="seconds"))``."""
    meta = {"doc": text}
    if unit:
        meta["unit"] = unit
    return meta


def _coerce(key: str, field: dataclasses.Field[Any], hint: Any, value: Any) -> Any:
    unit = field.metadata.get("unit")
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    try:
        if origin in (types.UnionType, typing.Union):
            non_none = [a for a in args if a is not type(None)]
            if value is None or (isinstance(value, str) and value == ""):
                return None
            return _coerce(key, field, non_none[0], value)
        if unit == "bytes":
            return parse_size(value if isinstance(value, (int, str)) else str(value), field=key)
        if unit == "seconds":
            return parse_duration(value, field=key)
        if hint is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ConfigError(f"expected a boolean, got {value!r}", field=key)
        if hint is int:
            if isinstance(value, bool):
                raise ConfigError(f"expected an integer, got {value!r}", field=key)
            return int(value)
        if hint is float:
            if isinstance(value, bool):
                raise ConfigError(f"expected a number, got {value!r}", field=key)
            return float(value)
        if hint is str:
            if not isinstance(value, (str, int, float)):
                raise ConfigError(f"expected a string, got {value!r}", field=key)
            return str(value)
        if origin is tuple:
            items = value.split(",") if isinstance(value, str) else list(value)
            elem = args[0] if args else str
            return tuple(
                _coerce(key, field, elem, item.strip() if isinstance(item, str) else item)
                for item in items
                if not (isinstance(item, str) and not item.strip())
            )
        if origin is dict or hint is dict:
            if not isinstance(value, Mapping):
                raise ConfigError(f"expected a table, got {value!r}", field=key)
            return dict(value)
    except InvalidArgument as exc:
        raise ConfigError(exc.message.split(": ", 1)[-1], field=key) from None
    except (TypeError, ValueError):
        raise ConfigError(f"invalid value {value!r}", field=key) from None
    return value


def _leaf_fields(root: type[Any]) -> dict[str, tuple[type[Any], dataclasses.Field[Any], Any]]:
    """Map ``section.key`` to (section class, field, type hint)."""
    out: dict[str, tuple[type[Any], dataclasses.Field[Any], Any]] = {}
    for section in dataclasses.fields(root):
        section_cls = typing.get_type_hints(root)[section.name]
        hints = typing.get_type_hints(section_cls)
        for leaf in dataclasses.fields(section_cls):
            out[f"{section.name}.{leaf.name}"] = (section_cls, leaf, hints[leaf.name])
    return out


def load_config(
    root: type[T],
    *,
    toml_path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> T:
    """Build ``root`` from its defaults, a TOML file, the environment and flag overrides."""
    leaves = _leaf_fields(root)
    values: dict[str, Any] = {}
    if toml_path:
        import tomllib  # here: the CLI imports this module for its settings, never a file

        path = Path(toml_path)
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist", field="--config") from None
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise ConfigError(
                f"cannot read config file {path}: {reason}", field="--config"
            ) from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}", field="--config") from None
        for section, table in data.items():
            if not isinstance(table, dict):
                raise ConfigError("expected a [section] table", field=section)
            for key, value in table.items():
                dotted = f"{section}.{key}"
                if dotted not in leaves:
                    raise ConfigError(f"unknown key in {path}", field=dotted)
                values[dotted] = value
    if env:
        for dotted in leaves:
            name = ENV_PREFIX + dotted.replace(".", "_").upper()
            if name in env:
                values[dotted] = env[name]
    for dotted, value in (overrides or {}).items():
        if dotted not in leaves:
            raise ConfigError("unknown key", field=dotted)
        if value is not None:
            values[dotted] = value
    sections: dict[str, dict[str, Any]] = {}
    for dotted, value in values.items():
        _, leaf, hint = leaves[dotted]
        section, key = dotted.split(".", 1)
        sections.setdefault(section, {})[key] = _coerce(dotted, leaf, hint, value)
    kwargs: dict[str, Any] = {}
    hints = typing.get_type_hints(root)
    for section_field in dataclasses.fields(root):  # type: ignore[arg-type]
        cls = hints[section_field.name]
        kwargs[section_field.name] = cls(**sections.get(section_field.name, {}))
    config = root(**kwargs)
    validate = getattr(config, "validate", None)
    if callable(validate):
        validate()
    return config


def _toml_value(value: Any) -> str:
    """A default as TOML; None (an optional limit left off) is the empty string."""
    if value is None:
        return '""'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    import json  # only `make etc` and `laminar config` write TOML

    return json.dumps(str(value), ensure_ascii=False)  # a TOML basic string


def render_example(root: type[Any], title: str) -> str:
    """An example TOML file with every key at its default, each under its one-line doc.

    ``etc/laminar/*.toml`` are this output; a test keeps them equal, so they never drift
    from the dataclasses."""
    lines = [
        f"# {title}",
        "# Every key with its default; see docs/ops.md. Generated by `make etc`.",
    ]
    hints = typing.get_type_hints(root)
    for section in dataclasses.fields(root):
        lines += ["", f"[{section.name}]"]
        section_cls = hints[section.name]
        for leaf in dataclasses.fields(section_cls):
            default = getattr(section_cls(), leaf.name)
            unit = leaf.metadata.get("unit")
            text = leaf.metadata.get("doc", "") + (f" [{unit}]" if unit else "")
            lines += [f"# {part}" for part in textwrap.wrap(text, 88)]
            lines.append(f"{leaf.name} = {_toml_value(default)}")
    return "\n".join(lines) + "\n"


def describe_config(root: type[Any]) -> list[tuple[str, str, str, str]]:
    """(key, env var, default, doc) for every key; used by ``--help-config`` and docs."""
    rows = []
    for dotted, (_, leaf, _) in _leaf_fields(root).items():
        default = leaf.default if leaf.default is not dataclasses.MISSING else "(computed)"
        unit = leaf.metadata.get("unit")
        text = leaf.metadata.get("doc", "") + (f" [{unit}]" if unit else "")
        env_name = ENV_PREFIX + dotted.replace(".", "_").upper()
        rows.append((dotted, env_name, repr(default), text))
    return rows


def changed_keys(old: Any, new: Any) -> list[str]:
    """``section.key`` of every setting that differs between two configs of one root
    (what a SIGHUP reload reports as applied or needing a restart)."""
    out = []
    for section in dataclasses.fields(old):
        a, b = getattr(old, section.name), getattr(new, section.name)
        if not dataclasses.is_dataclass(a):
            continue
        for f in dataclasses.fields(a):
            if getattr(a, f.name) != getattr(b, f.name):
                out.append(f"{section.name}.{f.name}")
    return out


def with_keys(old: T, new: T, keys: typing.Iterable[str]) -> T:
    """``old`` with only the settings named in ``keys`` (``section.key``) taken from
    ``new``: what a SIGHUP reload keeps as the running config once it applied those keys.
    Storing whole sections would mark keys that need a restart as running at their new
    value, and the next reload would no longer name them."""
    sections: dict[str, dict[str, Any]] = {}
    for key in keys:
        section, _, name = key.partition(".")
        sections.setdefault(section, {})[name] = getattr(getattr(new, section), name)
    changes = {s: dataclasses.replace(getattr(old, s), **c) for s, c in sections.items()}
    return typing.cast(T, dataclasses.replace(typing.cast(Any, old), **changes))
