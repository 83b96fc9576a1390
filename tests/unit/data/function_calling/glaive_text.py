"""Glaive v2 rows written by hand for the function-calling tests: the system text (prose, then
pretty-printed functions) and the chat, as the dataset lays them out."""

from __future__ import annotations

import json
from typing import Any

from hpcpipe.data.function_calling.formats import GLAIVE_NO_FUNCTIONS, GLAIVE_WITH_FUNCTIONS

SONG_TOOL = {
    "name": "play_song",
    "description": "Play a song",
    "parameters": {
        "type": "object",
        "properties": {"title": {"type": "string", "description": "The song title"}},
        "required": ["title"],
    },
}


def glaive_system(*tools: dict[str, Any]) -> str:
    """A Glaive system text: prose, then pretty-printed functions separated by blank lines."""
    if not tools:
        return f"SYSTEM: {GLAIVE_NO_FUNCTIONS}\n\n"
    return f"SYSTEM: {GLAIVE_WITH_FUNCTIONS}\n" + "\n\n".join(json.dumps(t, indent=4) for t in tools) + "\n\n"


def glaive_row(*turns: str, tools: tuple[dict[str, Any], ...] = (SONG_TOOL,)) -> dict[str, str]:
    return {"system": glaive_system(*tools), "chat": "".join(t + "\n\n\n" for t in turns)}
