"""The ToT search driver (section 19): exact call counts with an injected oracle, memoization,
limits, producer edges; then the replay engine end to end, capture and consistency checks."""
import itertools

import pytest

from kmesh_lib.base.data import resolve_path
from kmesh_lib.bounds.ideal import count_exact_prefix_edges
from kmesh_lib.engine.model_spec import ByteTokenizer
from kmesh_lib.engine.requests import RequestResult
from kmesh_lib.kv.capture_contract import validate_capture
from kmesh_lib.sections.tot_headroom.generator import capture_record
from kmesh_lib.workloads import game24
from kmesh_lib.workloads.game24 import OPS, Puzzle, fmt
from kmesh_lib.workloads.tot_search import SearchConfig, TotSearch, encode

TOK = ByteTokenizer(512)
ENGINE_INFO = {"name": "vllm", "version": "test", "mode": "replay", "device": "cpu", "block_size": 16, "num_gpu_blocks": 129}
P1234 = Puzzle(0, (1, 2, 3, 4), 1)


def oracle(respond, finish=lambda call: "length"):
    """A fake generator for unit tests of the search logic: text from ``respond(call)``."""
    def generate(calls):
        generate.groups.append([c.invocation_id for c in calls])
        results = []
        for c in calls:
            ids = encode(TOK, respond(c))
            t = 1_000 * (c.call_index + 1)
            results.append(RequestResult(c.invocation_id, list(c.prompt_token_ids), ids, t_submit_ns=t,
                                         t_token_ns=[t + 1] * len(ids), finish_reason=finish(c)))
        return results
    generate.groups = []
    return generate


def commuted(call):
    """Proposals: a + b and b + a of the first two numbers (one value key); values: likely."""
    if call.kind == "value":
        return "thinking\nJudgement: likely\n"
    a, b, *rest = call.state.numbers
    left = " ".join(fmt(x) for x in (*rest, a + b))
    return f"{fmt(a)} + {fmt(b)} = {fmt(a + b)} (left: {left})\n{fmt(b)} + {fmt(a)} = {fmt(a + b)} (left: {left})\n\nInput:"


def solver(call):
    """Proposals: one step on a solution path, then a distractor; values: sure iff solvable."""
    numbers = call.state.numbers
    if call.kind == "value":
        return "Judgement: " + ("sure" if game24.solve(numbers) else "impossible")
    lines = []
    for (i, a), (j, b) in itertools.permutations(enumerate(numbers), 2):
        c = OPS["*"](a, b) if not lines else None
        for op in OPS:
            c = OPS[op](a, b)
            rest = [x for k, x in enumerate(numbers) if k not in (i, j)] + [c]
            if c is not None and game24.solve(rest):
                lines.append(f"{fmt(a)} {op} {fmt(b)} = {fmt(c)} (left: {' '.join(map(fmt, rest))})")
                break
        if lines:
            break
    a, b, *rest = numbers
    lines.append(f"{fmt(a)} * {fmt(b)} = {fmt(a * b)} (left: {' '.join(map(fmt, (*rest, a * b)))})")
    return "\n".join(lines) + "\n"


def test_exact_call_counts_and_value_memoization():
    gen = oracle(commuted)
    run = TotSearch(gen, TOK, SearchConfig(base_seed=100)).run([P1234, Puzzle(1, (1, 2, 3, 4), 1)])
    # puzzle 0: step 1: 1 proposal, 2 candidates with numbers (3 3 4): 1 value call, 1 avoided;
    # steps 2 and 3: 2 proposals, 4 candidates with one key: 1 value call, 3 avoided.
    # puzzle 1: the same proposals; every value is memoized from puzzle 0 (2 + 4 + 4 avoided).
    c = run.counts
    assert (c["num_proposal_calls"], c["num_value_calls"], c["num_calls"]) == (10, 3, 13)
    assert (c["num_avoided_value_calls"], c["num_valued_candidates"]) == (17, 20)
    assert c["num_value_calls"] + c["num_avoided_value_calls"] == c["num_valued_candidates"]
    assert (c["num_valid_proposals"], c["num_unparsed_proposal_lines"], c["num_invalid_proposals"]) == (20, 0, 0)
    assert [len(g) for g in gen.groups] == [1, 1, 2, 1, 2, 1, 1, 2, 2]
    calls = [inv.call for inv in run.invocations]
    assert [c.call_index for c in calls] == list(range(13))
    assert [c.seed for c in calls] == [100 + i for i in range(13)]
    assert [c.kind[0] for c in calls[:8]] == list("pvppvppv")
    parents = [c.parent_id and int(c.parent_id.split("-c")[1][:4]) for c in calls[:8]]
    assert parents == [None, 0, 0, 0, 2, 2, 2, 5]  # the producer of each call's state
    first = run.outcomes[0]
    assert (first.status, first.reason, first.expression, first.num_calls) == (
        "failed", "equals 10, not 24", "(1 + 2) + (3 + 4)", 8)
    assert run.outcomes[1].num_calls == 5 and not run.partial


