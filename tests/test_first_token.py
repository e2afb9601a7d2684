"""Time to first token under load (tpusim.serving.first_token): the rule against cases worked by
hand from its numbered steps (SGLang's overlap loop, prefill first, joined prompts, chunks)."""

from __future__ import annotations

import pytest

from tpusim.serving.first_token import first_token_wait_s, joined_prompts, receive_wait_s

# A worked case: 16 clients, a 20 ms decode step, a 4000-token prompt whose prefill takes 80 ms on
# the GPU and 60 ms on the host, 500 output tokens at 25 ms each, a 5 ms client turnaround.
CASE = {"concurrency": 16, "decode_step_s": 0.020, "prefill_gpu_s": 0.080, "prefill_host_s": 0.060,
        "prompt_tokens": 4000, "output_tokens": 500, "tpot_s": 0.025, "turnaround_s": 0.005}


def test_a_worked_case_by_hand():
    # 2. received at the first step boundary after 5 ms: 20 - 5 = 15 ms
    # 3. joined: 15 others x 20 ms / (500 x 25 ms) = 0.024 prompts; the GPU prefill 80 x 1.024 = 81.92 ms
    # 4. behind one decode step: max(60, 20 + 81.92) = 101.92 ms; wait 15 + 101.92 = 116.92 ms
    assert receive_wait_s(0.020, 0.005) == pytest.approx(0.015)
    assert joined_prompts(16, 0.020, 500, 0.025, 4000) == pytest.approx(0.024)
    assert first_token_wait_s(**CASE) == pytest.approx(0.11692)


def test_an_idle_server_waits_for_the_prefill_alone():
    assert first_token_wait_s(**{**CASE, "concurrency": 1}) == pytest.approx(0.080)  # max(60 host, 80 GPU)
    assert first_token_wait_s(**{**CASE, "concurrency": 1, "prefill_host_s": 0.1}) == pytest.approx(0.1)


def test_a_host_bound_prefill_hides_the_step_launched_before_it():
    # the host issues the 150 ms of kernels while the GPU finishes the 20 ms step: 15 + 150 ms
    assert first_token_wait_s(**{**CASE, "prefill_host_s": 0.150}) == pytest.approx(0.165)


def test_a_slow_client_lands_in_a_later_step():
    # 45 ms after the boundary: received at the third boundary, 60 - 45 = 15 ms later
    assert receive_wait_s(0.020, 0.045) == pytest.approx(0.015)
    assert receive_wait_s(0.020, 0.0) == pytest.approx(0.020)  # an instant client still waits one step


def test_the_chunk_budget_caps_joined_prompts_and_a_long_prompt_runs_in_chunks():
    # 999 others x 20 ms / (10 x 25 ms) = 79.9 prompts, but 16384 tokens hold 2.048 prompts of 8000: 1.048 others
    assert joined_prompts(1000, 0.020, 10, 0.025, 8000) == pytest.approx(16384 / 8000 - 1)
    # 20000 tokens: 2 chunks (host 2 x 60 ms), no room for others: 15 + max(120, 20 + 80) = 135 ms
    assert first_token_wait_s(**{**CASE, "prompt_tokens": 20000}) == pytest.approx(0.135)


def test_more_load_waits_longer():
    light = first_token_wait_s(**CASE)
    heavy = first_token_wait_s(**{**CASE, "concurrency": 64, "decode_step_s": 0.040, "tpot_s": 0.050})
    assert heavy > light > first_token_wait_s(**{**CASE, "concurrency": 1})


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError):
        first_token_wait_s(**{**CASE, "turnaround_s": -1.0})
    with pytest.raises(ValueError):
        receive_wait_s(0.0, 0.001)
