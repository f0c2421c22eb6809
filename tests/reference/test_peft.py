"""dstrain's LoRA against PEFT itself, on tiny random qwen2/llama models in float32:

- an adapter dstrain trains (`<out_dir>/lora_adapter`) loads with `PeftModel.from_pretrained`
  without missing or unexpected keys, and PEFT's logits, loss and adapter gradients equal those of
  `dstrain debug forward --adapter` on the same adapter;
- an adapter PEFT saves (`get_peft_model` + `save_pretrained`, B made non-zero) gives the same
  logits in dstrain, and a run started from it (`lora.init_from`) logs PEFT's loss at step 1;
- `dstrain export --merge-lora` equals PEFT's `merge_and_unload()` of the same adapter, weight by
  weight and in logits;
- both of PEFT's target_modules forms (a list of names matched as suffixes, one string matched as
  a full regex), target_parameters on a MoE model's expert stacks (PEFT's nested ParamWrappers,
  its expert-major layouts), modules_to_save on its routers (trained whole) and rsLoRA (alpha/√r)
  select and scale as PEFT does;
- lora_dropout > 0 acts in training only: evaluation logits are PEFT's model.eval() logits.

Every expected value comes from running PEFT; nothing is hard-coded."""

import json
import os
import shutil
import warnings

import pytest
import torch

import reflib

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
safetensors_torch = pytest.importorskip("safetensors.torch")

VOCAB = 258 + 6  # the byte tokenizer's ids (0..257), as in the other training tests
MICRO, SEQ = 2, 32
TOL = reflib.FP32_TOL
PEFT_PREFIX = "base_model.model."


# --- inputs ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    names = ["qwen2-untied", "llama-mha-tied", "llama-gqa-untied", "qwen3-moe-aux-loss",
             "qwen2-moe-shared-expert"]
    return {n: reflib.save_tiny_model(str(root / n), dict(reflib.TINY_CONFIGS[n], vocab_size=VOCAB))
            for n in names}


def write_corpus(path, batches):
    """Text lines of several scripts, and the first `batches` batches dstrain packs of them with the
    byte tokenizer (UTF-8 bytes, eos 256): [(input_ids, labels)], each [MICRO, SEQ]."""
    words = ["the", "quick", "brown", "fox", "über", "naïve", "中文", "テスト", "code()", "x=1;", "42"]
    return reflib.write_packed_corpus(path, words, batches, MICRO, SEQ, stride=5, lengths=7)


def yaml_targets(targets):
    """A config value of PEFT's two forms: a list, or one (single-quoted, so `\\` stays) regex."""
    if isinstance(targets, str):
        return "'" + targets.replace("'", "''") + "'"
    return "[" + ", ".join(targets) + "]"


def write_run_yaml(tmp, model_dir, corpus, lora, steps, lr, stage=0):
    run_dir = os.path.join(tmp, "run")
    training = {"max_steps": steps, "per_device_train_batch_size": MICRO,
                "gradient_accumulation_steps": 1, "lr": lr, "lr_scheduler": "constant",
                "weight_decay": 0.0, "seed": 11, "log_interval": 1}
    lora = {k: yaml_targets(v) if isinstance(v, (list, str)) and k != "init_from" else v
            for k, v in lora.items()}
    path = reflib.write_run_config(os.path.join(tmp, "run.yaml"), model_dir, run_dir,
                                   reflib.line_corpus_data(corpus, SEQ, shuffle=False), training,
                                   stage=stage, save_final=True, more={"lora": lora})
    return path, run_dir


# --- the PEFT side --------------------------------------------------------------------------------

def base_model(model_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="sdpa").to(reflib.device())


