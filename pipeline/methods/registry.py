"""The method registry: each method is a per-question program registered by name with typed params.

    @register_method("sr-rag", params=SrRagParams, paper="...", description="...")
    def sr_rag(q: Question, p: SrRagParams) -> Generator[Request, Any, Answer]:
        hits = (yield Retrieve([q.question], k=p.k))[0]
        out = (yield Generate([rag_prompt(q.question, hits)]))[0]
        return Answer(extract_answer(out.text), out.text, used_docs=hits)

Parameters come from the config section `method` (`--set method.name=sr-rag --set method.params.k=3`).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import pkgutil
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from pipeline.engine.requests import Answer, Question, Request
from pipeline.errors import DynragError

Program = Callable[[Question, Any], Generator[Request, Any, Answer]]


class MethodError(DynragError, ValueError):
    """An unknown method name or an invalid method parameter."""


class MethodParams(BaseModel):
    """Base class of every method's parameters: validated, unknown keys refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def with_config(self, cfg) -> MethodParams:
        """These parameters with the defaults that depend on the run's configuration filled in."""
        return self

    def for_output(self, out: str) -> MethodParams:
        """These parameters bound to the run writing `out`: where a method keeps state of its own per run
        (ERM4's reservoir). The rows and the run's configuration record the unbound parameters, so the same
        command in two output folders gives the same rows."""
        return self

    def state_files(self) -> list[str]:
        """Local files this run reads and writes besides its output (bound parameters): one job at a time
        holds each (`pipeline.io.output_lock.state_lock`)."""
        return []


@dataclass(frozen=True)
class MethodSpec:
    name: str
    program: Program
    params_model: type[MethodParams]
    description: str
    paper: str
    one_call: bool = False  # one LLM call per question, its last request: a streaming generator buys it nothing

    def params(self, values: dict | None = None, cfg=None) -> MethodParams:
        """Validated parameters; with `cfg`, configuration-dependent defaults resolved (`with_config`)."""
        try:
            params = self.params_model.model_validate(values or {})
            return params if cfg is None else params.with_config(cfg)
        except ValidationError as err:
            msgs = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
            raise MethodError(f"method {self.name}: invalid params: {msgs}") from None

    def defaults(self) -> list[tuple[str, str, Any, str]]:
        """(name, type, default, description) of every parameter."""
        rows = []
        for name, f in self.params_model.model_fields.items():
            a = f.annotation
            ann = a.__name__ if isinstance(a, type) else str(a).replace("typing.", "")
            rows.append((name, ann, f.default, f.description or ""))
        return rows


_REGISTRY: dict[str, MethodSpec] = {}


def register_method(
    name: str,
    *,
    params: type[MethodParams] = MethodParams,
    description: str = "",
    paper: str = "",
    one_call: bool = False,
):
    """`one_call`: the program makes one LLM call per question and it is its last request (generation.streaming=auto
    then drives vLLM with batched calls where every method of the process is such)."""

    def deco(fn: Program) -> Program:
        if name in _REGISTRY and _REGISTRY[name].program is not fn:
            raise ValueError(f"method {name!r} registered twice")
        doc = description or (fn.__doc__ or "").strip().split("\n")[0]
        _REGISTRY[name] = MethodSpec(name, fn, params, doc, paper, one_call)
        return fn

    return deco


def _load_all() -> None:
    """Import every module of this package: each registers its methods."""
    for mod in sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)])):
        importlib.import_module(f"{__package__}.{mod}")


def all_methods() -> dict[str, MethodSpec]:
    _load_all()
    return dict(sorted(_REGISTRY.items()))


def get_method(name: str) -> MethodSpec:
    _load_all()
    if name not in _REGISTRY:
        raise MethodError(f"unknown method {name!r}; known: {', '.join(sorted(_REGISTRY))} (dynrag methods)")
    return _REGISTRY[name]


def all_one_call(names: list[str]) -> bool:
    """Every method named makes one LLM call a question, as its last request (no names: not known, False); what
    a generator serving them needs to know (pipeline.backends.streams)."""
    return bool(names) and all(get_method(n).one_call for n in names)


def config_hash(*parts: Any) -> str:
    """A short stable hash of the method, its params and the settings that change its output."""
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]
