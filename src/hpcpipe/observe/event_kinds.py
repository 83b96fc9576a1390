"""Every kind of line in a run's ``events.jsonl``, with its fields: the contract between the modules
that write events and those that read them (reports, chaos checks, ``plan goodput``, dashboards).

``docs/reference/events.md`` is generated from this table. Under the test suite
(``HPCPIPE_CHECK_EVENTS=1``, set by ``tests/conftest.py``) ``append_event`` refuses a kind or a
field that is not here, so the table cannot drift from what runs write; in production nothing is
checked (an event must never stop a run).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

CHECK_EVENTS_VAR = "HPCPIPE_CHECK_EVENTS"

# On every line: when, which kind, and (with observe.otel) the trace the line belongs to.
COMMON_FIELDS: dict[str, str] = {
    "time": "Unix time the line was written (seconds)",
    "event": "the kind (a name below)",
    "trace_id": "with observe.otel: the trace of the span the event belongs to (hex)",
    "span_id": "with observe.otel: that span (hex)",
}


@dataclass(frozen=True)
class EventKind:
    """One kind of event: who writes it, what it means, and its fields (name -> meaning)."""

    writer: str
    meaning: str
    fields: dict[str, str]
    # A field whose name is known only at run time (``pruned``: the value of hpo.metric).
    named_at_run_time: str | None = field(default=None)


def _problem_fields(where: str) -> dict[str, str]:
    return {
        "step": "the checkpoint's step",
        "path": "its directory",
        "tier": f"the tier it was read from ({where})",
        "file": "the file with the problem (or the manifest)",
        "reason": "what is wrong (missing, size, hash, ...)",
        "expected": "the manifest's value, when one was compared",
        "actual": "the value found",
    }


_STEP = {"step": "the optimizer step"}

EVENT_KINDS: dict[str, EventKind] = {
    # -- the group and its restarts (launch.worker, launch.agent_timeline) ---------------------
    "group_start": EventKind(
        "launch.worker (rank 0)",
        "A process group formed: the first start or a restart.",
        {
            "world_size": "ranks in the group",
            "nodes": "distinct hosts in the group",
            "restart_count": "the elastic agent's restart count (0 at the first start)",
            "worker_start": "the last worker process's start (Unix time; null when unknown)",
            "worker_running": "the last rank to run trainer code (Unix time)",
            "pg_up": "init_process_group returned on every rank (Unix time)",
        },
    ),
    "restart": EventKind(
        "launch.worker (rank 0)",
        "The group restarted after a failure (restart_count > 0).",
        {"restart_count": "the elastic agent's restart count"},
    ),
    "membership_change": EventKind(
        "launch.worker (rank 0)",
        "The group restarted with a different world size (a node lost or joined).",
        {
            "old_world_size": "ranks before",
            "new_world_size": "ranks now",
            "nodes": "distinct hosts now",
        },
    ),
    "agent_restart": EventKind(
        "launch.agent_timeline (each node's agent)",
        "One restart as the agent saw it: the milestones chaos phases and plan goodput read.",
        {
            "node": "the agent's host",
            "restart": "this agent's restart number (1, 2, ...)",
            "failure_seen": "the poll that found a failed worker (Unix time)",
            "workers_stopped": "the surviving workers stopped (Unix time)",
            "rendezvous_done": "the next rendezvous completed (Unix time)",
            "workers_started": "the new workers started (Unix time)",
        },
    ),
    "run_finished": EventKind(
        "launch.worker (rank 0)",
        "Training ended normally.",
        {
            **_STEP,
            "world_size": "ranks at the end",
            "epochs": "train.epochs it trained to (null: train.steps)",
        },
    ),
    "dataset_changed": EventKind(
        "launch.worker (rank 0)",
        "The run resumed on another dataset than it trained on before (lineage.json's earlier_datasets).",
        {
            **_STEP,
            "earlier": "the dataset manifest hash trained on until this step",
            "now": "the dataset manifest hash from this step on",
        },
    ),
    # -- the trainer ----------------------------------------------------------------------------
    "layout": EventKind(
        "train.trainer (rank 0)",
        "The parallel layout, once at start (docs/parallelism.md).",
        {
            "strategy": "the data-parallel strategy (single, ddp, fsdp, deepspeed)",
            "pp": "pipeline stages",
            "dp": "data-parallel replicas",
            "tp": "tensor-parallel ranks",
            "tp_groups": "the global ranks of each tensor-parallel group (with a mesh)",
            "pp_groups": "the global ranks of each pipeline (with a mesh)",
        },
    ),
    "resumed": EventKind(
        "train.trainer (rank 0)",
        "Training resumed from a checkpoint.",
        {
            **_STEP,
            "checkpoint": "the checkpoint directory",
            "saved_world_size": "ranks that saved it",
            "world_size": "ranks now",
            "micro_batch_size": "micro-batch per rank from here (an OOM's shrink kept if the config is)",
            "accum_steps": "micro-batches per step from here",
            "restore_s": "seconds to restore",
        },
    ),
    "lr_schedule_changed": EventKind(
        "train.trainer (rank 0)",
        "The resumed run's LR schedule differs from its checkpoint's: it spans another number of "
        "steps (train.steps or train.epochs changed: stretched or shrunk), or the LR at the resumed "
        "step changed (train.lr, warmup_steps, min_lr_ratio, schedule) (docs/fault-tolerance.md).",
        {
            **_STEP,
            "old_steps": "the schedule's steps when the checkpoint was saved (null: not recorded)",
            "new_steps": "its steps now",
            "old_lr": "the LR at the step when the checkpoint was saved (the one it recorded)",
            "new_lr": "the LR at the step now",
        },
    ),
    "oom_restart_split": EventKind(
        "train.trainer (rank 0)",
        "An out-of-memory error the ranks could not recover from in-process ended the last start; "
        "this restart trains with half its micro-batch (train/oom_restart.py).",
        {
            **_STEP,
            "old_micro_batch_size": "the checkpoint's (or the config's)",
            "old_accum_steps": "the checkpoint's (or the config's)",
            "new_micro_batch_size": "this start's",
            "new_accum_steps": "this start's (the global batch is unchanged)",
        },
    ),
    "oom_recovered": EventKind(
        "train.trainer (rank 0)",
        "Some rank ran out of memory: every rank halved the micro-batch and retried the step.",
        {
            **_STEP,
            "micro_step": "the micro-batch that failed",
            "rank": "the highest rank that ran out of memory",
            "strategy": "the data-parallel strategy",
            "old_micro_batch_size": "before",
            "old_accum_steps": "before",
            "new_micro_batch_size": "after",
            "new_accum_steps": "after (the global batch is unchanged)",
        },
    ),
    "preempted": EventKind(
        "train.trainer (rank 0)",
        "A stop signal (SIGTERM, SIGUSR1, SIGINT) ended the run, after a checkpoint when there was time.",
        {
            **_STEP,
            "checkpointed": "a checkpoint was written before exiting",
            "signal": "the signal's name (rank 0's, else one another rank received)",
            "signalled_here": "this process received it (not only a peer)",
            "since_signal_s": "seconds from the signal to the event",
            "grace_s": "fault.preempt_grace_s",
            "exit_code": "the code the run exits with (75, or 130 for SIGINT)",
        },
    ),
    "pruned": EventKind(
        "train.trainer (rank 0)",
        "An HPO trial was stopped by its study's pruner.",
        {**_STEP, "why": "the pruner's reason"},
        named_at_run_time="the value of hpo.metric at the step",
    ),
    "calls_calibrated": EventKind(
        "recipes.lora_fc (rank 0)",
        "The function-calling adapter's call threshold was calibrated at the end of training.",
        {
            "threshold": "the chosen threshold",
            "cases": "calibration cases",
            "target": "the target (lora.calibration_target)",
        },
    ),
    # -- observability --------------------------------------------------------------------------
    "hang": EventKind(
        "observe.watchdog (the stalled rank)",
        "A rank made no progress for fault.hang_timeout_s; its stacks were dumped.",
        {
            "rank": "the stalled rank",
            **_STEP,
            "stalled_s": "seconds without progress",
            "timeout_s": "the limit",
            "host": "its host",
            "pid": "its process id",
            "stack_file": "the stack dump's name in the run directory (hang-rank<R>.txt)",
            "peers": "the peers' last beats, when known",
        },
    ),
    "imbalance": EventKind(
        "observe.telemetry (rank 0)",
        "One rank is slower than the rest beyond observe.imbalance.threshold.",
        {
            **_STEP,
            "ratio": "the slowest rank's busy time over the median's",
            "threshold": "observe.imbalance.threshold",
            "slowest_rank": "the slowest rank",
            "host": "its host",
            "phase": "its phase furthest above that phase's median",
            "phase_excess_s": "that phase's excess, seconds per step",
            "busy_s": "per rank: step time minus exposed communication, seconds per step",
            "cause": "a throttled GPU on the slowest rank, when telemetry says so",
            "streak": "checks in a row with this rank slowest and over the threshold",
        },
    ),
    "gpu_telemetry_off": EventKind(
        "observe.telemetry",
        "GPU telemetry (NVML) is off for this run.",
        {"reason": "why (no GPU, no NVML, ...)"},
    ),
    "tracing_unreachable": EventKind(
        "observe.otel_steps",
        "The OpenTelemetry collector could not be reached (once per process).",
        {"endpoint": "observe.otel.endpoint", "reason": "the exporter's error", "rank": "the rank"},
    ),
    "tracing_closed": EventKind(
        "observe.otel_steps",
        "Tracing ended: what was sent and what was lost.",
        {
            "spans": "spans ended",
            "sent": "spans the collector accepted",
            "failed": "spans whose export failed",
            "dropped": "spans dropped from a full queue",
            "rank": "the rank",
        },
    ),
    # -- checkpoints (checkpoint.store, checkpoint.after_commit, checkpoint.memory_tier) ---------
    "checkpoint_staged": EventKind(
        "checkpoint.store",
        "An asynchronous save copied its state off the training loop's tensors.",
        {**_STEP, "blocking_s": "seconds the training loop waited"},
    ),
    "checkpoint_committed": EventKind(
        "checkpoint.store (rank 0)",
        "A checkpoint was written and its manifest committed.",
        {
            **_STEP,
            "path": "its directory",
            "bytes": "bytes written (all ranks)",
            "files": "files written",
            "write_s": "seconds from the save's start to the commit",
        },
    ),
    "checkpoint_save_failed": EventKind(
        "checkpoint.store",
        "A save failed; the previous checkpoints are untouched.",
        {**_STEP, "path": "the checkpoint directory it was writing", "error": "the error"},
    ),
    "checkpoint_temporaries_removed": EventKind(
        "checkpoint.store",
        "Half-written directories of an interrupted save were removed at start.",
        {"names": "their names"},
    ),
    "checkpoint_verified": EventKind(
        "checkpoint.after_commit",
        "A committed checkpoint was read back in the background and matched its manifest.",
        {**_STEP, "path": "its directory"},
    ),
    "checkpoint_verify_failed": EventKind(
        "checkpoint.after_commit",
        "A committed checkpoint did not match its manifest (one event per problem).",
        _problem_fields("fast"),
    ),
    "checkpoint_durable_copied": EventKind(
        "checkpoint.after_commit",
        "A checkpoint was copied to the durable tier.",
        {**_STEP, "path": "the durable copy", "copy_s": "seconds to copy"},
    ),
    "checkpoint_durable_failed": EventKind(
        "checkpoint.after_commit",
        "The copy to the durable tier failed; the fast tier's copy is kept.",
        {**_STEP, "error": "the error"},
    ),
    "checkpoint_pruned": EventKind(
        "checkpoint.after_commit",
        "Old checkpoints beyond checkpoint.keep_last and checkpoint.keep_every were deleted.",
        {"tier": "fast or durable", "steps": "the steps deleted"},
    ),
    "checkpoint_prune_failed": EventKind(
        "checkpoint.after_commit",
        "Deleting old checkpoints failed.",
        {"tier": "fast or durable", "error": "the error"},
    ),
    "checkpoint_memory_kept": EventKind(
        "checkpoint.memory_tier",
        "A rank's files were copied into the node's memory tier.",
        {**_STEP, "bytes": "bytes copied", "copy_s": "seconds to copy"},
    ),
    "checkpoint_memory_skipped": EventKind(
        "checkpoint.memory_tier",
        "The memory tier did not keep a checkpoint.",
        {**_STEP, "reason": "why (no room, ...)"},
    ),
    "checkpoint_restored": EventKind(
        "checkpoint.store",
        "A checkpoint was loaded.",
        {
            **_STEP,
            "path": "its directory",
            "tier": "the tier it came from (memory, fast, durable)",
            "saved_world_size": "ranks that saved it",
            "load_s": "seconds to load",
            "same_config": "the job's config hash equals the saved one",
            "memory_files": "rank 0's files read from the node's memory tier",
        },
    ),
    "checkpoint_fallback": EventKind(
        "checkpoint.store",
        "The newest checkpoint failed verification at restore; an older one is tried (one event "
        "per problem).",
        _problem_fields("memory, fast or durable"),
    ),
    "checkpoint_none_verify": EventKind(
        "checkpoint.resume_choice",
        "No checkpoint passed verification at restore.",
        {"action": "what the run does (start from scratch)", "detail": "the problems found"},
    ),
}


def check_event(kind: str, fields: dict[str, object]) -> None:
    """ValueError when ``kind`` or a field of it is not in EVENT_KINDS (the suite's check)."""
    spec = EVENT_KINDS.get(kind)
    if spec is None:
        raise ValueError(f"events.jsonl: kind {kind!r} is not in hpcpipe/observe/event_kinds.py")
    unknown = sorted(set(fields) - set(spec.fields) - set(COMMON_FIELDS))
    if len(unknown) > (1 if spec.named_at_run_time else 0):
        raise ValueError(f"events.jsonl: {kind} has fields {unknown} not in hpcpipe/observe/event_kinds.py")


def checking_events() -> bool:
    return os.environ.get(CHECK_EVENTS_VAR) == "1"
