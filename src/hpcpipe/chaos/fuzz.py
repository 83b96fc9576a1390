"""Generated config files and CLI lines for ``fuzz_config``, and the harness that runs them.

Every case is drawn from the trial's generator: wrong types, unknown keys, huge numbers, unicode,
YAML tags that would create a marker file if anything executed them, path traversal in names and
paths, invalid options, garbage directories, and valid configs (a fuzzer that never sees exit 0
proves little). The commands only validate and render (``presets show``, ``--dry-run``, ``hpo
status``, ...): no case may train. Cases run in this process (``python -m hpcpipe`` costs 1-2 s
to start); a sample runs again as real subprocesses to show the answers agree.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from random import Random
from typing import Any

from hpcpipe.chaos import jobs
from hpcpipe.config import load_config
from hpcpipe.errors import USER_ERROR_EXIT_CODE, UserError, one_line
from hpcpipe.layout import RunLayout, StudyLayout
from hpcpipe.presets import preset_path
from hpcpipe.yamlfile import dump_yaml, load_yaml_text

CATEGORIES: dict[str, int] = {  # category -> weight
    "valid": 15,
    "wrong_type": 12,
    "unknown_key": 10,
    "huge_number": 11,
    "unicode": 12,
    "yaml_tag": 12,
    "traversal": 13,
    "bad_option": 8,
    "garbage_dir": 7,
}
HUGE_NUMBERS: tuple[Any, ...] = (
    1e308, 10**30, -(10**30), 2**63, -1, 0, 1e-320, math.nan, math.inf, -math.inf,
)  # fmt: skip
UNICODE_PIECES = (
    "\u202e", "\u200f", "שלום", "مرحبا", "🔥🚀", "👩\u200d💻", "e\u0301", "\x07", "\x1b[31m", "\x7f",
    "\x85", "\u2028", "\ufeff", "\n", "\r", "\t", "Ω≈ç√", "𝟚", "ﷺ", "\x01",
)  # fmt: skip
# Tags PyYAML's unsafe loaders would execute; {sh}, {q} and {py} create the case's marker file
# (as a shell command, a path for `touch`, Python code). The last two are safe tags of odd types.
YAML_TAGS = (
    "!!python/object/apply:os.system [{sh}]",
    '!!python/object/apply:subprocess.call [["touch", {q}]]',
    '!!python/object/new:subprocess.Popen [["touch", {q}]]',
    "!!python/object/apply:builtins.exec [{py}]",
    "!!python/object/apply:builtins.eval [{py}]",
    "!!python/name:os.system",
    "!!python/module:os",
    "!!python/object:os._wrap_close {{a: 1}}",
    "!!binary aGVsbG8=",
    "!!set {{a, b}}",
)
PATH_KEYS = (
    "run.name", "run.out_dir", "data.prepared_dir", "data.cache_dir", "data.root", "checkpoint.dir",
    "checkpoint.durable_dir", "hpo.dir", "hpo.study", "hpo.storage", "observe.prometheus.targets_dir",
)  # fmt: skip
# Commands that validate a config and render or read, never train: name -> base preset.
CONFIG_COMMANDS = {
    "presets show": "tiny",
    "launch slurm": "tiny",
    "launch k8s": "tiny",
    "hpo launch slurm": "tiny-hpo",
    "hpo launch katib": "tiny-hpo",
    "hpo status": "tiny-hpo",
    "data prepare": "tiny",
}


@dataclass(frozen=True)
class FuzzCase:
    index: int
    category: str
    args: tuple[str, ...]  # after `hpcpipe`
    files: tuple[tuple[str, bytes], ...] = ()  # written under the sandbox root before the case runs
    codes: frozenset[int] = frozenset({0, 2})  # acceptable exit codes

    def shown(self, limit: int = 200) -> str:
        text = " ".join(repr(a) if not a.isprintable() or " " in a else a for a in self.args)
        return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class FuzzTargets:
    """Where escapes and markers would land; every name carries ``token`` so it can be found."""

    token: str
    markers: Path  # a payload that ran creates a file here
    outside: Path  # an absolute directory outside the sandbox root

    def escape_name(self, index: int) -> str:
        return f"escape-{self.token}-{index}"

    def marker(self, index: int) -> Path:
        return self.markers / f"marker-{self.token}-{index}"

    @property
    def watched(self) -> tuple[Path, ...]:
        """Directories outside the sandbox where a traversal could land (searched for the token)."""
        return (Path(tempfile.gettempdir()), Path.home())


@dataclass
class CaseMaker:
    """Draws one case at a time from ``rng``."""

    rng: Random
    targets: FuzzTargets
    raw: dict[str, dict[str, Any]] = field(default_factory=dict)  # preset -> its YAML as a dict
    leaves: dict[str, list[tuple[str, Any]]] = field(default_factory=dict)  # preset -> resolved keys

    def __post_init__(self) -> None:
        for preset in dict.fromkeys(CONFIG_COMMANDS.values()):  # not a set: its order follows the hash seed
            self.raw[preset] = load_yaml_text(preset_path(preset).read_text())
            self.leaves[preset] = sorted(_flatten(load_config(preset).to_dict()), key=lambda kv: kv[0])

    def make(self, index: int) -> FuzzCase:
        names, weights = zip(*CATEGORIES.items(), strict=True)
        category = self.rng.choices(names, weights)[0]
        return getattr(self, f"_{category}")(index)

    # -- config mutations: (dotted key, value) edits, delivered as a file or as --set ------------

    def _wrong_type(self, index: int) -> FuzzCase:
        command, preset = self._command()
        key, default = self.rng.choice(self.leaves[preset])
        pool: list[Any] = ["abc", [1, 2], {"a": 1}, None, True, "", "1e", 3.5]
        value = self.rng.choice([v for v in pool if type(v) is not type(default)])
        return self._config_case(index, "wrong_type", command, preset, {key: value})

    def _unknown_key(self, index: int) -> FuzzCase:
        command, preset = self._command()
        leaf, _ = self.rng.choice(self.leaves[preset])
        bogus = f"bogus_{self.targets.token}{self.rng.choice(['', '_ü', '🔥'])}"
        key = self.rng.choice([bogus, f"{leaf.split('.')[0]}.{bogus}", f"{leaf}.{bogus}"])
        return self._config_case(index, "unknown_key", command, preset, {key: self.rng.randint(-5, 5)})

    def _huge_number(self, index: int) -> FuzzCase:
        command, preset = self._command()
        numeric = [(k, v) for k, v in self.leaves[preset] if isinstance(v, int | float) or v is None]
        key, _ = self.rng.choice(numeric)
        return self._config_case(index, "huge_number", command, preset, {key: self.rng.choice(HUGE_NUMBERS)})

    def _unicode(self, index: int) -> FuzzCase:
        command, preset = self._command()
        strings = [(k, v) for k, v in self.leaves[preset] if isinstance(v, str) or v is None]
        key, _ = self.rng.choice(strings)
        value = "".join(self.rng.choice(UNICODE_PIECES) for _ in range(self.rng.randint(1, 6)))
        if self.rng.random() < 0.2:  # unicode in a key name too
            key = f"{key.split('.')[0]}.{value.strip() or 'x'}"
        return self._config_case(index, "unicode", command, preset, {key: value})

    def _traversal(self, index: int) -> FuzzCase:
        name, tmp = self.targets.escape_name(index), tempfile.gettempdir()
        target = self.rng.choice(
            [
                f"../../{name}",
                f"{'../' * 12}{tmp.lstrip('/')}/{name}",
                str(self.targets.outside / name),
                f"{tmp}/{name}",
                f"{name}/../../../{name}",
                f"~/{name}",
            ]
        )
        if self.rng.random() < 0.15:  # a traversal in a CLI path argument, not in a config key
            return self._traversal_argument(index, target)
        command, preset = self._command()
        key = self.rng.choice(PATH_KEYS)
        if key == "hpo.storage":
            target = self.rng.choice(["journal:", "sqlite:///"]) + target
        return self._config_case(index, "traversal", command, preset, {key: target})

    def _traversal_argument(self, index: int, target: str) -> FuzzCase:
        garbage = f"case-{index}"
        files = ((f"{garbage}/manifest.json", b'{"files": "x"}'),)
        args = self.rng.choice(
            [
                ("presets", "show", f"{target}.yaml"),
                ("data", "stage", garbage, target),
                ("launch", "slurm", "tiny", "--set", f"run.out_dir={target}", "--dry-run"),
            ]
        )
        return FuzzCase(index, "traversal", args, files)

    def _yaml_tag(self, index: int) -> FuzzCase:
        marker = str(self.targets.marker(index))
        tag = self.rng.choice(YAML_TAGS).format(
            sh=json.dumps(f"touch '{marker}'"),
            q=json.dumps(marker),
            py=json.dumps(f"open({marker!r}, 'w').close()"),
        )
        command, preset = self._command()
        if command != "presets show" and self.rng.random() < 0.25:  # the tag as a --set value
            key, _ = self.rng.choice(self.leaves[preset])
            return self._config_case(index, "yaml_tag", command, preset, {key: tag}, as_set=True)
        placeholder = f"TAG_{self.targets.token}"
        edits: dict[str, Any] = (
            {} if self.rng.random() < 0.2 else {self.rng.choice(self.leaves[preset])[0]: placeholder}
        )
        text = _dump(_edited(self.raw[preset], edits)) if edits else placeholder + "\n"
        files = ((f"case-{index}.yaml", text.replace(placeholder, tag).encode()),)
        return FuzzCase(index, "yaml_tag", self._command_args(command, f"case-{index}.yaml", []), files)

    # -- valid configs, invalid options, garbage directories -------------------------------------

    def _valid(self, index: int) -> FuzzCase:
        fixed = [("presets", "list"), ("--version",), ("train", "--help"), ("launch", "slurm", "--help")]
        if self.rng.random() < 0.15:
            return FuzzCase(index, "valid", self.rng.choice(fixed))
        command, preset = self._command(katib=False)
        edits: dict[str, Any] = self.rng.choice(
            [
                {},
                {"train.steps": self.rng.randint(1, 10**6), "run.seed": self.rng.randint(0, 2**31)},
                {"run.name": f"ok-{index}", "model.n_layers": self.rng.randint(1, 8)},
                {"train.lr": self.rng.uniform(1e-5, 1.0), "launch.slurm.partition": "gpu"},
                {"parallel.nnodes": "1:4", "launch.slurm.time": "02:00:00"},
            ]
        )
        return self._config_case(index, "valid", command, preset, edits)

    def _bad_option(self, index: int) -> FuzzCase:
        # Every line here fails to parse (or asks for help): none of them may start training.
        bogus = f"--bogus-{self.targets.token}"
        nproc = self.rng.choice(["0", "-1", "abc", "1e3", "", "2.5", "nan", "∞"])
        lines: list[tuple[str, ...]] = [
            ("train", "tiny", "--nproc", nproc),
            ("train", "tiny", "--max-restarts", "-1"),
            ("train", "tiny", bogus),
            ("train", "tiny", "--set"),
            ("train",),
            ("presets", "show"),
            ("hpo", "status"),
            ("hpo", "run", "tiny-hpo", "--workers", "0"),
            ("hpo", "launch", "slurm", "tiny-hpo", "--workers", "0", "--dry-run"),
            (
                "launch",
                "slurm",
                "tiny",
                "--nodes",
                self.rng.choice(["0", "abc", "2:1", "-1", "𝟚"]),
                "--dry-run",
            ),
            ("launch", "slurm", "tiny", "--gpus-per-node", "-3", "--dry-run"),
            ("launch", "k8s", "tiny", "--api", f"api{self.targets.token}", "--dry-run"),
            ("launch", "k8s", "tiny", "--dry-run", "--submit"),
            (f"verb-{self.targets.token}",),
        ]
        return FuzzCase(index, "bad_option", self.rng.choice(lines))

    def _garbage_dir(self, index: int) -> FuzzCase:
        folder = f"case-{index}"
        name, args, codes = self.rng.choice(
            [
                (StudyLayout.RECORD, ("hpo", "status", folder), {0, 2}),
                (StudyLayout.RECORD, ("hpo", "best", folder), {0, 2}),
                ("manifest.json", ("data", "verify", folder), {0, 2}),
                ("step-00000001/manifest.json", ("ckpt", "list", folder), {0, 2}),
                ("step-00000001/manifest.json", ("ckpt", "verify", folder), {0, 1, 2}),  # 1: mismatch
                (RunLayout.LINEAGE, ("lineage", folder), {0, 2}),
                (RunLayout.CONFIG, ("launch", "finished", folder), {0, 1, 2}),  # 1: not finished
            ]
        )
        files = [(f"{folder}/{name}", self._garbage(index))]
        if name == StudyLayout.RECORD and self.rng.random() < 0.5:
            files.append((f"{folder}/{StudyLayout.BASE}", self._garbage(index)))
        return FuzzCase(index, "garbage_dir", args, tuple(files), frozenset(codes))

    def _garbage(self, index: int) -> bytes:
        escape = f"../../{self.targets.escape_name(index)}"
        marker = json.dumps(str(self.targets.marker(index)))
        choices = [
            self.rng.randbytes(self.rng.randint(0, 64)),
            b"{", b"[]", b"null", b'{"study": 5}', json.dumps({"study": escape}).encode(),
            json.dumps({"files": {escape: {"sha256": "00", "size": 1}}, "step": 10**30}).encode(),
            f"!!python/object/apply:os.system [{json.dumps('touch ' + marker)}]\n".encode(),
            json.dumps({"steps": [{"name": "\u202e🔥", "inputs": None}]}).encode(),
            json.dumps({"git_sha": "[/]", "steps": {"train": {"status": "[b", "error": "[/red]"}}}).encode(),
        ]  # fmt: skip
        return self.rng.choice(choices)

    # -- helpers ----------------------------------------------------------------------------------

    def _command(self, katib: bool = True) -> tuple[str, str]:
        names = [n for n in CONFIG_COMMANDS if katib or n != "hpo launch katib"]
        command = self.rng.choice(names)
        return command, CONFIG_COMMANDS[command]

    def _config_case(
        self,
        index: int,
        category: str,
        command: str,
        preset: str,
        edits: dict[str, Any],
        as_set: bool = False,
    ) -> FuzzCase:
        """The edits as --set overrides on the preset, or written into a YAML file (presets show)."""
        if as_set or (command != "presets show" and self.rng.random() < 0.5):
            sets = [f"{key}={_set_text(value)}" for key, value in edits.items()]
            return FuzzCase(index, category, self._command_args(command, preset, sets))
        path = f"case-{index}.yaml"
        files = ((path, _dump(_edited(self.raw[preset], edits)).encode()),)
        return FuzzCase(index, category, self._command_args(command, path, []), files)

    def _command_args(self, command: str, config: str, sets: list[str]) -> tuple[str, ...]:
        flags = tuple(a for s in sets for a in ("--set", s))
        if command == "presets show":
            return ("presets", "show", config, self.rng.choice(["--resolved", "--raw"]))
        if command == "data prepare":  # a source that cannot exist: preparing must fail before writing
            fixed = ("--set", "data.format=tokens", "--set", f"data.sources=[missing-{self.targets.token}]")
            return ("data", "prepare", config, *flags, *fixed)
        dry = ("--dry-run",) if command in ("launch slurm", "launch k8s", "hpo launch slurm") else ()
        return (*command.split(), config, *flags, *dry)


def generate_cases(rng: Random, count: int, targets: FuzzTargets) -> list[FuzzCase]:
    maker = CaseMaker(rng, targets)
    return [maker.make(index) for index in range(count)]


def cases_digest(cases: list[FuzzCase], work: Path) -> str:
    """A short hash of every case's arguments and files, ``work`` written as ``<work>``: equal
    seeds give equal digests wherever the trial runs."""
    digest = hashlib.sha256()
    for case in cases:
        digest.update(json.dumps([case.category, case.args]).replace(str(work), "<work>").encode())
        for name, data in case.files:
            digest.update(name.encode() + b"\0" + data.replace(str(work).encode(), b"<work>"))
    return digest.hexdigest()[:12]


def _flatten(tree: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    leaves: list[tuple[str, Any]] = []
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            leaves += _flatten(value, f"{prefix}{key}.")
        else:
            leaves.append((f"{prefix}{key}", value))
    return leaves


def _edited(raw: dict[str, Any], edits: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of ``raw`` with dotted keys set (a value in the way is replaced by a section)."""
    tree: dict[str, Any] = json.loads(json.dumps(raw))
    for key, value in edits.items():
        node = tree
        *parents, last = key.split(".")
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[last] = value
    return tree


