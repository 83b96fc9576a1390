"""Compile an hpcpipe pipeline spec (JSON on standard input) to Kubeflow Pipelines IR YAML.

    python kfp_compile.py OUT.yaml < spec.json

Run by ``hpcpipe launch kfp`` in an interpreter that has ``kfp`` and ``kfp-kubernetes``
(``hpcpipe.kfp.sdk.kfp_interpreter``); it imports those and the standard library only, never
hpcpipe (whose k8s extra conflicts with kfp). Each step is a container component loaded from a
component spec, so its command is exactly the spec's argv with KFP's placeholders in place of the
``{"input"|"output": NAME}`` tokens and a first ``sh -c`` that writes the ``config`` parameter to
the path the steps read it from.
"""

from __future__ import annotations

import json
import sys
from typing import Any

# The steps read their config from a file; KFP passes it as a string parameter.
_WRITE_CONFIG = 'mkdir -p "$(dirname "$1")" && printf "%s" "$2" > "$1" && shift 2 && exec "$@"'


def component_text(name: str, image: str, config_path: str, argv: list[Any], types: dict[str, str]) -> str:
    """A KFP component spec (YAML is a superset of JSON) running ``argv`` after writing the config."""
    inputs: list[dict[str, str]] = [{"name": "config", "type": "String"}]
    outputs: list[dict[str, str]] = []
    command: list[Any] = ["sh", "-c", _WRITE_CONFIG, "sh", config_path, {"inputValue": "config"}]
    for token in argv:
        if isinstance(token, dict) and "input" in token:
            inputs.append({"name": token["input"], "type": types.get(token["input"], "Artifact")})
            command.append({"inputPath": token["input"]})
        elif isinstance(token, dict) and "output" in token:
            outputs.append({"name": token["output"], "type": types.get(token["output"], "Artifact")})
            command.append({"outputPath": token["output"]})
        else:
            command.append(str(token))
    spec = {
        "name": name,
        "inputs": inputs,
        "outputs": outputs,
        "implementation": {"container": {"image": image, "command": command}},
    }
    return json.dumps(spec)


def build(spec: dict[str, Any]) -> Any:
    """The pipeline function for ``spec`` (kfp.dsl)."""
    from kfp import dsl
    from kfp.components import load_component_from_text

    image, config_path = spec["image"], spec["config_path"]
    step_types = spec["artifact_types"]

    def component(name: str, argv: list[Any], own_type: str) -> Any:
        types = {"record": own_type, "params": "Artifact", **step_types}
        return load_component_from_text(component_text(name, image, config_path, argv, types))

    components = {
        step["name"]: component(step["name"], step["argv"], step_types.get(step["name"], "Artifact"))
        for step in spec["steps"]
    }
    katib = spec["katib"]

    def body(config: str, tune: bool) -> None:
        tasks: dict[str, Any] = {}
        params, previous = None, None
        for step in spec["steps"]:
            if katib is not None and step["name"] == "train":
                params = _katib_branch(dsl, component, katib, config, tune, tasks[katib["after"]], spec)
            inputs = {up: tasks[up].outputs["record"] for up in step["after"]}
            if any(isinstance(t, dict) and t.get("input") == "params" for t in step["argv"]):
                inputs["params"] = params
            task = components[step["name"]](config=config, **inputs)
            if previous is not None:
                # One step at a time, in hpcpipe's order: they share lineage.json on the claim.
                task.after(previous)
            task.set_display_name(step["name"])
            task.set_caching_options(False)  # hpcpipe's lineage decides what re-runs, not KFP's cache
            _platform(task, spec)
            tasks[step["name"]] = previous = task

    return _as_pipeline(dsl, body, spec)


def _katib_branch(
    dsl: Any, component: Any, katib: dict[str, Any], config: str, tune: bool, after: Any, spec: dict[str, Any]
) -> Any:
    """If tune: the Katib step's best parameters; else an empty set (``{}``)."""
    search = component("katib", katib["argv"], "Artifact")
    default = component("no-search", [*_NO_SEARCH, {"output": "params"}], "Artifact")
    with dsl.If(tune == True, name="search"):  # noqa: E712  (KFP needs the comparison)
        found = search(config=config)
        found.after(after)
        found.set_display_name("katib")
        found.set_caching_options(False)
        _platform(found, spec)  # the cluster credentials come from the run's service account
    with dsl.Else(name="no-search"):
        none = default(config=config)
        none.set_display_name("no search")
    return dsl.OneOf(found.outputs["params"], none.outputs["params"])


# The else branch: an empty parameter set, written by the image's shell.
_NO_SEARCH = ["sh", "-c", 'printf "{}" > "$0"']


def _platform(task: Any, spec: dict[str, Any]) -> None:
    """Claims, plain and secret environment, through kfp-kubernetes."""
    from kfp import kubernetes

    for claim in spec["claims"]:
        kubernetes.mount_pvc(task, pvc_name=claim["claim"], mount_path=claim["mount"])
    for name, value in spec["env"].items():
        task.set_env_variable(name, value)
    task.set_env_variable("PYTHONUNBUFFERED", "1")
    for name, (secret, key) in spec["secret_env"].items():
        kubernetes.use_secret_as_env(task, secret_name=secret, secret_key_to_env={key: name})


def _as_pipeline(dsl: Any, body: Any, spec: dict[str, Any]) -> Any:
    """``body`` as a @dsl.pipeline with the parameters ``config`` (the resolved config) and, when
    the spec has a Katib step, ``tune`` (run it)."""
    import inspect

    params = [
        inspect.Parameter(
            "config", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=spec["config"], annotation=str
        )
    ]
    if spec["katib"] is not None:
        params.append(
            inspect.Parameter("tune", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=True, annotation=bool)
        )

    def pipeline(*args: Any) -> None:
        values = dict(zip([p.name for p in params], args, strict=False))
        body(values["config"], values.get("tune", False))

    pipeline.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    pipeline.__name__ = spec["name"].replace("-", "_")
    return dsl.pipeline(name=spec["name"], description=spec["description"])(pipeline)


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python kfp_compile.py OUT.yaml < spec.json")
    from kfp import compiler

    spec = json.load(sys.stdin)
    compiler.Compiler().compile(build(spec), package_path=sys.argv[1])


if __name__ == "__main__":
    main()
