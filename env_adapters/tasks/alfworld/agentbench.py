"""What AgentBench's ALFWorld task (function-calling edition) shows the agent and how it reads the agent's action.

The texts are upstream's, verbatim (typos included: models are compared on them); :func:`process_action` is
upstream's normalisation: the first line of the argument, lower-cased, kept when it is an admissible command, else
the admissible command with the highest sentence BLEU (smoothing method 4) if that exceeds 0.01, else unchanged
(the engine then answers "Nothing happens.").
"""

from __future__ import annotations

from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

from env_adapters.task import function_tool

INSTRUCTION = """Interact with a household to solve a task. Imagine you are an intelligent agent in a household \
environment and your target is to perform actions to complete) the task goal. At the beginning of your interactions, \
you will be given the detailed description of the current environment and your goal to accomplish. A tool will be \
provided for you to use to submit the action you want to take. This tool is the only tool you should and must take in \
order to operate any action in the environment. The way you perform action is to place the action chosen by you in \
the arguments field of your tool call. For each of your turn, you will be given a list of actions which you can \
choose one to perform in this turn. The action you would like to take should be offered in this format: "the name of \
your next action", and you should fill it in the argument field of your tool call. Note that you should always call \
a tool to operate an action from the given choices. After your each turn, the environment will give you immediate \
feedback based on which you plan your next few steps. if the environment output "Nothing happened", that means the \
previous action is invalid and you should try more options.
 Reminder:
1. the action must be chosen from the given available actions. Any actions except provided available actions will \
be regarded as illegal.
2. Always call the tool to hand in your next action and think when necessary."""
# One line for tiny models (the task's ``prompt: short``): upstream's instruction costs ~250 tokens per episode.
SHORT_INSTRUCTION = "Reach the task's goal: call take_action with one of the available actions."
INSTRUCTIONS = {"upstream": INSTRUCTION, "short": SHORT_INSTRUCTION}

TOOL = function_tool("take_action", "Take an action.",
                     {"action": {"type": "string", "description": "The action you would like to take"}})
TOOL["function"]["parameters"]["additionalProperties"] = False
TOOLS = [TOOL]

NO_TOOL_CALL = "No executable tool calls found. Please call a tool instead"
INVALID_TOOL_CALL = "No valid tool calls found. Please call a tool instead."
BLEU_LIMIT = 0.01
MAX_ACTION_CHARS = 1000
"""What of an action's first line is read: every admissible command is far shorter. Upstream reads it whole, and
BLEU-scored a 3.9 MB action against each command for 40 s in one step."""
REPEAT_LIMIT = 3  # the same raw action this many times in a row ends the episode (after more than 3 steps)

_SMOOTHING = SmoothingFunction().method4


def available_actions(commands: list[str]) -> str:
    """The list appended to every observation."""
    return " AVAILABLE ACTIONS: " + "\n".join(commands) + "\n"


def task_prompt(intro: str, commands: list[str]) -> str:
    """The first user message: the game's intro without its banner paragraph, then the available actions."""
    return "Here is your task. " + "\n".join(intro.split("\n\n")[1:]) + available_actions(commands)


def process_ob(observation: str) -> str:
    """Drop the "You arrive at loc N. " prefix that old grammars put before a receptacle's description."""
    if observation.startswith("You arrive at loc "):
        observation = observation[observation.find(". ") + 2:]
    return observation


def bleu(reference: str, candidate: str) -> float:
    return sentence_bleu([reference.split()], candidate.split(), smoothing_function=_SMOOTHING)


def process_action(action: str, choices: list[str]) -> str:
    """Map the agent's action text to the command sent to the engine (upstream ``process_action``).

    Only the first :data:`MAX_ACTION_CHARS` characters of the first line are read.

    Raises:
        AttributeError: ``action`` is not a string (upstream then reports an invalid tool call).
    """
    action = action.strip().lower().split("\n", 1)[0][:MAX_ACTION_CHARS]
    if not choices or action in choices:
        return action
    try:  # upstream keeps the action as it is on any failure of the scoring
        scores = [bleu(choice, action) for choice in choices]
    except Exception:  # noqa: BLE001 - upstream's bare except
        return action
    best = max(range(len(choices)), key=scores.__getitem__)  # first of equal maxima, as numpy's argmax
    return choices[best] if scores[best] > BLEU_LIMIT else action