def peft_from_pretrained(model_dir, adapter_dir):
    """PeftModel.from_pretrained, trainable (for the gradients), with the warnings raised while
    loading: PEFT warns (UserWarning) about missing adapter keys and ignored config keys. API
    deprecation notices between PEFT and transformers say nothing about the adapter: left out."""
    base = base_model(model_dir)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = peft.PeftModel.from_pretrained(base, adapter_dir, is_trainable=True)
    return model, [str(w.message) for w in caught
                   if not issubclass(w.category, (DeprecationWarning, FutureWarning))]


def dstrain_name(peft_name):
    """PEFT's parameter name → dstrain's: base_model.model.<module>.lora_A.default.weight →
    <module>.lora_A.weight."""
    return peft_name[len(PEFT_PREFIX):].replace(".default.", ".")


def peft_dump(model, ids, train):
    """Logits, loss (HF causal-LM loss on labels = ids) and the adapter gradients, as debug forward
    names them."""
    model.train(train)
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids.to(model.device), labels=ids.to(model.device))
    out.loss.backward()
    dump = {"logits": out.logits.detach().float().cpu(), "loss": out.loss.detach().float().cpu()}
    if getattr(out, "aux_loss", None) is not None:  # a MoE model's load-balancing loss
        dump["aux_loss"] = out.aux_loss.detach().float().cpu()
    for name, p in model.named_parameters():
        if p.requires_grad:
            dump["grad." + dstrain_name(name)] = p.grad.detach().float().cpu()
    return dump


def peft_batch_loss(model, inp, lab):
    """The loss dstrain logs for a packed batch (labels already shifted by the packing)."""
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=inp.to(model.device)).logits
    return torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                             lab.to(model.device).reshape(-1)).item()


def adapted_modules(model):
    return sorted(name[len(PEFT_PREFIX):] for name, m in model.named_modules()
                  if isinstance(m, peft.tuners.lora.LoraLayer))


def adapted_weights(model):
    """The base weights an adapter changes: a module's weight, or a ParamWrapper's parameter (an
    expert stack, named without PEFT's nesting)."""
    out = []
    for name, m in model.named_modules():
        if not isinstance(m, peft.tuners.lora.LoraLayer):
            continue
        name = name[len(PEFT_PREFIX):]
        if isinstance(m, peft.tuners.lora.ParamWrapper):
            out.append(name.replace(".base_layer", "") + "." + m.parameter_name)
        else:
            out.append(name + ".weight")
    out += [name[len(PEFT_PREFIX):] + ".weight" for name, m in model.named_modules()
            if isinstance(m, peft.utils.ModulesToSaveWrapper)]
    return sorted(out)


def is_lora_key(key):
    return key.endswith((".lora_A.weight", ".lora_B.weight"))


def assert_scaling(model, r, alpha, rslora):
    want = alpha / r ** 0.5 if rslora else alpha / r
    for name, m in model.named_modules():
        if isinstance(m, peft.tuners.lora.LoraLayer):
            assert m.scaling["default"] == pytest.approx(want, rel=1e-12), name


def debug_forward(tmp, model_dir, adapter_dir, ids, eval_mode):
    extra = ["--adapter", adapter_dir] + (["--eval"] if eval_mode else [])
    sub = os.path.join(tmp, "fwd-eval" if eval_mode else "fwd-train")
    os.makedirs(sub, exist_ok=True)
    return reflib.dstrain_forward(sub, model_dir, ids, extra=extra)


def compare_forward(got, want, what):
    """rel diffs of logits, loss and every adapter gradient; fails naming the worst."""
    try:
        diffs = reflib.compare_all(got, want, TOL)
    except AssertionError as e:
        raise AssertionError(f"{what}: {e}") from None
    grads = {k: v for k, v in diffs.items() if k.startswith("grad.")}
    assert grads, f"{what}: no adapter gradients compared"
    worst = max(grads, key=grads.get)
    print(f"{what}: logits {diffs['logits']:.2e}, loss {diffs['loss']:.2e}, "
          f"grads (worst {worst}) {grads[worst]:.2e}")
    return diffs


