"""Finding and rendering the Jinja templates (ACL policies, agent configs, worker files).

Templates live in the checkout's top-level `templates/`, which the wheel ships as
`provision/_templates`. The loader tries, in order: an explicit `--templates-dir`, the packaged
copy (installed wheel), then the checkout's `templates/` (an editable install or a plain checkout,
which do not have the packaged copy).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2

from provision.durations import format_duration
from provision.errors import InputError, LocalEnvironmentError

_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # provision/
PACKAGED_TEMPLATES = _PACKAGE_DIR / "_templates"
CHECKOUT_TEMPLATES = _PACKAGE_DIR.parent / "templates"
CONTEXT_LINES = 2


def find_templates_dir(explicit: Path | None = None) -> Path:
    """The folder templates are loaded from (see the module docstring for the order)."""
    if explicit is not None:
        if not explicit.is_dir():
            raise InputError(f"--templates-dir {explicit}: not a folder")
        return explicit
    for candidate in (PACKAGED_TEMPLATES, CHECKOUT_TEMPLATES):
        if candidate.is_dir():
            return candidate
    raise LocalEnvironmentError(
        f"no templates found (looked in {PACKAGED_TEMPLATES} and {CHECKOUT_TEMPLATES})"
    )


def make_environment(templates_dir: Path) -> jinja2.Environment:
    """A strict, deterministic environment: undefined names fail, trailing newlines stay; the
    `duration` filter shows seconds (a job's timings) as a Go duration, as the spec writes it."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,  # noqa: S701 - output is HCL/JSON/INI, never HTML; values are validated
    )
    env.filters["duration"] = format_duration
    return env


def render_template(env: jinja2.Environment, name: str, context: Mapping[str, Any]) -> str:
    """Render `name`; a template error names the template, line and the lines around it."""
    try:
        return env.get_template(name).render(**context)
    except jinja2.TemplateNotFound:
        raise InputError(f"template {name!r} not found in {_search_path(env)}") from None
    except jinja2.TemplateSyntaxError as exc:
        message = exc.message or "syntax error"
        raise InputError(_describe(env, exc.name or name, exc.lineno, message)) from None
    except jinja2.UndefinedError as exc:
        raise InputError(_describe(env, name, _error_line(exc, name), str(exc))) from None


def _search_path(env: jinja2.Environment) -> str:
    loader = env.loader
    return ", ".join(loader.searchpath) if isinstance(loader, jinja2.FileSystemLoader) else "?"


def _error_line(exc: BaseException, name: str) -> int | None:
    """The template line of a render-time error, from the traceback jinja rewrites."""
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith(name):
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _describe(env: jinja2.Environment, name: str, line: int | None, message: str) -> str:
    where = f"{name}:{line}" if line else name
    excerpt = ""
    if line and env.loader is not None:
        try:
            source = env.loader.get_source(env, name)[0].splitlines()
        except jinja2.TemplateNotFound:
            source = []
        low, high = max(1, line - CONTEXT_LINES), min(len(source), line + CONTEXT_LINES)
        shown = (f"{n}{'>' if n == line else ':'} {source[n - 1]}" for n in range(low, high + 1))
        excerpt = " | " + " | ".join(shown) if source else ""
    return f"template {where}: {message}{excerpt}"
