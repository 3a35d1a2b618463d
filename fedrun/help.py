"""`fedrun --help`: every option with its default and meaning, read from the configs' own comments.

One source: conf/config.yaml's comments explain the top-level options, each group yaml's first
comment line explains that choice, and the comments of `conf/algo/<name>.yaml` (or any group's
yaml named on the command line, e.g. `fedrun algo=pfedme --help`) explain its options, printed first
(after the usage lines), before the general options and every group's choices. Nothing here
lists an option or a choice by name; a new yaml or a new commented key shows up by itself.
"""
from __future__ import annotations

import ast
import importlib.util
import os
import re
import shutil
import textwrap

from omegaconf import OmegaConf

from .config import CONF_DIR, group_file, group_options, search_roots

_KEY = re.compile(r"^(\s*)([A-Za-z_][\w-]*):(.*)$")  # a `key: value  # comment` line, at any indentation
_SKIP = ("defaults", "hydra", "_target_")


def _split_comment(rest: str) -> tuple[str, str]:
    """`' 0.01   # inner lr'` -> ('0.01', 'inner lr'); a '#' inside a value must follow no space."""
    m = re.search(r"\s#\s?", rest)
    if not m:
        return rest.strip(), ""
    return rest[:m.start()].strip(), rest[m.end():].strip()


def read_yaml_doc(path: str) -> tuple[list[str], list[tuple[str, str, str]]]:
    """The header comment of a yaml file and its options.

    Returns:
        (header lines, [(key, default as written, comment)]). A key that holds other keys (a mapping,
        e.g. logger/mlflow.yaml's `mlflow:`) is no option itself: its keys are, dotted (`mlflow.tracking_uri`).
        A `name:` equal to the file's own name is no option either (conf/partition, conf/dataset). A
        comment continued on the following indented `#` lines is joined into one; `defaults`, `hydra`
        and `_target_` are left out, with what they hold.
    """
    header: list[str] = []
    options: list[list[str]] = []
    in_header, last = True, None
    parents: list[tuple[int, str]] = []  # (indentation, key) of the mappings the current line is inside
    skip_below: int | None = None  # inside a left-out key: its indentation
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for line in lines:
        stripped = line.strip()
        if in_header and stripped.startswith("#"):
            text = stripped.lstrip("#").strip()
            if not text.startswith("@package"):
                header.append(text)
            continue
        in_header = False
        m = _KEY.match(line)
        if m:
            indent, key, rest = len(m.group(1)), m.group(2), m.group(3)
            if skip_below is not None and indent > skip_below:
                continue
            skip_below = None
            while parents and parents[-1][0] >= indent:
                parents.pop()
            if options and last is options[-1] and not last[1] and parents and indent > 0 \
                    and last[0] == ".".join(k for _, k in parents):
                options.pop()  # the previous key holds this one: a mapping, not an option
            if key in _SKIP:
                last, skip_below = None, indent
                continue
            value, comment = _split_comment(rest)
            if key == "name" and indent == 0 and value == os.path.basename(path)[:-len(".yaml")]:
                continue  # a dataset's or partition's own name (what the code dispatches on), not a setting
            options.append([".".join([*(k for _, k in parents), key]), value, comment])
            last = options[-1]
            parents.append((indent, key))
        elif last is not None and line[:1].isspace() and stripped.startswith("#"):
            last[2] = f"{last[2]} {stripped.lstrip('#').strip()}".strip()
        elif stripped.startswith("- "):
            continue  # an item of a block list (its value is read below)
        else:
            last = None
    if any(not value for _, value, _ in options):  # a block value (a list over several lines): as yaml, compact
        cfg = OmegaConf.load(path)
        for opt in options:
            node = OmegaConf.select(cfg, opt[0], default=None) if not opt[1] else None
            if node is not None:
                opt[1] = str(OmegaConf.to_container(node, resolve=False) if OmegaConf.is_config(node) else node)
                opt[1] = opt[1].replace("'", "")
    return header, [tuple(o) for o in options]


def _width() -> int:
    return max(72, min(120, shutil.get_terminal_size((100, 24)).columns))


def _rows(pairs: list[tuple[str, str]], indent: int = 2, col: int = 30) -> list[str]:
    """`name  meaning` rows, the meaning wrapped under itself."""
    width, out = _width(), []
    col = min(col, max((len(n) for n, _ in pairs), default=0) + indent + 2)
    for name, meaning in pairs:
        head = " " * indent + name
        if len(head) + 2 > col:
            out.append(head)
            head = ""
        wrapped = textwrap.wrap(meaning, width - col, break_long_words=False, break_on_hyphens=False) or [""]
        out.append(head.ljust(col) + wrapped[0])
        out += [" " * col + w for w in wrapped[1:]]
    return out