def compare_merged(model_dir, adapter_dir, merged_dir, ids, what):
    """dstrain's --merge-lora directory against PEFT's merge_and_unload() of the same adapter: every
    weight (exactly the adapted ones moved), and logits."""
    peft_model = peft.PeftModel.from_pretrained(base_model(model_dir), adapter_dir)
    adapted = adapted_weights(peft_model)
    want_model = peft_model.merge_and_unload()
    got_model = base_model(merged_dir)
    base = {n: p.detach().cpu() for n, p in base_model(model_dir).named_parameters()}
    want = {n: p.detach().cpu() for n, p in want_model.named_parameters()}
    got = {n: p.detach().cpu() for n, p in got_model.named_parameters()}
    diffs = reflib.compare_all(got, want, TOL)
    moved = sorted(n for n in want if not torch.equal(want[n], base[n]))
    assert moved == adapted, f"{what}: merged weights that moved: {moved}, adapted: {adapted}"
    want_model.eval()
    got_model.eval()
    with torch.no_grad():
        logits_want = want_model(input_ids=ids.to(want_model.device)).logits
        logits_got = got_model(input_ids=ids.to(got_model.device)).logits
    d = reflib.assert_close(logits_got, logits_want, TOL, f"{what}: merged logits")
    print(f"{what}: merged weights worst {max(diffs.values()):.2e}, merged logits {d:.2e}")


# --- dstrain-trained adapters in PEFT -------------------------------------------------------------

TRAINED = {
    # PEFT's list form, with a dotted suffix; plain alpha/r.
    "qwen2-list": dict(model="qwen2-untied", world=1, stage=0, lora={
        "r": 4, "alpha": 8, "dropout": 0.1, "use_rslora": "false",
        "target_modules": ["q_proj", "self_attn.v_proj", "down_proj"]}),
    # One regex (full match): layer 1's q/k plus every up_proj; rsLoRA.
    "llama-regex-rslora": dict(model="llama-mha-tied", world=1, stage=0, lora={
        "r": 8, "alpha": 16, "dropout": 0.2, "use_rslora": "true",
        "target_modules": r".*layers\.1\.self_attn\.(q|k)_proj|.*\.up_proj"}),
    # A MoE model's attention and both expert stacks (target_parameters: no dropout, as PEFT) and
    # its routers trained whole (modules_to_save), with its load-balancing loss, on 2 ranks at ZeRO
    # stage 3; and a Qwen2-MoE's shared expert
    # (PEFT's target_modules names match its projections, not the experts' stacks).
    "qwen3-moe-experts-zero3": dict(model="qwen3-moe-aux-loss", world=2, stage=3, lora={
        "r": 4, "alpha": 8, "dropout": 0.0, "use_rslora": "false",
        "target_modules": ["q_proj", "v_proj"],
        "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
        "modules_to_save": ["mlp.gate"]}),
    "qwen2-moe-shared-expert": dict(model="qwen2-moe-shared-expert", world=1, stage=0, lora={
        "r": 4, "alpha": 8, "dropout": 0.05, "use_rslora": "false",
        "target_modules": ["q_proj", "gate_proj", "up_proj", "down_proj"]}),
    # PEFT's "all-linear" shorthand, trained on 2 ranks at ZeRO stage 3 (sharded base and adapters).
    "qwen2-all-linear-zero3": dict(model="qwen2-untied", world=2, stage=3, lora={
        "r": 4, "alpha": 4, "dropout": 0.05, "use_rslora": "false",
        "target_modules": "all-linear"}),
}


def peft_all_linear(model_dir):
    """The modules PEFT's "all-linear" adapts on this model."""
    config = peft.LoraConfig(task_type="CAUSAL_LM", target_modules="all-linear")
    return adapted_modules(peft.get_peft_model(base_model(model_dir), config))


