"""Where a Kubernetes job's config says its run directory lies, for ``k8s_cluster``'s check that
a job found under this run's name is this run's (``reuse_or_clear``): the run directory it
names, the claim and namespace it lies on (``place_label``), and why a path alone proves nothing."""

from __future__ import annotations


def unproven(ours: str | None) -> str:
    """Why a job naming this run's path may still be another run's."""
    if ours is None:  # the path is on the submitting machine and the pods' own disks
        return "run.out_dir is on no claim of launch.k8s, so the same path may be another machine's run"
    return (
        "it is not labelled as on this run's claim (another claim or namespace, or an older hpcpipe's label)"
    )


def shared_place(config: str | None) -> str | None:
    """``place_label`` of the run directory a job's config.yaml names, where it lies on a claim;
    None where it lies on none, or the config names none."""
    import yaml

    from hpcpipe.launch.kubernetes import place_label, run_claim

    try:
        raw = yaml.safe_load(config or "")
        run, k8s = raw["run"], (raw.get("launch") or {}).get("k8s") or {}
        claim = run_claim(k8s.get("runs_pvc"), k8s.get("checkpoint_pvc"))
        namespace = str(k8s.get("namespace", "default"))
        return (
            None if not claim else place_label(namespace, str(claim), str(run["out_dir"]), str(run["name"]))
        )
    except (KeyError, TypeError, AttributeError, yaml.YAMLError):
        return None


def run_dir_in(config: str | None) -> str | None:
    """The run directory a job's config.yaml names (run.out_dir/run.name); None where it names none."""
    import posixpath

    import yaml

    try:
        run = yaml.safe_load(config or "")["run"]
        return posixpath.normpath(posixpath.join(str(run["out_dir"]), str(run["name"])))
    except (KeyError, TypeError, yaml.YAMLError):
        return None
