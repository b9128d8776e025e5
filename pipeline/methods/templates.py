"""Prompt templates a method takes as a parameter, so a run can ask the model exactly what another system asks
(e.g. a benchmark passing FlashRAG's templates to both sides) while each method keeps its own default.

A template is Python format strings: `system` and `user` over the fields the method names (unknown fields are
refused when the parameters are validated), `doc` formats each retrieved passage into the `{reference}` field.
With `chat` the prompt is chat messages (the generator applies the model's chat template); without it, system
and user are joined by a blank line and sent as raw text. A `continuation` (what the model has written so far)
follows the prompt as the start of the model's turn: an assistant message in chat, appended text in raw.
"""

from __future__ import annotations

import string
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from indexing import Hit
from pipeline.engine.requests import Prompt


class PromptTemplate(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    system: str = Field("", description="system message (format string); empty: none")
    user: str = Field(description="user message or raw prompt (format string)")
    doc: str = Field("Doc {idx} (Title: {title}) {text}\n", description="one passage of {reference}: idx, title, text")
    chat: bool = Field(True, description="chat messages (True) or raw text (False)")

    def fields(self) -> set[str]:
        """The names of the fields `system` and `user` use."""
        return {name for part in (self.system, self.user) for _, name, _, _ in string.Formatter().parse(part) if name}

    def reference(self, hits: Sequence[Hit]) -> str:
        return "".join(self.doc.format(idx=i, title=h.title, text=h.text) for i, h in enumerate(hits, 1))

    def render(self, hits: Sequence[Hit] = (), suffix: str = "", continuation: str = "", **fields: object) -> Prompt:
        """The prompt with `fields` (and `{reference}` from `hits`) filled in; `suffix` is appended to the user
        message, `continuation` starts the model's turn (text the model continues, e.g. the reasoning so far)."""
        values = {"reference": self.reference(hits), **fields}
        system, user = self.system.format(**values), self.user.format(**values) + suffix
        if not self.chat:  # raw text the model continues: no trailing blank (a lone space is a poor token)
            return ("\n\n".join(p for p in (system, user) if p) + continuation).rstrip(" ")
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
        return messages + ([{"role": "assistant", "content": continuation}] if continuation.strip() else [])


def check_template(template: PromptTemplate | None, allowed: set[str], what: str = "template") -> None:
    """Refuse a template that uses a field the method does not fill (a ValueError names them)."""
    unknown = template.fields() - allowed if template else set()
    if unknown:
        raise ValueError(f"{what} uses unknown fields {sorted(unknown)}; allowed: {sorted(allowed)}")
