"""Bad input and security: fuzzed configs, malicious pickles, credentials, listening addresses.

Each kind drives the real CLI a user would run and checks what reached the user and the disk:
exit 0 or one ``error:`` line with exit 2 (never a traceback), nothing executed from a payload,
nothing written outside the sandbox, no secret in any output or file, every socket a local run
listens on (hpcpipe's exporters, torch's stores and gloo's pairs) on loopback only. All
randomness comes from ``ctx.rng``, so a trial replays from its seed.
"""

from __future__ import annotations

import base64
import dataclasses
import shutil
import string
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from random import Random
from typing import Any

from hpcpipe.chaos import fuzz, jobs
from hpcpipe.chaos.checks import Checks
from hpcpipe.chaos.forge import (
    CHECKPOINT_PLACES,
    CIFAR_FILES,
    CIFAR_SHAPES,
    PAYLOADS,
    Payload,
    forge_checkpoint,
    forge_cifar,
)
from hpcpipe.chaos.scenario import TrialContext, TrialResult
from hpcpipe.chaos.sockets import (
    Listener,
    classify,
    describe,
    exporters_answer,
    free_port_base,
    listening_sockets,
    process_tree,
    stop_tree,
    violations,
    workers,
)
from hpcpipe.checkpoint.tiers import Tier
from hpcpipe.errors import UserError
from hpcpipe.layout import RunLayout

# ---------------------------------------------------------------------------------------------
# fuzz_config


def fuzz_config(ctx: TrialContext) -> TrialResult:
    """``cases`` generated config files and CLI lines, in-process; a sample again as subprocesses."""
    count = ctx.param("cases", 1000)
    work = _absolute(ctx).work
    roots = (work / "jail" / "root", work / "jail" / "replica")  # ../.. from either lands in work
    targets = fuzz.FuzzTargets(f"{ctx.rng.getrandbits(40):010x}", work / "markers", work / "outside")
    for folder in (*roots, targets.markers, targets.outside):
        folder.mkdir(parents=True)
    cases = fuzz.generate_cases(ctx.rng, count, targets)
    sample = sorted(ctx.rng.sample(range(count), min(count, max(3, round(count / 100)))))
    started = time.perf_counter()
    if ctx.cli is None:
        raise UserError("fuzz_config runs the hpcpipe CLI in-process: run it through `hpcpipe chaos run`")
    outcomes, failures = _run_cases(fuzz.InProcessCli(ctx.cli), cases, work, roots, targets)
    seconds = time.perf_counter() - started
    failures += _replay_as_subprocesses([cases[i] for i in sample], outcomes, work, roots, targets)
    checks = Checks()
    for case, why in failures[:1]:
        checks.check(False, f"case {case.index} ({case.category}): {why}; args: {case.shown()}")
    codes = Counter("usage error" if fuzz.is_usage_error(o.stderr) else f"exit {o.code}" for o in outcomes)
    seen = ", ".join(f"{n} {answer}" for answer, n in sorted(codes.items()))
    passed = (
        f"{count} cases in {seconds:.1f} s in-process ({seen}); {len(sample)} also as subprocesses, alike"
    )
    placement = {
        "categories": dict(sorted(Counter(c.category for c in cases).items())),
        "digest": fuzz.cases_digest(cases, work),
        "subprocess_sample": sample[:10],
    }
    return checks.result(passed, placement, lost=len(failures))


def _absolute(ctx: TrialContext) -> TrialContext:
    """``ctx`` with absolute directories: cases and jobs run in other working directories."""
    return dataclasses.replace(ctx, work=ctx.work.resolve(), shared=ctx.shared.resolve())


