"""The chat-template guard: a template that drops tool schemas, or ends a turn with another token than the stop token,
cannot start training (checked from the tokenizer alone, and on each episode's real tools)."""

from __future__ import annotations

import copy

import pytest
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import DictConfigWrap
from verl.utils.dataset.rl_dataset import RLHFDataset

from agentrl_verl.core.agent_loop import AGENT_NAME, AgentRLAgentLoop
from agentrl_verl.core.chat_template import (
    OVERRIDE,
    TEMPLATE_FILE,
    ChatTemplateError,
    check_chat_template,
    is_chatml,
    project_template,
    render,
    turn_boundary,
)
from agentrl_verl.models.tiny import build_tiny_model
from env_adapters.client import StartedSession
from env_adapters.task import function_tool

NO_TOOLS = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
"""ChatML without tool support, as SmolLM2-Instruct's own template is: ``tools=`` is silently ignored."""
FIRST_TOOL_ONLY = project_template().replace("{%- for tool in tools %}", "{%- for tool in tools[:1] %}")
"""A template that shows only the first tool: it passes the one-tool probe, not an episode with two tools."""
TOOLS = [function_tool("calculate", "evaluate", {"expression": {"type": "string"}}),
         function_tool("submit", "answer", {"answer": {"type": "string"}})]


@pytest.fixture(scope="module")
def base():
    return AutoTokenizer.from_pretrained(build_tiny_model())


def with_template(tokenizer, template: str | None = None, eos: str | None = None):
    changed = copy.deepcopy(tokenizer)
    if template is not None:
        changed.chat_template = template
    if eos is not None:
        changed.eos_token = eos
    return changed


def test_the_tiny_and_the_project_templates_pass(base):
    for tokenizer in (base, with_template(base, project_template())):
        check_chat_template(tokenizer)
        assert is_chatml(tokenizer)
        end, after = turn_boundary(tokenizer)
        assert tokenizer.convert_ids_to_tokens(end) == "<|im_end|>" and after == "\n"


def test_a_template_that_drops_the_tools_is_refused_naming_what_to_set(base):
    tokenizer = with_template(base, NO_TOOLS)
    assert "calculate" not in render(tokenizer, [{"role": "user", "content": "x"}], TOOLS)  # dropped, silently
    with pytest.raises(ChatTemplateError, match="does not render tool schemas") as error:
        check_chat_template(tokenizer)
    assert OVERRIDE in str(error.value) and TEMPLATE_FILE in str(error.value)


def test_a_turn_that_ends_with_another_token_than_eos_is_refused(base):
    # The GGUF's tokenizer says eos is <|im_start|>; its turns end with <|im_end|>.
    with pytest.raises(ChatTemplateError, match=r"ends an assistant turn with '<\|im_end\|>'.*eos_token is "
                                                r"'<\|im_start\|>'.*set eos_token to '<\|im_end\|>'"):
        check_chat_template(with_template(base, eos="<|im_start|>"))


def test_a_turn_without_an_end_token_is_refused(base):
    plain = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
    with pytest.raises(ChatTemplateError, match="no special token"):
        turn_boundary(with_template(base, plain))
    glued = with_template(base, plain.replace("\\n", "<|im_end|>"))  # an end token, but no newline after it
    assert turn_boundary(glued)[1] == "" and not is_chatml(glued)


def _loop(tokenizer, env=None) -> AgentRLAgentLoop:
    config = OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"prompt_length": 4096, "response_length": 1024,
                                          "multi_turn": {"format": "hermes"}}},
        "data": {"apply_chat_template_kwargs": {}},
        "agentrl": {"env": {"url": "http://unused"}, "agent": {}},
    })
    return AgentRLAgentLoop(trainer_config=DictConfigWrap(config), server_manager=None, tokenizer=tokenizer,
                            processor=None, dataset_cls=RLHFDataset, data_config=DictConfigWrap(config.data),
                            hf_model_type="llama", env_client=env)


def test_the_agent_loop_cannot_start_with_a_template_that_drops_the_tools(base):
    with pytest.raises(ChatTemplateError, match=OVERRIDE.replace(".", r"\.")):
        _loop(with_template(base, NO_TOOLS))


class OpeningOnly:
    async def start_sample(self, name, index=-1, custom_task=None):
        return StartedSession(session_id=1, messages=[{"role": "user", "content": "What is 2+3?"}], tools=TOOLS)

    async def cancel(self, session_id):
        pass


async def test_an_episode_whose_prompt_misses_one_of_its_tools_stops_the_run(base):
    loop = _loop(with_template(base, FIRST_TOOL_ONLY), OpeningOnly())  # the one-tool probe passes
    with pytest.raises(ChatTemplateError, match=r"episode calc/4: .* does not name the tools \['submit'\]"):
        await loop.run({}, data_source="calc", extra_info={"index": 4}, raw_prompt=[], agent_name=AGENT_NAME)