def test_children_extend_their_producer_exactly():
    run = TotSearch(oracle(commuted), TOK, SearchConfig()).run([P1234])
    records = [capture_record(inv, run_id="t", engine_info=ENGINE_INFO, clock_domain="fake") for inv in run.invocations]
    assert validate_capture(records).ok
    assert count_exact_prefix_edges(records) == 7 == sum(r["parent_id"] is not None for r in records)
    root = records[0]["prompt_token_ids"]
    assert root == encode(TOK, game24.FEWSHOT) + encode(TOK, "\nInput: 1 2 3 4\nPossible next steps:\n")
    assert records[1]["extra"]["parsed"] == {"judgement": "likely"}


def test_chains_that_do_not_fit_restart_from_the_header():
    cfg = SearchConfig(max_tokens=100, max_model_len=1100)
    run = TotSearch(oracle(commuted), TOK, cfg).run([P1234])
    header = encode(TOK, game24.FEWSHOT)
    by_id = {inv.call.invocation_id: inv for inv in run.invocations}
    for inv in run.invocations[1:]:
        call, parent = inv.call, by_id[inv.call.parent_id].result
        kept = parent.prompt_token_ids + parent.output_token_ids
        question = (game24.value_question if call.kind == "value" else game24.propose_question)(call.state)
        assert call.context_reset == (len(kept) + len(encode(TOK, question)) + 100 > 1100)
        start = header if call.context_reset else kept
        assert list(call.prompt_token_ids) == start + encode(TOK, question) and len(call.prompt_token_ids) + 100 <= 1100
    resets = sum(inv.call.context_reset for inv in run.invocations)
    assert 0 < resets == run.counts["num_context_resets"] < 7


@pytest.mark.requires_data("game24")
def test_the_solver_oracle_solves_and_grades():
    puzzles = game24.load_puzzles(resolve_path("$KMESH_DATA_ROOT/game24/24.csv"), [0, 1, 2])
    run = TotSearch(oracle(solver), TOK, SearchConfig()).run(puzzles)
    assert [o.status for o in run.outcomes] == ["solved"] * 3
    assert all(game24.grade(o.numbers, o.expression).ok and len(o.steps) == 3 for o in run.outcomes)


def test_unparsed_proposals_end_a_puzzle_but_not_the_run():
    run = TotSearch(oracle(lambda call: "\x01zz 4 + = ?"), TOK, SearchConfig()).run([P1234, Puzzle(5, (2, 3, 4, 5), 6)])
    assert [(o.status, o.reason, o.num_calls) for o in run.outcomes] == [("failed", "no valid proposal at step 1", 1)] * 2
    c = run.counts
    assert (c["num_calls"], c["num_unparsed_proposal_calls"], c["num_unparsed_proposal_lines"]) == (2, 2, 2)
    assert c["num_value_calls"] == 0
    assert not run.partial


def test_call_limit_stops_before_a_group_and_marks_partial():
    run = TotSearch(oracle(commuted), TOK, SearchConfig(max_calls=5)).run([P1234, Puzzle(1, (1, 2, 3, 4), 1)])
    assert run.limit_hit == "max_calls" and run.partial and run.counts["num_calls"] == 5
    assert [(o.status, o.reason) for o in run.outcomes] == [
        ("partial", "limit max_calls at step 3"), ("not_run", "limit hit before: max_calls")]


def test_run_ceiling_is_checked_at_call_boundaries():
    ticks = iter(range(0, 10_000, 100))
    run = TotSearch(oracle(commuted), TOK, SearchConfig(run_ceiling_s=250), clock=lambda: next(ticks)).run([P1234])
    assert run.limit_hit == "run_ceiling" and run.counts["num_calls"] == 2
    assert run.outcomes[0].reason == "limit run_ceiling at step 2"