def _run_cases(
    cli: fuzz.InProcessCli,
    cases: list[fuzz.FuzzCase],
    work: Path,
    roots: tuple[Path, ...],
    targets: fuzz.FuzzTargets,
) -> tuple[list[fuzz.Outcome], list[tuple[fuzz.FuzzCase, str]]]:
    """Each case in the sandbox root, in this process; (outcomes, (case, why) of the failures)."""
    outcomes, failures = [], []
    seen = fuzz.outside_entries(work, roots, targets)
    for case in cases:
        fuzz.write_files(case, roots[0])
        outcome = cli.run(case.args, roots[0])
        outcomes.append(outcome)
        now = fuzz.outside_entries(work, roots, targets)
        why = _escape_or_payload(now - seen, targets) or fuzz.judge(case, outcome)
        seen = now
        if why:
            failures.append((case, why))
    return outcomes, failures


def _escape_or_payload(new: set[str], targets: fuzz.FuzzTargets) -> str | None:
    """A marker file means a payload ran; any other new path outside the root is an escape."""
    ran = sorted(p for p in new if Path(p).parent == targets.markers)
    if ran:
        return f"a payload ran: it created {ran[0]}"
    return f"wrote outside the sandbox root: {sorted(new)[0]}" if new else None


def _replay_as_subprocesses(
    cases: list[fuzz.FuzzCase],
    outcomes: list[fuzz.Outcome],
    work: Path,
    roots: tuple[Path, ...],
    targets: fuzz.FuzzTargets,
) -> list[tuple[fuzz.FuzzCase, str]]:
    """``python -m hpcpipe`` for each case, in a fresh replica root (as deep below ``work`` as the
    in-process one, so ``../..`` lands alike): the same answer?"""
    failures, root = [], roots[1]
    for case in cases:
        shutil.rmtree(root)
        root.mkdir()
        fuzz.write_files(case, root)
        seen = fuzz.outside_entries(work, roots, targets)
        real = fuzz.run_as_subprocess(case.args, root, timeout_s=120)
        new = fuzz.outside_entries(work, roots, targets) - seen
        got, want = fuzz.summary(real, (root,)), fuzz.summary(outcomes[case.index], (roots[0],))
        why = _escape_or_payload(new, targets) or fuzz.judge(case, real)
        if why is None and got != want:
            why = f"in-process answer {want} differs from the subprocess's {got}"
        if why:
            failures.append((case, f"as a subprocess: {why}"))
    return failures


# ---------------------------------------------------------------------------------------------
# malicious_pickle


def malicious_pickle(ctx: TrialContext) -> TrialResult:
    """A pickle payload in a checkpoint and in a CIFAR batch: both refused, nothing executed."""
    ctx = _absolute(ctx)
    draw = draw_pickle(ctx.rng)
    marker = ctx.work / f"pwned-{draw['marker']}"
    payload = Payload(draw["payload"], str(marker))
    run, steps = _copy_base_checkpoint(ctx)
    ckpt = Tier("fast", RunLayout(run).checkpoints).committed()[0][1]
    forged = forge_checkpoint(ckpt, draw["checkpoint"], payload, draw["pick"], draw["protocol"])
    resumed = jobs.train(ctx, "run", f"train.steps={steps + 2}")
    checks = Checks()
    _check_refusal(checks, resumed, forged, ctx.scenario.nproc, "resuming from the forged checkpoint")
    cifar = forge_cifar(
        ctx.work / "cifar",
        draw["cifar_file"],
        payload,
        draw["cifar_shape"],
        draw["cifar_seed"],
        draw["protocol"],
    )
    images = _read_cifar(ctx, draw["cifar_verb"])
    _check_refusal(checks, images, cifar, 1, f"`hpcpipe {draw['cifar_verb']}` on the forged CIFAR batch")
    checks.check(not marker.exists(), f"a payload ran: {marker} exists")
    passed = (
        f"{forged.relative_to(ckpt)} ({draw['checkpoint']}) and {draw['cifar_file']} refused; nothing ran"
    )
    return checks.result(passed, draw)


