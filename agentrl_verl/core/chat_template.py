"""What a model's chat template must do for agentic training, checked before a model trains: render the tool schemas,
and end an assistant turn with the token generation stops at.

A template that drops ``tools`` (SmolLM2-Instruct's own does, silently) trains a model on episodes whose prompts never
show it its tools; a turn that ends with another token than the stop token leaves every generated turn either
unterminated or cut where the template would not cut it. Both are caught here, from the tokenizer alone:
:func:`check_chat_template` at the agent loop's start, :func:`missing_tools` on each episode's real tool list.

:func:`turn_boundary` also tells the agent loop whether the template is ChatML (``<|im_end|>`` then a newline between
turns), whose boundary verl's Qwen token builder handles, also for models of another architecture.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from typing import Any

TEMPLATE_FILE = "agentrl_verl/models/templates/chatml_tools.jinja"
"""The project's ChatML template with hermes function calling (for models whose own template drops the tools)."""
OVERRIDE = "actor_rollout_ref.model.custom_chat_template"
"""verl's setting that replaces a model's chat template."""
PROBE_TOOL = {"type": "function", "function": {
    "name": "agentrl_probe_tool", "description": "A tool that exists only to see whether the template renders tools.",
    "parameters": {"type": "object", "properties": {"value": {"type": "string"}}, "required": ["value"]}}}
_MARK = "agentrl-probe-reply"


class ChatTemplateError(ValueError):
    """The model's chat template cannot train a tool-using agent; the message says what to set."""


def project_template() -> str:
    """The text of :data:`TEMPLATE_FILE`."""
    return (resources.files("agentrl_verl.models") / "templates" / "chatml_tools.jinja").read_text()


def render(tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None,
           add_generation_prompt: bool = False) -> str:
    """``messages`` (and ``tools``) as the tokenizer's chat template renders them, as text."""
    return tokenizer.apply_chat_template(list(messages), tools=list(tools) if tools else None, tokenize=False,
                                         add_generation_prompt=add_generation_prompt)


def missing_tools(tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]) -> list[str]:
    """The names of ``tools`` that the rendered prompt of ``messages`` does not contain."""
    text = render(tokenizer, messages, tools, add_generation_prompt=True)
    return [tool["function"]["name"] for tool in tools if tool["function"]["name"] not in text]


def turn_boundary(tokenizer: Any) -> tuple[int, str]:
    """The special token that ends an assistant turn in the template, and the text the template puts after it.

    Raises:
        ChatTemplateError: the template puts no special token after an assistant's reply.
    """
    text = render(tokenizer, [{"role": "user", "content": "ping"}, {"role": "assistant", "content": _MARK}])
    ids = tokenizer.encode(text[text.rindex(_MARK) + len(_MARK):], add_special_tokens=False)
    special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}))
    end = next((i for i in ids if i in special), None)
    if end is None:
        raise ChatTemplateError(f"the chat template ends an assistant turn with no special token (after the reply: "
                                f"{tokenizer.decode(ids)!r}); generation could not stop where a turn ends")
    return end, tokenizer.decode(ids[ids.index(end) + 1:])


def is_chatml(tokenizer: Any) -> bool:
    """Whether turns end as ChatML's do: ``<|im_end|>``, then a newline before the next turn."""
    end, after = turn_boundary(tokenizer)
    return tokenizer.convert_ids_to_tokens(end) == "<|im_end|>" and after == "\n"


def check_chat_template(tokenizer: Any) -> None:
    """Refuse a tokenizer whose chat template drops tool schemas, or whose assistant turns end with another token than
    its ``eos_token`` (which the rollout stops at and the agent loop strips).

    Raises:
        ChatTemplateError: naming :data:`OVERRIDE` and :data:`TEMPLATE_FILE`, or the eos token to set.
    """
    user = [{"role": "user", "content": "ping"}]
    if missing_tools(tokenizer, user, [PROBE_TOOL]):
        raise ChatTemplateError(
            "the model's chat template does not render tool schemas (a prompt rendered with tools=[...] does not name "
            f"them), so the model would never see its tools: set {OVERRIDE} to a template that renders them, e.g. the "
            f"contents of {TEMPLATE_FILE} for a ChatML model, or build the model with `agentrl-verl build-model`")
    end, _ = turn_boundary(tokenizer)
    if end != tokenizer.eos_token_id:
        raise ChatTemplateError(
            f"the chat template ends an assistant turn with {tokenizer.convert_ids_to_tokens(end)!r} (id {end}), but "
            f"the tokenizer's eos_token is {tokenizer.eos_token!r} (id {tokenizer.eos_token_id}), where generation "
            f"stops: set eos_token to {tokenizer.convert_ids_to_tokens(end)!r} in the model directory's "
            "tokenizer_config.json (and eos_token_id in generation_config.json), or use a template that ends turns "
            "with the eos token")


def check_episode_tools(tokenizer: Any, prompt_ids: Sequence[int], tools: Sequence[dict[str, Any]],
                        where: str) -> None:
    """Refuse an episode whose rendered prompt does not name each of its tools (``where`` names the episode).

    Raises:
        ChatTemplateError: as :func:`check_chat_template`.
    """
    text = tokenizer.decode(list(prompt_ids))
    missing = [tool["function"]["name"] for tool in tools if tool["function"]["name"] not in text]
    if missing:
        raise ChatTemplateError(
            f"{where}: the prompt rendered by the model's chat template does not name the tools {missing}, so the "
            f"model would never see them: set {OVERRIDE} to a template that renders tools (e.g. the contents of "
            f"{TEMPLATE_FILE}), or build the model with `agentrl-verl build-model`")