@pytest.mark.parametrize("case", sorted(TRAINED))
def test_dstrain_adapter_loads_in_peft_with_same_outputs(models, tmp, case):
    spec = TRAINED[case]
    lora = spec["lora"]
    model_dir = models[spec["model"]]
    corpus = os.path.join(tmp, "train.txt")
    write_corpus(corpus, 4 * spec["world"])
    yaml, run_dir = write_run_yaml(tmp, model_dir, corpus, lora, steps=4, lr=2e-2,
                                   stage=spec["stage"])
    reflib.train(yaml, spec["world"])
    assert len(reflib.read_losses(run_dir)) == 4
    adapter = os.path.join(run_dir, "lora_adapter")
    rslora = lora["use_rslora"] == "true"

    # The files: PEFT's config keys and values, PEFT's tensor names.
    with open(os.path.join(adapter, "adapter_config.json")) as f:
        config = json.load(f)
    assert config["peft_type"] == "LORA" and config["task_type"] == "CAUSAL_LM"
    assert (config["r"], config["lora_alpha"], config["lora_dropout"]) == (
        lora["r"], lora["alpha"], lora["dropout"])
    assert config["use_rslora"] is rslora and config["bias"] == "none"
    if lora["target_modules"] == "all-linear":  # written expanded (a list), as PEFT writes it
        assert isinstance(config["target_modules"], list)
    else:  # a list as a list, a regex as one string
        assert config["target_modules"] == lora["target_modules"]
    assert config.get("target_parameters") == lora.get("target_parameters")
    assert config["modules_to_save"] == lora.get("modules_to_save")
    assert config["base_model_name_or_path"] == model_dir
    tensors = safetensors_torch.load_file(os.path.join(adapter, "adapter_model.safetensors"))
    # lora_A/lora_B, and a module of modules_to_save as its whole weight.
    saved = lora.get("modules_to_save", [])
    assert all(k.startswith(PEFT_PREFIX) and (is_lora_key(k) or any(
        k.endswith(m + ".weight") for m in saved)) for k in tensors)
    assert any(not is_lora_key(k) for k in tensors) == bool(saved)
    assert all(tensors[k].abs().max() > 0 for k in tensors)  # trained: B moved off zero

    # PEFT loads it with no warning, selects the same modules and holds the file's tensors.
    model, caught = peft_from_pretrained(model_dir, adapter)
    assert not caught, f"PEFT warned while loading dstrain's adapter: {caught}"
    loaded = peft.get_peft_model_state_dict(model)
    assert sorted(loaded) == sorted(tensors)
    assert all(torch.equal(loaded[k].cpu(), tensors[k]) for k in tensors)
    modules = sorted({dstrain_name(k).rsplit(".lora_", 1)[0] for k in tensors if is_lora_key(k)})
    assert adapted_modules(model) == modules
    if lora["target_modules"] == "all-linear":
        assert modules == peft_all_linear(model_dir)
    assert_scaling(model, lora["r"], lora["alpha"], rslora)
    # The warning check is not vacuous: the same adapter less one module's B is warned about.
    broken = os.path.join(tmp, "broken_adapter")
    shutil.copytree(adapter, broken)
    dropped = sorted(k for k in tensors if k.endswith("lora_B.weight"))[0]
    safetensors_torch.save_file({k: v for k, v in tensors.items() if k != dropped},
                                os.path.join(broken, "adapter_model.safetensors"))
    assert any("missing adapter keys" in w for w in peft_from_pretrained(model_dir, broken)[1])

    # Evaluation: PEFT's model.eval() outputs. Training mode draws dropout masks (dstrain's differ
    # from PEFT's), so the two modes must differ in dstrain: dropout is really there, in training.
    ids = reflib.random_ids(VOCAB, 2, 40, seed=3)
    want = peft_dump(model, ids, train=False)
    base_logits = reflib.dstrain_forward(tmp, model_dir, ids)["logits"]
    effect = reflib.rel_diff(base_logits, want["logits"])
    print(f"{case}: the adapter moves PEFT's logits by {effect:.2e} (relative to the base)")
    assert effect > 1e-4, "the adapter changes nothing: the comparison would be vacuous"
    compare_forward(debug_forward(tmp, model_dir, adapter, ids, True), want, case)
    if lora["dropout"] > 0:
        train_logits = debug_forward(tmp, model_dir, adapter, ids, False)["logits"]
        assert reflib.rel_diff(train_logits, want["logits"]) > 1e-4, \
            "dropout had no effect in training"

    # The checkpoint exports to the same adapter, and merges as PEFT merges it.
    ckpt = os.path.join(run_dir, "checkpoints", "latest")
    exported = os.path.join(tmp, "exported")
    reflib.run(["export", ckpt, "--adapter-only", "--out", exported])
    again = safetensors_torch.load_file(os.path.join(exported, "adapter_model.safetensors"))
    assert sorted(again) == sorted(tensors)
    assert all(torch.equal(again[k], tensors[k]) for k in tensors)
    merged = os.path.join(tmp, "merged")
    reflib.run(["export", ckpt, "--merge-lora", "--out", merged, "--dtype", "float32"])
    compare_merged(model_dir, adapter, merged, ids, case)