def draw_pickle(rng: Random) -> dict[str, Any]:
    """Where the payloads go and what they call: the trial's placement, drawn before anything runs."""
    return {
        "checkpoint": rng.choice(CHECKPOINT_PLACES),
        "pick": round(rng.random(), 6),  # which rank's trainer state, or which byte item
        "payload": rng.choice(PAYLOADS),
        "protocol": rng.randint(2, 5),
        "cifar_file": rng.choice(CIFAR_FILES),
        "cifar_shape": rng.choice(CIFAR_SHAPES),
        "cifar_seed": rng.randrange(1000),
        "cifar_verb": rng.choice(["data prepare", "train"]),
        "marker": f"{rng.getrandbits(32):08x}",
    }


def _copy_base_checkpoint(ctx: TrialContext) -> tuple[Path, int]:
    """A fresh copy of the shared base run (trained once per chaos run): (run dir, its steps)."""
    steps, base = 2, ctx.shared / "security" / f"pickle-base-{ctx.scenario.job}-{ctx.scenario.nproc}"
    if not Tier("fast", RunLayout(base / "base").checkpoints).committed():
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        sets = jobs.job_sets(ctx, "base", base, f"train.steps={steps}", f"checkpoint.every_steps={steps}")
        args = ["train", ctx.scenario.job, "--nproc", str(ctx.scenario.nproc), *_flags(sets)]
        proc = jobs.run_hpcpipe(args, base, ctx.scenario.timeout_s)
        if proc.returncode != 0:
            raise RuntimeError(f"the base run failed (exit {proc.returncode}): {jobs.last_line(proc.stderr)}")
    shutil.copytree(base / "base", ctx.work / "run")
    return ctx.work / "run", steps


def _read_cifar(ctx: TrialContext, verb: str) -> subprocess.CompletedProcess[str]:
    """The vision recipe's data path on the forged directory, through ``data prepare`` or ``train``."""
    work = ctx.work
    sets = [
        f"data.root={work / 'cifar'}",
        f"data.prepared_dir={work / 'prepared-images'}",
        f"run.out_dir={work}",
    ]
    return jobs.run_hpcpipe([*verb.split(), "resnet-tiny", *_flags(sets)], work, ctx.scenario.timeout_s)


def _flags(sets: list[str]) -> list[str]:
    return [arg for item in sets for arg in ("--set", item)]


def _check_refusal(
    checks: Checks, proc: subprocess.CompletedProcess[str], forged: Path, ranks: int, what: str
) -> None:
    """Exit 2, no traceback, ``error: <the forged file>: ...``: the only line from one process;
    from N ranks, each rank's line, then the agent's and the launcher's account of the failure."""
    lines = fuzz.lines_of(proc.stderr)
    shown = " | ".join(lines[-4:])[:300]
    checks.exit_code(proc, 2, what)
    checks.check("Traceback" not in proc.stderr, f"{what}: a traceback on stderr ({shown})")
    refusals = [line for line in lines if line.startswith("error: ") and str(forged) in line]
    checks.check(bool(refusals), f"{what}: no error line names {forged} ({shown})")
    if ranks == 1:
        checks.check(len(lines) == 1, f"{what}: {len(lines)} stderr lines, expected one ({shown})")
        return
    others = [line for line in lines if line not in refusals and not _reports_a_rejecting_worker(line)]
    checks.check(not others, f"{what}: unexpected stderr line {others[:1]}")
    checks.check(
        bool(lines) and lines[-1].startswith("error: a worker rejected"), f"{what}: last line {shown}"
    )


def _reports_a_rejecting_worker(line: str) -> bool:
    """torch's elastic agent's log lines (the failed worker; the others it then stops),
    hpcpipe's agent's line, the launcher's summary (exit 2)."""
    return (
        ("torch/distributed/elastic" in line and "(exitcode: 2)" in line)
        or ("torch/distributed/elastic" in line and "closing signal SIGTERM" in line)
        or (line.startswith("agent: worker rank") and "exit code 2" in line)
        or line.startswith("error: a worker rejected the job")
    )


# ---------------------------------------------------------------------------------------------
# secrets_stay_hidden