def test_an_invocation_over_its_bound_stops_the_search():
    seen = []
    gen = oracle(commuted, finish=lambda call: "timeout" if call.kind == "value" else "length")
    run = TotSearch(gen, TOK, SearchConfig(), on_group=seen.extend).run([P1234])
    assert run.limit_hit == "invocation_bound" and run.counts["num_timeouts"] == 1 and run.counts["num_calls"] == 2
    assert [inv.call.kind for inv in seen] == ["proposal", "value"]  # the timed-out group is still recorded
    rec = capture_record(seen[1], run_id="t", engine_info=ENGINE_INFO, clock_domain="fake")
    assert rec["status"] == "timeout" and validate_capture([capture_record(seen[0], run_id="t", engine_info=ENGINE_INFO,
                                                                           clock_domain="fake"), rec]).ok


# -- the driver on the replay engine (vLLM's scheduler and KV-cache manager, no forward pass) --
@pytest.fixture(scope="module")
def replay_cfg():
    from kmesh_lib.sections.tot_headroom.experiment import TotHeadroomParams

    return TotHeadroomParams(ENGINE="replay", MODEL="tiny", BLOCK_SIZE=16, NUM_GPU_BLOCKS=129, MAX_MODEL_LEN=2048,
                             PUZZLE_INDICES=[0, 1], MAX_TOKENS=16, SWEEP_POOL_BLOCKS=[8, 64], POLICY="model",
                             NUM_SCALE_PUZZLES=0)


@pytest.mark.requires_data("game24")
def test_forcing_off_leaves_the_driver_unchanged(replay_cfg):
    """POLICY: model: no forced ids reach the engine, and the replay engine's own outputs give what
    they gave before forcing existed (nothing parses; the second root prompt hits the header)."""
    from kmesh_lib.base.records import RunRecord
    from kmesh_lib.sections.tot_headroom import experiment as tx
    from kmesh_lib.sections.tot_headroom.generator import engine_generator

    class Spy:
        def __init__(self):
            self.specs = []

        def submit(self, spec):
            self.specs.append(spec)

    spy = Spy()
    calls = TotSearch(oracle(commuted), TOK, SearchConfig()).run([P1234]).invocations[:2]
    with pytest.raises(AttributeError):  # the spy cannot step: only the submitted specs matter here
        engine_generator(spy, SearchConfig(max_tokens=7), outputs=None)([inv.call for inv in calls])
    assert spy.specs[0].forced_token_ids is None and spy.specs[0].max_tokens == 7

    record = RunRecord.open("tot_headroom", replay_cfg)
    run = tx.run_engine(replay_cfg, record)
    assert [(o.status, o.reason) for o in run.search.outcomes] == [("failed", "no valid proposal at step 1")] * 2
    assert run.drain_ok and run.num_unattributed_events == 0 and not run.search.partial
    assert [r["num_cached_tokens"] for r in run.records] == [0, 880]  # the header + "\nInput: 1 1 " = 880 tokens = 55 blocks
    assert [len(r["output_token_ids"]) for r in run.records] == [16, 16] and all(r["block_events"] for r in run.records)
    assert {r["extra"]["policy"] for r in run.records} == {"model"}


def test_sampling_params_are_unchanged_without_forced_ids():
    from kmesh_lib.engine.forcing import FORCED_TOKENS_KEY
    from kmesh_lib.engine.requests import RequestSpec
    from kmesh_lib.engine.vllm_engine import _sampling_params

    plain = _sampling_params(RequestSpec("a", [5, 6], max_tokens=9, temperature=0.7, seed=3))
    assert (plain.max_tokens, plain.temperature, plain.seed, plain.extra_args) == (9, 0.7, 3, None)
    forced = _sampling_params(RequestSpec("b", [5, 6], max_tokens=9, temperature=0.7, seed=3, forced_token_ids=(7, 8)))
    assert forced.max_tokens == 2 and forced.extra_args == {FORCED_TOKENS_KEY: [7, 8]}