def _first_sentence(header: list[str], limit: int = 120) -> str:
    """The header's first sentence (a sentence ends at '. ' before a capital), cut at `limit`."""
    text = re.split(r"\.\s+(?=[A-Z`(])", " ".join(header), maxsplit=1)[0].rstrip(".")
    return text if len(text) <= limit else text[:limit - 3].rsplit(" ", 1)[0] + " ..."


def _defaults(top) -> dict[str, str | None]:
    """The groups of config.yaml's defaults list and their default choices, in its order."""
    out = {}
    for d in top.get("defaults", []):
        if not isinstance(d, str):
            (k, v), = d.items()
            if not str(k).startswith("override "):  # `override hydra/job_logging: ...` is Hydra's, no choice
                out[str(k)] = v
    return out


def _launchers(roots: list[str]) -> list[tuple[str, str]]:
    """hydra/launcher choices: Hydra's basic one, fedrun's batched plugin and conf/hydra/launcher."""
    out = [("basic", "Hydra's default: a sweep's jobs one after the other")]
    spec = importlib.util.find_spec("hydra_plugins.fedrun_batched")
    if spec and spec.origin:
        with open(spec.origin, encoding="utf-8") as f:
            doc = ast.get_docstring(ast.parse(f.read())) or ""
        out.append(("batched", doc.splitlines()[0].split(": ", 1)[-1] if doc else ""))
    for name in group_options("hydra/launcher", roots):
        out.append((name, _first_sentence(read_yaml_doc(group_file("hydra/launcher", name, roots))[0])))
    return out


def _chosen(argv: list[str], groups: list[str]) -> list[tuple[str, str]]:
    """The `group=choice` pairs the command line names (the first of a sweep's list)."""
    out = []
    for arg in argv:
        key, eq, value = arg.partition("=")
        if eq and key.lstrip("+") in groups and value:
            out.append((key.lstrip("+"), value.split(",")[0]))
    return out


def help_text(argv: list[str]) -> str:
    """The text `fedrun [group=choice ...] --help` prints."""
    roots = search_roots(argv)
    top_path = os.path.join(CONF_DIR, "config.yaml")
    top = OmegaConf.load(top_path)
    hydra_help = top.get("hydra", {}).get("help", {})
    _, options = read_yaml_doc(top_path)
    groups = _defaults(top)
    lines = [str(hydra_help.get("header", "")).rstrip()]

    # the choices the command line names first (`fedrun algo=X --help`: its options on the first screen)
    for group, name in _chosen(argv, [*groups, "hydra/launcher"]):
        if name not in group_options(group, roots):  # hydra/launcher=basic|batched|joblib: no yaml of fedrun's
            continue
        path = group_file(group, name, roots)
        header, opts = read_yaml_doc(path)
        included = [d for d in OmegaConf.load(path).get("defaults", []) if isinstance(d, str) and d.startswith("_")
                    and d != "_self_"]
        for d in reversed(included):  # the shared options it includes (conf/partition/_split.yaml) before its own
            own = {k for k, _, _ in opts}
            opts = [o for o in read_yaml_doc(group_file(group, d, roots))[1] if o[0] not in own] + opts
        lines += ["", f"{group}={name} ({group}/{name}.yaml):"]
        lines += ["  " + h for h in header]
        if opts:
            prefix = "" if group == "experiment" else f"{group.replace('/', '.')}."
            lines.append(f"  options ({prefix}key=value; default, then meaning):" if prefix else "  sets:")
            lines += _rows([(f"{prefix}{k}={v}", c) for k, v, c in opts], indent=4)

    lines += ["", "Options (key=value; default, then meaning; from conf/config.yaml):"]
    lines += _rows([(f"{k}={v}", c) for k, v, c in options])

    lines += ["", "Config groups (group=choice; * marks the default; `fedrun GROUP=CHOICE --help` lists its options):"]
    for group, default in groups.items():
        lines.append(f"  {group}:" + ("" if default is not None else "   (default: none)"))
        pairs = []
        for name in group_options(group, roots):
            header, _ = read_yaml_doc(group_file(group, name, roots))
            pairs.append((("*" if name == default else " ") + name, _first_sentence(header)))
        lines += _rows(pairs, indent=4)
    lines.append("  hydra/launcher:   (with -m)")
    lines += _rows([(("*" if n == "basic" else " ") + n, d) for n, d in _launchers(roots)], indent=4)

    footer = str(hydra_help.get("footer", "")).rstrip()
    if footer:
        lines += ["", footer]
    return "\n".join(lines) + "\n"
