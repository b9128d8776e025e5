"""Turning a prompt (a user message, chat messages, or raw text) into token ids, the same way for
every generation backend: the model's chat template with the generation prompt appended. Chat messages that
end with an assistant message are continued: that message's text follows the generation prompt as the start
of the model's own turn (how a multi-round method lets the model go on from what it has written)."""

from __future__ import annotations

from typing import Any

from pipeline.engine.requests import WINDOW, Completion, Prompt, SamplingSpec
from pipeline.errors import QuestionError


def to_messages(prompt: Prompt) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)


def render(tokenizer: Any, prompt: Prompt, chat: bool = True) -> tuple[str, bool]:
    """(text, add_special_tokens): the chat-templated text, or the raw text when chat is off."""
    if isinstance(prompt, str) and not chat:
        return prompt, True
    messages = to_messages(prompt)
    if len(messages) > 1 and messages[-1]["role"] == "assistant":
        text, special = render(tokenizer, messages[:-1], chat)
        return text + messages[-1]["content"], special
    if getattr(tokenizer, "chat_template", None):
        try:
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True), False
        except Exception:  # templates without a system role (e.g. Gemma): fold it into the user turn
            if messages and messages[0]["role"] == "system" and len(messages) > 1:
                merged = [
                    {"role": messages[1]["role"], "content": f"{messages[0]['content']}\n\n{messages[1]['content']}"}
                ]
                return tokenizer.apply_chat_template(
                    merged + messages[2:], tokenize=False, add_generation_prompt=True
                ), False
            raise
    return "\n\n".join(m["content"] for m in messages) + "\n", True


def encode(tokenizer: Any, prompt: Prompt, chat: bool = True) -> list[int]:
    text, special = render(tokenizer, prompt, chat)
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


class PromptTooLong(QuestionError, ValueError):
    pass


def window_check(prompt_tokens: int, spec: SamplingSpec, max_model_len: int, max_new_tokens: int) -> Completion | None:
    """None where a prompt of `prompt_tokens` runs. With `spec.fit`, a prompt that leaves less room than its
    max_tokens (`max_new_tokens` when None) is not run: its empty Completion (finish_reason WINDOW, `over`: the
    tokens missing) goes back to the program. Without, a prompt that fills the window is its question's error
    (the backend cuts max_tokens to the room left). Every generator checks here (vllm_gen, vllm_stream, hf_gen)."""
    room = max_model_len - prompt_tokens
    want = spec.max_tokens or max_new_tokens
    if spec.fit and room < want:
        return Completion("", prompt_tokens=prompt_tokens, finish_reason=WINDOW, over=want - room)
    if room <= 0:
        raise PromptTooLong(f"prompt of {prompt_tokens} tokens does not fit generation.max_model_len={max_model_len}")
    return None


def cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    cut = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)