def _dump(tree: dict[str, Any]) -> str:
    return dump_yaml(tree, allow_unicode=True, sort_keys=False)


def _set_text(value: Any) -> str:
    """A value as the text after ``--set key=`` (YAML flow, which is how --set reads it)."""
    if isinstance(value, str):
        return value
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    return json.dumps(value, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------
# Running a case and judging what it did


@dataclass(frozen=True)
class Outcome:
    code: int
    stdout: str
    stderr: str
    uncaught: str | None = None  # the traceback of an exception that escaped `hpcpipe`'s main


class InProcessCli:
    """``python -m hpcpipe ARGS`` in this process, as ``hpcpipe.cli.app.main`` runs it (a UserError
    becomes ``error: ...`` and exit 2), with the click command built once: typer rebuilds it on
    every call, ~40 ms, most of a case. The subprocess sample checks that the answers agree."""

    def __init__(self, command: Any) -> None:
        # Passed in by `hpcpipe chaos run` (the CLI room sits above chaos): the root command.
        self.command = command

    def run(self, args: tuple[str, ...], cwd: Path) -> Outcome:
        """Run in ``cwd`` with stdout and stderr captured; cwd and the environment are put back."""
        out, err = io.StringIO(), io.StringIO()
        saved_env, saved_cwd = dict(os.environ), Path.cwd()
        uncaught = None
        try:
            os.chdir(cwd)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = self._main(args)
        except Exception:  # what the interpreter would print as a traceback, then exit 1
            uncaught, code = traceback.format_exc(), 1
        finally:
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)
        if isinstance(code, str):  # sys.exit("text") prints the text and exits 1
            err.write(code + "\n")
            code = 1
        return Outcome(code or 0, out.getvalue(), err.getvalue(), uncaught)

    def _main(self, args: tuple[str, ...]) -> int | str | None:
        try:
            self.command.main(args=list(args), prog_name="python -m hpcpipe")  # always ends in SystemExit
        except UserError as exc:
            sys.stderr.write(f"error: {one_line(str(exc))}\n")
            return USER_ERROR_EXIT_CODE
        except SystemExit as exc:
            return exc.code
        return 0


