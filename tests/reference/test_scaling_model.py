"""scripts/scaling-model.py and docs/scaling.md: the page's tables are the script's output for
bench/scaling_inputs.json (so the page cannot drift from its inputs), the byte formulas equal the
communicators' counters of real 2-rank CPU runs at stages 0-3 (read from their traces), and the
model's own pieces agree with figures measured or published elsewhere in the project."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

import reflib

SCRIPT = os.path.join(reflib.REPO, "scripts", "scaling-model.py")
DOC = os.path.join(reflib.REPO, "docs", "scaling.md")
INPUTS = os.path.join(reflib.REPO, "bench", "scaling_inputs.json")


def script(*args, timeout=300):
    return subprocess.run([sys.executable, SCRIPT] + list(args), cwd=reflib.REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def model():
    spec = importlib.util.spec_from_file_location("scaling_model", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_doc_tables_are_the_scripts_output(tmp):
    r = script("--check-doc")
    assert r.returncode == 0, r.stderr
    # Not vacuous: one changed figure in one table is caught.
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    start = text.index("<!-- scaling-model:projection -->")
    changed = text[:start] + text[start:].replace("| 95% |", "| 94% |", 1)
    assert changed != text
    doc = os.path.join(tmp, "scaling.md")
    with open(doc, "w", encoding="utf-8") as f:
        f.write(changed)
    r = script("--check-doc", "--doc", doc)
    assert r.returncode == 1
    assert "table 'projection' differs" in r.stderr


@pytest.fixture(scope="module")
def check_runs(tmp_path_factory):
    """Four real 2-rank launches (stages 0-3, 3 steps of 2 micro-steps each, traced), compared
    by the script with its formulas and with the page's table of that comparison."""
    work = str(tmp_path_factory.mktemp("scaling-check"))
    r = script("check", "--dstrain", reflib.dstrain_binary(), "--work", work, "--check-doc",
               timeout=600)
    return r, work


def test_byte_formulas_equal_the_counters_of_2_rank_runs(check_runs):
    """Every step's bucket/unit collectives on both ranks, and the run's 8-byte all-reduces,
    equal the formulas; the page's table of them is what this run printed."""
    r, work = check_runs
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # A row per collective kind and one of the 8-byte all-reduces: stage 0 all-reduces,
    # stages 1-3 reduce-scatters and all-gathers.
    assert r.stdout.count("| equal |") == 2 + 3 + 3 + 3
    assert "differ" not in r.stdout
    for stage in (0, 1, 2, 3):
        assert os.path.exists(os.path.join(work, f"stage{stage}", "trace", "trace.json"))


def test_a_counter_that_differs_from_the_formula_fails_the_check(tmp, check_runs):
    """The comparison is not vacuous: a trace whose reduce-scatter charged one byte more fails."""
    src = os.path.join(tmp, "runs")
    shutil.copytree(check_runs[1], src)
    trace = os.path.join(src, "stage2", "trace", "trace.json")
    with open(trace, encoding="utf-8") as f:
        data = json.load(f)
    for e in data["traceEvents"]:
        if e.get("name") == "reduce_scatter" and "bucket" in e.get("args", {}):
            e["args"]["bytes_sent"] += 1
            break
    with open(trace, "w", encoding="utf-8") as f:
        json.dump(data, f)
    r = script("check", "--work", src, "--no-run")
    assert r.returncode == 1
    assert "stage 2 reduce_scatter: formula" in r.stderr


def test_shapes_match_published_parameter_counts_and_measured_mfu(model):
    inputs = model.Inputs(INPUTS)
    assert inputs.shape("qwen2.5-0.5b").numel() == 494_032_768  # Qwen2.5-0.5B's safetensors
    assert round(inputs.shape("llama3-8b").numel() / 1e9, 2) == 8.03
    assert round(inputs.shape("llama3-70b").numel() / 1e9, 2) == 70.55
    tiny = model.Shape("tiny", inputs.get("check.shape", dict), "check.shape")
    assert tiny.numel() == 1_017_216
    # docs/models.md's FLOPs per token: with the measured tokens/s it gives the MFU
    # docs/performance.md reports for that run (41.5%).
    q = inputs.shape("qwen2.5-0.5b")
    mfu = q.flops_per_token() * inputs.get("compute.tokens_per_s") / inputs.get("compute.peak_flops")
    assert round(100 * mfu, 1) == 41.5


