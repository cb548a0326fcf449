"""The one loader of YAML that comes from a host (LMCache's config, `vllm serve --config`).

A host's YAML is hostile text: PyYAML's safe loader still expands aliases, so 416 bytes of
"billion laughs" (nine anchors, each a list of nine aliases of the one before) build 10^9
list members, and deeply nested flow collections make its scanner and composer slow and
recursive. Neither LMCache's config nor vLLM's CLI-option YAML needs anchors, aliases or deep
nesting (https://docs.lmcache.ai/api_reference/configurations.html;
https://docs.vllm.ai/en/latest/configuration/serve_args.html), so the loader refuses them,
and documents larger than any real config, with a `HostYamlError` a caller turns into a
finding instead of a hang or a traceback.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.events import AliasEvent, CollectionStartEvent, Event
from yaml.nodes import Node

# Real LMCache / vLLM configs are a few KiB; the cap bounds parse time and memory.
MAX_YAML_CHARS = 64 * 1024
# Nesting deeper than this is no configuration (LMCache's deepest value is extra_config.*).
MAX_YAML_DEPTH = 32


_REFUSED = "YAML anchors and aliases are refused in host YAML"


class HostYamlError(ValueError):
    """Host YAML that kvops refuses to load, or that does not parse; the message says where."""


def _where(event: Event) -> str:
    mark = event.start_mark
    return f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""


class _HostLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors, aliases and deep nesting while composing."""

    _depth = 0

    def fetch_more_tokens(self) -> None:
        # The scanner runs ahead of the composer: bound its nesting too.
        super().fetch_more_tokens()
        if self.flow_level > MAX_YAML_DEPTH or len(self.indents) > MAX_YAML_DEPTH:
            raise HostYamlError(f"nested deeper than {MAX_YAML_DEPTH} levels: refused")

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, AliasEvent):
            raise HostYamlError(f"{_where(event)}alias *{event.anchor}: {_REFUSED}")
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            raise HostYamlError(f"{_where(event)}anchor &{anchor}: {_REFUSED}")
        nested = isinstance(event, CollectionStartEvent)
        if nested:
            self._depth += 1
            if self._depth > MAX_YAML_DEPTH:
                raise HostYamlError(f"nested deeper than {MAX_YAML_DEPTH} levels: refused")
        try:
            return super().compose_node(parent, index)
        finally:
            if nested:
                self._depth -= 1


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""
    return f"{where}{getattr(exc, 'problem', None) or exc}"


def load_host_yaml(text: str) -> Any:
    """The document, or HostYamlError (too large, anchors/aliases, too deep, not YAML, or a
    value PyYAML cannot build, such as an integer of more digits than Python converts)."""
    if len(text) > MAX_YAML_CHARS:
        raise HostYamlError(f"{len(text)} characters, larger than {MAX_YAML_CHARS}: refused")
    loader: _HostLoader | None = None
    try:
        loader = _HostLoader(text)  # the reader checks characters here already
        return loader.get_single_data()
    except HostYamlError:
        raise
    except yaml.YAMLError as exc:
        raise HostYamlError(_yaml_problem(exc)) from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise HostYamlError(f"a value does not load: {str(exc)[:200]}") from None
    finally:
        if loader is not None:
            loader.dispose()