def test_routers_trained_whole_start_from_the_base_weights(models, tmp):
    """modules_to_save at ZeRO stage 3 on 2 ranks (the base sharded, so the trained copies take
    their first values from the base's files): after one step at lr 1e-30 (no fp32 weight moves)
    the adapter's router weights are the model's own, bit for bit."""
    model_dir = models["qwen3-moe-aux-loss"]
    corpus = os.path.join(tmp, "train.txt")
    write_corpus(corpus, 2)
    lora = {"r": 2, "alpha": 4, "target_modules": ["q_proj"], "modules_to_save": ["gate"]}
    yaml, run_dir = write_run_yaml(tmp, model_dir, corpus, lora, steps=1, lr=1e-30, stage=3)
    reflib.train(yaml, 2)
    tensors = safetensors_torch.load_file(os.path.join(run_dir, "lora_adapter",
                                                       "adapter_model.safetensors"))
    base = {n: p.detach().cpu() for n, p in base_model(model_dir).named_parameters()}
    routers = sorted(k[len(PEFT_PREFIX):] for k in tensors if not is_lora_key(k))
    assert routers == sorted(n for n in base if n.endswith("mlp.gate.weight")), routers
    for name in routers:
        assert torch.equal(tensors[PEFT_PREFIX + name], base[name]), name


# --- PEFT-saved adapters in dstrain ---------------------------------------------------------------

SAVED = {
    "qwen2-list-rslora": ("qwen2-untied", dict(r=4, lora_alpha=16, use_rslora=True,
                                               target_modules=["k_proj", "o_proj", "gate_proj"])),
    "llama-regex": ("llama-gqa-untied",
                    dict(r=6, lora_alpha=12, use_rslora=False,
                         target_modules=r".*layers\.0\.mlp\.(up|down)_proj|.*\.v_proj")),
    # One expert stack of a Qwen2-MoE (its adapter at mlp.experts itself) beside its shared
    # expert's gate_proj; modules_to_save "gate" (PEFT's plain suffix match) trains the routers
    # and the shared experts' gates whole.
    "qwen2-moe-down-stacks": ("qwen2-moe-shared-expert",
                              dict(r=4, lora_alpha=8, use_rslora=False, target_modules=["gate_proj"],
                                   target_parameters=["experts.down_proj"],
                                   modules_to_save=["gate"])),
    # PEFT expands "all-linear" and saves the full module paths it chose.
    "qwen2-all-linear": ("qwen2-untied", dict(r=2, lora_alpha=3, use_rslora=True,
                                              target_modules="all-linear")),
}