def test_timeline_without_overlap_is_compute_plus_every_collective(model):
    m = model.Model(model.Inputs(INPUTS))
    for shape in m.shapes:
        comp = m.compute(shape)
        for stage in (1, 2, 3):
            n, nodes = 64, 8
            ser = model.simulate(m.net, shape, comp, stage, (n, nodes), m.opts, True)
            ideal = comp.step(model.owned_elements(shape, stage, n, m.opts))
            assert ser.t == pytest.approx(ideal + ser.comm_busy, rel=1e-9)
            over = model.simulate(m.net, shape, comp, stage, (n, nodes), m.opts, False)
            assert ideal <= over.t <= ser.t * (1 + 1e-9)
            # The timeline issues exactly the collectives the byte formulas count.
            counted = model.engine_collectives(shape, stage, n, 1, m.opts, shape.element_bytes)
            assert over.calls == sum(c for c, _ in counted.values())


def test_collective_time_follows_busbw_and_the_ring_latency(model):
    net = model.Network(model.Inputs(INPUTS))
    big = 8 * 10**9
    # Large messages: bytes over busbw (360 GB/s in a node) plus NCCL's Simple ring latency.
    t = net.seconds("all_gather", big, 8, 1)
    assert t == pytest.approx(big / 360e9 + (8.4 + 7 * 3.4) * 1e-6, rel=1e-9)
    # Small messages: LL's latency, growing with the ranks (6.6 + 7 x 0.6 us in a node).
    assert net.seconds("all_gather", 0, 8, 1) == pytest.approx(10.8e-6, rel=1e-9)
    assert net.seconds("all_gather", 0, 512, 64) > 50 * net.seconds("all_gather", 0, 8, 1)


def test_bad_inputs_are_one_clear_error_exit_2(tmp):
    with open(INPUTS, encoding="utf-8") as f:
        data = json.load(f)
    del data["network"]["intra_node_busbw_gbs"]
    path = os.path.join(tmp, "inputs.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f)
    r = script("--inputs", path)
    assert r.returncode == 2
    assert r.stderr.strip() == (f"scaling-model: {path}: missing key "
                                "'network.intra_node_busbw_gbs'")
    with open(path, "w", encoding="utf-8") as f:
        f.write('{"compute": ')
    r = script("--inputs", path)
    assert r.returncode == 2
    assert f"{path}: line 1: not valid JSON" in r.stderr
    data2 = json.loads(json.dumps(data))
    data2["network"]["intra_node_busbw_gbs"] = {"value": "fast"}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data2, f)
    r = script("--inputs", path)
    assert r.returncode == 2
    assert "key 'network.intra_node_busbw_gbs' is 'fast'; expected a number" in r.stderr


