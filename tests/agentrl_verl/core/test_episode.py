"""The episode record the agent loop writes and everything reads back, and the one success definition."""

import json

import pytest

from agentrl_verl.core.cross_policy import TurnLog
from agentrl_verl.core.episode import RECORD_KEY, RECORD_VERSION, EpisodeRecord, is_success
from agentrl_verl.core.trainer import episode_metrics


def _record(**changes) -> EpisodeRecord:
    log = TurnLog()
    log.record({"policy": "current", "policy_version": 3}, start=0, num_tokens=5)
    fields = {"task": "webshop", "status": "completed", "reward": 0.5, "env_reward": 0.5, "turns": 1,
              "oldest_version": 3, "newest_version": 4, "turn_log": log, **changes}
    return EpisodeRecord(**fields)


def test_the_record_crosses_into_verl_as_one_versioned_field_beside_verls_own_version_range():
    record = _record()
    extra = json.loads(json.dumps(record.to_extra_fields()))  # what TransferQueue and the metrics file keep
    # One namespaced field, and the two keys verl reads itself (its TransferQueue tags): nothing else at the top.
    assert set(extra) == {RECORD_KEY, "min_global_steps", "max_global_steps"}
    assert (extra["min_global_steps"], extra["max_global_steps"]) == (3, 4)
    assert extra[RECORD_KEY]["version"] == RECORD_VERSION and extra[RECORD_KEY]["task"] == "webshop"
    back = EpisodeRecord.from_extra_fields(extra)
    assert back == record and back.turn_log.policies == ["current"] and back.turn_log.spans == [(0, 5)]
    assert back.to_extra_fields() == extra
    # Rows another agent loop wrote carry no record; a record of another layout is refused by name.
    assert EpisodeRecord.from_extra_fields(None) is None and EpisodeRecord.from_extra_fields({"turns": 2}) is None
    with pytest.raises(ValueError, match="layout 0, this agentrl_verl reads 1"):
        EpisodeRecord.from_extra_fields({RECORD_KEY: {**extra[RECORD_KEY], "version": 0}})


@pytest.mark.parametrize(("status", "env_reward", "success"), [
    ("completed", 1.0, True),
    ("completed", 0.5, False),  # a partial reward (a WebShop purchase of the right type only): reward, not success
    ("completed", 0.0, False),
    ("task limit reached", 1.0, False),
])
def test_success_is_a_completed_episode_with_full_reward(status, env_reward, success):
    assert is_success(status, env_reward) is success
    assert _record(status=status, env_reward=env_reward).success is success


def test_training_metrics_and_held_out_figures_count_the_same_successes():
    from agentrl_verl.tools.evaluate import episode_record

    records = [_record(env_reward=1.0), _record(env_reward=0.5), _record(status="agent invalid action")]
    outputs = [type("Output", (), {"extra_fields": r.to_extra_fields(), "prompt_ids": [1], "response_ids": [2]})
               for r in records]
    tokenizer = type("Tokenizer", (), {"decode": staticmethod(lambda ids: "text")})
    row = {"data_source": "webshop", "extra_info": {"index": 0}}
    held_out = [episode_record(out, tokenizer, row)["success"] for out in outputs]
    assert held_out == [True, False, False]
    assert episode_metrics([out.extra_fields for out in outputs])["agentrl/webshop/success_rate"] == 1 / 3