ENV_CARRIERS = (
    "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN", "PGPASSWORD", "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN", "HF_TOKEN", "WANDB_API_KEY",
)  # fmt: skip
DEAD = "127.0.0.1:1"  # nothing listens on port 1: every connection is refused at once
USER = "chaos"
SECRET_COMMANDS = (
    "hpo_storage_with_password", "hpo_storage_pgpassword", "mlflow_uri_in_config",
    "pushgateway_uri_in_config", "track_sync_uri_option", "models_list_env_uri",
)  # fmt: skip


def secrets_stay_hidden(ctx: TrialContext) -> TrialResult:
    """A secret in environment variables and URIs: in no output, in no file under the trial."""
    ctx = _absolute(ctx)
    secret, placement = draw_secrets(ctx.rng)
    env = {name: secret for name in placement["env"]}
    env |= {"MLFLOW_TRACKING_URI": f"http://{USER}:{secret}@{DEAD}", "MLFLOW_TRACKING_USERNAME": USER}
    (ctx.work / "synced-run").mkdir()  # a run directory for `track sync`
    RunLayout(ctx.work / "synced-run").config.write_text(jobs.job_config(ctx).to_yaml())
    commands = _secret_commands(ctx, secret)
    names = ["train", *placement["commands"]]
    with ThreadPoolExecutor(len(names)) as pool:  # mostly waiting on refused connections
        procs = dict(
            zip(names, pool.map(lambda name: _run_carrier(ctx, commands[name][0], env), names), strict=True)
        )
    checks, forms = Checks(), _secret_forms(secret)
    for name, proc in procs.items():
        _check_carrier(checks, name, proc, commands[name][1:], forms)
    leaked = _files_holding(ctx.work, forms)
    checks.check(not leaked, f"the secret is in {len(leaked)} file(s): {', '.join(leaked[:3])}")
    passed = (
        f"a secret in {len(placement['env']) + 1} env vars and {len(names)} commands: only redacted URIs seen"
    )
    return checks.result(passed, placement, lost=len(leaked))


def draw_secrets(rng: Random) -> tuple[str, dict[str, list[str]]]:
    """(the secret, which environment variables and commands carry it): drawn before anything runs."""
    secret = "".join(rng.choices(string.ascii_letters + string.digits, k=24))
    env = sorted(rng.sample(ENV_CARRIERS, rng.randint(2, len(ENV_CARRIERS))))
    commands = sorted(rng.sample(SECRET_COMMANDS, rng.randint(3, len(SECRET_COMMANDS))))
    return secret, {"env": env, "commands": commands}


def _check_carrier(
    checks: Checks, name: str, proc: subprocess.CompletedProcess[str], want: tuple[int, str], forms: list[str]
) -> None:
    """The exit code it should have, no secret in its output, the redacted URI in its stderr."""
    code, redacted = want
    checks.exit_code(proc, code, name)
    output = proc.stdout + proc.stderr
    checks.check(not any(form in output for form in forms), f"{name}: the secret is in its output")
    last = jobs.last_line(proc.stderr)
    checks.check(
        redacted in proc.stderr, f"{name}: no {redacted!r} (the redacted URI) on its stderr ({last})"
    )


def _secret_commands(ctx: TrialContext, secret: str) -> dict[str, tuple[list[str], int, str]]:
    """name -> (hpcpipe arguments, expected exit code, the redacted URI its stderr must show).

    ``train`` trains with MLflow tracking (to the URI in the environment) and TensorBoard on; the
    others fail fast, by design (a password in the config) or on the refused connection."""
    job, url, work = ctx.scenario.job, f"http://{USER}:{secret}@{DEAD}", ctx.work
    run = _flags(jobs.job_sets(ctx, "run", work, "train.steps=3"))
    tracked = ["--set", "observe.mlflow.close_timeout_s=1", "--set", "observe.tensorboard=true"]

    def refused(key: str) -> list[str]:  # a run whose config holds the URI
        return ["train", job, *_flags(jobs.job_sets(ctx, "refused", work, f"{key}={url}"))]

    def study(storage: str) -> list[str]:
        return ["hpo", "status", "tiny-hpo", *_flags([f"run.out_dir={work}", f"hpo.storage={storage}"])]

    mlflow, postgres = f"http://{DEAD}", f"postgresql://{DEAD}/db"  # as they must be shown
    return {
        "train": (["train", job, "--nproc", "1", *run, *tracked], 0, mlflow),
        "hpo_storage_with_password": (study(f"postgresql://{USER}:{secret}@{DEAD}/db"), 2, postgres),
        "hpo_storage_pgpassword": (study(f"postgresql://{USER}@{DEAD}/db"), 2, postgres),
        "mlflow_uri_in_config": (refused("observe.mlflow.tracking_uri"), 2, mlflow),
        "pushgateway_uri_in_config": (refused("observe.prometheus.pushgateway"), 2, mlflow),
        "track_sync_uri_option": (
            ["track", "sync", str(work / "synced-run"), "--tracking-uri", url],
            2,
            mlflow,
        ),
        "models_list_env_uri": (["models", "list"], 2, mlflow),
    }