@pytest.mark.requires_data("game24")
def test_scripted_search_on_vllm_accounting_hits_every_producer_prefix(replay_cfg):
    """Forced outputs through the replay engine: parseable proposals reach vLLM's real cache accounting."""
    from kmesh_lib.bounds.ideal import ideal_prefill_tokens, lru_prefill_tokens
    from kmesh_lib.engine.replay import ReplayEngine
    from kmesh_lib.kv.capture import BlockPoolCapture, drain_check
    from kmesh_lib.sections.tot_headroom.generator import InvocationBlockLog, engine_generator

    engine = ReplayEngine(replay_cfg)
    capture = BlockPoolCapture(engine.block_pool)
    log = InvocationBlockLog(engine, capture)
    cfg = SearchConfig(max_tokens=64)
    forced = engine_generator(engine, cfg, on_step=capture.mark_step, outputs=lambda call: encode(TOK, commuted(call)))
    run = TotSearch(forced, TOK, cfg).run([P1234])
    records = [capture_record(inv, run_id="t", engine_info=ENGINE_INFO, clock_domain="monotonic",
                              block_events=log.events_for(inv.call.invocation_id),
                              scheduling=log.scheduling_for(inv.call.invocation_id)) for inv in run.invocations]
    assert (run.counts["num_calls"], run.counts["num_value_calls"], run.counts["num_avoided_value_calls"]) == (8, 3, 7)
    assert all(r["output_token_ids"] == encode(TOK, commuted(inv.call)) for r, inv in zip(records, run.invocations))
    assert validate_capture(records).ok and log.num_unattributed == 0 and drain_check(engine.block_pool).ok
    by_id = {r["invocation_id"]: r for r in records}
    for rec in records[1:]:  # every child reuses at least all of its producer's hashed blocks
        parent = by_id[rec["parent_id"]]
        kept = len(parent["prompt_token_ids"]) + len(parent["output_token_ids"])
        assert (kept - 1) // 16 * 16 <= rec["num_cached_tokens"] <= (len(rec["prompt_token_ids"]) - 1) // 16 * 16
    for rec in records:  # no preemption in a roomy pool: scheduled = prefill after the hit + one per fed-back token
        extra = rec["extra"]
        assert extra["num_preemptions"] == 0
        assert extra["num_scheduled_tokens"] == (len(rec["prompt_token_ids"]) - rec["num_cached_tokens"]
                                                 + len(rec["output_token_ids"]) - 1)
    assert count_exact_prefix_edges(records) == 7
    observed = sum(len(r["prompt_token_ids"]) - r["num_cached_tokens"] for r in records)
    ideal, lru = ideal_prefill_tokens(records, 16, 128), lru_prefill_tokens(records, 16, 128)
    assert ideal.num_prefill_tokens <= lru.num_prefill_tokens <= observed
    log.close()
    capture.close()
    engine.close()


@pytest.mark.requires_data("game24")
def test_gpu_pool_is_what_512_mib_of_7b_kv_buys():
    from kmesh_lib.base.params import ParamError
    from kmesh_lib.sections.tot_headroom.experiment import TotHeadroomParams

    gpu = dict(DEVICE="cuda", MODEL="qwen2.5-7b", WEIGHTS="dummy", DTYPE="bfloat16", BLOCK_SIZE=16, KV_CACHE_MIB=512)
    assert TotHeadroomParams(NUM_GPU_BLOCKS=586, **gpu).NUM_GPU_BLOCKS == 586  # 57,344 B/token * 16 = 896 KiB blocks
    with pytest.raises(ParamError, match="buys 585 blocks"):
        TotHeadroomParams(NUM_GPU_BLOCKS=585, **gpu)


@pytest.mark.requires_data("game24")
def test_a_real_model_directory_is_hashed_and_checked_against_its_manifest(tmp_path):
    import json

    from kmesh_lib.sections.tot_headroom.experiment import TotHeadroomParams, check_model_files, sha256_file

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 2,
                                                   "num_attention_heads": 4, "num_key_value_heads": 2}))
    (model / "model.safetensors").write_bytes(b"weights")
    cfg = TotHeadroomParams(MODEL=str(model), ENGINE="replay", BLOCK_SIZE=16)
    with pytest.raises(ValueError, match="needs its tokenizer"):
        check_model_files(cfg)
    (model / "tokenizer.json").write_text("{}")
    hashes = check_model_files(cfg)
    assert set(hashes) == {"config.json", "model.safetensors", "tokenizer.json"}
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps(hashes))
    assert check_model_files(TotHeadroomParams(MODEL=str(model), ENGINE="replay", BLOCK_SIZE=16,
                                               MODEL_MANIFEST=str(manifest))) == hashes
    (model / "tokenizer.json").write_text('{"changed": 1}')
    with pytest.raises(ValueError, match=r"differ from MODEL_MANIFEST.*tokenizer.json"):
        check_model_files(TotHeadroomParams(MODEL=str(model), ENGINE="replay", BLOCK_SIZE=16, MODEL_MANIFEST=str(manifest)))
    assert hashes["model.safetensors"] == sha256_file(model / "model.safetensors")