def run_as_subprocess(args: tuple[str, ...], cwd: Path, timeout_s: float) -> Outcome:
    proc = jobs.run_hpcpipe(list(args), cwd, timeout_s)
    return Outcome(proc.returncode, proc.stdout, proc.stderr)


def lines_of(text: str) -> list[str]:
    """The non-blank lines a terminal shows (split at newlines only: ``str.splitlines`` would also
    split at the unicode line separators a one-line message may quote)."""
    return [line for line in text.split("\n") if line.strip()]


def is_usage_error(stderr: str) -> bool:
    """Click's own answer to a bad option or a missing argument: its usage block or error box."""
    lines = lines_of(stderr)
    return bool(lines) and lines[0].startswith(("Usage: ", "╭─ Error", "Error: "))


def judge(case: FuzzCase, outcome: Outcome) -> str | None:
    """Why the case failed (None: it passed): its exit code, traceback and error line."""
    if outcome.uncaught is not None:
        return f"uncaught exception: {outcome.uncaught.strip().splitlines()[-1][:200]}"
    if "Traceback" in outcome.stderr:
        return "a traceback on stderr"
    if outcome.code not in case.codes:
        last = jobs.last_line(outcome.stderr)[:150]
        return f"exit {outcome.code}, expected one of {sorted(case.codes)}: {last}"
    if outcome.code != 2 or is_usage_error(outcome.stderr):
        return None
    lines = lines_of(outcome.stderr)
    if len(lines) != 1:
        shown = " | ".join(line.strip() for line in lines[:3])[:200]
        return f"exit 2 with {len(lines)} stderr lines, expected one: {shown!r}"
    return None


def summary(outcome: Outcome, roots: tuple[Path, ...]) -> tuple[int, str]:
    """What must match between the in-process and the subprocess run: code and error line."""
    if is_usage_error(outcome.stderr):
        return outcome.code, "usage error"
    lines = lines_of(outcome.stderr)
    text = lines[0].strip() if outcome.code == 2 and lines else ""
    for root in roots:
        text = text.replace(str(root), "<root>")
    return outcome.code, text


def write_files(case: FuzzCase, root: Path) -> None:
    for name, data in case.files:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def outside_entries(work: Path, roots: tuple[Path, ...], targets: FuzzTargets) -> set[str]:
    """Every path under ``work`` outside the sandbox roots, plus token-named entries elsewhere."""
    found: set[str] = set()
    for folder, dirs, files in os.walk(work):
        here = Path(folder)
        dirs[:] = [d for d in dirs if here / d not in roots]
        found |= {str(here / name) for name in [*dirs, *files]}
    for watched in targets.watched:
        with contextlib.suppress(OSError):
            found |= {str(watched / n) for n in os.listdir(watched) if targets.token in n}
    return found
