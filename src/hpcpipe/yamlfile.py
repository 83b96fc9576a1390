"""Reading a YAML file a user wrote (a job, a sweep, chaos scenarios, acceptance thresholds).

``yaml.safe_load`` alone keeps the last of two equal keys in one mapping without a word: a job
with two ``train:`` sections trained with the second and ignored the first. Here a repeated key
is an error naming its line, as is any other YAML error (with its problem), text that is not
UTF-8, a file that holds nothing, and aliases that expand past ALIAS_EXPANSION_LIMIT values.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from hpcpipe.errors import ConfigError

# Values aliases may add to one document. A job holds hundreds; 305 bytes of nine aliases nested
# nine deep add 387 million, which every model_dump, config hash and error message expands.
ALIAS_EXPANSION_LIMIT = 100_000


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader (no object construction) that refuses a key repeated in one mapping, and
    a document whose aliases expand past ALIAS_EXPANSION_LIMIT values."""

    def construct_document(self, node: yaml.Node) -> Any:
        sizes: dict[int, int] = {}
        if _expanded(node, sizes, set()) - len(sizes) > ALIAS_EXPANSION_LIMIT:
            raise yaml.constructor.ConstructorError(
                None, None, f"its aliases expand to more than {ALIAS_EXPANSION_LIMIT:,} values"
            )
        return super().construct_document(node)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor`: merged keys may be overridden, as YAML means them to be
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str | int | float | bool):
                continue  # an unhashable key: SafeLoader's own error names it
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _expanded(node: yaml.Node, sizes: dict[int, int], open_nodes: set[int]) -> int:
    """How many values ``node`` holds with every alias written out; ``sizes`` memoizes each
    distinct node (an alias is the node it names), so this is linear in the file. A node that
    holds itself counts once: the config names it, where its value is checked."""
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in open_nodes:
        return 1
    open_nodes.add(id(node))
    children: list[yaml.Node] = []
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [part for pair in node.value for part in pair]
    sizes[id(node)] = 1 + sum(_expanded(child, sizes, open_nodes) for child in children)
    open_nodes.discard(id(node))
    return sizes[id(node)]


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
    """An int as YAML 1.2 (and every reader since) reads it: YAML 1.1's ``010`` was octal 8 (a
    job of ``steps: 010`` trained 8 steps) and ``1:30`` base 60 (90); now 10 and the text "1:30"."""
    text = str(loader.construct_scalar(node)).replace("_", "")
    if ":" in text:
        return text
    if re.fullmatch(r"[-+]?0[0-7]+", text):
        return int(text, 10)
    return yaml.SafeLoader.construct_yaml_int(loader, node)


_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)

_FLOAT_TAG = "tag:yaml.org,2002:float"
# YAML 1.2's floats: YAML 1.1 wants a dot and a signed exponent, so ``1e-3``, ``5e8`` and ``1.5e3``
# were strings (a grid of [0.001, 1e-3] planned two runs; ``lr: 1e-3`` failed as "not a number").
# Base 60 (``1:30.5``) goes as it did for ints; ``_`` separators stay, as they do for ints; an
# exponent or a dot is required, so an int still resolves as an int.
_FLOAT_1_2 = re.compile(
    r"""^(?:[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+
    |[-+]?[0-9][0-9_]*\.[0-9_]*
    |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
# Swapped in place (not appended): the resolvers for one first character are tried in order.
_RESOLVERS_1_2 = {
    first: [(tag, _FLOAT_1_2 if tag == _FLOAT_TAG else regexp) for tag, regexp in resolvers]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_UniqueKeyLoader.yaml_implicit_resolvers = _RESOLVERS_1_2


class SafeDumper(yaml.SafeDumper):
    """yaml.SafeDumper that quotes every string this module's reader would not read back as one:
    YAML 1.1's writer left ``1e3`` or ``64e9`` bare (a string to YAML 1.1), which the reader takes
    as a float, so a saved config.yaml with ``launch.slurm.account: '1e3'`` failed to load again."""


# Both readers' floats: a string either would take as a float is quoted (YAML 1.1's base 60,
# ``1:30.5``, is 90.5 to a plain yaml.safe_load reader of config.yaml or the Helm values).
SafeDumper.yaml_implicit_resolvers = {
    first: [
        *resolvers,
        *(
            (tag, regexp)
            for tag, regexp in yaml.SafeDumper.yaml_implicit_resolvers.get(first, [])
            if tag == _FLOAT_TAG
        ),
    ]
    for first, resolvers in _RESOLVERS_1_2.items()
}


def dump_yaml(data: Any, **options: Any) -> str:
    """``data`` as YAML that ``load_yaml_text`` reads back as the same values."""
    return str(yaml.dump(data, Dumper=SafeDumper, **options))


def load_yaml_text(text: str) -> Any:
    """``text`` as the job files are read (repeated keys refused, YAML 1.2 ints and floats)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)


def read_yaml_file(path: Path, what: str = "file") -> Any:
    """The document in ``path``; a ConfigError (one line naming the file, and the line when YAML
    knows it) when it is not UTF-8 YAML, repeats a key, or is empty. ``what`` names the kind of
    file in the empty-file message."""
    try:
        data = load_yaml_text(path.read_text())
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not valid YAML (not UTF-8 text)") from None
    except RecursionError:  # nested past Python's recursion limit
        raise ConfigError(f"{path}: not valid YAML: nested too deeply") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None)
        raise ConfigError(f"{path}{where}: not valid YAML" + (f": {problem}" if problem else "")) from None
    if data is None:
        raise ConfigError(f"{path}: the {what} is empty")
    return data