def save_peft_adapter(model_dir, out_dir, settings):
    """get_peft_model + save_pretrained, with A and B both random (B non-zero, so that the adapter
    changes the logits). Returns PEFT's model."""
    torch.manual_seed(21)
    model = peft.get_peft_model(base_model(model_dir),
                                peft.LoraConfig(task_type="CAUSAL_LM", lora_dropout=0.0, **settings))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)
            elif "modules_to_save" in name:  # a module trained whole: moved off the base
                p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(out_dir)
    return model


@pytest.mark.parametrize("case", sorted(SAVED))
def test_peft_adapter_starts_dstrain_at_peft_outputs(models, tmp, case):
    name, settings = SAVED[case]
    model_dir = models[name]
    adapter = os.path.join(tmp, "peft_adapter")
    model = save_peft_adapter(model_dir, adapter, settings)

    # debug forward --adapter: logits, loss and adapter gradients (dropout 0: both modes agree).
    ids = reflib.random_ids(VOCAB, 2, 40, seed=4)
    want = peft_dump(model, ids, train=True)
    base_logits = reflib.dstrain_forward(tmp, model_dir, ids)["logits"]
    effect = reflib.rel_diff(base_logits, want["logits"])
    print(f"{case}: the adapter moves PEFT's logits by {effect:.2e} (relative to the base)")
    assert effect > 1e-3, "the adapter changes nothing: the comparison would be vacuous"
    compare_forward(debug_forward(tmp, model_dir, adapter, ids, False), want, case)

    # A run from it: the config's own r/alpha/targets are overridden by the adapter's. The first
    # logged loss is PEFT's loss on the first batch. lr is so small that no weight moves in fp32,
    # so the run's adapter and its --merge-lora export are PEFT's adapter and merge.
    corpus = os.path.join(tmp, "train.txt")
    batches = write_corpus(corpus, 1)
    lora = {"r": 2, "alpha": 5, "target_modules": ["q_proj"], "init_from": adapter}
    yaml, run_dir = write_run_yaml(tmp, model_dir, corpus, lora, steps=1, lr=1e-30)
    reflib.run(["train", yaml])
    got = reflib.read_losses(run_dir)[1]
    want_loss = peft_batch_loss(model, *batches[0])
    rel = abs(got - want_loss) / abs(want_loss)
    print(f"{case}: first loss dstrain {got:.8f} PEFT {want_loss:.8f} (relative {rel:.2e})")
    assert rel <= TOL, f"first loss {got:.8f} vs PEFT {want_loss:.8f} (relative {rel:.3g})"

    out = os.path.join(run_dir, "lora_adapter")
    with open(os.path.join(out, "adapter_config.json")) as f:
        written = json.load(f)
    assert written["r"] == settings["r"] and written["lora_alpha"] == settings["lora_alpha"]
    assert written["use_rslora"] is settings["use_rslora"]
    assert written.get("target_parameters") == settings.get("target_parameters")
    assert written["modules_to_save"] == settings.get("modules_to_save")
    with open(os.path.join(adapter, "adapter_config.json")) as f:
        saved = json.load(f)["target_modules"]  # a list is written in set order
    if isinstance(saved, str):
        assert written["target_modules"] == saved
    else:
        assert sorted(written["target_modules"]) == sorted(saved)
    peft_tensors = safetensors_torch.load_file(os.path.join(adapter, "adapter_model.safetensors"))
    ours = safetensors_torch.load_file(os.path.join(out, "adapter_model.safetensors"))
    assert sorted(ours) == sorted(peft_tensors)
    worst = max(reflib.rel_diff(ours[k], peft_tensors[k]) for k in ours)
    assert worst <= 1e-7, f"the 1-step adapter moved: {worst:.3g}"
    merged = os.path.join(tmp, "merged")
    reflib.run(["export", os.path.join(run_dir, "checkpoints", "latest"), "--merge-lora",
                "--out", merged, "--dtype", "float32"])
    compare_merged(model_dir, adapter, merged, ids, case)