def _run_carrier(ctx: TrialContext, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return jobs.run_hpcpipe(args, ctx.work, ctx.scenario.timeout_s, env)


def _secret_forms(secret: str) -> list[str]:
    """The secret as it could leak: plain, and inside an HTTP basic-auth header."""
    basic = base64.b64encode(f"{USER}:{secret}".encode()).decode()
    return [secret, basic]


def _files_holding(root: Path, forms: list[str]) -> list[str]:
    """Every file under ``root`` (relative paths) whose bytes contain one of ``forms``."""
    needles = [form.encode() for form in forms]
    found = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if any(needle in data for needle in needles):
            found.append(str(path.relative_to(root)))
    return found


# ---------------------------------------------------------------------------------------------
# loopback_only


def loopback_only(ctx: TrialContext) -> TrialResult:
    """A real multi-rank run with exporters: every socket it listens on, hpcpipe's or torch's, is
    on loopback (its exporters, the agent's rendezvous store, rank 0's store, gloo's pairs)."""
    ctx = _absolute(ctx)
    ranks = ctx.scenario.nproc
    base, attempts = free_port_base(ctx.rng, ranks)
    placement = {"port_base": base, "ranks": ranks, "attempts": attempts}
    exporters = {base + rank for rank in range(ranks)}
    listeners = _listeners_of_a_live_run(ctx, base, exporters)
    checks = Checks()
    last = jobs.last_line((ctx.work / "stderr.txt").read_text())
    if not checks.check(listeners is not None, f"the exporters never answered ({last})"):
        return checks.result("", placement)
    assert listeners is not None
    found = {s.port for s in listeners if s.owner == "hpcpipe"}
    checks.check(exporters <= found, f"exporter ports {sorted(exporters - found)} are not listening")
    bad = violations(listeners)
    checks.check(not bad, f"the run listens beyond loopback: {describe(bad)} (all: {describe(listeners)})")
    return checks.result(describe(listeners), placement, lost=len(bad))


def _listeners_of_a_live_run(ctx: TrialContext, base: int, exporters: set[int]) -> list[Listener] | None:
    """Train with exporters on ``base``; once they answer, every listener of the run's processes
    (None if they never answer). The run is killed with its workers in any case."""
    steps = ctx.param("steps", 2000)  # far more than it trains before it is killed
    sets = jobs.job_sets(ctx, "run", ctx.work, f"train.steps={steps}", f"observe.prometheus.port={base}")
    args = ["train", ctx.scenario.job, "--nproc", str(ctx.scenario.nproc), *_flags(sets)]
    with (ctx.work / "stdout.txt").open("w") as out, (ctx.work / "stderr.txt").open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hpcpipe", *args], cwd=ctx.work, env=jobs.hpcpipe_env(),
            stdout=out, stderr=err, start_new_session=True,
        )  # fmt: skip
        try:
            if not exporters_answer(proc, exporters, ctx.scenario.timeout_s):
                return None
            tree = process_tree(proc.pid)
            return classify(listening_sockets(tree), exporters, proc.pid, workers(tree))
        finally:
            stop_tree(proc)