def test_measured_layers_replace_the_extrapolated_layers(tmp, model):
    """A measured_layers entry (scripts/bench/layer-times writes them) sets that shape's decoder
    layers and optimizer; the embedding, the head and the other shapes keep the FLOP rate; an
    entry measured at another length is refused, naming the key."""
    with open(INPUTS, encoding="utf-8") as f:
        data = json.load(f)
    data.pop("measured_layers", None)  # the FLOP-rate model to compare with
    plain_path = os.path.join(tmp, "plain.json")
    with open(plain_path, "w", encoding="utf-8") as f:
        json.dump(data, f)
    plain = model.Model(model.Inputs(plain_path))
    entry = {"forward_ms": 10.0, "backward_ms": 25.0, "optimizer_ns_per_element": 0.02,
             "micro": 4, "seq": 2048, "checkpointing": False,
             "shape": {"hidden": 4096, "intermediate": 14336, "heads": 32, "kv_heads": 8,
                       "head_dim": 128}}
    data["measured_layers"] = {"kind": "measured", "where": "a test", "source": "made up",
                               "value": {"llama3-8b": entry}}
    path = os.path.join(tmp, "inputs.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f)
    m = model.Model(model.Inputs(path))
    s8, s70 = m.shapes[1], m.shapes[2]
    comp, before = m.compute(s8), plain.compute(plain.shapes[1])
    assert comp.fwd[1:-1] == [0.010] * 32 and comp.bwd[1:-1] == [0.025] * 32
    assert (comp.fwd[0], comp.fwd[-1], comp.bwd[-1]) == (before.fwd[0], before.fwd[-1],
                                                        before.bwd[-1])
    assert comp.opt_per_element == pytest.approx(2e-11)
    assert m.compute(s70).fwd == plain.compute(plain.shapes[2]).fwd
    rows = {line.split(" | ")[0].lstrip("| "): line for line in m.shapes_table().splitlines()}
    assert "| 35.00 |" in rows["llama3-8b"]  # one layer: 10 + 25 ms
    assert rows["llama3-8b"].endswith("| measured per layer at 2048 × 4, extrapolated to 32 layers |")
    assert rows["llama3-70b"].endswith("| extrapolated |")
    entry["seq"] = 1024
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f)
    r = script("--inputs", path)
    assert r.returncode == 2
    assert r.stderr.strip() == (f"scaling-model: {path}: measured_layers.llama3-8b.seq is 1024; "
                                "the shape has 2048")


def test_tensor_parallel_rank_holds_its_split_of_every_matrix(model):
    """Megatron's split: 1/TP of every matrix, embedding and head a rank, the norms whole; the
    group's micro-batch TP times one GPU's; the FLOPs (and so MFU) stay the whole model's."""
    s = model.Inputs(INPUTS).shape("llama3-8b")
    norms = (2 * s.L + 1) * s.H
    for tp in (2, 4, 8):
        r = s.tensor_parallel(tp)
        assert r.numel() == (s.numel() - norms) // tp + norms
        assert r.tokens() == tp * s.tokens()
        assert r.flops_per_token() == s.flops_per_token()
    with pytest.raises(model.InputError, match="kv_heads"):
        s.tensor_parallel(16)  # 8 kv heads do not split 16 ways


def test_tensor_parallel_collectives_and_their_time(model):
    """Per layer 2 all-gathers and 2 reduce-scatters of S forward and as many backward (again in
    the recompute of a checkpointed layer), serial on NVLink; compute per GPU unchanged at the
    same tokens a GPU; the no-overlap timeline is still compute plus every collective."""
    m = model.Model(model.Inputs(INPUTS))
    for name, recompute in (("llama3-8b", 1), ("llama3-70b", 2)):
        shape = next(s for s in m.shapes if s.name == name)
        for tp in (2, 8):
            s = shape.tensor_parallel(tp)
            fwd, bwd = model.tp_collectives(s, True)
            S = s.tokens() * s.H * 2
            assert fwd[1] == [("all_gather", S), ("reduce_scatter", S)] * 2
            assert bwd[1] == fwd[1] * recompute
            comp, whole = m.compute(s), m.compute(shape)
            one = m.net.seconds("all_gather", S // tp * (tp - 1), tp, 1)
            assert comp.tp_fwd[1] == pytest.approx(4 * one, rel=1e-9)  # RS costs as AG does
            assert comp.fwd[1] - comp.tp_fwd[1] == pytest.approx(whole.fwd[1], rel=1e-12)
            scale = (64, 8)
            dp = scale[0] // tp
            for stage in (1, 3):
                ser = model.simulate(m.net, s, comp, stage, (dp, scale[1]), m.opts, True)
                ideal = comp.step(model.owned_elements(s, stage, dp, m.opts))
                assert ser.t == pytest.approx(ideal + ser.comm_busy, rel=1e-9)


def test_data_parallel_group_of_a_tp_rank_gets_its_own_nics(model):
    """TP inside a node: a TP rank's data-parallel group has 8 / TP ranks a node, and the TP
    groups' rings run at once, so across nodes it gets 8 / TP NICs' busbw at most."""
    net = model.Network(model.Inputs(INPUTS))
    assert net.busbw(8, 8) == 345  # whole nodes: the measured figure
    assert net.busbw(8, 4) == 4 * 47
    assert net.busbw(64, 1) == 47
    assert net.busbw(1, 1) == 360


def test_tensor_parallel_of_one_is_the_projection(model):
    """TP 1 is the ZeRO projection above: the same step, and ZeRO-3 alone is its baseline."""
    m = model.Model(model.Inputs(INPUTS))
    shape = next(s for s in m.shapes if s.name == "llama3-8b")
    for scale in m.scales:
        for stage in (1, 2, 3):
            tl = model.simulate(m.net, shape, m.compute(shape), stage, scale, m.opts, False)
            l = m.layout(shape, 1, stage, scale)
            assert (l.step, l.tp_comm, l.dp) == (tl.t, 0.0, scale[0])
    # Activations a GPU: with TP's sequence parallelism the same as TP 1; without, more.
    loss = m.loss_chunk
    for tp in (2, 4, 8):
        s = shape.tensor_parallel(tp)
        assert model.activation_bytes(s, loss) == pytest.approx(model.activation_bytes(shape, loss))
        assert model.activation_bytes(s, loss, False) > model.activation_bytes(shape, loss)


def test_pipeline_schedule_and_stage_split_follow_lib_train_pipeline(model):
    """The schedule and the balanced split are pipeline.cpp's: every forward then its backward
    once, 1F1B holding at most P - p micro-batches on rank p, interleaving (P - p - 1)·2 +
    (v - 1)·P + 1 chunks' micro-batches; the split of tests/unit/train/pipeline_test.cpp."""
    for P, v, m in ((2, 1, 4), (4, 1, 2), (4, 1, 8), (4, 2, 8), (8, 2, 16)):
        for p in range(P):
            actions = model.pipeline_schedule(P, p, m, v)
            forwards = [(i, c) for f, i, c in actions if f]
            backwards = [(i, c) for f, i, c in actions if not f]
            assert sorted(forwards) == sorted(backwards) == sorted(
                (i, c) for i in range(m) for c in range(v))
            held = most = 0
            for f, i, c in actions:
                assert f or (i, c) in forwards[:forwards.index((i, c)) + 1]
                held += 1 if f else -1
                most = max(most, held)
            want = min(m, P - p) if v == 1 else min(m * v, (P - p - 1) * 2 + (v - 1) * P + 1)
            assert most == want, (P, v, m, p)
    with pytest.raises(model.InputError, match="multiple"):
        model.pipeline_schedule(4, 0, 6, 2)
    costs = [0, 1, 1, 1, 1, 2]  # embedding (free), four equal layers, a head as costly as two
    assert model.balance_stages(costs, 1) == [(0, 6)]
    assert model.balance_stages(costs, 2) == [(0, 4), (4, 6)]
    assert model.balance_stages(costs, 3) == [(0, 3), (3, 5), (5, 6)]
    assert model.balance_stages([1, 1, 1, 1, 1], 2) == [(0, 2), (2, 5)]
    # block_costs: a layer's matrices, the head's vocabulary projection, the embedding nothing.
    s = model.Inputs(INPUTS).shape("llama3-70b")
    costs = model.block_costs(s)
    layer = sum(n for name, n, u in s.parameters(whole=True) if u == 1 and "norm" not in name)
    assert costs[0] == 0 and costs[1:-1] == [layer] * s.L and costs[-1] == s.V * s.H


def test_pipeline_idle_share_on_the_timeline_is_the_formula(model):
    """With equal stages, no transfer time and nothing to reduce (one rank a stage), each rank's
    actions end at (v·m + P - 1) chunk times: idle (P - 1)/(v·m + P - 1) of the step. A transfer
    time only adds to it."""
    m = model.Model(model.Inputs(INPUTS))
    shape = model.Inputs(INPUTS).shape("llama3-8b")

    class Comp:
        pass

    for P, v, mb in ((2, 1, 4), (4, 1, 2), (4, 1, 8), (4, 2, 8), (8, 2, 16)):
        per = 2  # layers a virtual stage
        s = model.copy.copy(shape)
        s.L = per * P * v
        comp = Comp()
        comp.fwd = [0.0] + [1.0] * s.L + [0.0]
        comp.bwd = [0.0] + [2.0] * s.L + [0.0]
        comp.tp_fwd = comp.tp_bwd = [0.0] * (s.L + 2)
        comp.opt_per_element = comp.tp_norm = 0.0
        split = [(0 if k == 0 else 1 + k * per, s.L + 2 if k == P * v - 1 else 1 + (k + 1) * per)
                 for k in range(P * v)]
        layout = model.PipelineLayout(s, comp, P, v, (P, P), split)
        chunk = per * 3.0
        ends = []
        for transfer in (0.0, 0.5):
            tls = model.pipeline_step(m.net, layout, 1, (1, 1), m.opts, mb,
                                      [transfer] * (P * v - 1), P)
            ends.append(max(tl.actions_end for tl in tls))
        assert ends[0] == pytest.approx((v * mb + P - 1) * chunk, rel=1e-12)
        busy = v * mb * chunk
        assert 1 - busy / ends[0] == pytest.approx(model.pipeline_bubble(P, mb, v), rel=1e-12)
        assert ends[1] > ends[0]


def test_pipeline_boundary_is_one_micro_batch_of_hidden_states(model):
    """A rank sends [tokens / TP, hidden] bf16 a micro-batch and boundary (TP's sequence
    parallelism), its whole [tokens, hidden] without; across nodes at one NIC's busbw, in a node
    at NVLink's, plus one step of NCCL's latency."""
    inputs = model.Inputs(INPUTS)
    net = model.Network(inputs)
    for name, hidden in (("llama3-70b", 8192), ("llama3.1-405b", 16384)):
        s = inputs.shape(name).tensor_parallel(8)
        s.micro = 8  # one sequence of 2048 a GPU of the group
        assert model.boundary_bytes(s) == 2048 * hidden * 2
        assert model.boundary_bytes(s, False) == 8 * 2048 * hidden * 2
        one = model.boundary_bytes(s)
        across, inside = net.transfer_seconds(one, True), net.transfer_seconds(one, False)
        assert one / 47e9 < across < one / 47e9 + 50e-6
        assert one / 360e9 < inside < one / 360e9 + 50e-6
    assert round(inputs.shape("llama3.1-405b").numel() / 1e9, 2) == 405.85


def test_pipeline_of_one_stage_is_the_projection(model):
    """P = 1 is the projection above: one stage and one micro-step on the pipeline's timeline is
    the ZeRO step of stages 1 and 2, and the search's P = 1 rows are the tensor-parallel layouts
    (with one layer of stage 3 prefetch); stage 2 is never faster than stage 1 (so the search
    simulates it only where stage 1 does not fit)."""
    m = model.Model(model.Inputs(INPUTS))
    shape = next(s for s in m.shapes if s.name == "llama3-70b")
    scale = (64, 8)
    for tp in (1, 8):
        for stage in (1, 2):
            one = m.pipeline(shape, 1, tp, stage, 1, scale, shape.micro * tp, 1)
            l = m.layout(shape, tp, stage, scale)
            assert (one.step, one.zero_comm, one.memory) == (l.step, l.zero_comm, l.memory)
            assert one.tp_comm == pytest.approx(l.tp_comm, rel=1e-12)
    for scale in m.pp_scales[:2]:
        runs = m.pipelines(shape, scale)
        for r in (r for r in runs if r.p == 1):
            l = m.layout(shape, r.tp, r.stage, scale, m.pp_prefetch)
            assert (r.step, r.memory, r.mfu, r.m, r.across_gb) == (l.step, l.memory, l.mfu, 1, 0)
    for args in ((4, 2, 1), (8, 1, 2)):
        P, tp, v = args
        steps = [m.pipeline(shape, P, tp, z, v, scale, tp, 4 * P).step for z in (1, 2)]
        assert steps[1] >= steps[0]
